"""rho=auto under load: the cost model, the admission rule and the batch-time rho controller.

Pure: nothing here reads a clock or touches asyncio. Callers pass ``now`` (``time.monotonic()``), so
the unit tests drive every rule on a fake clock.

- ``CostModel``: seconds of one ONNX run, ``b0·runs + b1·tokens + b2·kept``, where ``tokens`` are the
  padded tokens ORT sees and ``kept`` the token-work the schedule keeps at each row's rho
  (``tokens · schedule_fraction(rho)``). Fitted online by exponentially weighted ridge least squares
  on the runs the batcher makes, so it follows the machine (other load, thermal state) within tens of
  runs; seeded by the warm-up so the first prediction is not zero.
- ``TailFactor``: the fit predicts the mean; this scales every prediction by a high quantile of how
  much longer recent batches actually ran, so admitted requests meet their targets at the tail.
- ``admit``: admission by predicted time in system. The work queued ahead is costed at the lowest rho
  each job may still get (a fixed rho, or an auto request's floor): if even that cannot finish this
  request by its due time (its deadline, or for rho=auto its latency target) it is refused at once
  with a Retry-After of the predicted drain time, instead of queueing and being served late.
- ``choose_batch_rho``: rho of the auto requests of a batch, decided when the batch is formed from
  the work then still queued: the highest rho on a grid at which every request still able to meet
  its due time (at the floor) meets it, and no higher than the arrival rate can be served at
  (``ArrivalRate``, ``sustainable_rho``).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, get_args

import numpy as np

from retention_core.contract import Schedule

# Candidate rhos of the controller (plus every job's own floor and ceiling).
RHO_GRID = (1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.25, 0.2, 0.15, 0.1, 0.05)
# rho values the cost model's per-token estimate is exported at (a metric label, so bounded).
EXPORTED_RHOS = (0.1, 0.3, 0.5, 0.7, 1.0)

# Why a request got its rho (usage.rho_reason).
RhoReason = Literal["requested", "default", "auto:idle", "auto:backlog", "auto:floor"]
REASON_REQUESTED: RhoReason = "requested"  # a number from the client
REASON_DEFAULT: RhoReason = "default"  # the model's default_rho (no rho sent)
REASON_IDLE: RhoReason = "auto:idle"  # rho=auto at its ceiling: the target holds without degrading
REASON_BACKLOG: RhoReason = "auto:backlog"  # lowered (above the floor) so the queued work meets its targets
REASON_FLOOR: RhoReason = "auto:floor"  # at min_rho: the target holds only there, or not even there
RHO_REASONS: tuple[RhoReason, ...] = get_args(RhoReason)


class KeptFraction(Protocol):
    """The share of a row's token-work its pruned layers do at ``rho``; ``length``: its real tokens
    (0: long enough that the kept-token floor never applies)."""

    def __call__(self, rho: float, length: int = 0, /) -> float: ...


def schedule_fraction(schedule: Schedule, rho: float, length: int = 0) -> float:
    """Mean kept fraction over the schedule's points at ``rho`` (``frac_p = rho^(((p+1)/P)^power)``):
    the share of a row's token-work its pruned layers do. A row of ``length`` real tokens keeps at least
    min(floor, length) of them at every point (the kept-token floor), so a short row costs the same at
    every rho: lowering rho buys nothing there."""
    points = schedule.num_points
    least = min(schedule.min_kept_tokens, length) / length if length > 0 else 0.0
    return sum(max(rho ** (((p + 1) / points) ** schedule.power), least) for p in range(points)) / points


def runs_for(tokens: float, max_batch_tokens: int) -> int:
    """ONNX runs ``tokens`` padded tokens take (at least one)."""
    return max(1, math.ceil(tokens / max_batch_tokens))


def tokens_through(cumulative: float, max_batch_tokens: int, fill: float) -> float:
    """Padded tokens of the runs up to the one that holds the last of ``cumulative`` queued tokens, that
    last run counted at least ``fill`` tokens full: requests arriving behind a job join its run until
    its batch forms, so under load a job's run ends as late as a full one (``fill``: recent batches)."""
    full = (runs_for(cumulative, max_batch_tokens) - 1) * max_batch_tokens
    return full + max(cumulative - full, min(fill, max_batch_tokens))


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


