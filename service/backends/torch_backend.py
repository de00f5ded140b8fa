"""The torch backend: ``weights.safetensors`` run by ``retention_torch``'s GPU-shaped forward.

The only service module that imports torch (``tests/test_layering.py``), and only when
``RETENTION_BACKEND=torch`` (``service.backends.open_backend``). On a CUDA device it runs bf16 and one
CUDA graph per shape plan by default, the plans of the server's runs captured when the model loads
(``RETENTION_CUDA_GRAPHS_AT_LOAD``; ``GET /models`` and ``/metrics`` say how many); on the CPU the same
forward runs eagerly in fp32. A two-path model (its ρ < 1 rows run a copy of the encoder of their own)
gets one runner per path (``retention_torch.two_path``), each with its own plans and graphs.
"""

from __future__ import annotations

import logging
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

from retention_core.contract import Manifest
from retention_core.tasks import TaskSpec
from retention_torch.forward import Head, Plan
from retention_torch.runner import LoadBudget, Runner, load_plans
from retention_torch.two_path import DENSE_RHO, TwoPathRunner, branch_states
from retention_torch.weights import ModelWeights, WeightsError, from_state
from service.backends.base import (
    BackendInfo,
    DeviceMemory,
    DeviceOutOfMemory,
    GraphOutputs,
    ModelLoadError,
    ShapeBuckets,
    model_file,
)
from service.serving import GraphCache
from service.settings import Settings

log = logging.getLogger("service")

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
PRECISION_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16"}


def resolve_device(name: str) -> torch.device:
    """``auto``: the first CUDA device when torch sees one, else the CPU."""
    if name == "auto":
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """``auto``: bf16 on a CUDA device (flash attention, tensor cores), fp32 on the CPU."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPES[name]


class TorchBackend:
    def __init__(
        self, runner: Runner, dtype: torch.dtype, output_width: int, pruned_runner: Runner | None = None
    ) -> None:
        self.runner = runner  # a two-path model's ρ ≥ 1 path (the original's weights); else every row's
        self.pruned_runner = pruned_runner  # a two-path model's ρ < 1 path (the copy's weights)
        device = runner.device
        mode = "cuda-graphs" if runner.graphs else "eager"
        self.info = BackendInfo(
            "torch",
            str(device),
            [f"torch-{device.type}-{mode}"],
            PRECISION_NAMES[dtype],
            graphs=self.graph_cache,
        )
        self.output_width: int | None = output_width
        self.buckets: ShapeBuckets | None = ShapeBuckets(runner.batch_buckets, runner.length_buckets)

    @property
    def forward(self) -> Runner | TwoPathRunner:
        """What runs a run's rows (read at each run: a reload or a test may swap the runners)."""
        if self.pruned_runner is None:
            return self.runner
        return TwoPathRunner(self.runner, self.pruned_runner)

    @property
    def runners(self) -> list[Runner]:
        return [self.runner] if self.pruned_runner is None else [self.runner, self.pruned_runner]

    def capture_at_load(self, plans: list[Plan], budget: LoadBudget, runner: Runner | None = None) -> int:
        """Capture the plans of the server's runs before any request meets them (nothing on the CPU);
        the number captured. ``runner``: the path that runs them (default: the first)."""
        runner = runner or self.runner
        captured = runner.capture_at_load(plans, budget)
        stopped = runner.stats.load_stopped
        log.info(
            "%s: %d of %d planned CUDA graphs captured at load%s",
            self.info.device,
            captured,
            len(plans),
            f" (stopped at {stopped})" if stopped else "",
        )
        return captured

    def graph_cache(self) -> GraphCache | None:
        """The runners' CUDA graphs now (both paths' together); None when they capture none (the CPU,
        graphs off)."""
        runners = self.runners  # read at each call: a reload or a test may swap them
        if not runners[0].graphs:
            return None
        held = sum(compiled.graph is not None for r in runners for compiled in list(r.compiled.values()))
        counts = [asdict(r.stats) for r in runners]
        stopped = next((c["load_stopped"] for c in counts if c["load_stopped"]), None)
        summed = {key: sum(c[key] for c in counts) for key in counts[0] if key != "load_stopped"}
        limit = sum(r.max_graphs for r in runners)
        return GraphCache(limit=limit, held=held, load_stopped=stopped, **summed)  # the same counts

    def run(self, feeds: dict[str, np.ndarray]) -> GraphOutputs:
        try:
            result = self.forward.run(feeds)
        except torch.OutOfMemoryError as exc:
            if self.runner.device.type == "cuda":
                torch.cuda.empty_cache()  # hand back what the failed run's allocations cached
            rows, length = feeds["input_ids"].shape
            raise DeviceOutOfMemory(
                f"{rows} rows x {length} tokens did not fit on {self.info.device}"
            ) from exc
        return result.main, result.kept_counts, result.survival_depth

    def device_memory(self) -> DeviceMemory | None:
        memory = self.runner.device_memory()
        return None if memory is None else DeviceMemory(*memory)

    def close(self) -> None:
        for runner in self.runners:
            runner.compiled.clear()  # the captured graphs' memory goes back to the pool


