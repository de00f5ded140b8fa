"""The GPU-shaped forward against dense SDPA on one GPU: the ``forward`` part of ``benchmarks.gpu``.

What serving on a GPU runs (``service.backends.torch_backend``: ``retention_torch``'s runner, host
feeds in, host vectors out) against what users run today (Hugging Face's encoder with SDPA, mean pooled),
same random weights, same fixed-length batches, same precision:

- ``dense-sdpa``: the HF model called eagerly (attention mask given), the common service;
- ``dense-sdpa-graph``: the same model captured once per shape as a CUDA graph (no mask: full rows), the
  fastest dense forward a user could run;
- ``retention@ρ`` (eager) and ``retention@ρ-graph`` (one CUDA graph per plan), ρ 1 / 0.7 / 0.5 / 0.3,
  with the product's embedding selection (merging, every other layer, a quarter leading share, the
  32-token floor: ``models/recipes/minilm-embed.yaml``).

Grid: MiniLM (384 × 6) and base (768 × 12) shapes, fp32 (TF32 off) and bf16, batch 1 / 8 / 32 / 128 ×
256 / 512 tokens; the serving precision's cells first (bf16, the base shape first), so that a time
budget that runs out loses the fp32 ones. Per cell: sequences/s (median of rounds), the ratio to the
faster dense variant, the token-work limit 1 / work and the share of it reached, the variant's own peak
device memory (its weights plus what one call allocates above what was in use before it: each shape and
precision is built alone on the device), and which SDPA kernel its attention ran (``sdpa_backend``:
flash, memory-efficient, cudnn or math, read from the aten op SDPA dispatched to; a graph replays what
its eager twin ran). Per shape and precision at 8 × 256, each variant's CUDA kernels, attention kernel
names and host milliseconds per forward (torch.profiler, started once before any graph is captured:
kineto records graph replays only when it was set up first), each profile in its own ``try``, as the
host-bound study measured them. ``--dry-run``: the same code on the CPU with a tiny shape (no graphs).
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

RHOS = (1.0, 0.7, 0.5, 0.3)
SHAPES: dict[str, dict[str, int]] = {
    "minilm": {
        "hidden_size": 384,
        "num_hidden_layers": 6,
        "num_attention_heads": 12,
        "intermediate_size": 1536,
    },
    "base": {
        "hidden_size": 768,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "intermediate_size": 3072,
    },
}
DRY_SHAPES = {
    "tiny": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}
}
VOCAB = 30522
MAX_POSITIONS = 512
BATCHES = (1, 8, 32, 128)
LENGTHS = (256, 512)
DRY_BATCHES = (2, 1)
DRY_LENGTHS = (32,)
PRECISIONS = ("bf16", "fp32")  # the serving precision (bf16 on a GPU) first
SERVING_PRECISION = "bf16"
SERVING_SHAPE = "base"
PROFILE_SHAPE = (8, 256)  # batch × length where kernels and host time are profiled (host-bound regime)
PROFILE_CALLS = 5
WARMUP_CALLS = 3
ROUNDS = 3
MIN_ROUND_SECONDS = 0.1  # a round repeats the call until it has run this long (32 cells in ~200 s)
MAX_ROUND_CALLS = 200
DENSE = "dense-sdpa"
DENSE_GRAPH = "dense-sdpa-graph"
GRAPH_SUFFIX = "-graph"
# The aten op scaled_dot_product_attention dispatched to, by kernel (CPU and CUDA names).
SDPA_BACKENDS = {
    "_scaled_dot_product_flash_attention": "flash",
    "_scaled_dot_product_flash_attention_for_cpu": "flash",
    "_scaled_dot_product_efficient_attention": "memory-efficient",
    "_scaled_dot_product_cudnn_attention": "cudnn",
    "_scaled_dot_product_attention_math": "math",
    "_scaled_dot_product_attention_math_for_mps": "math",
}
SDPA_OP = "scaled_dot_product_attention"
SDPA_CHOICES = {  # torch.nn.attention.SDPBackend's names
    "FLASH_ATTENTION": "flash",
    "EFFICIENT_ATTENTION": "memory-efficient",
    "CUDNN_ATTENTION": "cudnn",
    "MATH": "math",
    "OVERRIDEABLE": "overrideable",
}
ATTENTION_KERNEL_MARKS = ("flash", "fmha", "efficient_attention", "cudnn", "attention")


@dataclass(frozen=True)
class ForwardPlan:
    device: str  # "cuda" | "cpu"
    dry_run: bool
    shapes: dict[str, dict[str, int]]
    batches: tuple[int, ...]
    lengths: tuple[int, ...]
    seconds_left: Callable[[], float]

    @property
    def cuda(self) -> bool:
        return self.device == "cuda"


def selection() -> Any:
    """The product's embedding selection, read from its recipe (models/recipes/minilm-embed.yaml), so the
    check follows the recipe: merging, leading share, floor, pruning interval, schedule power."""
    from benchmarks.embedding_graphs import PRODUCT_RECIPE
    from training.fitting.fit import retention_config
    from training.recipes.recipe import load_recipe

    return retention_config(load_recipe(PRODUCT_RECIPE))


def selection_label(config: Any) -> str:
    return (
        f"merge_dropped {config.merge_dropped}, pruning_interval {config.pruning_interval}, leading_share "
        f"{config.leading_share:g}, min_kept_tokens {config.min_kept_tokens}, power {config.schedule_power:g}"
    )


@dataclass
class Built:
    """One shape in one precision on the device, nothing else: its memory is the variants' own."""

    dense: Any  # HF model (sdpa)
    weights: Any  # retention_torch ModelWeights
    schedule: Any
    head: Any


