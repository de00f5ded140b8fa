"""rho=auto under load: the admission rule and the batch-time rho controller.

Pure: nothing here reads a clock or touches asyncio. Callers pass ``now`` (``time.monotonic()``), so
the unit tests drive every rule on a fake clock. Durations come from the learned cost model
(``service.scheduling.cost``).

- ``admit``: admission by predicted time in system. The work queued ahead is costed at the lowest rho
  each job may still get (a fixed rho, or an auto request's ``min_rho``): if even that cannot finish
  this request by its due time (its deadline, or for rho=auto its latency target) it is refused at once
  with a Retry-After of the predicted drain time, instead of queueing and being served late.
- ``choose_batch_rho``: rho of the auto requests of a batch, decided when the batch is formed from
  the work then still queued: the highest rho on a grid at which every request still able to meet
  its due time (at its ``min_rho``) meets it, and no higher than the arrival rate can be served at
  (``ArrivalRate``, ``sustainable_rho``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from service.scheduling.cost import CostModel, runs_for
from service.serving import REASON_BACKLOG, REASON_IDLE, REASON_MIN_RHO, RhoReason

# Candidate rhos of the controller (plus every job's own min_rho and max_rho).
RHO_GRID = (1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.25, 0.2, 0.15, 0.1, 0.05)


def run_groups(tokens: Sequence[int], max_batch_tokens: int) -> list[tuple[int, int]]:
    """How the batcher will cut a queue into batches (arrival order, up to the token budget, at least
    one job each): ``(begin, end)`` job indices of each batch."""
    groups: list[tuple[int, int]] = []
    begin, total = 0, 0
    for index, size in enumerate(tokens):
        if index > begin and total + size > max_batch_tokens:
            groups.append((begin, index))
            begin, total = index, 0
        total += size
    if begin < len(tokens):
        groups.append((begin, len(tokens)))
    return groups


def sustainable_rho(rate: float, seconds_per_request: Callable[[float], float], cap: float = 1.0) -> float:
    """The highest rho on the grid at which requests arriving at ``rate`` keep the model busy at most
    ``cap`` of the time (``rate · seconds_per_request(rho) <= cap``); the grid's lowest without one. Above
    it the queue grows whatever the queue is now."""
    for rho in RHO_GRID:
        if rate * seconds_per_request(rho) <= cap:
            return rho
    return RHO_GRID[-1]


@dataclass(frozen=True)
class Verdict:
    admit: bool
    predicted_s: float  # predicted time from now to this request's end (wait + own run), lowest rho
    wait_s: float  # predicted time until the work ahead of it is done
    retry_after_s: int  # for a refusal: whole seconds until the work ahead is predicted to drain


def admit(now: float, due: float, wait_s: float, own_s: float, idle: bool) -> Verdict:
    """Admit when ``now + wait_s + own_s <= due``. An idle model (nothing queued or running) always
    admits: the request cannot be served sooner, and refusing it would refuse it forever."""
    predicted = wait_s + own_s
    ok = idle or now + predicted <= due
    retry = max(1, math.ceil(wait_s))
    return Verdict(ok, predicted, wait_s, 0 if ok else retry)


@dataclass(frozen=True)
class Pending:
    """One queued request as the controller sees it. Fixed rho: ``min_rho == max_rho == rho``."""

    tokens: int  # padded tokens of its rows
    min_rho: float  # lowest rho it may get
    max_rho: float  # highest rho it may get
    due: float  # time.monotonic() by which it should be done (deadline, or the auto target)
    auto: bool
    length: int = 0  # real tokens of its (mean) row, for the kept-token floor; 0: long rows


def rho_for(job: Pending, candidate: float) -> float:
    return job.max_rho if not job.auto else min(job.max_rho, max(job.min_rho, candidate))


@dataclass(frozen=True)
class Backlog:
    """What the controller predicts over: the batch being formed, the queue behind it (in order), the
    cost model, the batcher's token budget and the tail factor every predicted duration is scaled by."""

    batch: Sequence[Pending]
    queued: Sequence[Pending]
    cost: CostModel
    max_batch_tokens: int
    factor: float = 1.0

    @property
    def jobs(self) -> list[Pending]:
        return [*self.batch, *self.queued]

    def ends(self, now: float, rho_of: Callable[[Pending], float]) -> list[float]:
        """Predicted end of every job (batch, then queue in order) with rhos from ``rho_of``: the batch
        as one step, then the queue cut into batches as the batcher will cut it; a job ends with its
        batch."""
        cost, budget = self.cost, self.max_batch_tokens
        ends: list[float] = []
        tokens = 0.0
        kept = 0.0
        groups = [self.batch] + [
            self.queued[begin:end] for begin, end in run_groups([j.tokens for j in self.queued], budget)
        ]
        for members in groups:
            tokens += sum(job.tokens for job in members)
            kept += sum(job.tokens * cost.fraction(rho_of(job), job.length) for job in members)
            seconds = self.factor * cost.predict(runs_for(tokens, budget), tokens, kept)
            ends.extend([now + seconds] * len(members))
        return ends

    def meets(self, now: float, candidate: float, lost: set[int]) -> bool:
        """Whether every job not already ``lost`` ends by its due time with autos at ``candidate``."""
        ends = self.ends(now, lambda job: rho_for(job, candidate))
        return all(
            end <= job.due for i, (job, end) in enumerate(zip(self.jobs, ends, strict=True)) if i not in lost
        )

    def lost_at_min_rho(self, now: float) -> set[int]:
        """Jobs (indices over batch + queued) that miss their due time even with every auto at its
        min_rho: they must not pull everyone else down to min_rho for nothing."""
        ends = self.ends(now, lambda job: job.min_rho)
        return {i for i, (job, end) in enumerate(zip(self.jobs, ends, strict=True)) if end > job.due}


