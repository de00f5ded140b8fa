"""A request as the batcher queues it (``Job``), with rho=auto's bounds (``service.serving.AutoBudget``);
what the request gets back is a ``service.serving.InferenceResult``."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import numpy as np

from retention_core.codecs.base import Row
from service.scheduling.admission import Pending
from service.serving import AutoBudget, InferenceResult, RhoReason, due_at

# One row's results: its first graph output, its kept counts (L,), its survival depth (T,) if any.
RowResult = tuple[np.ndarray, np.ndarray, np.ndarray | None]


@dataclass
class Job:
    rows: list[Row]
    rho: float  # fixed: the request's; rho=auto: its max_rho until the batch it joins is formed
    future: asyncio.Future[InferenceResult]
    deadline: float  # time.monotonic()
    auto: AutoBudget | None = None
    tokens: int = 0  # padded tokens (shape lengths) of its rows
    length: int = 0  # real tokens of its mean row (the kept-token floor raises short rows' work)
    enqueued: float = field(default_factory=time.monotonic)
    cancelled: bool = False
    reason: RhoReason | None = None
    predicted_wait: float = 0.0
    # A job with more rows than one batch holds is served across batches (``Slice``), interleaved with
    # the jobs that arrive meanwhile. ``tokens`` then counts only the rows not yet taken.
    taken: int = 0  # rows handed to a batch so far
    rho_chosen: bool = False  # rho=auto: its first batch chose its rho; every later slice keeps it
    resumed: bool = False  # part of it ran in the last batch: the next batch serves the arrivals first
    started: float | None = None  # its first batch began
    results: list[RowResult | None] = field(default_factory=list)  # per row, filled as its runs finish
    answered_rows: int = 0

    @property
    def open_auto(self) -> bool:
        """rho=auto with its rho still to be chosen."""
        return self.auto is not None and not self.rho_chosen

    @property
    def min_rho(self) -> float:
        """The lowest rho this job may still get."""
        return self.auto.min_rho if self.auto is not None and self.open_auto else self.rho

    @property
    def due(self) -> float:
        return due_at(self.deadline, self.auto.due if self.auto is not None else None)

    @property
    def by_target(self) -> bool:
        """Its rho=auto target, not its deadline, is what a late answer would miss."""
        return self.due < self.deadline

    def pending(self, tokens: int | None = None) -> Pending:
        """The job (or ``tokens`` of it: a slice) as the rho controller sees it."""
        size = self.tokens if tokens is None else tokens
        if self.auto is not None and self.open_auto:
            return Pending(size, self.auto.min_rho, self.auto.max_rho, self.due, True, self.length)
        return Pending(size, self.rho, self.rho, self.due, False, self.length)


@dataclass(frozen=True)
class Slice:
    """Rows ``[begin, end)`` of a job, as one batch holds them (a whole job: all its rows)."""

    job: Job
    begin: int
    end: int
    tokens: int  # their padded tokens

    @classmethod
    def whole(cls, job: Job) -> Slice:
        return cls(job, job.taken, len(job.rows), job.tokens)

    @property
    def rows(self) -> list[Row]:
        return self.job.rows[self.begin : self.end]