def build(shape: dict[str, int], plan: ForwardPlan, precision: str) -> Built:
    """Random weights of ``shape`` in ``precision``: one HF model (SDPA) for the dense peer, its tensors
    for ours (the same seed for every precision: the same weights)."""
    import torch
    from transformers import AutoModel, BertConfig

    from retention_torch.weights import from_state
    from training.engine.encoders import EncoderBackbone
    from training.engine.model import RetentionModel, manifest_schedule
    from training.export.torch_weights import torch_architecture, torch_head, torch_state

    torch.manual_seed(0)
    sizes: dict[str, Any] = {"vocab_size": VOCAB, "max_position_embeddings": MAX_POSITIONS, **shape}
    config = BertConfig(**sizes)
    hf = AutoModel.from_config(config, attn_implementation="sdpa").eval()
    model = RetentionModel(EncoderBackbone(hf), "embedding", shape["hidden_size"], selection()).eval()
    state, architecture = torch_state(model), torch_architecture(model)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[precision]
    return Built(
        dense=copy.deepcopy(hf).to(plan.device, dtype),
        weights=from_state(state, architecture, "pooled", plan.device, dtype),
        schedule=manifest_schedule(model),
        head=torch_head(model),
    )


def groups(shapes: dict[str, dict[str, int]]) -> list[tuple[str, str]]:
    """(shape, precision) in the order they are measured: the serving precision first, the serving
    shape first within it."""
    pairs = [(shape, precision) for precision in PRECISIONS for shape in shapes]
    return sorted(pairs, key=lambda pair: (pair[1] != SERVING_PRECISION, pair[0] != SERVING_SHAPE))


def token_work(schedule: Any, rho: float, length: int) -> float:
    """Share of dense encoder token-work a full row of ``length`` does at ``rho`` (the speed limit's
    inverse): ``retention_core.schedule.token_work_curve``, the last layer's queries included."""
    from retention_core.schedule import token_work_curve

    return token_work_curve(schedule, length, [rho])[0]


