"""A request as the batcher queues it (``Job``), rho=auto's bounds (``AutoBudget``) and what the request
gets back (``JobResult``)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import numpy as np

from retention_core.codecs.base import Row
from service.scheduling.admission import Pending, RhoReason


@dataclass(frozen=True)
class AutoBudget:
    """A rho=auto request: its rho is chosen in [min_rho, max_rho] when its batch is formed."""

    min_rho: float
    max_rho: float  # auto_max_rho (or min_rho, when that is higher)
    due: float  # time.monotonic() by which it should be answered: arrival + its latency target


@dataclass
class JobResult:
    outputs: list[np.ndarray]  # first graph output per row, unpadded
    kept_counts: np.ndarray  # (R, L) int64
    queue_time: float  # enqueue -> start of the first run holding its rows
    inference_time: float  # that start -> end of the last run holding its rows
    rho: float  # the rho its rows were served at
    rho_reason: RhoReason | None = None  # rho=auto: why that rho
    predicted_wait: float = 0.0  # admission's predicted wait for the work queued ahead
    depths: list[np.ndarray] | None = None  # survival depth (T_i,) per row; None: the graph has none


# One row's results: its first graph output, its kept counts (L,), its survival depth (T,) if any.
RowResult = tuple[np.ndarray, np.ndarray, np.ndarray | None]


@dataclass
class Job:
    rows: list[Row]
    rho: float  # fixed: the request's; rho=auto: its max_rho until the batch it joins is formed
    future: asyncio.Future[JobResult]
    deadline: float  # time.monotonic()
    auto: AutoBudget | None = None
    tokens: int = 0  # padded tokens (shape lengths) of its rows
    length: int = 0  # real tokens of its mean row (the kept-token floor raises short rows' work)
    enqueued: float = field(default_factory=time.monotonic)
    cancelled: bool = False
    reason: RhoReason | None = None
    predicted_wait: float = 0.0

    @property
    def min_rho(self) -> float:
        """The lowest rho this job may still get."""
        return self.auto.min_rho if self.auto is not None else self.rho

    @property
    def due(self) -> float:
        return min(self.deadline, self.auto.due) if self.auto is not None else self.deadline

    def pending(self) -> Pending:
        """The job as the rho controller sees it."""
        if self.auto is not None:
            return Pending(self.tokens, self.auto.min_rho, self.auto.max_rho, self.due, True, self.length)
        return Pending(self.tokens, self.rho, self.rho, self.due, False, self.length)
