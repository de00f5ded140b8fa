"""The torch backend: ``weights.safetensors`` run by ``retention_torch``'s GPU-shaped forward.

The only service module that imports torch (``tests/test_layering.py``), and only when
``RETENTION_BACKEND=torch`` (``service.backends.open_backend``). On a CUDA device it runs bf16 and one
CUDA graph per shape plan by default; on the CPU the same forward runs eagerly in fp32.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch

from retention_core.contract import Manifest
from retention_core.tasks import TaskSpec
from retention_torch.forward import Head
from retention_torch.runner import Runner
from retention_torch.weights import WeightsError, load
from service.backends.base import (
    BackendInfo,
    DeviceMemory,
    DeviceOutOfMemory,
    GraphOutputs,
    ModelLoadError,
    ShapeBuckets,
    model_file,
)
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
    def __init__(self, runner: Runner, dtype: torch.dtype, output_width: int) -> None:
        self.runner = runner
        device = runner.device
        mode = "cuda-graphs" if runner.graphs else "eager"
        self.info = BackendInfo("torch", str(device), [f"torch-{device.type}-{mode}"], PRECISION_NAMES[dtype])
        self.output_width: int | None = output_width
        self.buckets: ShapeBuckets | None = ShapeBuckets(runner.batch_buckets, runner.length_buckets)

    def run(self, feeds: dict[str, np.ndarray]) -> GraphOutputs:
        try:
            result = self.runner.run(feeds)
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
        self.runner.compiled.clear()  # the captured graphs' memory goes back to the pool


def open_torch(directory: Path, manifest: Manifest, spec: TaskSpec, settings: Settings) -> TorchBackend:
    label = directory.name
    described = manifest.torch_weights
    if manifest.pruned_branch is not None:
        raise ModelLoadError(
            f"{label}: its rho < 1 path runs weights of its own (a two-path model), which the torch "
            "backend does not run; serve it with RETENTION_BACKEND=onnxruntime"
        )
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
        weights = load(path, described.architecture, spec.head, device, dtype)
    except WeightsError as exc:
        raise ModelLoadError(f"{label}: {described.file}: {exc}") from exc
    except Exception as exc:
        log.error("torch could not load %s: %s", path, exc)
        raise ModelLoadError(f"{label}: {described.file} could not be loaded by torch") from exc
    pooling = manifest.embedding.pooling if manifest.embedding is not None else "mean"
    head = Head(spec.head, pooling, manifest.schedule.last_layer_queries)
    runner = Runner(
        weights,
        manifest.schedule,
        head,
        manifest.max_length,
        graphs=settings.cuda_graphs,
        max_graphs=settings.max_cuda_graphs,
    )
    width = described.architecture.hidden_size
    if spec.head != "pooled":
        width = int(weights.head_tensors["head.out.weight"].shape[0])
    return TorchBackend(runner, dtype, width)
