"""Where an ONNX graph's time goes: onnxruntime's own profiler, kernel time summed by operator type,
for the dense peer a user would serve and for our graph at several ρ, on the same documents.

    python -m experiments.op_profile --out results/experiments/op-profile/op_profile.json  # MiniLM, 8 × 256
    python -m experiments.op_profile --quick --out /tmp/op_profile.json     # tiny model, seconds

Variants: ``peer-fused`` (``training.export.optimize.build_dense_peer``: the model as optimum exports it,
fused by onnxruntime's transformer optimizer) and ``ours@ρ`` (our exported graph, ``training.export.graph``,
what the service serves), each in fp32 and, with ``--int8``, with dynamic int8 weights. Each variant
runs ``--iterations`` profiled calls after a warm-up; a row gives, per operator type, milliseconds of
kernel time per call and its share of the variant's kernel time, and per variant the wall time per
call and what lies outside kernels (the executor, allocation, thread hand-offs). Timings depend on
shapes and the schedule, not on trained weights: the graphs come from the pretrained backbone with
fresh scorers and the embedding recipe's schedule, or from ``--run-dir``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.embedding_graphs import DEFAULT_RECIPE, documents, our_model, peer_checkpoint, token_feeds
from benchmarks.harness import ort_session, publish

MODULE = "experiments.op_profile"
SEQ_LEN, BATCH, ITERATIONS = 256, 8, 10
QUICK_SEQ_LEN, QUICK_BATCH, QUICK_ITERATIONS = 32, 2, 2
DEFAULT_RHOS = (1.0, 0.5, 0.3)
PEER, OURS = "peer-fused", "ours"
WARM_UP_CALLS = 2
TOP_OPERATORS = 12  # rows per variant in the markdown table (the JSON keeps every operator type)


@dataclass(frozen=True)
class OperatorTime:
    operator: str
    milliseconds_per_call: float
    share_of_kernels: float
    nodes: int  # distinct graph nodes of this type that ran


@dataclass(frozen=True)
class Profile:
    variant: str
    precision: str
    rho: float | None
    wall_milliseconds_per_call: float  # median of the profiled calls, timed around session.run
    kernel_milliseconds_per_call: float
    outside_kernels_milliseconds_per_call: float
    operators: list[OperatorTime]


CONTAINERS = frozenset({"If", "Loop", "Scan"})  # their time is their branch's nodes, profiled one by one


def kernel_events(trace: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The profiler's per-node kernel events (``*_kernel_time``), one per node run; control-flow nodes
    are left out (counting them would count their branch twice)."""
    return [
        event
        for event in trace
        if event.get("cat") == "Node"
        and str(event.get("name", "")).endswith("_kernel_time")
        and event.get("args", {}).get("op_name") not in CONTAINERS
    ]


def by_operator(events: list[dict[str, Any]], calls: int) -> tuple[float, list[OperatorTime]]:
    """Kernel events → (kernel ms per call, per operator type ms per call and share), slowest first."""
    micros: dict[str, float] = defaultdict(float)
    nodes: dict[str, set[str]] = defaultdict(set)
    for event in events:
        operator = event["args"]["op_name"]
        micros[operator] += float(event["dur"])
        nodes[operator].add(event["name"])
    total = sum(micros.values())
    rows = [
        OperatorTime(
            operator=operator,
            milliseconds_per_call=spent / 1000.0 / calls,
            share_of_kernels=spent / total if total else 0.0,
            nodes=len(nodes[operator]),
        )
        for operator, spent in sorted(micros.items(), key=lambda item: -item[1])
    ]
    return total / 1000.0 / calls, rows


def profile_variant(
    path: Path, feeds: dict[str, np.ndarray], threads: int, iterations: int, workdir: Path, name: str
) -> tuple[float, float, list[OperatorTime]]:
    """Warm up, then profile ``iterations`` calls: (wall ms per call, kernel ms per call, operators)."""
    session = ort_session(path, threads, profile=workdir / name)
    for _ in range(WARM_UP_CALLS):  # arenas, first-shape allocations: profiled, then left out below
        session.run(None, feeds)
    walls = []
    for _ in range(iterations):
        started = time.perf_counter()
        session.run(None, feeds)
        walls.append((time.perf_counter() - started) * 1000.0)
    trace = json.loads(Path(session.end_profiling()).read_text(encoding="utf-8"))
    events = kernel_events(trace)
    per_run = len(events) // (iterations + WARM_UP_CALLS)  # the same nodes run in every call
    kernel_ms, operators = by_operator(events[-per_run * iterations :], iterations)
    return statistics.median(walls), kernel_ms, operators


