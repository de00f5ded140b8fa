"""The GPU path on one NVIDIA GPU in one command (docs/benchmarks.md, "GPU"; ``scripts/gpu_check.sh``):
``forward`` (the serving forward written for the GPU, ``retention_torch``, vs HF dense SDPA eager and as
a CUDA graph: ``benchmarks.gpu_forward``), ``torch`` (the exported graph's torch forward vs HF dense
SDPA, fp32 and bf16/fp16 autocast, sequences/s and ``torch.cuda.max_memory_allocated``),
``onnxruntime`` (the exported graphs on the CUDA provider with I/O binding, parity with the CPU
provider) and ``fit`` (seconds per step of the embedding recipe's quick profile, CUDA vs CPU). Each part
is recorded even when another fails; ``--budget-s`` stops adding cells. ``--dry-run``: the same code
paths on the CPU, tiny, labelled ``cpu dry run``.

    python -m benchmarks.gpu --out results/bench            # on the GPU machine
    python -m benchmarks.gpu --dry-run --out /tmp/gpu       # this CPU, seconds
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from functools import partial
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import gpu_forward
from benchmarks.embedding_graphs import DEFAULT_RECIPE, documents
from benchmarks.encoder_speed import classifier, export_graphs
from benchmarks.harness import cli, describe, publish, random_tokens, speedups, timed_rounds

MODULE = "benchmarks.gpu"
RESULT_FILE = "gpu.json"
DRY_RUN_DEVICE = "cpu dry run"
ORT_SKIPPED = "skipped: onnxruntime-gpu not installed"
ORT_FELL_BACK = "skipped: CUDAExecutionProvider did not load (the session fell back to the CPU)"
MEASURED = "measured"
DENSE_TORCH = "hf-sdpa-dense"
DENSE_ONNX = "dense-onnx"
RHOS = (1.0, 0.5, 0.3)
SCHEDULE_POWER = 0.5  # the schedule the CPU speed and memory benchmarks measure
# The MiniLM shape (all-MiniLM-L6-v2): what the device measures when the package is not installed.
MINILM_SHAPE: dict[str, Any] = {
    "vocab_size": 30522,
    "hidden_size": 384,
    "num_hidden_layers": 6,
    "num_attention_heads": 12,
    "intermediate_size": 1536,
    "max_position_embeddings": 512,
}
# Main output of an exported graph (logits / embedding): fp32 on the GPU against the CPU provider. The
# CUDA provider may use TF32 matrix products, ~1e-3 relative, so this is looser than export's parity.
PARITY_ATOL = 1e-3
MAX_SECONDS_PER_CELL = 30.0  # later repeat rounds are dropped past this (at least one always runs)
WARMUP_CALLS = 3  # before timing: kernels picked, allocator and ORT arena grown for the shape
FIT_WARMUP_STEPS = 2  # step times dropped: CUDA kernels, allocator growth, first batches
TOKENIZER_DIR = "tokenizer"
DATA_DIR = "data"
FIT_PROFILE = "quick"
PARTS = ("forward", "torch", "onnxruntime", "fit")
NOT_SELECTED = "skipped: not selected (--parts)"
OUT_OF_TIME = "skipped: time budget (--budget-s) spent"
FIT_RESERVE_S = 90.0  # of --budget-s, kept for the fit part when it runs (its model build, both fits)


@dataclass(frozen=True)
class Sizes:
    seq_len: int
    batches: tuple[int, ...]
    repeats: int  # timed rounds per cell
    iterations: int  # calls per variant in a round
    fit_steps: int
    cpu_fit_steps: int  # fewer: a CPU step of the real recipe takes seconds


# The device run: sized to end well inside 8 minutes on one GPU (a lent device's budget is 15 minutes).
FULL = Sizes(seq_len=512, batches=(32, 8), repeats=7, iterations=3, fit_steps=30, cpu_fit_steps=5)
DRY = Sizes(seq_len=16, batches=(2,), repeats=2, iterations=1, fit_steps=3, cpu_fit_steps=3)
DRY_FIT_BATCH = 2  # rows per step of the dry run's fit (the recipe's quick profile has 8)
DRY_FIT_ROWS = 6


@dataclass(frozen=True)
class Plan:
    """What one run measures; ``device`` is the torch device, ``label`` what its numbers are called."""

    dry_run: bool
    device: str
    label: str
    sizes: Sizes
    rhos: tuple[float, ...]
    cpu_seconds_per_step: float | None
    assets: Path | None
    parts: tuple[str, ...] = PARTS
    seq_lens: tuple[int, ...] = ()  # the torch grid's lengths; () = (sizes.seq_len,)
    deadline: float | None = None  # time.perf_counter() past which no torch group or fit starts
    fit_reserve_s: float = FIT_RESERVE_S

    @property
    def lengths(self) -> tuple[int, ...]:
        return self.seq_lens or (self.sizes.seq_len,)

    def at_length(self, seq_len: int) -> Plan:
        return replace(self, sizes=replace(self.sizes, seq_len=seq_len))

    def seconds_left(self) -> float:
        return float("inf") if self.deadline is None else self.deadline - time.perf_counter()

    @property
    def cuda(self) -> bool:
        return self.device == "cuda"

    @property
    def seq_len(self) -> int:
        return self.sizes.seq_len


@dataclass
class Cell:
    """One timed variant at one batch and precision. Memory: see the module docstring; None on CPU."""

    part: str
    variant: str
    precision: str
    rho: float | None
    batch: int
    seq_len: int
    device: str
    seconds_per_batch: float  # median over repeat rounds
    sequences_per_second: float
    speedup_vs_dense: float  # median of paired ratios (same round) against the part's dense variant
    peak_memory_bytes: int | None
    activation_memory_bytes: int | None


@dataclass(frozen=True)
class Variant:
    name: str
    rho: float | None
    run: Callable[[], object]


# ----------------------------------------------------------------------------------------- the model
def minilm_backbone() -> tuple[Any, str]:
    """The packaged all-MiniLM-L6-v2 when installed, else its shape with random weights."""
    from transformers import BertConfig

    from training.encoders import DEFAULT_BACKBONE, backbone_from_config, load_backbone

    try:
        return load_backbone(DEFAULT_BACKBONE), f"{DEFAULT_BACKBONE} weights"
    except ImportError:  # the package is missing (a bare GPU machine): the same shape, random weights
        return backbone_from_config(BertConfig(**MINILM_SHAPE)), "MiniLM shape, random weights"


def build_model(plan: Plan) -> tuple[Any, str]:
    """Our retention encoder with fresh scorers and head, on the CPU (exported from there)."""
    import torch

    if plan.dry_run:
        return classifier(True, None, SCHEDULE_POWER), "tiny random (training.tiny)"
    torch.manual_seed(0)  # the MiniLM shape's random weights, without the package
    backbone, source = minilm_backbone()
    return classifier(False, backbone, SCHEDULE_POWER), source


def model_shape(model: Any, source: str) -> dict[str, Any]:
    sizes = ("hidden_size", "num_layers", "num_heads", "intermediate_size")
    return {"backbone": source, **{size: getattr(model.backbone.info, size) for size in sizes}}


def graph_feeds(ids: np.ndarray, rho: float | None) -> dict[str, np.ndarray]:
    """Inputs of the exported graphs: the dense graph takes no ρ."""
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    if rho is not None:
        feeds["rho"] = np.full(ids.shape[0], rho, np.float32)
    return feeds


def cells_of(
    part: str,
    variants: list[Variant],
    precision: str,
    batch: int,
    plan: Plan,
    dense: str,
    memory: dict[str, tuple[int | None, int | None]],
) -> list[Cell]:
    """Warm every variant up, time them in interleaved rounds: a cell each, its speed-up the median of
    its paired ratios over ``dense``."""
    for variant in variants:
        for _ in range(WARMUP_CALLS):
            variant.run()
    runs = {variant.name: variant.run for variant in variants}
    rounds = timed_rounds(runs, plan.sizes.repeats, plan.sizes.iterations, MAX_SECONDS_PER_CELL)
    cells = []
    for variant in variants:
        timing = speedups(rounds, variant.name, dense, batch)
        what = (part, variant.name, precision, variant.rho, batch, plan.seq_len, plan.label)
        speed = (timing["seconds_per_batch"], timing["sequences_per_second"], timing["speedup_vs_dense"])
        cells.append(Cell(*what, *speed, *memory[variant.name]))
    return cells


# ----------------------------------------------------------------------------------------- 1. torch
def half_precision(plan: Plan) -> tuple[str, Any]:
    """bf16 where the device has it (its fp32 range: no overflow in masks and scores), else fp16."""
    import torch

    if plan.cuda and not torch.cuda.is_bf16_supported():
        return "fp16-autocast", torch.float16
    return "bf16-autocast", torch.bfloat16


def synchronised(plan: Plan, call: Callable[[], object]) -> Callable[[], object]:
    """A call that returns once the device finished it (CUDA kernels run asynchronously)."""
    import torch

    def run() -> object:
        result = call()
        if plan.cuda:
            torch.cuda.synchronize()
        return result

    return run


def torch_memory(plan: Plan, run: Callable[[], object]) -> tuple[int | None, int | None]:
    """(peak allocated, peak less what was allocated before) of one call; None on the CPU."""
    import torch

    if not plan.cuda:
        return None, None
    run()  # warm-up: cuBLAS workspaces and first-shape allocations belong to no one cell
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    run()
    peak = torch.cuda.max_memory_allocated()
    return peak, peak - before


def torch_variants(model: Any, dense: Any, ids: Any, plan: Plan, dtype: Any) -> list[Variant]:
    import torch

    # autocast: weights stay fp32, matrix products in ``dtype``; fp32 (``dtype`` None): nothing
    context = contextlib.nullcontext if dtype is None else partial(torch.autocast, plan.device, dtype=dtype)
    mask = torch.ones_like(ids)

    def pruned(rho: float) -> Callable[[], object]:
        rhos = torch.full((ids.shape[0],), rho, device=ids.device)

        def call() -> object:
            with torch.inference_mode(), context():
                return model.forward_pruned(ids, mask, rhos).logits

        return synchronised(plan, call)

    def dense_call() -> object:
        with torch.inference_mode(), context():
            return dense(input_ids=ids, attention_mask=mask).last_hidden_state

    return [
        *(Variant(f"retention@{rho:g}", rho, pruned(rho)) for rho in plan.rhos),
        Variant(DENSE_TORCH, None, synchronised(plan, dense_call)),
    ]


def measure_torch(model: Any, plan: Plan) -> dict[str, Any]:
    import torch
    from transformers import AutoModel

    model = model.to(plan.device).eval()
    dense = AutoModel.from_config(model.backbone.config, attn_implementation="sdpa").to(plan.device).eval()
    rng = np.random.default_rng(0)
    half_name, half_dtype = half_precision(plan)
    precisions = (("fp32", None), (half_name, half_dtype))
    reserve = plan.fit_reserve_s if "fit" in plan.parts else 0.0
    cells: list[Cell] = []
    failures: dict[str, str] = {}
    skipped: list[str] = []
    longest = 0.0  # the slowest group so far: the estimate of the next one's seconds
    for seq_len in plan.lengths:
        at = plan.at_length(seq_len)
        for batch in plan.sizes.batches:
            for precision, dtype in precisions:
                name = f"{precision} {batch} × {seq_len}"
                if precision in failures:
                    continue
                if plan.seconds_left() - reserve < 1.5 * longest:  # the time guard: stop adding cells
                    skipped.append(name)
                    continue
                started = time.perf_counter()
                try:  # a precision that fails (an op without a kernel) must not lose the other's numbers
                    tokens = random_tokens(batch, seq_len, model.backbone.info_vocab_size, rng)
                    ids = torch.from_numpy(tokens).to(plan.device)
                    variants = torch_variants(model, dense, ids, at, dtype)
                    memory = {variant.name: torch_memory(at, variant.run) for variant in variants}
                    cells += cells_of("torch", variants, precision, batch, at, DENSE_TORCH, memory)
                except Exception as exc:
                    traceback.print_exc()
                    failures[precision] = f"{precision}: {type(exc).__name__}: {exc}"
                longest = max(longest, time.perf_counter() - started)
                print(f"torch {name}: {time.perf_counter() - started:.1f} s", flush=True)
                if plan.cuda:
                    torch.cuda.empty_cache()
    status = MEASURED if not failures else "failed: " + "; ".join(failures.values())
    return {"status": status, "cells": [asdict(cell) for cell in cells], "skipped_for_time": skipped}


# ----------------------------------------------------------------------------------- 2. onnxruntime
def bound_run(session: Any, feeds: dict[str, np.ndarray], device: str) -> Callable[[], object]:
    """A call of ``session`` through I/O binding: inputs copied to ``device`` once, outputs left there."""
    import onnxruntime as ort

    binding = session.io_binding()
    values = {name: ort.OrtValue.ortvalue_from_numpy(array, device, 0) for name, array in feeds.items()}
    for name, value in values.items():
        binding.bind_ortvalue_input(name, value)
    for output in session.get_outputs():
        binding.bind_output(output.name, device)

    def run() -> object:
        session.run_with_iobinding(binding)
        binding.synchronize_outputs()  # the CUDA provider's run may return before its stream is done
        return values  # keeps the bound inputs alive as long as the call

    return run


def device_memory_in_use() -> int:
    """Bytes in use on the GPU, whoever allocated them (ORT's allocations are not torch's)."""
    import torch

    free, total = torch.cuda.mem_get_info()
    return int(total - free)


def device_session(path: Path, plan: Plan) -> Any:
    """A session through our runtime, CUDA provider first (the CPU provider alone in a dry run)."""
    from retention_core.onnx import open_session

    return open_session(path, use_cuda=plan.cuda)


def cuda_missing(session: Any, plan: Plan) -> str | None:
    """Why ``session`` is not on the GPU when it should be: no CUDA provider in this onnxruntime (the
    CPU wheel), or one that failed to load (CUDA or cuDNN libraries not found) and fell back."""
    import onnxruntime as ort

    from retention_core.onnx import CUDA_PROVIDER

    if not plan.cuda:
        return None
    if CUDA_PROVIDER not in ort.get_available_providers():
        return ORT_SKIPPED
    return None if CUDA_PROVIDER in session.get_providers() else ORT_FELL_BACK


def ort_parity(graphs: dict[str, Path], plan: Plan, ids: np.ndarray) -> list[dict[str, Any]]:
    """Device session against the CPU provider, same inputs: every ρ of the pruned graph and the dense."""
    from retention_core.onnx import open_session

    checks = []
    for graph, rhos in (("pruned", plan.rhos), ("dense", (None,))):
        on_device_session, cpu_session = device_session(graphs[graph], plan), open_session(graphs[graph])
        for rho in rhos:
            feeds = graph_feeds(ids, rho)
            on_device, on_cpu = on_device_session.run(None, feeds), cpu_session.run(None, feeds)
            diff = float(np.max(np.abs(on_device[0] - on_cpu[0])))
            # kept counts (pruned graphs' second output) follow from ρ and lengths alone: exactly equal
            counts_equal = len(on_device) < 2 or bool(np.array_equal(on_device[1], on_cpu[1]))
            checks.append(
                {
                    "graph": graph,
                    "rho": rho,
                    "batch": int(ids.shape[0]),
                    "max_abs_diff": diff,
                    "atol": PARITY_ATOL,
                    "kept_counts_equal": counts_equal,
                    "within_tolerance": diff <= PARITY_ATOL and counts_equal,
                }
            )
    return checks


def ort_batch_cells(graphs: dict[str, Path], plan: Plan, batch: int, ids: np.ndarray) -> list[Cell]:
    """One fresh session per variant (its own arena, so its memory is its own), then timed together."""
    variants: list[Variant] = []
    memory: dict[str, tuple[int | None, int | None]] = {}
    for name, graph, rho in [
        (DENSE_ONNX, "dense", None),
        *((f"retention-onnx@{rho:g}", "pruned", rho) for rho in plan.rhos),
    ]:
        before = device_memory_in_use() if plan.cuda else 0
        run = bound_run(device_session(graphs[graph], plan), graph_feeds(ids, rho), plan.device)
        for _ in range(WARMUP_CALLS):
            run()
        memory[name] = (device_memory_in_use() - before, None) if plan.cuda else (None, None)
        variants.append(Variant(name, rho, run))
    return cells_of("onnxruntime", variants, "fp32", batch, plan, DENSE_ONNX, memory)


def measure_onnxruntime(model: Any, plan: Plan, workdir: Path) -> dict[str, Any]:
    pruned, dense = export_graphs(model, workdir)  # ρ an input; the dense baseline of the same weights
    graphs = {"pruned": pruned, "dense": dense}
    probe = device_session(graphs["dense"], plan)
    if (reason := cuda_missing(probe, plan)) is not None:
        return {"status": reason, "parity": [], "cells": []}
    rng = np.random.default_rng(1)
    vocab = model.backbone.info_vocab_size
    parity = ort_parity(graphs, plan, random_tokens(min(plan.sizes.batches), plan.seq_len, vocab, rng))
    cells: list[Cell] = []
    for batch in plan.sizes.batches:
        cells += ort_batch_cells(graphs, plan, batch, random_tokens(batch, plan.seq_len, vocab, rng))
    return {
        "status": MEASURED,
        "providers": probe.get_providers(),
        "io_binding": plan.device,  # onnxruntime names the devices as torch does
        "parity": parity,
        "cells": [asdict(cell) for cell in cells],
    }


# -------------------------------------------------------------------------------------------- 3. fit
def fit_tokenizer(backbone: str, assets: Path | None) -> Any:
    """The backbone's tokenizer from its package, else the copy ``--write-assets`` saved."""
    from transformers import AutoTokenizer

    from training.encoders import load_tokenizer

    try:
        return load_tokenizer(backbone)
    except ImportError:
        if assets is None or not (assets / TOKENIZER_DIR).is_dir():
            raise FileNotFoundError(
                f"no {backbone} package and no {TOKENIZER_DIR}/ in --assets: "
                "write them with python -m benchmarks.gpu --write-assets DIR"
            ) from None
        return AutoTokenizer.from_pretrained(str(assets / TOKENIZER_DIR), use_fast=True)


