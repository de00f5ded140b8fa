"""The backend side of a batch: the one worker thread per model, and the planned runs executed on it.

The backend (onnxruntime or torch) runs outside the event loop (a dedicated thread per model, so a model
runs one batch at a time and the loop stays free to accept, admit and answer requests). Each run's
results are handed back as soon as that run finishes (``RunDone``, ``service.scheduling.delivery``).

A run the device cannot hold (``DeviceOutOfMemory``: CUDA out of memory) is split in halves and each
half retried, down to single rows; a single row that still does not fit is left unanswered and the
batch ends with ``RowsOutOfMemory`` after every other run was answered, so only the requests holding
such a row fail (503 with Retry-After: ``service.errors.DeviceMemoryExhausted``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from retention_core.codecs.base import Row
from retention_core.shapes import bucket
from service.backends import DeviceOutOfMemory
from service.runtime import LoadedModel
from service.scheduling.cost import KeptFraction
from service.scheduling.jobs import RowResult

# Rows a finished run answered, (row index in the batch, its result), and when it finished.
RunDone = Callable[[list[tuple[int, RowResult]], float], None]


@dataclass
class RunStats:
    rows: int
    padded_tokens: int
    seconds: float
    kept_work: float  # padded tokens x the schedule's kept fraction at each row's rho
    splits: int = 0  # out-of-memory retries of this run in smaller pieces


class RowsOutOfMemory(RuntimeError):
    """Rows of the batch (indices in it) that did not fit on the device even one at a time; every other
    row was answered."""

    def __init__(self, rows: list[int], stats: list[RunStats]) -> None:
        super().__init__(f"{len(rows)} rows did not fit on the device alone")
        self.rows = rows
        self.stats = stats  # the batch's runs, for the cost model and metrics


# (outputs per row, kept counts (R, L), depths per row or None) of one run
RunOutputs = tuple[list[np.ndarray], np.ndarray, list[np.ndarray] | None]


def inference_thread(model_name: str) -> ThreadPoolExecutor:
    """The model's one inference thread: every run of its backend goes through it."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"infer-{model_name}")


def execute(
    model: LoadedModel,
    fraction: KeptFraction,
    rows: list[Row],
    rhos: list[float],
    lengths: list[int],
    runs: list[list[int]],
    run_done: RunDone,
) -> list[RunStats]:
    """Worker thread: every planned run through the backend, each padded to its longest shape length;
    each run's results (by row index in the batch) handed to ``run_done`` as soon as it finishes (a run
    split after running out of device memory: as each piece finishes). Raises ``RowsOutOfMemory`` at the
    end when some single rows did not fit."""
    stats = []
    unfit: list[int] = []
    buckets = model.backend.buckets
    for run in runs:
        length = max(lengths[i] for i in run)
        begin = time.perf_counter()
        splits = run_fitting(model, rows, rhos, run, lengths, run_done, unfit)
        seconds = time.perf_counter() - begin
        kept = length * sum(fraction(rhos[i], len(rows[i])) for i in run)
        padded_rows = len(run) if buckets is None else bucket(len(run), buckets.batch)
        stats.append(RunStats(len(run), padded_rows * length, seconds, kept, splits))
    if unfit:
        raise RowsOutOfMemory(unfit, stats)
    return stats


def run_fitting(
    model: LoadedModel,
    rows: list[Row],
    rhos: list[float],
    run: list[int],
    lengths: list[int],
    run_done: RunDone,
    unfit: list[int],
) -> int:
    """One planned run, padded to its longest row; on ``DeviceOutOfMemory`` its two halves, recursively,
    down to single rows (those that still do not fit go to ``unfit``). Returns how many splits it took.
    Each piece is padded to its own longest row, not the run's: a short row split off a long one must not
    be refused for the long one's padding."""
    length = max(lengths[i] for i in run)
    try:
        outputs, counts, depths = model.run([rows[i] for i in run], [rhos[i] for i in run], length)
    except DeviceOutOfMemory:
        if len(run) == 1:
            unfit.extend(run)
            return 0
        middle = len(run) // 2
        first = run_fitting(model, rows, rhos, run[:middle], lengths, run_done, unfit)
        return 1 + first + run_fitting(model, rows, rhos, run[middle:], lengths, run_done, unfit)
    run_done(
        [
            (index, (outputs[slot], counts[slot], None if depths is None else depths[slot]))
            for slot, index in enumerate(run)
        ],
        time.monotonic(),
    )
    return 0