def dense_call(model: Any, ids: np.ndarray, device: str) -> Callable[[], np.ndarray]:
    """The usual service: ids to the device, the HF encoder with its mask, mean pooling, vectors back."""
    import torch

    def call() -> np.ndarray:
        with torch.inference_mode():
            tokens = torch.from_numpy(ids).to(device)
            mask = torch.ones_like(tokens)
            states = model(input_ids=tokens, attention_mask=mask).last_hidden_state
            weights = mask.unsqueeze(-1).to(states.dtype)
            return ((states * weights).sum(1) / weights.sum(1)).float().cpu().numpy()

    return call


def dense_graph_call(model: Any, ids: np.ndarray, device: str) -> Callable[[], np.ndarray]:
    """The same dense forward captured once as a CUDA graph (full rows, so no mask), ids copied into its
    static buffer, vectors copied back."""
    import torch

    static = torch.from_numpy(ids).to(device)
    with torch.inference_mode():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUP_CALLS):
                model(input_ids=static).last_hidden_state.mean(1)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            pooled = model(input_ids=static).last_hidden_state.mean(1)

    def call() -> np.ndarray:
        static.copy_(torch.from_numpy(ids), non_blocking=True)
        graph.replay()
        return pooled.float().cpu().numpy()

    return call


def ours_call(runner: Any, ids: np.ndarray, rho: float) -> Callable[[], np.ndarray]:
    """What the torch backend runs for a request batch: graph feeds in, vectors out."""
    feeds = {
        "input_ids": ids,
        "attention_mask": np.ones_like(ids),
        "rho": np.full(ids.shape[0], rho, dtype=np.float32),
    }
    return lambda: runner.run(feeds).main


def seconds_per_call(call: Callable[[], object]) -> float:
    """Median over rounds of the mean time per call; every call ends with its result on the host."""
    for _ in range(WARMUP_CALLS):
        call()
    rounds = []
    for _ in range(ROUNDS):
        calls, started = 0, time.perf_counter()
        while calls < MAX_ROUND_CALLS and (calls == 0 or time.perf_counter() - started < MIN_ROUND_SECONDS):
            call()
            calls += 1
        rounds.append((time.perf_counter() - started) / calls)
    return statistics.median(rounds)


def peak_memory(call: Callable[[], object], plan: ForwardPlan, weights_bytes: int) -> dict[str, int | None]:
    """The variant's own device memory: its weights, plus the most one call allocates above what was in
    use before it (what a graph holds in its pool was allocated at capture, so it is in use already:
    ``device_in_use_bytes``)."""
    if not plan.cuda:
        return {"peak_memory_bytes": None, "call_peak_bytes": None, "device_in_use_bytes": None}
    import torch

    torch.cuda.synchronize()
    before = int(torch.cuda.memory_allocated())
    torch.cuda.reset_peak_memory_stats()
    call()
    torch.cuda.synchronize()
    above = int(torch.cuda.max_memory_allocated()) - before
    return {
        "peak_memory_bytes": weights_bytes + above,
        "call_peak_bytes": above,
        "device_in_use_bytes": before,
    }


