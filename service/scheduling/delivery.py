"""Answering each job of a batch as soon as the runs holding its rows are done."""

from __future__ import annotations

import numpy as np

from service.scheduling.jobs import Job, JobResult, RowResult


class Delivery:
    """Answers each job of a batch as soon as every run holding one of its rows is done, instead of when
    the whole batch is: a batch is cut into several runs (``plan_runs``), and a short request in the first
    run should not wait for the long rows of the last one. Lives on the event loop (``add`` is called
    there, once per run, in run order)."""

    def __init__(self, jobs: list[Job], start: float) -> None:
        self.jobs = jobs
        self.start = start  # the batch's first run began
        self.owner = [j for j, job in enumerate(jobs) for _ in job.rows]  # row -> its job
        self.first_row = [0] * len(jobs)
        for j in range(1, len(jobs)):
            self.first_row[j] = self.first_row[j - 1] + len(jobs[j - 1].rows)
        self.missing = [len(job.rows) for job in jobs]
        self.results: list[RowResult | None] = [None] * len(self.owner)

    def add(self, done: list[tuple[int, RowResult]], end: float) -> None:
        for index, result in done:
            self.results[index] = result
            owner = self.owner[index]
            self.missing[owner] -= 1
            if self.missing[owner] == 0:
                self._answer(self.jobs[owner], self.first_row[owner], end)

    def _answer(self, job: Job, first: int, end: float) -> None:
        if job.future.done():
            return
        mine = [result for result in self.results[first : first + len(job.rows)] if result is not None]
        depths = [depth for _, _, depth in mine if depth is not None]
        job.future.set_result(
            JobResult(
                [output for output, _, _ in mine],
                np.stack([counts for _, counts, _ in mine]),  # (R, L)
                self.start - job.enqueued,
                end - self.start,
                rho=job.rho,
                rho_reason=job.reason,
                predicted_wait=job.predicted_wait,
                depths=depths if len(depths) == len(job.rows) else None,
            )
        )
