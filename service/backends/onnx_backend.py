"""The ONNX Runtime backend: ``model.onnx`` (or its int8 variant) in one session, on the CPU or, when
onnxruntime-gpu is installed and ``use_cuda`` is on, CUDA."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from retention_core.contract import Manifest, TensorSpec
from retention_core.onnx import open_session
from retention_core.tasks import TaskSpec
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
CUDA_PROVIDER = "CUDAExecutionProvider"


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
        self.session = session
        self.output_names = output_names
        providers = session.get_providers()
        device = "cuda:0" if CUDA_PROVIDER in providers else "cpu"
        self.info = BackendInfo("onnxruntime", device, providers, precision)
        width = session.get_outputs()[0].shape[-1]
        self.output_width = width if isinstance(width, int) else None
        self.buckets: ShapeBuckets | None = None  # onnxruntime runs every shape it is given

    def run(self, feeds: dict[str, np.ndarray]) -> GraphOutputs:
        main, counts, *optional = self.session.run(self.output_names, feeds)
        return main, np.asarray(counts, dtype=np.int64), optional[0] if optional else None

    def device_memory(self) -> DeviceMemory | None:
        return None  # onnxruntime reports no allocator statistics through its Python API

    def close(self) -> None:
        """Nothing to release by hand: the session goes with the last reference."""


def open_onnx(directory: Path, manifest: Manifest, spec: TaskSpec, settings: Settings) -> OnnxBackend:
    label = directory.name
    variant = manifest.variants.get(settings.precision) or manifest.variants.get("fp32")
    if variant is None:
        raise ModelLoadError(f"{label}: manifest lists no fp32 variant")
    model_path = model_file(directory, variant.file, ".onnx", "variant file")
    try:
        session = open_session(
            model_path,
            settings.intra_op_threads,
            settings.inter_op_threads,
            use_cuda=settings.use_cuda,
            cpu_mem_arena=settings.cpu_mem_arena,
            mem_pattern=settings.ort_mem_pattern,
        )
    except Exception as exc:
        log.error("onnxruntime could not load %s: %s", model_path, exc)
        raise ModelLoadError(f"{label}: {variant.file} could not be loaded by onnxruntime") from exc
    check_specs(label, "inputs", session.get_inputs(), manifest.inputs, spec.inputs)
    # survival_depth is optional: directories exported before it stop at kept_counts (explain off)
    contract = spec.output_contract(len(manifest.outputs))
    check_specs(label, "outputs", session.get_outputs(), manifest.outputs, contract)
    return OnnxBackend(session, variant.precision, [output.name for output in manifest.outputs])
