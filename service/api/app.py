"""``create_app(settings)``: the FastAPI application. Settings are built once, here or by the caller."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, Depends, FastAPI
from fastapi.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.deps import LATENCY_TARGET_HEADER, TIMEOUT_HEADER, require_admin_key, require_api_key
from service.api.early import hint, refusal
from service.api.faces import FACES
from service.api.loop_lag import probe_loop_lag
from service.api.refusal import RefusalHold, send_error
from service.api.routers import admin, explorer, health, models
from service.api.routers import metrics as metrics_router
from service.api.routers.common import route_task
from service.api.routers.tasks import task_router
from service.errors import PayloadTooLarge, install_error_handlers
from service.metrics import Metrics, status_class
from service.server import ModelServer
from service.serving import Server
from service.settings import Settings

log = logging.getLogger("service")

API_DESCRIPTION = """Adaptive Retention: encoder Transformers that prune tokens inside the network.
Every inference request picks a budget **rho** in (0, 1] (fraction of real tokens kept at the last
layer; rho = 1 is exactly the dense model) or `rho=auto` (the server holds a latency target).
Every response reports `usage` and the headers `x-rho-effective`, `x-queue-time`, `x-inference-time`."""


def endpoint_label(scope: Scope) -> str:
    """Bounded label: the matched route template without the leading slash, else 'other'."""
    path = getattr(scope.get("route"), "path", None)
    if not isinstance(path, str):
        return "other"
    return path.strip("/") or "root"


def task_paths() -> dict[str, str]:
    """Path -> task of every inference route (what early refusal reads a request's task from)."""
    paths = {face.path: face.task for face in FACES.values()}
    for face in FACES.values():
        paths.update(dict.fromkeys(face.companion_paths, face.task))
    return paths


class RequestMiddleware:
    """Pure ASGI: arrival time, early refusal (429 from the request line and headers, before the body:
    ``service.api.early``), body size limit (413), the hold of every 429 (``service.api.refusal``),
    in-flight gauge, request count and latency (by endpoint and the task the route serves)."""

    def __init__(self, app: ASGIApp, settings: Settings, metrics: Metrics, server: Server) -> None:
        self.app = app
        self.settings = settings
        self.metrics = metrics
        self.server = server
        self.tasks = task_paths()
        self.holds = RefusalHold(settings)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.monotonic()
        scope.setdefault("state", {})["start"] = start
        status = 500
        self.metrics.in_flight.inc()

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                if status < 300 and scope.get("path") in self.tasks:
                    self.holds.answered(time.monotonic())
                if status == 429:
                    headers = list(message.get("headers") or [])
                    await self.holds.hold(headers)
                    if self.holds.close:
                        message = {**message, "headers": [*headers, (b"connection", b"close")]}
            await send(message)

        labels: dict[str, str] | None = None
        try:
            if await self._refused_early(scope, start, send_wrapper):
                path = str(scope.get("path", ""))
                labels = {"endpoint": path.strip("/"), "task": self.tasks[path]}
                return
            limited = await self._limited(scope, receive, send_wrapper)
            if limited is not None:
                await self.app(scope, limited, send_wrapper)
        finally:
            self.metrics.in_flight.dec()
            labels = labels or {"endpoint": endpoint_label(scope), "task": route_task(scope.get("route"))}
            self.metrics.requests.labels(**labels, status_class=status_class(status)).inc()
            self.metrics.request_duration.labels(**labels).observe(time.monotonic() - start)

    async def _refused_early(self, scope: Scope, arrival: float, send: Send) -> bool:
        """Answer 429 now, before the body is read, when even a minimal request of this kind would be late
        (``service.api.early``). False: the request goes on."""
        if not self.settings.early_refusal or not self.settings.admission_control:
            return False
        found = hint(scope, self.tasks, self.settings, arrival)
        error = refusal(self.server, found) if found is not None else None
        if error is None:
            return False
        self.metrics.rejections.labels(reason=error.reason).inc()
        self.metrics.shed.labels(reason=error.reason).inc()
        await send_error(send, str(scope.get("path", "")), error)
        return True

    async def _limited(self, scope: Scope, receive: Receive, send: Send) -> Receive | None:
        """Reject bodies over ``max_body_bytes`` before the app reads them; returns None when rejected."""
        limit = self.settings.max_body_bytes
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None:
            try:
                too_large = int(declared) > limit
            except ValueError:
                too_large = False
            if too_large:
                await self._reject(scope, send)
                return None
            return receive
        if scope.get("method") in ("GET", "HEAD", "OPTIONS"):
            return receive
        # No Content-Length (chunked): buffer up to the limit, then replay.
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return receive
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                await self._reject(scope, send)
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return replay

    async def _reject(self, scope: Scope, send: Send) -> None:
        self.metrics.rejections.labels(reason="payload_too_large").inc()
        message = f"request body larger than {self.settings.max_body_bytes} bytes"
        await send_error(send, str(scope.get("path", "")), PayloadTooLarge(message))


def _install_sighup(server: ModelServer) -> bool:
    """SIGHUP reloads the models (as POST /admin/reload does, when mounted). Only possible when the loop
    runs in the main thread."""
    loop = asyncio.get_running_loop()
    tasks: set[asyncio.Task[Any]] = set()

    def on_hup() -> None:
        log.info("SIGHUP: reloading models")
        task = loop.create_task(server.reload())
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    try:
        loop.add_signal_handler(signal.SIGHUP, on_hup)
    except (RuntimeError, ValueError, NotImplementedError, AttributeError):
        return False
    return True


def inference_routers() -> list[APIRouter]:
    """One route per task with an HTTP face (``service.api.faces``, in registry order; the generic
    handler's unless the face builds its own), then each face's companions (the embedding's: OpenAI's
    /v1/embeddings and TEI's /, /info and /tokenize): the registered tasks decide which routes mount."""
    routers = [(face.router or task_router)(face) for face in FACES.values()]
    return routers + [companion for face in FACES.values() for companion in face.companions]


def mount_routers(app: FastAPI, settings: Settings) -> list[APIRouter]:
    """Mount the routers the settings ask for; returns them. The API routes need the API key only when
    one is set; the admin routes exist only with an admin key (model control is opt-in) and need it."""
    api_auth = [Depends(require_api_key)] if settings.api_key is not None else []
    mounted: list[tuple[APIRouter, list[Any]]] = [
        *((router, api_auth) for router in (*inference_routers(), models.router)),
        (health.router, []),
        (metrics_router.router, []),
        (explorer.router, []),  # a static page: it asks for the API key and sends it with its calls
    ]
    if settings.admin_api_key is not None:
        mounted.append((admin.router, [Depends(require_admin_key)]))
    for router, dependencies in mounted:
        app.include_router(router, dependencies=dependencies)
    return [router for router, _ in mounted]


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    metrics = Metrics()
    server = ModelServer(settings, metrics)  # the composition root: the one place it is built

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async def first_load() -> None:
            try:
                report = await server.load_all()
                log.info("models loaded: %s; errors: %s", report.loaded, report.errors)
            except Exception:
                log.exception("initial model load failed")
                server.started = True

        load_task = asyncio.create_task(first_load())
        lag_probe = asyncio.create_task(probe_loop_lag(metrics.event_loop_lag))
        sighup = _install_sighup(server)
        try:
            yield
        finally:
            lag_probe.cancel()
            if sighup:
                with contextlib.suppress(Exception):
                    asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
            await load_task
            await server.close()

    app = FastAPI(
        title="Adaptive Retention",
        version="0.1.0",
        description=API_DESCRIPTION,
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.server = server
    install_error_handlers(app)

    mounted = mount_routers(app, settings)
    metrics.init_endpoints(
        [
            *(
                (endpoint_label({"route": route}), route_task(route))
                for router in mounted
                for route in router.routes
            ),
            ("other", ""),
        ]
    )
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type", TIMEOUT_HEADER, LATENCY_TARGET_HEADER],
            expose_headers=[
                "x-rho-effective",
                "x-rho-reason",
                "x-predicted-wait",
                "x-queue-time",
                "x-inference-time",
                "x-model",
                "Retry-After",
            ],
        )
    app.add_middleware(RequestMiddleware, settings=settings, metrics=metrics, server=server)
    return app
