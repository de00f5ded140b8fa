"""Which int8 form of the pruned branch's attention is fastest
(docs/experiments/2026-11-27-int8-attention.md).

The int8 export splits every biased ``Attention`` node (padding + merged tokens' log-size) into an int8
QKV ``MatMul``, a ``Split`` and an fp32 ``MultiHeadAttention`` core, because ``QAttention`` has no
attention-bias input. The operator profile showed the pruned int8 graph at ρ = 0.5 no faster than at
ρ = 1 (8 × 256). Variants of the pruned branch, the unpruned branch int8 as shipped in all of them:

- ``split`` (shipped): MatMul int8 → Split → MultiHeadAttention(q, k, v, bias, attention_bias);
- ``fp32-attention``: the ``Attention`` node left whole and fp32 (QKV projection and core in one
  kernel), only the other MatMuls int8;
- ``split-prebiased``: the QKV bias added before the Split, MultiHeadAttention without its bias input.

Timed interleaved (paired rounds, ms per call of 8 × 256 random documents) at ρ 1 / 0.5 / 0.3, with the
fp32 graph beside them; cosine of each variant's embeddings to the fp32 graph's.

    python -m experiments.int8_attention --run-dir /root/retention-runs/minilm-embed-full \
        --out results/experiments/int8-attention/int8_attention.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from retention_core.machine import describe
from retention_core.onnx import open_session
from training import export as E
from training.fit import load_run

ROUNDS = 9
BATCH, LENGTH = 8, 256
RHOS = (1.0, 0.5, 0.3)


def quantize_pruned(model: Any, variant: str) -> Any:
    """The pruned standalone graph in int8, its attention as ``variant`` says."""
    if variant == "fp32-attention":
        return E.int8_weights(model, [op for op in E.INT8_OPERATORS if op != "Attention"])
    model = E.split_biased_attention(model)
    if variant == "split-prebiased":
        model = prebiased_split(model)
    return E.int8_weights(model, E.INT8_OPERATORS)


def prebiased_split(model: Any) -> Any:
    """Each split's QKV bias added to the packed projection before the Split; MHA without bias."""
    from onnx import helper

    nodes = []
    for node in model.graph.node:
        if node.op_type == "Split" and node.name.endswith("/Split"):
            prefix = node.name[: -len("/Split")]
            mha = next(n for n in model.graph.node if n.name == f"{prefix}/MultiHeadAttention")
            biased = f"{prefix}/qkv_biased"
            nodes.append(
                helper.make_node("Add", [node.input[0], mha.input[3]], [biased], name=f"{prefix}/AddBias")
            )
            node.input[0] = biased
        if node.op_type == "MultiHeadAttention" and node.name.endswith("/MultiHeadAttention"):
            node.input[3] = ""
        nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model


def build(run_dir: Path, workdir: Path) -> dict[str, Path]:
    model, _, _ = load_run(run_dir)
    fp32 = workdir / "fp32.onnx"
    E.export_onnx(model, fp32, model.backbone.info_vocab_size)
    parts = E.unjoined(onnx.load(str(fp32)))
    assert parts is not None, "the export has no unpruned branch"
    unpruned_int8 = E.quantized(parts[1])
    paths = {"fp32": fp32}
    for variant in ("split", "fp32-attention", "split-prebiased"):
        pruned = E.unjoined(onnx.load(str(fp32)))[0]  # type: ignore[index]  # fresh: the variants edit it
        paths[variant] = workdir / f"{variant}.onnx"
        onnx.save(
            E.with_unpruned_branch(quantize_pruned(pruned, variant), unpruned_int8), str(paths[variant])
        )
    return paths


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m experiments.int8_attention", description=__doc__)
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    paths = build(args.run_dir, Path(tempfile.mkdtemp()))
    sessions = {name: open_session(path) for name, path in paths.items()}
    ids = np.random.default_rng(0).integers(2000, 20000, (BATCH, LENGTH)).astype(np.int64)
    names = {graph_input.name for graph_input in sessions["fp32"].get_inputs()}
    results: dict[str, Any] = {}
    for rho in RHOS:
        every = {
            "input_ids": ids,
            "attention_mask": np.ones_like(ids),
            "rho": np.full(BATCH, rho, np.float32),
        }
        feeds = {name: value for name, value in every.items() if name in names}
        outputs = {name: session.run(None, feeds)[0] for name, session in sessions.items()}  # warm-up
        times: dict[str, list[float]] = {name: [] for name in sessions}
        order = list(sessions)
        for round_index in range(ROUNDS):
            for name in order[round_index % len(order) :] + order[: round_index % len(order)]:
                start = time.perf_counter()
                sessions[name].run(None, feeds)
                times[name].append(time.perf_counter() - start)
        reference = np.asarray(times["split"])
        cells = {}
        for name, series in times.items():
            vectors, base = outputs[name], outputs["fp32"]
            cosine = np.sum(vectors * base, 1) / (
                np.linalg.norm(vectors, axis=1) * np.linalg.norm(base, axis=1)
            )
            cells[name] = {
                "ms_median": 1000 * float(np.median(series)),
                "speedup_vs_split_median": float(np.median(reference / np.asarray(series))),
                "cosine_to_fp32_mean": float(np.mean(cosine)),
            }
        results[f"{rho:g}"] = cells
        print(rho, json.dumps(cells, indent=None), flush=True)
    payload = {
        "results": results,
        "batch": BATCH,
        "tokens": LENGTH,
        "rounds": ROUNDS,
        "machine": describe(),
        "command": "python -m experiments.int8_attention --run-dir "
        + str(args.run_dir)
        + " --out "
        + str(args.out),
        "seconds": round(time.perf_counter() - started, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
