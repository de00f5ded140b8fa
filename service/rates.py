"""Event rates, shared by the scheduler (requests arriving, ``service.scheduling.cost``) and the HTTP layer
(requests answered, the refusal hold's budget: ``service.api.refusal``). Imports no other service module."""

from __future__ import annotations

import math


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