def fit_recipe(plan: Plan) -> Any:
    """The embedding recipe's quick profile, logging every step (each log line syncs the device, so its
    clock is the step's). A dry run shrinks its batch and length; ``--assets`` supplies its texts."""
    from training.recipes import load_recipe

    recipe = load_recipe(DEFAULT_RECIPE, FIT_PROFILE).model_copy(update={"log_every": 1})
    if plan.dry_run:
        return recipe.model_copy(update={"batch_size": DRY_FIT_BATCH, "max_length": plan.seq_len})
    if plan.assets is not None and (plan.assets / DATA_DIR).is_dir():
        dataset = recipe.dataset.model_copy(update={"root": str(plan.assets / DATA_DIR)})
        return recipe.model_copy(update={"dataset": dataset})
    return recipe


def fit_backbone(plan: Plan, tokenizer: Any) -> Any:
    """A fresh backbone per fit (a fit trains it): the tiny one in a dry run, else MiniLM."""
    from training.encoders import backbone_from_config
    from training.tiny import tiny_config

    if plan.dry_run:
        return backbone_from_config(tiny_config(tokenizer.vocab_size))
    return minilm_backbone()[0]


def step_seconds(log_path: Path) -> list[float]:
    """Each step's seconds from the run's log (cumulative seconds since the loop started)."""
    cumulative = [json.loads(line)["seconds"] for line in log_path.read_text(encoding="utf-8").splitlines()]
    return [later - earlier for earlier, later in pairwise([0.0, *cumulative])]


