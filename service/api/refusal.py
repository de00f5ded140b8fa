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
"""

from __future__ import annotations

import asyncio
import json

from starlette.types import Send

from service.errors import ServiceError, error_payload
from service.settings import Settings


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
        self.max_hold_s = settings.max_refusal_hold_s
        self.close = settings.refusal_connection_close
        self.held = 0  # refusals being held now

    def seconds(self, headers: list[tuple[bytes, bytes]]) -> float:
        """How long a 429 with ``headers`` is held now: the setting (never past its Retry-After), or
        under a storm as long as keeps the held clients' return rate within the budget (capped)."""
        if self.hold_s <= 0:
            return 0.0
        retry_after = retry_after_of(headers)
        calm = self.hold_s if retry_after is None else min(self.hold_s, retry_after)
        storm = (self.held + 1) / self.retry_budget_per_s  # this refusal included
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
