"""onnxruntime sessions, set up one way for the service's ONNX Runtime backend, training's export,
evaluation and speed curve, and the benchmarks.

A package of its own, beside ``retention_torch``: the core (``retention_core``) imports neither
onnxruntime nor torch, and training may not import the service. It imports onnxruntime and nothing of
the project (``tests/test_layering.py``)."""

from __future__ import annotations

from pathlib import Path

import onnxruntime as ort

CPU_PROVIDER = "CPUExecutionProvider"
CUDA_PROVIDER = "CUDAExecutionProvider"


def session_options(
    intra_op_threads: int = 0, inter_op_threads: int = 0, cpu_mem_arena: bool = True, mem_pattern: bool = True
) -> ort.SessionOptions:
    """0 threads = onnxruntime's default (one per core). ``cpu_mem_arena=False``: buffers go straight to
    the allocator instead of ORT's CPU arena, which keeps (never returns) its largest footprint.
    ``mem_pattern=False``: no memory pattern per input shape (ORT plans and keeps one for every distinct
    shape it sees, which only pays when the shapes repeat: a server's batches come in many shapes)."""
    options = ort.SessionOptions()
    options.enable_cpu_mem_arena = cpu_mem_arena
    options.enable_mem_pattern = mem_pattern
    # Several sessions may share the process: spinning threads would burn the cores of the others.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    options.intra_op_num_threads = intra_op_threads
    options.inter_op_num_threads = inter_op_threads
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return options


def providers(use_cuda: bool = False) -> list[str]:
    """CUDA first when asked for and available, CPU always as the fallback."""
    cuda = [CUDA_PROVIDER] if use_cuda and CUDA_PROVIDER in ort.get_available_providers() else []
    return [*cuda, CPU_PROVIDER]


def open_session(
    path: Path,
    intra_op_threads: int = 0,
    inter_op_threads: int = 0,
    use_cuda: bool = False,
    cpu_mem_arena: bool = True,
    mem_pattern: bool = True,
) -> ort.InferenceSession:
    return ort.InferenceSession(
        str(path),
        sess_options=session_options(intra_op_threads, inter_op_threads, cpu_mem_arena, mem_pattern),
        providers=providers(use_cuda),
    )
