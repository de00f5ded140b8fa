"""How a refusal is sent from the ASGI middleware: the error body of ``service.errors`` (one mapping,
OpenAI's shape under ``/v1/``) written straight to ``send``, and the bounded hold of a 429.

Holding a 429 open before answering it (``refusal_hold_s``, never longer than its ``Retry-After``)
slows a client that retries as soon as it is answered: a loop that retries 50 ms after each 429 sends
one request per hold instead of twenty a second. An ``asyncio.sleep`` costs the server a connection
and a few hundred bytes, not a core; at most ``max_held_refusals`` are held at once, the rest are
answered at once, so the hold never costs more than a bounded number of sockets.
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
    """Holds 429s for ``refusal_hold_s`` (at most their Retry-After), ``max_held_refusals`` at a time."""

    def __init__(self, settings: Settings) -> None:
        self.hold_s = settings.refusal_hold_s
        self.capacity = settings.max_held_refusals
        self.close = settings.refusal_connection_close
        self.held = 0  # refusals being held now

    def seconds(self, headers: list[tuple[bytes, bytes]]) -> float:
        """How long a 429 with ``headers`` is held: the setting, never past its Retry-After."""
        retry_after = retry_after_of(headers)
        return self.hold_s if retry_after is None else min(self.hold_s, retry_after)

    async def hold(self, headers: list[tuple[bytes, bytes]]) -> None:
        seconds = self.seconds(headers)
        if seconds <= 0 or self.held >= self.capacity:
            return
        self.held += 1
        try:
            await asyncio.sleep(seconds)
        finally:
            self.held -= 1