@dataclass(frozen=True)
class BatchRho:
    candidate: float  # the rho auto jobs were clamped to
    lowered: bool  # below the highest max_rho of the batch's auto jobs
    lost: frozenset[int] = frozenset()  # batch jobs late even at their min_rho: served there, cheapest

    def rhos(self, batch: Sequence[Pending]) -> list[float]:
        """The rho of each job of the batch."""
        return [
            job.min_rho if job.auto and i in self.lost else rho_for(job, self.candidate)
            for i, job in enumerate(batch)
        ]


def choose_batch_rho(
    now: float,
    batch: Sequence[Pending],
    queued: Sequence[Pending],
    cost: CostModel,
    max_batch_tokens: int,
    factor: float = 1.0,
    shedding: bool = False,
    load_max_rho: float = 1.0,
) -> BatchRho:
    """The highest rho (grid, min_rhos and max_rhos) at which the batch and the queue behind it meet
    the due times of every job that can still meet its own at its min_rho, every predicted duration
    scaled by ``factor`` (``TailFactor``). Auto jobs get it clamped to their [min_rho, max_rho]; without
    any feasible candidate, the lowest min_rho. Batch jobs already late even at their min_rho are served
    at it (``lost``): the least late they can be. ``shedding`` (admission refused requests just now):
    every auto job at its min_rho, whatever the queue allows, so that compute is degraded before anyone
    else is turned away (above its min_rho a job spends capacity the next arrivals are refused for).
    ``load_max_rho`` (``sustainable_rho`` of the recent arrival rate): no candidate above it, however
    short the queue — at the start of a flood the queue is short while requests pour in behind it."""
    autos = [job for job in batch if job.auto]
    if not autos:
        return BatchRho(1.0, False)
    bottom = min(job.min_rho for job in (*autos, *(j for j in queued if j.auto)))
    highest = max(job.max_rho for job in autos)
    top = max(bottom, min(load_max_rho, highest))  # the arrival rate's bound, never below a min_rho
    edges = {job.min_rho for job in autos} | {job.max_rho for job in autos}
    if shedding:
        return BatchRho(bottom, bottom < highest)
    candidates = sorted({rho for rho in (*RHO_GRID, *edges) if bottom <= rho <= top}, reverse=True)
    backlog = Backlog(batch, queued, cost, max_batch_tokens, factor)
    lost = backlog.lost_at_min_rho(now)
    lost_here = frozenset(i for i in lost if i < len(batch))
    # Lower rho only ends jobs earlier, so feasibility is monotone: binary search the descending list
    # for the first feasible candidate.
    low, high = 0, len(candidates)
    while low < high:
        middle = (low + high) // 2
        if backlog.meets(now, candidates[middle], lost):
            high = middle
        else:
            low = middle + 1
    if low == len(candidates):
        return BatchRho(bottom, True, lost_here)
    return BatchRho(candidates[low], candidates[low] < highest, lost_here)


def reason_for(job: Pending, rho: float) -> RhoReason:
    """usage.rho_reason of an auto job served at ``rho``."""
    if rho >= job.max_rho:
        return REASON_IDLE
    return REASON_MIN_RHO if rho <= job.min_rho else REASON_BACKLOG
