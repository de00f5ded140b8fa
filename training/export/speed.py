"""The manifest's speed curve: a staged model directory's graph timed at every ρ of ``SPEED_RHOS``.

``python -m training export`` measures the staged directory (``install.export_model``'s ``measure``)
before it is swapped into place; nothing here writes a model directory. The rows are the export's
example inputs (``graph.example_inputs``) made full length, so every task's graph gets its own inputs
(QA: a protected question third).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from retention_core import contract as C
from retention_core.machine import describe
from retention_ort import open_session
from training.export.graph import VALIDATION_SEED, example_inputs

SPEED_RHOS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
SPEED_BATCH = 8
SPEED_MAX_LENGTH = 256  # rows of min(max_length, this) real tokens
SPEED_REPEATS = 7
SPEED_THREADS = 1  # one intra-op thread: the steadiest timing on a machine that also runs other work


def speed_feeds(manifest: C.Manifest, vocab_size: int, rho: float) -> dict[str, np.ndarray]:
    """One batch of full-length rows (no padding) at ``rho``, with the task's inputs (QA: a protected
    question third)."""
    length = min(manifest.max_length, SPEED_MAX_LENGTH)
    example = example_inputs(SPEED_BATCH, length, vocab_size, (rho,), seed=VALIDATION_SEED)
    example["attention_mask"] = torch.ones_like(example["attention_mask"])
    example["input_ids"] = torch.randint(
        5, vocab_size, (SPEED_BATCH, length), generator=torch.Generator().manual_seed(VALIDATION_SEED)
    )
    example["token_type_ids"] = example["token_type_ids"][:1].expand(SPEED_BATCH, -1).contiguous()
    example["protected_mask"] = example["protected_mask"][:1].expand(SPEED_BATCH, -1).contiguous()
    return {spec.name: example[spec.name].numpy() for spec in manifest.inputs}


def measure_speed(onnx_path: Path, manifest: C.Manifest, vocab_size: int) -> C.SpeedCurve:
    """The manifest's speed-vs-ρ curve: the median of ``SPEED_REPEATS`` timed runs per ρ, ρ values
    interleaved within each repeat so a slow spell of the machine hits them all alike."""
    session = open_session(onnx_path, intra_op_threads=SPEED_THREADS, inter_op_threads=1)
    feeds = {rho: speed_feeds(manifest, vocab_size, rho) for rho in SPEED_RHOS}
    for rho in SPEED_RHOS:  # warm-up: every shape the timed runs will see
        session.run(None, feeds[rho])
    seconds: dict[float, list[float]] = {rho: [] for rho in SPEED_RHOS}
    for _ in range(SPEED_REPEATS):
        for rho in SPEED_RHOS:
            begin = time.perf_counter()
            session.run(None, feeds[rho])
            seconds[rho].append(time.perf_counter() - begin)
    median = {rho: float(np.median(times)) for rho, times in seconds.items()}
    return C.SpeedCurve(
        runtime=f"onnxruntime {manifest.variants['fp32'].precision}, {SPEED_THREADS} intra-op thread",
        batch_size=SPEED_BATCH,
        sequence_length=min(manifest.max_length, SPEED_MAX_LENGTH),
        repeats=SPEED_REPEATS,
        machine=describe(),
        points=[C.QualityPoint(rho=rho, value=round(median[1.0] / median[rho], 4)) for rho in SPEED_RHOS],
    )