def init_profiler(plan: ForwardPlan) -> str:
    """Start torch.profiler once before any CUDA graph is captured: kineto (CUPTI) set up after a capture
    is known to crash or miss the graph's kernels on some CUDA versions."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if plan.cuda else [])
    with torch_profile(activities=activities):
        torch.ones(8, device=plan.device).sum()
        if plan.cuda:
            torch.cuda.synchronize()
    return "before any capture"


def sdpa_backend(call: Callable[[], object]) -> str:
    """The SDPA kernel(s) one eager call ran ("none": it called no SDPA; a graph replay calls no aten op
    at all). Each ``scaled_dot_product_attention`` is asked which kernel torch picks for its very
    arguments (``torch._fused_sdp_choice``, what it dispatches by); an op already resolved to a kernel
    is named by that op."""
    import torch
    from torch.nn.attention import SDPBackend
    from torch.utils._python_dispatch import TorchDispatchMode

    found: set[str] = set()

    class Seen(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            name = func.__name__.split(".")[0]
            if name == SDPA_OP:
                found.add(
                    SDPA_CHOICES.get(SDPBackend(torch._fused_sdp_choice(*args, **kwargs)).name, "other")
                )
            elif name in SDPA_BACKENDS:
                found.add(SDPA_BACKENDS[name])
            return func(*args, **kwargs)

    with Seen():
        call()
    return "+".join(sorted(found)) or "none"


def kernel_events(events: Any) -> list[Any]:
    return [e for e in events if "CUDA" in str(getattr(e, "device_type", ""))]


def is_attention_kernel(name: str) -> bool:
    return any(mark in name.lower() for mark in ATTENTION_KERNEL_MARKS)


def attention_kernels(events: Any) -> list[str]:
    """Names of the CUDA kernels of attention among profiled events (flash, fmha/cutlass, cuDNN)."""
    return sorted({e.key for e in kernel_events(events) if is_attention_kernel(e.key)})[:4]


def attention_device_share(events: Any) -> float | None:
    """The attention kernels' share of the device time of the profiled calls: the most a faster
    attention kernel (flash instead of memory-efficient) could save of the forward (None: no device)."""

    def device_time(event: Any) -> float:
        return float(getattr(event, "self_device_time_total", getattr(event, "self_cuda_time_total", 0.0)))

    kernels = kernel_events(events)
    total = sum(device_time(e) for e in kernels)
    return sum(device_time(e) for e in kernels if is_attention_kernel(e.key)) / total if total else None


def profile(call: Callable[[], object], plan: ForwardPlan) -> dict[str, float]:
    """Device kernels and host milliseconds per forward (the call returns its result on the host, so
    host time includes the final wait)."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if plan.cuda else [])
    for _ in range(WARMUP_CALLS):
        call()
    with torch_profile(activities=activities) as prof:
        started = time.perf_counter()
        for _ in range(PROFILE_CALLS):
            call()
        seconds = time.perf_counter() - started
    events = prof.key_averages()
    kernels = sum(e.count for e in events if "CUDA" in str(getattr(e, "device_type", "")))
    attention, attention_share = attention_kernels(events), attention_device_share(events)
    aten = sum(e.count for e in events if e.key.startswith("aten::"))
    waits = sum(e.count for e in events if e.key in ("cudaStreamSynchronize", "cudaDeviceSynchronize"))
    if plan.cuda:
        torch.cuda.synchronize()
    return {
        "kernels_per_forward": kernels / PROFILE_CALLS,
        "aten_calls_per_forward": aten / PROFILE_CALLS,
        "host_waits_per_forward": waits / PROFILE_CALLS,
        "profiled_ms_per_forward": 1000 * seconds / PROFILE_CALLS,
        "attention_kernels": attention,
        "attention_device_share": attention_share,
    }


def variants(
    built: Built, precision: str, ids: np.ndarray, plan: ForwardPlan, failures: list[str]
) -> dict[str, Callable[[], Any]]:
    from retention_torch.runner import Runner

    calls: dict[str, Callable[[], Any]] = {DENSE: dense_call(built.dense, ids, plan.device)}
    if plan.cuda:
        try:  # HF's forward may not capture (a host read inside it): the eager dense peer still counts
            calls[DENSE_GRAPH] = dense_graph_call(built.dense, ids, plan.device)
        except Exception as exc:
            failures.append(f"{DENSE_GRAPH} {precision} {ids.shape}: {type(exc).__name__}: {exc}")
    modes = (("", False), (GRAPH_SUFFIX, True)) if plan.cuda else (("", False),)
    for suffix, graphs in modes:
        runner = Runner(built.weights, built.schedule, built.head, MAX_POSITIONS, graphs=graphs)
        for rho in RHOS:
            calls[f"retention@{rho:g}{suffix}"] = ours_call(runner, ids, rho)
    return calls


