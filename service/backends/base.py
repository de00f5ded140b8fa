"""The backend seam: what the scheduler runs a batch through, whatever runs the model.

A ``Backend`` is one model directory opened for inference on one device (TEI's backend trait is about as
small): ``run`` takes a task's graph feeds (``retention_core.tasks.TaskSpec.feeds``: ids, masks, ρ per
row) and answers what ``model.onnx`` answers (the main output, kept counts, survival depth), padded
rows included; ``info`` says what runs it; ``device_memory`` what it holds on an accelerator. Two
implementations: ONNX Runtime (``onnx_backend``, the CPU default; CUDA when onnxruntime-gpu is
installed) and torch (``torch_backend``, the GPU-shaped forward of ``retention_torch``). Only the chosen
one's module is imported, so the CPU serving image never imports torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

import numpy as np

from service.serving import GraphCache

BackendKind = Literal["onnxruntime", "torch"]
BACKENDS: tuple[BackendKind, ...] = ("onnxruntime", "torch")
# (main output (B, …), kept counts (B, P) int64, survival depth (B, T) int64 or None without it)
GraphOutputs = tuple[np.ndarray, np.ndarray, np.ndarray | None]


class DeviceOutOfMemory(RuntimeError):
    """The backend's device could not hold one run (CUDA out of memory), raised in the backend's own
    words so the scheduler (``service.scheduling.execution``) can split the run and retry without
    knowing torch. Nothing of the device's state is lost: the next, smaller run may succeed."""


class ModelLoadError(Exception):
    """A model directory is broken, or the backend cannot run it. The message is safe to show to an
    operator (no absolute paths)."""


def model_file(directory: Path, name: str, suffix: str, what: str) -> Path:
    """The manifest's file ``name`` inside ``directory``: a plain name (no path that could leave the
    directory) with ``suffix``, present. Raises ``ModelLoadError`` naming ``what`` it is."""
    label = directory.name
    path = directory / name
    if Path(name).name != name or path.suffix != suffix:
        raise ModelLoadError(f"{label}: {what} must be a plain *{suffix} name inside the model directory")
    if not path.is_file():
        raise ModelLoadError(f"{label}: missing {name}")
    return path


@dataclass(frozen=True)
class BackendInfo:
    kind: BackendKind
    device: str  # "cpu", "cuda:0"
    providers: list[str]  # onnxruntime's execution providers; the torch backend's device and graph mode
    precision: str  # what the weights compute in: fp32, int8 (onnxruntime), bf16 (torch)
    # reads the backend's CUDA graphs now; None: it captures none (onnxruntime, the CPU, graphs off)
    graphs: Callable[[], GraphCache | None] | None = None


@dataclass(frozen=True)
class ShapeBuckets:
    """The shapes a backend pads every run to (the torch backend's CUDA-graph plans): rows up to the
    next batch bucket, tokens up to the next length bucket. The scheduler plans its runs to fill them."""

    batch: tuple[int, ...]
    length: tuple[int, ...]


@dataclass(frozen=True)
class DeviceMemory:
    in_use_bytes: int  # allocated on the device now
    peak_bytes: int  # the allocator's high-water mark since the process started


class Backend(Protocol):
    info: BackendInfo
    # width of the main output's last axis when the backend knows it (checked against the manifest)
    output_width: int | None
    # the shapes it pads runs to, when it pads to a fixed set (None: each run's own shape)
    buckets: ShapeBuckets | None

    def run(self, feeds: dict[str, np.ndarray]) -> GraphOutputs: ...

    def device_memory(self) -> DeviceMemory | None: ...

    def close(self) -> None: ...
