"""Backends: one model directory opened for inference (``base.Backend``), chosen by one setting
(``RETENTION_BACKEND``: onnxruntime | torch). Each backend's module is imported only when chosen; what
only one backend reads is its own (``onnx_backend.OnnxSettings``), checked when the server is built
(``check_settings``)."""

from __future__ import annotations

from pathlib import Path

from retention_core.contract import Manifest
from retention_core.tasks import TaskSpec
from service.backends.base import (
    Backend,
    BackendInfo,
    DeviceMemory,
    DeviceOutOfMemory,
    GraphOutputs,
    ModelLoadError,
    ShapeBuckets,
)
from service.settings import Settings

__all__ = [
    "Backend",
    "BackendInfo",
    "DeviceMemory",
    "DeviceOutOfMemory",
    "GraphOutputs",
    "ModelLoadError",
    "ShapeBuckets",
    "check_settings",
    "open_backend",
]


def check_settings(settings: Settings) -> None:
    """Raise pydantic's ``ValidationError`` when the chosen backend's own settings are invalid (an
    unknown ``RETENTION_PRECISION``): the server fails when it is built, as ``Settings()`` does on its
    own fields, not at each model's load."""
    if settings.backend == "onnxruntime":
        from service.backends.onnx_backend import OnnxSettings

        OnnxSettings.of(settings)


def open_backend(directory: Path, manifest: Manifest, spec: TaskSpec, settings: Settings) -> Backend:
    """Open ``directory`` on the configured backend. Raises ``ModelLoadError``."""
    if settings.backend == "torch":
        try:
            from service.backends.torch_backend import open_torch
        except ImportError as exc:  # the CPU serving image has no torch
            raise ModelLoadError(
                f"{directory.name}: RETENTION_BACKEND=torch needs torch and safetensors installed"
            ) from exc
        return open_torch(directory, manifest, spec, settings)
    from service.backends.onnx_backend import open_onnx

    return open_onnx(directory, manifest, spec, settings)
