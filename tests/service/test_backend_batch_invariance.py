"""Both backends give a row the same bits alone and in any batch (issue 64): the onnxruntime backend (fp32
and int8) and the torch backend on the CPU, every task's head, rows at ragged lengths and mixed budgets on
one side of ρ = 1 (the planner never runs the two sides together: planner.plan_path_runs), first or last,
padded beside the longest row. What a backend is given is what the batcher gives it: rows padded to the
run's longest (the torch backend pads further to its own shape buckets)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from retention_core.contract import Manifest
from retention_core.tasks import task_spec
from service.backends import open_backend
from service.backends.base import Backend
from tests.batch_rows import padded_feeds, per_row
from tests.service.conftest import settings_for
from tests.training.test_batch_invariance import LENGTHS, SEQUENCE_HEAD_BOUND, SIDES, texts

BACKENDS = {"onnxruntime-fp32": {}, "onnxruntime-int8": {"precision": "int8"}, "torch": {"backend": "torch"}}
# The torch backend (built for GPUs) on the CPU: its pruned pass's outputs move by the last bits with the
# run's rows (≤ 3e-8 measured on these tiny models; its dense pass is exact): torch's CPU GEMMs block their
# sums by the matrix's row count. Kept tokens are exact.
TORCH_CPU_BOUND = 1e-6


def backend_for(directory: Path, options: dict[str, str]) -> Backend:
    manifest = Manifest.read(directory)
    return open_backend(
        directory, manifest, task_spec(manifest.task), settings_for(directory.parent, **options)
    )


def run_rows(backend: Backend, names: list[str], rows: list[np.ndarray], rhos: list[float]) -> list[list]:
    """Each row's (main output, kept counts, survival depth) from one run of ``rows`` padded to the
    longest, cut to its own tokens where an output has a token axis."""
    width = max(len(row) for row in rows)
    values = padded_feeds(rows, rhos, width)
    outputs = backend.run({name: values[name] for name in names})
    return per_row([output for output in outputs if output is not None], rows, width)


@pytest.mark.parametrize("side", sorted(SIDES))
@pytest.mark.parametrize("backend_name", sorted(BACKENDS))
@pytest.mark.parametrize("task", ["embedding", "classification", "qa", "summarization"])
def test_a_row_gets_the_same_bits_alone_and_in_any_batch(
    tiny_models: dict[str, Path], task: str, backend_name: str, side: str
) -> None:
    backend = backend_for(tiny_models[task], BACKENDS[backend_name])
    names = [spec.name for spec in task_spec(task).inputs]
    rows, rhos = texts(), list(SIDES[side])
    bound = TORCH_CPU_BOUND if backend_name == "torch" else 0.0
    bound = max(bound, SEQUENCE_HEAD_BOUND if task == "classification" else 0.0)
    try:
        batched = run_rows(backend, names, rows, rhos)
        reversed_batch = run_rows(backend, names, rows[::-1], rhos[::-1])[::-1]
        for i, (row, rho) in enumerate(zip(rows, rhos, strict=True)):
            alone = run_rows(backend, names, [row], [rho])[0]
            beside = run_rows(backend, names, [row, rows[-1]], [rho, rhos[-1]])[0]
            for other, how in (
                (batched[i], "in the batch"),
                (reversed_batch[i], "reversed"),
                (beside, "beside"),
            ):
                for index, (a, b) in enumerate(zip(alone, other, strict=True)):
                    same = a.shape == b.shape and (
                        np.array_equal(a, b) or (index == 0 and np.abs(a - b).max() <= bound)
                    )
                    where = f"{backend_name} {task} row {i} (length {LENGTHS[i]}, rho {rho}) {how}"
                    assert same, f"{where}: output {index}"
    finally:
        backend.close()