def seconds_per_step(plan: Plan, device: str, steps: int, inputs: tuple[Any, Any, list[Any]]) -> float:
    """Median seconds per step of ``steps`` steps of the recipe on ``device``, warm-up steps dropped."""
    from training.fit import LOG_FILE, fit

    recipe, tokenizer, rows = inputs
    with tempfile.TemporaryDirectory(prefix="gpu-fit-") as tmp:
        run_dir = Path(tmp) / "run"
        fit(
            recipe,
            run_dir,
            backbone=fit_backbone(plan, tokenizer),
            tokenizer=tokenizer,
            train_rows=rows,
            progress=False,
            device=device,
            stop_at=steps,
        )
        times = step_seconds(run_dir / LOG_FILE)
    return statistics.median(times[FIT_WARMUP_STEPS:] or times)


def fit_inputs(plan: Plan) -> tuple[Any, Any, list[Any]]:
    """(recipe, tokenizer, training rows): a dry run's rows are random texts of ``seq_len`` tokens."""
    from training.fit import training_rows

    recipe = fit_recipe(plan)
    tokenizer = fit_tokenizer(recipe.backbone, plan.assets)
    if plan.dry_run:
        texts = documents(tokenizer, DRY_FIT_ROWS, plan.seq_len, np.random.default_rng(0))
        return recipe, tokenizer, [{"text": text} for text in texts]
    return recipe, tokenizer, training_rows(recipe)