class CostModel:
    """Seconds of an ONNX run = ``b0·runs + b1·tokens + b2·kept``, learned online.

    Exponentially weighted ridge least squares: the sufficient statistics decay by ``forget`` per
    observed run, and a ridge term pulls toward the warm-up seed (worth ``prior_runs`` runs) so that
    directions the traffic never excites (e.g. the rho split while every request asks rho=1) keep the
    seed's proportions. Coefficients stay >= 0 (an active-set solve), so cost never falls as rho grows."""

    def __init__(
        self,
        fraction: KeptFraction,
        seed_seconds: float,
        seed_tokens: int,
        seed_rho: float = 1.0,
        forget: float = 0.9,
        prior_runs: float = 0.01,
    ) -> None:
        self.fraction = fraction
        self.forget = forget
        seed_kept = seed_tokens * fraction(seed_rho)
        seconds = max(seed_seconds, 1e-6)
        # Half of the seed run is per-run overhead, the rest per token, 30 % dense / 70 % kept work.
        self.prior = np.array([0.5 * seconds, 0.15 * seconds / seed_tokens, 0.35 * seconds / seed_kept])
        scale = np.array([1.0, float(seed_tokens), seed_kept])  # typical feature sizes
        self.ridge = prior_runs * np.diag(scale**2)
        self.gram = np.zeros((3, 3))  # Σ w·x·xᵀ
        self.moment = np.zeros(3)  # Σ w·x·y
        self.runs_observed = 0
        self.coefficients = self.prior.copy()
        self._floats = tuple(float(c) for c in self.coefficients)

    def features(self, runs: float, tokens: float, kept: float) -> np.ndarray:
        return np.array([runs, tokens, kept], dtype=np.float64)

    def observe(self, tokens: float, kept: float, seconds: float) -> None:
        """One ONNX run of ``tokens`` padded tokens and ``kept`` kept token-work took ``seconds``."""
        x = self.features(1.0, tokens, kept)
        self.gram = self.forget * self.gram + np.outer(x, x)
        self.moment = self.forget * self.moment + x * seconds
        self.runs_observed += 1
        self.coefficients = self._solve_nonnegative()
        self._floats = tuple(float(c) for c in self.coefficients)

    def _solve_nonnegative(self) -> np.ndarray:
        """The ridge solution with coefficients >= 0: solve, pin the most negative at 0, solve the rest
        again (an active set; three unknowns, so at most three solves)."""
        matrix = self.gram + self.ridge
        vector = self.moment + self.ridge @ self.prior
        free = [0, 1, 2]
        solution = np.zeros(3)
        while free:
            sub = np.linalg.solve(matrix[np.ix_(free, free)], vector[free])
            if (sub >= 0).all():
                solution[free] = sub
                break
            free.pop(int(np.argmin(sub)))
        return solution

    def predict(self, runs: float, tokens: float, kept: float) -> float:
        # plain floats: the controller calls this once per queued job and candidate
        b0, b1, b2 = self._floats
        return b0 * runs + b1 * tokens + b2 * kept

    def seconds(self, tokens: float, rho: float, max_batch_tokens: int) -> float:
        """Predicted seconds of ``tokens`` padded tokens all at ``rho``."""
        return self.predict(runs_for(tokens, max_batch_tokens), tokens, tokens * self.fraction(rho))

    def per_token(self, rho: float) -> float:
        """Marginal seconds per padded token at ``rho`` (what the metrics export)."""
        return float(self.coefficients[1] + self.coefficients[2] * self.fraction(rho))

    @property
    def per_run(self) -> float:
        return float(self.coefficients[0])


class TailFactor:
    """How much longer batches run than the cost model predicted, at a high quantile of the recent ones.

    The cost model fits the mean; on shared cores under overload a batch often takes several times that
    (tokenizing, HTTP and the load generator take turns on the same cores). Admission and the controller
    scale their predictions by this factor, so that the requests they admit against a latency target
    meet it at the tail and not only on average. Never below 1: a model that over-predicts is corrected
    by its own fit, not by a factor that would admit more than the fit says."""

    def __init__(self, window: int = 64, quantile: float = 0.9, min_batches: int = 8, ceiling: float = 10.0):
        self.ratios: deque[float] = deque(maxlen=window)
        self.quantile = quantile
        self.min_batches = min_batches
        self.ceiling = ceiling
        self.value = 1.0

    def observe(self, predicted_s: float, actual_s: float) -> None:
        """One batch predicted to take ``predicted_s`` took ``actual_s``."""
        self.ratios.append(actual_s / max(predicted_s, 1e-6))
        if len(self.ratios) < self.min_batches:
            return
        ordered = sorted(self.ratios)
        index = min(len(ordered) - 1, math.ceil(self.quantile * len(ordered)) - 1)
        self.value = min(self.ceiling, max(1.0, ordered[index]))


