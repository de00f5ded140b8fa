"""The app of ``create_app`` called in this process over ASGI: no socket, same bodies as over HTTP.

Ray Serve replicas use it for their health check (the app's own ``/readyz``), Ray Data actors for
every row (``clients.ray_batch``): everything goes through the public HTTP behaviour (faces, codecs,
the batcher by tokens, admission), so nothing here depends on the engine's internals.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from fastapi import FastAPI

# The base URL the in-process client sends with each request (never resolved: ASGI, no socket).
LOCAL_BASE_URL = "http://in-process"
READY_POLL_S = 0.05
# /readyz's status while the first load runs; any other non-200 status is final (no model, stopping).
LOADING = "loading"


class NotReadyError(RuntimeError):
    """The app is not ready: no model loaded, shutting down, or still loading past the wait."""


class InProcessApp:
    """httpx over ``ASGITransport`` to ``app``. Does not run the app's lifespan (see ``started``)."""

    def __init__(self, app: FastAPI, timeout_s: float = 600.0) -> None:
        self.app = app
        self.client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url=LOCAL_BASE_URL, timeout=timeout_s
        )

    async def request(
        self, method: str, path: str, params: dict[str, str] | None = None, json: Any = None
    ) -> httpx.Response:
        return await self.client.request(method, path, params=params, json=json)

    async def wait_ready(self, timeout_s: float) -> dict[str, Any]:
        """/readyz's body once it says ready; waits while the first load runs, up to ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            response = await self.request("GET", "/readyz")
            body: dict[str, Any] = response.json()
            if response.status_code == 200:
                return body
            if body.get("status") != LOADING or time.monotonic() > deadline:
                raise NotReadyError(f"not ready: {body.get('status')}")
            await asyncio.sleep(READY_POLL_S)

    async def aclose(self) -> None:
        await self.client.aclose()


@asynccontextmanager
async def started(app: FastAPI, ready_timeout_s: float) -> AsyncIterator[InProcessApp]:
    """Run the app's lifespan (model loading, batcher threads) and yield its client once it is ready."""
    async with app.router.lifespan_context(app):
        local = InProcessApp(app)
        try:
            await local.wait_ready(ready_timeout_s)
            yield local
        finally:
            await local.aclose()