def weights_bytes(built: Built, variant: str) -> int:
    """Bytes of the weights a variant runs: the HF model's parameters, or ours."""
    if variant.startswith(DENSE):
        return sum(t.numel() * t.element_size() for t in built.dense.parameters())
    return int(built.weights.nbytes)


def eager_twin(variant: str) -> str:
    return variant.removesuffix(GRAPH_SUFFIX)


def attention_backends(
    calls: dict[str, Callable[[], Any]], failures: list[str], where: str
) -> dict[str, str]:
    """Each variant's SDPA kernel: probed on the eager ones, a graph's is its eager twin's."""
    found: dict[str, str] = {}
    for name, call in calls.items():
        if name.endswith(GRAPH_SUFFIX):
            continue
        try:
            found[name] = sdpa_backend(call)
        except Exception as exc:
            failures.append(f"sdpa backend of {name} {where}: {type(exc).__name__}: {exc}")
    return {name: found.get(eager_twin(name), "unknown") for name in calls}


def profiled(
    call: Callable[[], object], plan: ForwardPlan, failures: list[str], where: str
) -> dict[str, Any]:
    """``profile`` in its own try: a profiler failure loses this variant's profile, not the cell."""
    try:
        return profile(call, plan)
    except Exception as exc:
        failures.append(f"profile of {where}: {type(exc).__name__}: {exc}")
        return {"profile_error": f"{type(exc).__name__}: {exc}"}


def measure_cell(
    built: Built, precision: str, batch: int, length: int, plan: ForwardPlan, failures: list[str]
) -> list[dict[str, Any]]:
    import torch

    ids = np.random.default_rng(batch * 1000 + length).integers(
        5, VOCAB, size=(batch, length), dtype=np.int64
    )
    calls = variants(built, precision, ids, plan, failures)
    seconds: dict[str, float] = {}
    for name, call in list(calls.items()):
        try:  # a variant that fails (capture, memory) is reported; the others still count
            seconds[name] = seconds_per_call(call)
        except Exception as exc:
            failures.append(f"{name} {precision} {batch} × {length}: {type(exc).__name__}: {exc}")
            del calls[name]
    fastest_dense = min(seconds[name] for name in (DENSE, DENSE_GRAPH) if name in seconds)
    is_profiled = (batch, length) == PROFILE_SHAPE or (plan.dry_run and batch == plan.batches[0])
    backends = attention_backends(calls, failures, f"{precision} {batch} × {length}")
    cells = []
    for name, call in calls.items():
        rho = float(eager_twin(name).split("@")[1]) if "@" in name else 1.0
        limit = 1.0 / token_work(built.schedule, rho, length) if "@" in name else 1.0
        speedup = fastest_dense / seconds[name]
        cell: dict[str, Any] = {
            "variant": name,
            "precision": precision,
            "batch": batch,
            "seq_len": length,
            "rho": rho if "@" in name else None,
            "cuda_graph": name.endswith(GRAPH_SUFFIX),
            "ms_per_batch": 1000 * seconds[name],
            "sequences_per_second": batch / seconds[name],
            "speedup_vs_fastest_dense": speedup,
            "speedup_vs_dense_graph": seconds[DENSE_GRAPH] / seconds[name]
            if DENSE_GRAPH in seconds
            else None,
            "token_work_limit": limit,
            "share_of_limit": speedup / limit,
            "sdpa_backend": backends[name],
            **peak_memory(call, plan, weights_bytes(built, name)),
        }
        if is_profiled:
            cell.update(profiled(call, plan, failures, f"{name} {precision} {batch} × {length}"))
        cells.append(cell)
    del calls
    if plan.cuda:
        torch.cuda.empty_cache()
    return cells


