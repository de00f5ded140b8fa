"""Answering each job of a batch as soon as the runs holding its rows are done."""

from __future__ import annotations

import numpy as np

from service.scheduling.jobs import Job, RowResult, Slice
from service.serving import InferenceResult


class Delivery:
    """Answers each job of a batch as soon as every run holding one of its rows is done, instead of when
    the whole batch is: a batch is cut into several runs (``plan_runs``), and a short request in the first
    run should not wait for the long rows of the last one. A job served across batches (``Slice``) keeps
    its rows' results on itself and is answered when the last of them is in. Lives on the event loop
    (``add`` is called there, once per run, in run order)."""

    def __init__(self, slices: list[Slice], start: float) -> None:
        self.start = start  # the batch's first run began
        # batch row -> (its job, its row in the job)
        self.owner = [(piece.job, row) for piece in slices for row in range(piece.begin, piece.end)]
        self.undelivered = len(self.owner)  # the batch's rows whose results have not reached the loop
        for piece in slices:
            job = piece.job
            if job.started is None:
                job.started = start
            if not job.results:
                job.results = [None] * len(job.rows)

    @property
    def answered(self) -> bool:
        """Every row of the batch has its result (the worker thread may still be closing the batch; a job
        served across batches may still have rows queued)."""
        return self.undelivered == 0

    def add(self, done: list[tuple[int, RowResult]], end: float) -> None:
        self.undelivered -= len(done)
        for index, result in done:
            job, row = self.owner[index]
            job.results[row] = result
            job.answered_rows += 1
            if job.answered_rows == len(job.rows):
                self._answer(job, end)

    def _answer(self, job: Job, end: float) -> None:
        if job.future.done():
            return
        mine = [result for result in job.results if result is not None]
        depths = [depth for _, _, depth in mine if depth is not None]
        started = job.started if job.started is not None else self.start
        job.future.set_result(
            InferenceResult(
                [output for output, _, _ in mine],
                np.stack([counts for _, counts, _ in mine]),  # (R, L)
                started - job.enqueued,
                end - started,
                rho=job.rho,
                rho_reason=job.reason,
                predicted_wait=job.predicted_wait,
                depths=depths if len(depths) == len(job.rows) else None,
            )
        )
        job.results = []  # the rows' outputs now live in the answer only