class ArrivalRate:
    """Requests per second arriving, an exponential-kernel estimate with time constant ``tau_s``:
    ``Σ exp(-(now - t_i) / tau) / tau`` over the arrival times ``t_i``. What the queue alone cannot show
    at the start of a flood: a batch formed from a short queue while requests pour in behind it."""

    def __init__(self, tau_s: float = 0.5) -> None:
        self.tau_s = tau_s
        self.mass = 0.0  # Σ exp(-(last - t_i) / tau)
        self.last = -math.inf

    def observe(self, now: float) -> None:
        self.mass = self.mass * math.exp(-(now - self.last) / self.tau_s) + 1.0 if self.mass else 1.0
        self.last = now

    def value(self, now: float) -> float:
        if not self.mass:
            return 0.0
        return self.mass * math.exp(-max(0.0, now - self.last) / self.tau_s) / self.tau_s


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
    """One queued request as the controller sees it. Fixed rho: ``floor == ceiling == rho``."""

    tokens: int  # padded tokens of its rows
    floor: float  # lowest rho it may get
    ceiling: float  # highest rho it may get
    due: float  # time.monotonic() by which it should be done (deadline, or the auto target)
    auto: bool
    length: int = 0  # real tokens of its (mean) row, for the kept-token floor; 0: long rows


def rho_for(job: Pending, candidate: float) -> float:
    return job.ceiling if not job.auto else min(job.ceiling, max(job.floor, candidate))


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

    def lost_at_floor(self, now: float) -> set[int]:
        """Jobs (indices over batch + queued) that miss their due time even with every auto at its
        floor: they must not pull everyone else down to the floor for nothing."""
        ends = self.ends(now, lambda job: job.floor)
        return {i for i, (job, end) in enumerate(zip(self.jobs, ends, strict=True)) if end > job.due}


@dataclass(frozen=True)
class BatchRho:
    candidate: float  # the rho auto jobs were clamped to
    lowered: bool  # below the highest ceiling of the batch's auto jobs
    lost: frozenset[int] = frozenset()  # batch jobs late even at their floor: served there, cheapest

    def rhos(self, batch: Sequence[Pending]) -> list[float]:
        """The rho of each job of the batch."""
        return [
            job.floor if job.auto and i in self.lost else rho_for(job, self.candidate)
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
    load_ceiling: float = 1.0,
) -> BatchRho:
    """The highest rho (grid, floors and ceilings) at which the batch and the queue behind it meet the
    due times of every job that can still meet its own at the floor, every predicted duration scaled
    by ``factor`` (``TailFactor``). Auto jobs get it clamped to their [floor, ceiling]; without any
    feasible candidate, the floor. Batch jobs already late even at their floor are served at it
    (``lost``): the least late they can be. ``shedding`` (admission refused requests just now): every
    auto job at its floor, whatever the queue allows, so that compute is degraded before anyone else is
    turned away (above its floor a job spends capacity the next arrivals are refused for).
    ``load_ceiling`` (``sustainable_rho`` of the recent arrival rate): no candidate above it, however
    short the queue — at the start of a flood the queue is short while requests pour in behind it."""
    autos = [job for job in batch if job.auto]
    if not autos:
        return BatchRho(1.0, False)
    bottom = min(job.floor for job in (*autos, *(j for j in queued if j.auto)))
    highest = max(job.ceiling for job in autos)
    top = max(bottom, min(load_ceiling, highest))  # the arrival rate's ceiling, never below a floor
    edges = {job.floor for job in autos} | {job.ceiling for job in autos}
    if shedding:
        return BatchRho(bottom, bottom < highest)
    candidates = sorted({rho for rho in (*RHO_GRID, *edges) if bottom <= rho <= top}, reverse=True)
    backlog = Backlog(batch, queued, cost, max_batch_tokens, factor)
    lost = backlog.lost_at_floor(now)
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
    if rho >= job.ceiling:
        return REASON_IDLE
    return REASON_FLOOR if rho <= job.floor else REASON_BACKLOG
