"""The ONNX Runtime backend: ``model.onnx`` (or its int8 variant) in one session, on the CPU or, when
onnxruntime-gpu is installed and ``use_cuda`` is on, CUDA.

Its own settings (``OnnxSettings``) live here, not on the service's ``Settings``: the same
``RETENTION_*`` environment variables as ever, read when a model opens; keywords given to ``Settings``
(a test's, a Ray Serve config's ``args``) win over them.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Literal

import numpy as np
import onnxruntime as ort
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from retention_core.contract import Manifest, TensorSpec
from retention_core.tasks import TaskSpec
from retention_ort import CUDA_PROVIDER, open_session
from service.backends.base import (
    BackendInfo,
    DeviceMemory,
    GraphOutputs,
    ModelLoadError,
    ShapeBuckets,
    model_file,
)
from service.settings import Settings

log = logging.getLogger("service")

ORT_TYPES = {"int64": "tensor(int64)", "float32": "tensor(float)"}


class OnnxSettings(BaseSettings):
    """What only the ONNX Runtime backend reads (env prefix ``RETENTION_``, as the service's ``Settings``;
    the threads one run uses, ``intra_op_threads``, are the service's: torch reads them too)."""

    model_config = SettingsConfigDict(env_prefix="RETENTION_", extra="ignore")

    precision: Literal["fp32", "int8"] = Field(
        default="fp32", description="preferred ONNX variant; falls back to fp32 when a model lacks it"
    )
    inter_op_threads: int = Field(default=1, ge=1, description="onnxruntime inter-op threads")
    use_cuda: bool = Field(default=True, description="use CUDAExecutionProvider when onnxruntime offers it")
    cpu_mem_arena: bool = Field(
        default=True,
        description="onnxruntime's CPU memory arena (fast reuse; keeps its peak); false: plain allocations",
    )
    ort_mem_pattern: bool = Field(
        default=False,
        description="onnxruntime's memory pattern: one allocation plan kept per input shape seen; off, "
        "since batches come in many shapes (rows x padded length)",
    )

    @classmethod
    def of(cls, settings: Settings) -> OnnxSettings:
        """This backend's settings for a server on ``settings``: its keywords (``Settings``' extra
        fields) over the environment."""
        return cls(**(settings.model_extra or {}))


def check_specs(
    label: str, kind: str, actual: list[Any], expected: list[TensorSpec], contract: tuple[TensorSpec, ...]
) -> None:
    """The session's inputs/outputs must equal the manifest's, and the manifest the task contract."""
    want = [(s.name, s.dtype, len(s.axes)) for s in expected]
    if want != [(s.name, s.dtype, len(s.axes)) for s in contract]:
        raise ModelLoadError(
            f"{label}: manifest {kind} {[w[0] for w in want]} do not match the task contract"
        )
    got = [(a.name, a.type, len(a.shape)) for a in actual]
    if [(n, ORT_TYPES[d], r) for n, d, r in want] != got:
        raise ModelLoadError(f"{label}: ONNX graph {kind} {got} do not match the manifest {want}")


class OnnxBackend:
    """One onnxruntime session over the manifest's variant of the configured precision."""

    def __init__(self, session: ort.InferenceSession, precision: str, output_names: list[str]) -> None:
        self.session: ort.InferenceSession | None = session
        self.output_names = output_names
        providers = session.get_providers()
        device = "cuda:0" if CUDA_PROVIDER in providers else "cpu"
        self.info = BackendInfo("onnxruntime", device, providers, precision)
        width = session.get_outputs()[0].shape[-1]
        self.output_width = width if isinstance(width, int) else None
        self.buckets: ShapeBuckets | None = None  # onnxruntime runs every shape it is given

    @property
    def closed(self) -> bool:
        return self.session is None

    def run(self, feeds: dict[str, np.ndarray]) -> GraphOutputs:
        if self.session is None:
            raise RuntimeError(f"the onnxruntime session of this {self.info.device} backend was closed")
        main, counts, *optional = self.session.run(self.output_names, feeds)
        return main, np.asarray(counts, dtype=np.int64), optional[0] if optional else None

    def device_memory(self) -> DeviceMemory | None:
        return None  # onnxruntime reports no allocator statistics through its Python API

    def close(self) -> None:
        """Release the session (its weights, arena and, on CUDA, device memory go with this last
        reference). The server calls it once no run of the model is in flight (``service.server``)."""
        self.session = None


def open_onnx(directory: Path, manifest: Manifest, spec: TaskSpec, settings: Settings) -> OnnxBackend:
    label = directory.name
    own = OnnxSettings.of(settings)
    variant = manifest.variants.get(own.precision) or manifest.variants.get("fp32")
    if variant is None:
        raise ModelLoadError(f"{label}: manifest lists no fp32 variant")
    model_path = model_file(directory, variant.file, ".onnx", "variant file")
    try:
        session = open_session(
            model_path,
            settings.intra_op_threads,
            own.inter_op_threads,
            use_cuda=own.use_cuda,
            cpu_mem_arena=own.cpu_mem_arena,
            mem_pattern=own.ort_mem_pattern,
        )
    except Exception as exc:
        log.error("onnxruntime could not load %s: %s", model_path, exc)
        raise ModelLoadError(f"{label}: {variant.file} could not be loaded by onnxruntime") from exc
    check_specs(label, "inputs", session.get_inputs(), manifest.inputs, spec.inputs)
    # survival_depth is optional: directories exported before it stop at kept_counts (explain off)
    contract = spec.output_contract(len(manifest.outputs))
    check_specs(label, "outputs", session.get_outputs(), manifest.outputs, contract)
    return OnnxBackend(session, variant.precision, [output.name for output in manifest.outputs])
