"""How a refusal is sent from the ASGI middleware: the error body of ``service.errors`` (one mapping,
OpenAI's shape under ``/v1/``) written straight to ``send``, and the bounded hold of a 429.

Holding a 429 open before answering it slows a client that retries as soon as it is answered: a loop
that retries 50 ms after each 429 sends one request per hold instead of twenty a second. An
``asyncio.sleep`` costs the server a connection and a few hundred bytes, not a core.

How long: ``refusal_hold_s`` (never past the 429's ``Retry-After``) while refusals are few. Under a
storm the hold grows with the number of refusals held now, so that the clients held come back at most
``refusal_retry_budget_per_s`` times a second in all (Little's law: the rate they return at is
held / hold): with 3,000 clients retrying, a 1 s hold lets 3,000 requests a second be parsed only to
be refused, and those parses take the core the accepted requests need. Bounded by
``max_refusal_hold_s`` (under the clients' timeouts) and by ``max_held_refusals`` (the rest are
answered at once), so the hold never costs more than a bounded number of sockets for a bounded time.

The budget also follows the server's speed (``refusals_per_answer``): a refusal parsed costs the event
loop about an answer's HTTP work without the model's, so a fixed 200 a second is a small share of a fast
core and most of a slow one (profiled on half a core: the 200 refusals a second took the time the model
needed, and ``rho=auto`` answered below fixed ρ 0.3; docs/experiments/2026-11-29-retry-storm-budget.md).
The held clients may return at most ``refusals_per_answer`` times the rate the server answers at
(an exponential-kernel estimate over ``ANSWER_RATE_TAU_S``), within the fixed budget and a floor.
"""

from __future__ import annotations

import asyncio
import json
import time

from starlette.types import Send

from service.errors import ServiceError, error_payload
from service.rates import ArrivalRate
from service.settings import Settings

ANSWER_RATE_TAU_S = 2.0  # the answered rate the budget follows: a few batches' worth, not one


async def send_error(send: Send, path: str, error: ServiceError) -> None:
    """``error`` as a complete JSON response (its status, code, message and headers)."""
    body = error_payload(path, error.status, error.code, error.message, param=error.param)
    payload = json.dumps(body).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(payload)).encode()),
        *((name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in error.headers.items()),
    ]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


def retry_after_of(headers: list[tuple[bytes, bytes]]) -> float | None:
    """The whole seconds of a response's ``Retry-After`` (None when absent or not a number)."""
    for name, value in headers:
        if name.lower() == b"retry-after":
            try:
                return float(int(value))
            except ValueError:
                return None
    return None


class RefusalHold:
    """Holds 429s: ``refusal_hold_s`` (at most their Retry-After), longer under a storm (module doc),
    ``max_held_refusals`` at a time."""

    def __init__(self, settings: Settings) -> None:
        self.hold_s = settings.refusal_hold_s
        self.capacity = settings.max_held_refusals
        self.retry_budget_per_s = settings.refusal_retry_budget_per_s
        self.min_retry_budget_per_s = min(settings.min_refusal_retry_budget_per_s, self.retry_budget_per_s)
        self.refusals_per_answer = settings.refusals_per_answer
        self.max_hold_s = settings.max_refusal_hold_s
        self.close = settings.refusal_connection_close
        self.held = 0  # refusals being held now
        self.answers = ArrivalRate(ANSWER_RATE_TAU_S)  # inference requests answered (2xx) a second

    def answered(self, now: float) -> None:
        """An inference request was answered: the rate the storm's budget follows."""
        self.answers.observe(now)

    def budget_per_s(self, now: float) -> float:
        """How often a second the held clients may come back in all: the fixed budget, or with
        ``refusals_per_answer`` that many per request answered a second, within [floor, fixed]."""
        if self.refusals_per_answer <= 0:
            return self.retry_budget_per_s
        following = self.refusals_per_answer * self.answers.value(now)
        return min(self.retry_budget_per_s, max(self.min_retry_budget_per_s, following))

    def seconds(self, headers: list[tuple[bytes, bytes]], now: float | None = None) -> float:
        """How long a 429 with ``headers`` is held now: the setting (never past its Retry-After), or
        under a storm as long as keeps the held clients' return rate within the budget (capped)."""
        if self.hold_s <= 0:
            return 0.0
        retry_after = retry_after_of(headers)
        calm = self.hold_s if retry_after is None else min(self.hold_s, retry_after)
        budget = self.budget_per_s(time.monotonic() if now is None else now)
        storm = (self.held + 1) / budget  # this refusal included
        return max(calm, min(storm, self.max_hold_s))

    async def hold(self, headers: list[tuple[bytes, bytes]]) -> None:
        seconds = self.seconds(headers)
        if seconds <= 0 or self.held >= self.capacity:
            return
        self.held += 1
        try:
            await asyncio.sleep(seconds)
        finally:
            self.held -= 1