def graphs(args: argparse.Namespace, workdir: Path) -> dict[str, Path]:
    """The fused dense peer and our exported graph (fp32; with ``--int8`` their dynamic int8 forms)."""
    from training.engine.encoders import DEFAULT_BACKBONE
    from training.export.graph import export_onnx
    from training.export.int8 import quantize_int8
    from training.export.optimize import build_dense_peer

    checkpoint = peer_checkpoint(args.quick, args.run_dir, DEFAULT_BACKBONE, workdir)
    model = our_model(args.run_dir, DEFAULT_RECIPE, checkpoint)
    files = {PEER: build_dense_peer(checkpoint, workdir).fused, OURS: workdir / "ours.onnx"}
    export_onnx(model, files[OURS], model.backbone.info_vocab_size)
    if args.int8:
        for name in (PEER, OURS):
            quantize_int8(files[name], workdir / f"{name}.int8.onnx")
            files[f"{name}-int8"] = workdir / f"{name}.int8.onnx"
    return {**files, "checkpoint": checkpoint}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from transformers import AutoTokenizer

    profiles: list[Profile] = []
    with tempfile.TemporaryDirectory(prefix="op-profile-") as tmp:
        workdir = Path(tmp)
        files = graphs(args, workdir)
        tokenizer = AutoTokenizer.from_pretrained(str(files.pop("checkpoint")), local_files_only=True)
        feeds = token_feeds(
            tokenizer, documents(tokenizer, args.batch, args.seq_len, np.random.default_rng(0)), args.seq_len
        )
        ours_feeds = {name: feeds[name] for name in ("input_ids", "attention_mask")}
        for name, path in files.items():
            precision = "int8" if name.endswith("-int8") else "fp32"
            rhos: list[float | None] = [None] if name.startswith(PEER) else list(args.rhos)
            for rho in rhos:
                run_feeds = (
                    feeds
                    if rho is None
                    else {**ours_feeds, "rho": np.full(args.batch, rho, dtype=np.float32)}
                )
                variant = name if rho is None else f"{name}@{rho:g}"
                wall, kernels, operators = profile_variant(
                    path, run_feeds, args.threads, args.iterations, workdir, variant
                )
                profiles.append(Profile(variant, precision, rho, wall, kernels, wall - kernels, operators))
    return {
        "settings": {
            "seq_len": args.seq_len,
            "batch": args.batch,
            "threads": args.threads,
            "iterations": args.iterations,
            "run_dir": None if args.run_dir is None else str(args.run_dir),
        },
        "profiles": [asdict(profile) for profile in profiles],
    }


def markdown(payload: dict[str, Any]) -> str:
    settings = payload["settings"]
    lines = [
        "# Operator profile (onnxruntime's profiler, kernel time by operator type)",
        "",
        f"{settings['batch']} documents × {settings['seq_len']} tokens, {settings['threads']} threads, "
        f"{settings['iterations']} profiled calls per variant after a warm-up.",
        "",
        "| variant | wall ms/call | kernels ms/call | outside kernels | top operators (ms/call, share) |",
        "|---|---|---|---|---|",
    ]
    for row in payload["profiles"]:
        top = ", ".join(
            f"{op['operator']} {op['milliseconds_per_call']:.1f} ({op['share_of_kernels']:.0%})"
            for op in row["operators"][:TOP_OPERATORS]
        )
        lines.append(
            f"| {row['variant']} | {row['wall_milliseconds_per_call']:.1f} | "
            f"{row['kernel_milliseconds_per_call']:.1f} | {row['outside_kernels_milliseconds_per_call']:.1f} "
            f"| {top} |"
        )
    lines += ["", f"Command: `{payload.get('command', '')}` ({payload.get('wall_seconds', '?')} s)."]
    return "\n".join(lines) + "\n"


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=f"python -m {MODULE}", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="JSON; the markdown table goes beside it")
    parser.add_argument(
        "--run-dir", type=Path, default=None, help="a trained embedding run (default: fresh scorers)"
    )
    parser.add_argument("--quick", action="store_true", help="tiny random checkpoint, seconds")
    parser.add_argument("--int8", action="store_true", help="also the dynamic int8 graphs")
    parser.add_argument("--seq-len", type=int, default=SEQ_LEN)
    parser.add_argument("--batch", type=int, default=BATCH)
    parser.add_argument("--iterations", type=int, default=ITERATIONS)
    parser.add_argument("--rhos", type=float, nargs="+", default=list(DEFAULT_RHOS))
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    if args.quick:
        args.seq_len, args.batch, args.iterations = QUICK_SEQ_LEN, QUICK_BATCH, QUICK_ITERATIONS
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    started = time.perf_counter()
    return publish(measure(args), markdown, args.out, MODULE, argv, machine=True, started=started)


if __name__ == "__main__":
    main()
