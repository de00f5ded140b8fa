"""What one backend run costs, learned online: the cost model, its tail factor, the arrival rate.

Pure: nothing here reads a clock or touches asyncio (callers pass ``now``, ``time.monotonic()``).

- ``CostModel``: seconds of one backend run, ``b0·runs + b1·tokens + b2·kept``, where ``tokens`` are the
  padded tokens the backend sees and ``kept`` the token-work the schedule keeps at each row's rho
  (``tokens · schedule_fraction(rho)``). Fitted online by exponentially weighted ridge least squares
  on the runs the batcher makes, so it follows the machine (other load, thermal state) within tens of
  runs; seeded by the warm-up so the first prediction is not zero.
- ``TailFactor``: the fit predicts the mean; this scales every prediction by a high quantile of how
  much longer recent batches actually ran, so admitted requests meet their targets at the tail.
- the arrival rate (``service.rates.ArrivalRate``, shared with the HTTP layer): requests per second
  arriving, what the queue alone cannot show at the start of a flood.

What a model's batcher does with them (seeding, learning from every batch, the metrics it publishes)
is ``service.scheduling.learning``.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Protocol

import numpy as np

from retention_core.contract import Schedule
from retention_core.schedule import mean_kept_fraction


class KeptFraction(Protocol):
    """The share of a row's token-work its pruned layers do at ``rho``; ``length``: its real tokens
    (0: long enough that the kept-token floor never applies)."""

    def __call__(self, rho: float, length: int = 0, /) -> float: ...


def schedule_fraction(schedule: Schedule, rho: float, length: int = 0) -> float:
    """The share of a row's token-work its pruned layers do at ``rho``: the mean kept fraction over the
    schedule's points, the kept-token floor applied for a row of ``length`` real tokens (0: unknown, no
    floor). The schedule's own statement, ``retention_core.schedule.mean_kept_fraction``."""
    return mean_kept_fraction(schedule, rho, length)


def runs_for(tokens: float, max_batch_tokens: int) -> int:
    """Runs ``tokens`` padded tokens take (at least one)."""
    return max(1, math.ceil(tokens / max_batch_tokens))


def tokens_through(cumulative: float, max_batch_tokens: int, fill: float) -> float:
    """Padded tokens of the runs up to the one that holds the last of ``cumulative`` queued tokens, that
    last run counted at least ``fill`` tokens full: requests arriving behind a job join its run until
    its batch forms, so under load a job's run ends as late as a full one (``fill``: recent batches)."""
    full = (runs_for(cumulative, max_batch_tokens) - 1) * max_batch_tokens
    return full + max(cumulative - full, min(fill, max_batch_tokens))


class CostModel:
    """Seconds of a backend run = ``b0·runs + b1·tokens + b2·kept``, learned online.

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
        """One run of ``tokens`` padded tokens and ``kept`` kept token-work took ``seconds``."""
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

    def __init__(self, window: int = 64, quantile: float = 0.9, min_batches: int = 8, cap: float = 10.0):
        self.ratios: deque[float] = deque(maxlen=window)
        self.quantile = quantile
        self.min_batches = min_batches
        self.cap = cap  # the largest factor: a broken prediction must not refuse everything
        self.value = 1.0

    def observe(self, predicted_s: float, actual_s: float) -> None:
        """One batch predicted to take ``predicted_s`` took ``actual_s``."""
        self.ratios.append(actual_s / max(predicted_s, 1e-6))
        if len(self.ratios) < self.min_batches:
            return
        ordered = sorted(self.ratios)
        index = min(len(ordered) - 1, math.ceil(self.quantile * len(ordered)) - 1)
        self.value = min(self.cap, max(1.0, ordered[index]))
