"""The ONNX Runtime side of a batch: the one worker thread per model, and the planned runs executed on it.

onnxruntime runs outside the event loop (a dedicated thread per model, so a model runs one batch at a
time and the loop stays free to accept, admit and answer requests). Each run's results are handed back
as soon as that run finishes (``RunDone``, ``service.scheduling.delivery``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from retention_core.codecs.base import Row
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


def ort_thread(model_name: str) -> ThreadPoolExecutor:
    """The model's one inference thread."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"ort-{model_name}")


def execute(
    model: LoadedModel,
    fraction: KeptFraction,
    rows: list[Row],
    rhos: list[float],
    lengths: list[int],
    runs: list[list[int]],
    run_done: RunDone,
) -> list[RunStats]:
    """Worker thread: every planned run through onnxruntime, each padded to its longest shape length;
    each run's results (by row index in the batch) handed to ``run_done`` as soon as it finishes."""
    stats = []
    for run in runs:
        length = max(lengths[i] for i in run)
        begin = time.perf_counter()
        outputs, counts, depths = model.run([rows[i] for i in run], [rhos[i] for i in run], length)
        seconds = time.perf_counter() - begin
        run_done(
            [
                (index, (outputs[slot], counts[slot], None if depths is None else depths[slot]))
                for slot, index in enumerate(run)
            ],
            time.monotonic(),
        )
        kept = length * sum(fraction(rhos[i], len(rows[i])) for i in run)
        stats.append(RunStats(len(run), len(run) * length, seconds, kept))
    return stats
