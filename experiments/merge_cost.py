"""What merging costs in ONNX Runtime (docs/experiments/2026-11-26-embedding-merge.md): the full
minilm-embed run exported twice, with and without ``merge_dropped``, timed interleaved (9 paired rounds,
8 documents x 256 tokens, this CPU); the median of merge time / drop time per rho.

    python -m experiments.merge_cost --run-dir /root/retention-runs/minilm-embed-full \
        --out results/experiments/embedding-merge/merge_cost.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.harness import describe
from retention_core.onnx import open_session
from training.export import export_onnx
from training.fit import load_run

ROUNDS = 9
BATCH, LENGTH = 8, 256
RHOS = (1.0, 0.7, 0.5, 0.3)


def paired_ratios(drop: object, merge: object, feeds: dict[str, np.ndarray]) -> list[float]:
    """merge time / drop time of each round, the two sessions run back to back."""
    ratios = []
    for _ in range(ROUNDS):
        start = time.perf_counter()
        drop.run(None, feeds)  # type: ignore[attr-defined]
        middle = time.perf_counter()
        merge.run(None, feeds)  # type: ignore[attr-defined]
        ratios.append((time.perf_counter() - middle) / (middle - start))
    return ratios


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m experiments.merge_cost", description=__doc__)
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    model, _, _ = load_run(args.run_dir)
    workdir = Path(tempfile.mkdtemp())
    export_onnx(model, workdir / "merge.onnx", model.backbone.info_vocab_size)
    model.config = dataclasses.replace(model.config, merge_dropped=False)
    export_onnx(model, workdir / "drop.onnx", model.backbone.info_vocab_size)
    drop, merge = open_session(workdir / "drop.onnx"), open_session(workdir / "merge.onnx")
    ids = np.random.default_rng(0).integers(2000, 20000, (BATCH, LENGTH)).astype(np.int64)
    names = {graph_input.name for graph_input in drop.get_inputs()}
    results = {}
    for rho in RHOS:
        every: dict[str, np.ndarray] = {
            "input_ids": ids,
            "attention_mask": np.ones_like(ids),
            "rho": np.full(BATCH, rho, np.float32),
        }
        feeds = {name: value for name, value in every.items() if name in names}
        drop.run(None, feeds), merge.run(None, feeds)  # warm-up
        ratios = paired_ratios(drop, merge, feeds)
        results[f"{rho:g}"] = {"median": float(np.median(ratios)), "min": min(ratios), "max": max(ratios)}
        print(rho, results[f"{rho:g}"], flush=True)
    payload = {"merge_time_over_drop_time": results, "batch": BATCH, "tokens": LENGTH, "machine": describe()}
    args.out.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