def open_torch(directory: Path, manifest: Manifest, spec: TaskSpec, settings: Settings) -> TorchBackend:
    label = directory.name
    described = manifest.torch_weights
    if described is None:
        raise ModelLoadError(
            f"{label}: no torch weights (exported before the torch backend existed); re-export it or "
            "serve it with RETENTION_BACKEND=onnxruntime"
        )
    path = model_file(directory, described.file, ".safetensors", "torch weights file")
    try:
        device = resolve_device(settings.torch_device)
        dtype = resolve_dtype(settings.torch_dtype, device)
        if settings.intra_op_threads > 0 and device.type == "cpu":
            torch.set_num_threads(settings.intra_op_threads)
        original, copy = branch_states(load_file(str(path)))
        paths = [
            from_state(state, described.architecture, spec.head, device, dtype)
            for state in (original, copy)
            if state
        ]
    except WeightsError as exc:
        raise ModelLoadError(f"{label}: {described.file}: {exc}") from exc
    except Exception as exc:
        log.error("torch could not load %s: %s", path, exc)
        raise ModelLoadError(f"{label}: {described.file} could not be loaded by torch") from exc
    pooling = manifest.embedding.pooling if manifest.embedding is not None else "mean"
    head = Head(spec.head, pooling, manifest.schedule.last_layer_queries)

    def runner_of(weights: ModelWeights) -> Runner:
        return Runner(
            weights,
            manifest.schedule,
            head,
            manifest.max_length,
            graphs=settings.cuda_graphs,
            max_graphs=settings.max_cuda_graphs,
        )

    runners = [runner_of(weights) for weights in paths]
    width = described.architecture.hidden_size
    if spec.head != "pooled":
        width = int(paths[0].head_tensors["head.out.weight"].shape[0])
    backend = TorchBackend(runners[0], dtype, width, runners[1] if len(runners) > 1 else None)
    if runners[0].graphs:  # before the warm-up and any request: no run pays a capture of these plans
        for runner, rhos in path_rhos(backend, manifest):
            plans = server_plans(runner, manifest, settings, rhos)
            backend.capture_at_load(plans, LoadBudget(settings.cuda_graphs_at_load), runner)
    return backend


def path_rhos(backend: TorchBackend, manifest: Manifest) -> list[tuple[Runner, tuple[float, ...]]]:
    """Each runner with the budgets its plans are captured at load for: the ρ a request without one gets
    and ρ = 1, each on the path that runs it."""
    rhos = default_rhos(manifest)
    if backend.pruned_runner is None:
        return [(backend.runner, rhos)]
    below = tuple(rho for rho in rhos if rho < DENSE_RHO)
    return [(backend.runner, (1.0,)), *([(backend.pruned_runner, below)] if below else [])]


def server_plans(
    runner: Runner, manifest: Manifest, settings: Settings, rhos: tuple[float, ...] | None = None
) -> list[Plan]:
    """The plans the server's runs of this model meet at ``rhos`` (default: the ρ a request without one
    gets and ρ = 1): its buckets under the batch token budget."""
    return load_plans(
        manifest.schedule,
        rhos or default_rhos(manifest),
        runner.batch_buckets,
        runner.length_buckets,
        settings.max_batch_tokens,
    )


def default_rhos(manifest: Manifest) -> tuple[float, ...]:
    return tuple(dict.fromkeys((manifest.default_rho, 1.0)))
