"""Why retention's eager torch forward runs 0.36-0.45x dense SDPA on an H100 at every rho
(docs/experiments/2026-11-27-gpu-host-bound.md): where one forward's time goes, and whether a base-size
model (768 x 12, where a token costs ~8x the compute) or bigger batches move the device out of the
host-bound regime.

1. ``profile``: MiniLM shape, 8 x 256, fp32, retention@0.5 and dense SDPA: wall ms per forward (synced),
   host ms per forward (the call returns before the device finishes unless the forward itself waits),
   CUDA kernels per forward and their summed device ms, device-to-host waits per forward, and the CPU
   operators that cost most.
2. ``grid``: sequences/s of retention at rho 1 / 0.5 / 0.3 against Hugging Face dense SDPA, MiniLM and
   base shapes, batch x length 8 x 256, 32 x 512, 128 x 512, fp32 and bf16 autocast (benchmarks.gpu's
   cells: interleaved rounds, paired ratios).

    PYTHONPATH=/tmp/site:. python3 -m experiments.gpu_host_bound --out $OUT/host-bound
    python -m experiments.gpu_host_bound --dry-run --out /tmp/host-bound      # this CPU, tiny sizes
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import gpu
from benchmarks.encoder_speed import NUM_LABELS
from benchmarks.harness import describe, publish

MODULE = "experiments.gpu_host_bound"
BASE_SHAPE: dict[str, Any] = {
    **gpu.MINILM_SHAPE,
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "intermediate_size": 3072,
}
SHAPES = {"minilm": gpu.MINILM_SHAPE, "base": BASE_SHAPE}
GRID = ((8, 256), (32, 512), (128, 512))
PROFILE_BATCH, PROFILE_LENGTH, PROFILE_RHO = 8, 256, 0.5
PROFILE_CALLS = 10
TOP_OPERATORS = 15
# Host-side calls that make the CPU wait for the device (a value read back, e.g. a top-k size).
WAITS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpyAsync", "cudaEventSynchronize")
SIZES = gpu.Sizes(seq_len=256, batches=(8,), repeats=5, iterations=3, fit_steps=0, cpu_fit_steps=0)
DRY_SIZES = replace(SIZES, repeats=2, iterations=1)
DRY_GRID = ((2, 16),)


def build(shape: dict[str, Any], plan: gpu.Plan) -> tuple[Any, Any]:
    """(our retention encoder with fresh scorers, Hugging Face's dense SDPA model), random weights."""
    import torch
    from transformers import AutoModel, BertConfig

    from training.encoders import backbone_from_config
    from training.model import RetentionConfig, RetentionModel

    if plan.dry_run:
        model = gpu.build_model(plan)[0]
    else:
        torch.manual_seed(0)
        backbone = backbone_from_config(BertConfig(**shape))
        config = RetentionConfig(schedule_power=gpu.SCHEDULE_POWER)
        model = RetentionModel(backbone, "classification", NUM_LABELS, config)
    model = model.to(plan.device).eval()
    dense = AutoModel.from_config(model.backbone.config, attn_implementation="sdpa").to(plan.device).eval()
    return model, dense


def key_time_ms(event: Any, attribute: str) -> float:
    """An event average's total in ms (torch names the device field ``device`` or ``cuda``)."""
    for name in (attribute, attribute.replace("device", "cuda")):
        if hasattr(event, name):
            return float(getattr(event, name)) / 1000.0
    return 0.0


def profile_one(name: str, call: Any, plan: gpu.Plan) -> dict[str, Any]:
    """One variant's per-forward facts over PROFILE_CALLS profiled calls."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(gpu.WARMUP_CALLS):
        call()
    if plan.cuda:
        torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(PROFILE_CALLS):
        call()
    host = time.perf_counter() - started  # the calls returned: host work and any waits inside them
    if plan.cuda:
        torch.cuda.synchronize()
    wall = time.perf_counter() - started
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if plan.cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(PROFILE_CALLS):
            call()
        if plan.cuda:
            torch.cuda.synchronize()
    averages = prof.key_averages()
    kernels = [
        e for e in averages if getattr(e, "device_type", None) is not None and "CUDA" in str(e.device_type)
    ]
    waits = {e.key: e.count / PROFILE_CALLS for e in averages if e.key in WAITS}
    operators = sorted(
        (e for e in averages if e.key.startswith("aten::")), key=lambda e: e.self_cpu_time_total, reverse=True
    )
    return {
        "variant": name,
        "wall_ms_per_forward": 1000 * wall / PROFILE_CALLS,
        "host_ms_per_forward": 1000 * host / PROFILE_CALLS,
        "kernels_per_forward": sum(e.count for e in kernels) / PROFILE_CALLS,
        "kernel_ms_per_forward": sum(key_time_ms(e, "self_device_time_total") for e in kernels)
        / PROFILE_CALLS,
        "waits_per_forward": waits,
        "aten_calls_per_forward": sum(e.count for e in averages if e.key.startswith("aten::"))
        / PROFILE_CALLS,
        "top_cpu_operators": [
            {
                "operator": e.key,
                "calls_per_forward": e.count / PROFILE_CALLS,
                "self_cpu_ms_per_forward": e.self_cpu_time_total / 1000.0 / PROFILE_CALLS,
            }
            for e in operators[:TOP_OPERATORS]
        ],
    }


def measure_profile(plan: gpu.Plan) -> list[dict[str, Any]]:
    import torch

    batch, length = (2, 16) if plan.dry_run else (PROFILE_BATCH, PROFILE_LENGTH)
    model, dense = build(gpu.MINILM_SHAPE, plan)
    tokens = gpu.random_tokens(batch, length, model.backbone.info_vocab_size, np.random.default_rng(0))
    ids = torch.from_numpy(tokens).to(plan.device)
    mask = torch.ones_like(ids)
    rhos = torch.full((batch,), PROFILE_RHO, device=ids.device)

    def pruned() -> object:  # unsynchronised: host time is what the Python side spends before returning
        with torch.inference_mode():
            return model.forward_pruned(ids, mask, rhos).logits

    def dense_call() -> object:
        with torch.inference_mode():
            return dense(input_ids=ids, attention_mask=mask).last_hidden_state

    raw = {f"retention@{PROFILE_RHO:g}": pruned, gpu.DENSE_TORCH: dense_call}
    return [profile_one(name, run, plan) for name, run in raw.items()]


def measure_grid(plan: gpu.Plan) -> tuple[list[dict[str, Any]], list[str]]:
    import torch

    cells: list[dict[str, Any]] = []
    failures: list[str] = []
    grid = DRY_GRID if plan.dry_run else GRID
    half_name, half_dtype = gpu.half_precision(plan)
    for shape_name, shape in SHAPES.items():
        model, dense = build(shape, plan)
        rng = np.random.default_rng(0)
        for batch, length in grid:
            for precision, dtype in (("fp32", None), (half_name, half_dtype)):
                label = f"{shape_name} {precision} {batch} x {length}"
                if plan.seconds_left() < 20:
                    failures.append(f"{label}: skipped, time budget spent")
                    continue
                started = time.perf_counter()
                try:
                    at = plan.at_length(length)
                    tokens = gpu.random_tokens(batch, length, model.backbone.info_vocab_size, rng)
                    ids = torch.from_numpy(tokens).to(plan.device)
                    variants = gpu.torch_variants(model, dense, ids, at, dtype)
                    memory = {v.name: gpu.torch_memory(at, v.run) for v in variants}
                    for cell in gpu.cells_of(
                        "torch", variants, precision, batch, at, gpu.DENSE_TORCH, memory
                    ):
                        cells.append({"shape": shape_name, **asdict(cell)})
                except Exception as exc:
                    traceback.print_exc()
                    failures.append(f"{label}: {type(exc).__name__}")
                print(f"{label}: {time.perf_counter() - started:.1f} s", flush=True)
                if plan.cuda:
                    torch.cuda.empty_cache()
        del model, dense
    return cells, failures


def measure(plan: gpu.Plan) -> dict[str, Any]:
    payload: dict[str, Any] = {"machine": describe(), "device": plan.label, "gpu": gpu.gpu_name()}
    payload["versions"] = gpu.versions()
    payload["profile"] = measure_profile(plan)
    payload["cells"], payload["grid_failures"] = measure_grid(plan)
    return payload


def markdown(payload: dict[str, Any]) -> str:
    lines = [f"Device: {payload['device']}.", "", "Per forward (8 x 256, fp32, MiniLM shape):", ""]
    lines += [
        "| variant | wall ms | host ms | CUDA kernels | kernel ms | aten calls | device-to-host waits |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in payload["profile"]:
        waits = ", ".join(f"{k} {v:g}" for k, v in row["waits_per_forward"].items()) or "none"
        lines.append(
            f"| {row['variant']} | {row['wall_ms_per_forward']:.2f} | {row['host_ms_per_forward']:.2f} | "
            f"{row['kernels_per_forward']:.0f} | {row['kernel_ms_per_forward']:.2f} | "
            f"{row['aten_calls_per_forward']:.0f} | {waits} |"
        )
    lines += [
        "",
        "| shape | precision | batch × seq | variant | seq/s | vs dense | peak MiB |",
        "|---|---|---|---|---|---|---|",
    ]
    for cell in payload["cells"]:
        peak = cell["peak_memory_bytes"]
        lines.append(
            f"| {cell['shape']} | {cell['precision']} | {cell['batch']} × {cell['seq_len']} | "
            f"{cell['variant']} | "
            f"{cell['sequences_per_second']:.1f} | {cell['speedup_vs_dense']:.2f}× | "
            f"{'–' if peak is None else round(peak / 2**20)} |"
        )
    if payload["grid_failures"]:
        lines += ["", "Not measured: " + "; ".join(payload["grid_failures"])]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    import torch

    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--budget-s", type=float, default=300.0)
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available() and not args.dry_run
    plan = gpu.Plan(
        dry_run=args.dry_run,
        device="cuda" if cuda else "cpu",
        label=(torch.cuda.get_device_name(0) if cuda else gpu.DRY_RUN_DEVICE),
        sizes=DRY_SIZES if args.dry_run else SIZES,
        rhos=gpu.RHOS,
        cpu_seconds_per_step=None,
        assets=None,
        deadline=time.perf_counter() + args.budget_s,
    )
    publish(measure(plan), markdown, args.out / "host_bound.json", MODULE, argv)


if __name__ == "__main__":
    main()