def measure_fit(plan: Plan) -> dict[str, Any]:
    if plan.seconds_left() < plan.fit_reserve_s / 3:
        return {"status": OUT_OF_TIME}
    inputs = fit_inputs(plan)
    recipe = inputs[0]
    device = seconds_per_step(plan, plan.device, plan.sizes.fit_steps, inputs)
    if plan.cpu_seconds_per_step is not None:
        cpu, cpu_source = plan.cpu_seconds_per_step, "passed in (--cpu-seconds-per-step)"
    else:
        cpu = seconds_per_step(plan, "cpu", plan.sizes.cpu_fit_steps, inputs)
        cpu_source = f"measured on this machine's CPU, {plan.sizes.cpu_fit_steps} steps"
    return {
        "status": MEASURED,
        "recipe": f"{DEFAULT_RECIPE.name} ({recipe.profile} profile)",
        "batch_size": recipe.batch_size,
        "max_length": recipe.max_length,
        "rows": "random texts (dry run)" if plan.dry_run else f"{recipe.dataset.name} train",
        "device": plan.label,
        "steps": plan.sizes.fit_steps,
        "warmup_steps_dropped": FIT_WARMUP_STEPS,
        "device_seconds_per_step": device,
        "cpu_seconds_per_step": cpu,
        "cpu_source": cpu_source,
        "speedup_vs_cpu": cpu / device,
    }