def measure_forward(plan: ForwardPlan) -> dict[str, Any]:
    """Every shape × precision × length × batch the time budget allows, the serving precision first
    (``groups``), each shape and precision alone on the device."""
    import torch

    if plan.cuda:
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32
        torch.backends.cudnn.allow_tf32 = False
    cells: list[dict[str, Any]] = []
    skipped: list[str] = []
    failures: list[str] = []
    try:
        profiler = init_profiler(plan)
    except Exception as exc:  # the cells still count; their profiles may then fail on their own
        profiler = f"failed: {type(exc).__name__}: {exc}"
        failures.append(f"profiler: {profiler}")
    for shape_name, precision in groups(plan.shapes):
        names = [f"{shape_name} {precision} {b} × {n}" for n in plan.lengths for b in plan.batches]
        if plan.seconds_left() <= 0:
            skipped += names
            continue
        built = build(plan.shapes[shape_name], plan, precision)
        for length in plan.lengths:
            for batch in plan.batches:
                name = f"{shape_name} {precision} {batch} × {length}"
                if plan.seconds_left() <= 0:
                    skipped.append(name)
                    continue
                try:
                    for cell in measure_cell(built, precision, batch, length, plan, failures):
                        cells.append({"shape": shape_name, **cell})
                except Exception as exc:  # one cell's failure (memory) must not lose the others
                    failures.append(f"{name}: {type(exc).__name__}: {exc}")
                print(f"forward: {name} done ({plan.seconds_left():.0f} s left)", flush=True)
        del built
        if plan.cuda:
            torch.cuda.empty_cache()
    status = "measured" if cells else "failed: no cell measured"
    return {
        "status": status,
        "selection": selection_label(selection()),
        "shapes": plan.shapes,
        "order": [f"{shape} {precision}" for shape, precision in groups(plan.shapes)],
        "profiler": profiler,
        "cells": cells,
        "skipped_for_time": skipped,
        "failed_cells": failures,
    }


def markdown_rows(cells: list[dict[str, Any]]) -> list[str]:
    """One row per shape × precision × batch × length: dense seq/s and each ρ's ratio, graph | eager."""
    groups: dict[tuple[Any, ...], dict[str, dict[str, Any]]] = {}
    for cell in cells:
        key = (cell["shape"], cell["precision"], cell["batch"], cell["seq_len"])
        groups.setdefault(key, {})[cell["variant"]] = cell
    rows = [
        "| shape | precision | batch × len | dense eager seq/s | dense graph seq/s | "
        + " | ".join(f"ρ {rho:g} graph / eager (limit)" for rho in RHOS)
        + " |",
        "|---|---|---|---|---|" + "---|" * len(RHOS),
    ]
    for (shape, precision, batch, length), found in groups.items():
        graph = found.get(DENSE_GRAPH)
        parts = []
        for rho in RHOS:
            eager, graphed = found.get(f"retention@{rho:g}"), found.get(f"retention@{rho:g}-graph")
            shown = [f"{c['speedup_vs_fastest_dense']:.2f}×" if c else "—" for c in (graphed, eager)]
            limit = (eager or graphed or {}).get("token_work_limit", 1.0)
            parts.append(f"{shown[0]} / {shown[1]} ({limit:.2f}×)")
        rows.append(
            f"| {shape} | {precision} | {batch} × {length} | {found[DENSE]['sequences_per_second']:.1f} | "
            + (f"{graph['sequences_per_second']:.1f}" if graph else "—")
            + " | "
            + " | ".join(parts)
            + " |"
        )
    profiled = [c for c in cells if "kernels_per_forward" in c]
    if profiled:
        rows += [
            "",
            "| shape | precision | variant | batch × len | SDPA kernel | kernels / forward | host waits "
            "| ms / forward (profiled) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        rows += [
            f"| {c['shape']} | {c['precision']} | {c['variant']} | {c['batch']} × {c['seq_len']} | "
            f"{c.get('sdpa_backend', '?')} | {c['kernels_per_forward']:.0f} | "
            f"{c['host_waits_per_forward']:.0f} | {c['profiled_ms_per_forward']:.2f} |"
            for c in profiled
        ]
    return rows
