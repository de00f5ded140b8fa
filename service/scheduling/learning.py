"""What one model's batcher knows of its costs, learns from every batch, and publishes.

Seeded by the model's warm-up run; after each batch the cost model learns every run of it and the tail
factor how far the batch ran past its prediction (``service.scheduling.cost``); both are then exported
as metrics. Also the arrival rate, which the rho controller reads."""

from __future__ import annotations

import functools

from service.metrics import EXPORTED_RHOS, Metrics
from service.rates import ArrivalRate
from service.runtime import LoadedModel
from service.scheduling.cost import (
    CostModel,
    KeptFraction,
    TailFactor,
    runs_for,
    schedule_fraction,
)
from service.scheduling.execution import RunStats

WARMUP_TOKENS = 32  # padded tokens of the warm-up run (2 short rows) that seeds the cost model


class ModelCosts:
    """One model's cost model, tail factor and arrival rate, with the kept-fraction of its schedule."""

    def __init__(
        self, model: LoadedModel, metrics: Metrics, max_batch_tokens: int, tail_quantile: float = 0.9
    ) -> None:
        self.name = model.name
        self.metrics = metrics
        self.max_batch_tokens = max_batch_tokens
        schedule, longest = model.manifest.schedule, model.manifest.max_length
        # keyed by (rho, real tokens capped at max_length): a few rho values x at most max_length lengths
        self.fraction: KeptFraction = functools.lru_cache(maxsize=8192)(
            lambda rho, length=0: schedule_fraction(schedule, rho, min(length, longest))
        )
        self.cost = CostModel(
            self.fraction, model.warmup_seconds, WARMUP_TOKENS, seed_rho=model.manifest.default_rho
        )
        self.tail = TailFactor(quantile=tail_quantile)
        self.arrivals = ArrivalRate()
        self.publish()

    def mean_seconds(self, tokens: float, kept: float) -> float:
        """The cost model's (mean) seconds of ``tokens`` padded tokens and ``kept`` token-work, cut into
        runs of at most ``max_batch_tokens``."""
        return self.cost.predict(runs_for(tokens, self.max_batch_tokens), tokens, kept)

    def tail_seconds(self, tokens: float, kept: float) -> float:
        """``mean_seconds`` scaled by the tail factor: what admission and the controller plan with."""
        return self.tail.value * self.mean_seconds(tokens, kept)

    def run_overhead_tokens(self, rhos: list[float]) -> float:
        """The fixed cost of one run in padded-token equivalents at the batch's mean rho (learned: the
        cost model's per-run over per-token seconds), so ``plan_runs`` trades padding for runs."""
        per_token = self.cost.per_token(sum(rhos) / len(rhos)) if rhos else 0.0
        if per_token <= 0.0:
            return 0.0
        return min(self.cost.per_run / per_token, float(self.max_batch_tokens))

    def learn(self, predicted_s: float, actual_s: float, runs: list[RunStats]) -> None:
        """A batch predicted (at the mean) to take ``predicted_s`` took ``actual_s`` over ``runs``."""
        self.tail.observe(predicted_s, actual_s)
        for run in runs:
            self.cost.observe(run.padded_tokens, run.kept_work, run.seconds)
        self.publish()

    def publish(self) -> None:
        per_token = {rho: self.cost.per_token(rho) for rho in EXPORTED_RHOS}
        self.metrics.record_cost_model(self.name, self.cost.per_run, per_token, self.tail.value)