# --------------------------------------------------------------------------------------------- run
def guarded(name: str, measure: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """A part's result, or its failure: the device's minutes are few, the other parts still report."""
    started = time.perf_counter()
    try:
        result = measure()
    except Exception as exc:
        traceback.print_exc()
        result = {"status": f"failed: {type(exc).__name__}: {exc}"}
    result["seconds"] = round(time.perf_counter() - started, 1)
    print(f"{name}: {result['status']} ({result['seconds']} s)", flush=True)
    return result


def versions() -> dict[str, Any]:
    """Library versions as imported (onnxruntime-gpu installs under the module name onnxruntime); on a
    machine without onnx or onnxruntime (a device image), each as installed, or None."""
    import torch

    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    try:
        import onnxruntime as ort

        from training.export import versions as export_versions

        found: dict[str, Any] = {**export_versions(), "onnxruntime_providers": ort.get_available_providers()}
    except ImportError:
        libraries = ("transformers", "onnx", "onnxruntime")
        found = {"torch": torch.__version__, **{name: installed(name) for name in libraries}}
    return {**found, "cuda": torch.version.cuda, "cudnn": cudnn}


def installed(distribution: str) -> str | None:
    """The installed version of ``distribution``, or None."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def loaded_distributions() -> dict[str, str]:
    """Every installed distribution a module of this run came from, with its version and where it was
    imported from (what a device image must hold, or scripts/gpu_check.sh carry)."""
    owners = importlib.metadata.packages_distributions()
    names = sorted({module.split(".")[0] for module in list(sys.modules)})
    imported = [name for name in names if name not in sys.stdlib_module_names and not name.startswith("_")]
    found = {dist: installed(dist) for name in imported for dist in owners.get(name, [])}
    return {dist: version for dist, version in found.items() if version is not None}


def gpu_name() -> str | None:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def measure(plan: Plan) -> dict[str, Any]:
    model, source = build_model(plan)
    payload: dict[str, Any] = {
        "dry_run": plan.dry_run,
        "device": plan.label,
        "gpu": gpu_name(),
        "model": model_shape(model, source),
        "seq_len": plan.seq_len,
        "batches": list(plan.sizes.batches),
        "rhos": list(plan.rhos),
    }
    payload["seq_lens"] = list(plan.lengths)
    payload["parts"] = list(plan.parts)
    measures: dict[str, Callable[[Path], dict[str, Any]]] = {
        "forward": lambda _: measure_forward(plan),
        # Exported first: the model is still the CPU fp32 model the exporter traces.
        "onnxruntime": lambda tmp: measure_onnxruntime(model, plan, tmp),
        "torch": lambda _: measure_torch(model, plan),
        "fit": lambda _: measure_fit(plan),
    }
    with tempfile.TemporaryDirectory(prefix="gpu-bench-") as tmp:
        for part, run in measures.items():
            if part in plan.parts:
                payload[part] = guarded(part, lambda run=run: run(Path(tmp)))  # type: ignore[misc]
            else:
                payload[part] = {"status": NOT_SELECTED}
    return payload


def write_assets(directory: Path) -> None:
    """What the fit part needs where neither the backbone package nor the data root is: the tokenizer
    and the file of the recipe's training split, in the data root's layout (checked by loading it)."""
    from training.data import REGISTRY, default_data_root
    from training.encoders import load_tokenizer
    from training.fit import training_rows
    from training.recipes import load_recipe

    recipe = load_recipe(DEFAULT_RECIPE, FIT_PROFILE)
    load_tokenizer(recipe.backbone).save_pretrained(str(directory / TOKENIZER_DIR))
    root = Path(recipe.dataset.root) if recipe.dataset.root else default_data_root()
    if root is None:
        raise SystemExit("no data root (../shared/data): the recipe's texts cannot be copied")
    source = REGISTRY[recipe.dataset.name][recipe.dataset.train_split].file
    (directory / DATA_DIR / source).parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(root / source, directory / DATA_DIR / source)
    dataset = recipe.dataset.model_copy(update={"root": str(directory / DATA_DIR)})
    rows = training_rows(recipe.model_copy(update={"dataset": dataset}))
    print(f"wrote {directory}: {TOKENIZER_DIR}/ and {len(rows)} training texts under {DATA_DIR}/")


# ---------------------------------------------------------------------------------------- markdown
def _mib(value: int | None) -> str:
    return "—" if value is None else f"{value / 2**20:.0f}"


def cell_rows(cells: list[dict[str, Any]]) -> list[str]:
    return [
        f"| {c['part']} | {c['variant']} | {c['precision']} | {c['batch']} × {c['seq_len']} "
        f"| {c['sequences_per_second']:.1f} | {c['speedup_vs_dense']:.2f}× | {_mib(c['peak_memory_bytes'])} "
        f"| {_mib(c['activation_memory_bytes'])} |"
        for c in cells
    ]


def markdown(payload: dict[str, Any]) -> str:
    device = payload["device"]
    where = "no GPU number here" if payload["dry_run"] else f"GPU: {payload['gpu']}"
    model = payload["model"]
    lines = [
        f"# The GPU path: {device}",  # the title line docs/benchmarks.md replaces with its own
        "",
        f"Device: {device} ({where}); model: {model['backbone']}, hidden {model['hidden_size']}, "
        f"{model['num_layers']} layers. Parts: "
        + ", ".join(f"{part} {payload[part]['status']}" for part in PARTS)
        + ".",
        "",
        "| part | variant | precision | batch × seq | seq/s | vs dense | peak memory (MiB) "
        "| activation (MiB) |",
        "|---|---|---|---|---|---|---|---|",
        *cell_rows(payload["torch"].get("cells", []) + payload["onnxruntime"].get("cells", [])),
        "",
    ]
    forward = payload.get("forward", {})
    if forward.get("cells"):
        lines += [
            "## The serving forward (retention_torch) vs dense SDPA",
            "",
            f"Selection: {forward['selection']}. Each ρ: its speed-up over the faster dense variant of "
            "the same precision, as one CUDA graph / eager, and (its limit, 1 / token-work).",
            "",
            *gpu_forward.markdown_rows(forward["cells"]),
            "",
        ]
        for note in forward.get("skipped_for_time", []) + forward.get("failed_cells", []):
            lines.append(f"- forward, not measured: {note}")
    for check in payload["onnxruntime"].get("parity", []):
        rho = "dense" if check["rho"] is None else f"ρ {check['rho']:g}"
        verdict = "within" if check["within_tolerance"] else "OUTSIDE"
        lines.append(
            f"- parity vs the CPU provider, {check['graph']} {rho}: max |Δ| {check['max_abs_diff']:.2e} "
            f"({verdict} {check['atol']:g}; kept counts equal: {check['kept_counts_equal']})"
        )
    skipped = payload["torch"].get("skipped_for_time", [])
    if skipped:
        lines.append(f"- not measured, out of the time budget: {', '.join(skipped)}")
    fit = payload["fit"]
    if fit.get("status") == MEASURED:
        lines.append(
            f"- fit {fit['recipe']}, batch {fit['batch_size']} × ≤ {fit['max_length']}: "
            f"{fit['device_seconds_per_step']:.3f} s/step on {fit['device']} vs "
            f"{fit['cpu_seconds_per_step']:.3f} s/step on the CPU ({fit['cpu_source']}): "
            f"{fit['speedup_vs_cpu']:.1f}×"
        )
    return "\n".join(lines) + "\n"


# -------------------------------------------------------------------------------------------- CLI
def measure_forward(plan: Plan) -> dict[str, Any]:
    """The ``forward`` part (``benchmarks.gpu_forward``) on this run's device and time budget, leaving
    the fit part its reserve."""
    from benchmarks import gpu_forward as F

    reserve = plan.fit_reserve_s if "fit" in plan.parts else 0.0
    return F.measure_forward(
        F.ForwardPlan(
            device=plan.device,
            dry_run=plan.dry_run,
            shapes=F.DRY_SHAPES if plan.dry_run else F.SHAPES,
            batches=F.DRY_BATCHES if plan.dry_run else F.BATCHES,
            lengths=F.DRY_LENGTHS if plan.dry_run else F.LENGTHS,
            seconds_left=lambda: plan.seconds_left() - reserve,
        )
    )


def make_plan(args: argparse.Namespace) -> Plan:
    import torch

    sizes = DRY if args.dry_run else FULL
    if not args.dry_run and not torch.cuda.is_available():
        raise SystemExit("no CUDA device here: run it on a GPU machine, or --dry-run on this CPU")
    if args.fit_steps is not None:
        sizes = replace(sizes, fit_steps=args.fit_steps)
    if args.batches is not None:
        sizes = replace(sizes, batches=args.batches)
    return Plan(
        dry_run=args.dry_run,
        device="cpu" if args.dry_run else "cuda",
        label=DRY_RUN_DEVICE if args.dry_run else torch.cuda.get_device_name(0),
        sizes=sizes,
        rhos=RHOS,
        cpu_seconds_per_step=args.cpu_seconds_per_step,
        assets=args.assets,
        parts=args.parts,
        seq_lens=args.seq_lens or (),
        deadline=None if args.budget_s is None else time.perf_counter() + args.budget_s,
        fit_reserve_s=args.fit_reserve_s,
    )


def int_list(text: str) -> tuple[int, ...]:
    return tuple(int(item) for item in text.split(",") if item.strip())


def part_list(text: str) -> tuple[str, ...]:
    parts = tuple(item.strip() for item in text.split(",") if item.strip())
    if not parts or not set(parts) <= set(PARTS):
        raise argparse.ArgumentTypeError(f"parts are among {', '.join(PARTS)}, not {text!r}")
    return parts


def parse(argv: list[str]) -> argparse.Namespace:
    parser = cli(MODULE, __doc__)
    parser.add_argument("--out", type=Path, help=f"directory for {RESULT_FILE} and its table")
    parser.add_argument("--dry-run", action="store_true", help="the same code paths on the CPU, tiny")
    parser.add_argument("--assets", type=Path, default=None, help="what --write-assets saved")
    parser.add_argument("--write-assets", type=Path, default=None, metavar="DIR", help="save them and exit")
    parser.add_argument("--fit-steps", type=int, default=None, help="steps of the device fit (default 30)")
    parser.add_argument("--cpu-seconds-per-step", type=float, help="the CPU's fit number, not measured")
    parser.add_argument("--parts", type=part_list, default=PARTS, help="comma list (default: all four)")
    parser.add_argument("--seq-lens", type=int_list, default=None, help="torch grid lengths, e.g. 512,256")
    parser.add_argument("--batches", type=int_list, default=None, help="batch sizes, e.g. 32,8,1")
    parser.add_argument("--budget-s", type=float, default=None, help="stop adding cells past this")
    parser.add_argument("--fit-reserve-s", type=float, default=FIT_RESERVE_S, help="of it, kept for fit")
    parser.add_argument("--image-check", type=Path, default=None, help="a JSON file to embed as 'image'")
    args = parser.parse_args(argv)
    if args.out is None and args.write_assets is None:
        parser.error("--out is required")
    return args


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    if args.write_assets is not None:
        write_assets(args.write_assets)
        return
    plan, started = make_plan(args), time.perf_counter()
    payload = measure(plan)
    payload["wall_seconds"] = round(time.perf_counter() - started, 1)
    payload["machine"] = describe()
    payload["versions"] = versions()
    payload["distributions"] = loaded_distributions()
    if args.image_check is not None:
        payload["image"] = json.loads(args.image_check.read_text(encoding="utf-8"))
    publish(payload, markdown, args.out / RESULT_FILE, MODULE, argv)
    if any(payload[part]["status"].startswith("failed") for part in PARTS):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
