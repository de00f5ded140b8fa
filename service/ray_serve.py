"""The service on Ray Serve: ``create_app(settings)`` unchanged behind ``serve.ingress``, one per replica.

    serve run deploy/ray/serve_config.local.yaml   # from a checkout; a cluster: deploy/ray/serve_config.yaml
    serve run service.ray_serve:build_app models_dir=/mnt/models

Each replica builds its own app (late-bound ``__serve_build_asgi_app__``), so it owns one set of ONNX
Runtime sessions, its batcher and its admission control; Serve runs the app's lifespan in the replica
(model loading, batcher threads, drain on shutdown). Serve's ``check_health`` is the app's ``/readyz``:
the first check waits while the models load, so a replica takes traffic only once it is ready.

Settings come from ``RETENTION_*`` in the replica's environment (the Serve config's ``runtime_env``)
and from the application's ``args`` (they win): ``models_dir`` must be a path every node sees (a shared
volume, the same image path on every pod). Our ``/metrics`` through the proxy reaches one replica at
random, so each replica also serves its own registry on a side port and, when
``RETENTION_RAY_METRICS_SD_DIR`` is set (a directory Prometheus reads), writes a ``file_sd`` target
file there (deploy/prometheus/prometheus.yml, job ``retention-ray-replicas``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import ray
from ray import serve
from ray.serve import Application
from ray.util import get_node_ip_address
from starlette.middleware import Middleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.app import create_app
from service.errors import error_payload
from service.inprocess import InProcessApp
from service.settings import Settings

log = logging.getLogger("service.ray_serve")

METRICS_SD_DIR_ENV = "RETENTION_RAY_METRICS_SD_DIR"
# Set on every node (before `ray start`) so Serve's HTTP proxies load ``proxy_middlewares``.
PROXY_CALLBACK_ENV = "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"
PROXY_CALLBACK = "service.ray_serve:proxy_middlewares"
REPLICA_LOST_RETRY_AFTER_S = 1
# The first health check waits this long for the models to load; Serve's own timeout must exceed it.
READY_WAIT_S = 100.0
HEALTH_CHECK_TIMEOUT_S = 120.0
HEALTH_CHECK_PERIOD_S = 5.0
METRICS_SCRAPE_TIMEOUT_S = 10.0
# Autoscaling on ongoing requests per replica: a replica's own batcher fills batches from its queue,
# so a handful of requests in flight each keeps its ONNX session busy without queueing past targets.
TARGET_ONGOING_REQUESTS = 8
MAX_ONGOING_REQUESTS = 64
MIN_REPLICAS = 1
MAX_REPLICAS = 4


class MetricsSidecar:
    """GET /metrics on ``host:port`` (port 0: any free one), answered by the app's own /metrics route on
    the replica's event loop (the same text as through the proxy, for this replica only)."""

    def __init__(self, local: InProcessApp, loop: asyncio.AbstractEventLoop, host: str) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404)
                    return
                future = asyncio.run_coroutine_threadsafe(local.request("GET", "/metrics"), loop)
                response = future.result(timeout=METRICS_SCRAPE_TIMEOUT_S)
                self.send_response(response.status_code)
                self.send_header("Content-Type", response.headers.get("content-type", "text/plain"))
                self.send_header("Content-Length", str(len(response.content)))
                self.end_headers()
                self.wfile.write(response.content)

            def log_message(self, format: str, *args: Any) -> None:  # scrapes are not worth a log line
                return

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.target = f"{host}:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, name="metrics-sidecar", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class ReplicaLostAs503:
    """Serve's HTTP proxy (Ray 2.60, ``proxy.py``) answers nothing when the replica serving a request dies
    under it: ``get_http_response_status`` maps the ``RayActorError`` to a 500 that
    ``send_http_response_on_exception`` does not send, the proxy's ASGI app returns without a response
    and uvicorn then sends its bare ``500 Internal Server Error``. The router retries a request on
    another replica only before the replica accepted it, so every request in flight on a crashed
    replica ends that way. The replica's messages also reach the proxy in batches, so a replica can die
    after its ``http.response.start`` went out and before its body did: the client then gets headers
    and a closed connection (a protocol error, not a status). This middleware, wrapped around the
    proxy, holds each response's start until its first body message and turns "the proxy returned (or
    raised) before any body" into what a client can act on: 503 + Retry-After in our error format (the
    batch client and load balancers retry it; a 500 they must not). A response whose body began is
    passed through untouched, whatever its status (our routes send each body whole, in one message)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        held_start: Message | None = None
        body_sent = False

        async def holding_start(message: Message) -> None:
            nonlocal held_start, body_sent
            if message["type"] == "http.response.start":
                held_start = message  # sent with the first body: a replica lost in between never shows
                return
            if held_start is not None and not body_sent:
                await send(held_start)
            body_sent = True
            await send(message)

        try:
            await self.app(scope, receive, holding_start)
        except Exception:
            if body_sent:
                raise
            log.warning("the proxy raised before a response body for %s: answered 503", scope.get("path"))
        if not body_sent:
            response = replica_lost_response(str(scope.get("path", "")))
            await send(response["start"])
            await send(response["body"])


def replica_lost_response(path: str) -> dict[str, Message]:
    body = error_payload(path, 503, "replica_unavailable", "the replica serving this request stopped; retry")
    payload = json.dumps(body).encode()
    start: Message = {
        "type": "http.response.start",
        "status": 503,
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(payload)).encode()),
            (b"retry-after", str(REPLICA_LOST_RETRY_AFTER_S).encode()),
        ],
    }
    return {"start": start, "body": {"type": "http.response.body", "body": payload}}


def proxy_middlewares() -> list[Middleware]:
    """Serve's HTTP proxy callback (``RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH``)."""
    return [Middleware(ReplicaLostAs503)]


def with_actor_threads(settings: Settings) -> Settings:
    """``intra_op_threads=0`` (ORT's default) means one thread per core of the node, whatever the actor
    was given: two replicas of one CPU each on a two-core node would run four ORT threads on two cores.
    In a Ray actor it means the actor's CPUs instead (the ``num_cpus`` it was scheduled with)."""
    if settings.intra_op_threads != 0:
        return settings
    cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 1.0)
    return settings.model_copy(update={"intra_op_threads": max(1, int(cpus))})


def write_target(sd_dir: Path, replica: str, target: str, labels: dict[str, str]) -> Path:
    """One Prometheus ``file_sd`` file per replica (written whole, then renamed: never read half)."""
    sd_dir.mkdir(parents=True, exist_ok=True)
    path = sd_dir / f"{replica}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps([{"targets": [target], "labels": labels}]), encoding="utf-8")
    tmp.replace(path)
    return path


@serve.deployment(
    ray_actor_options={"num_cpus": 1},
    max_ongoing_requests=MAX_ONGOING_REQUESTS,
    autoscaling_config={
        "min_replicas": MIN_REPLICAS,
        "max_replicas": MAX_REPLICAS,
        "target_ongoing_requests": TARGET_ONGOING_REQUESTS,
    },
    health_check_period_s=HEALTH_CHECK_PERIOD_S,
    health_check_timeout_s=HEALTH_CHECK_TIMEOUT_S,
)
@serve.ingress()
class RetentionService:
    """One replica: the app of ``create_app`` with its settings; routes, bodies and errors unchanged."""

    def __init__(self, settings: dict[str, Any] | None = None, metrics_sd_dir: str | None = None) -> None:
        # Settings() reads RETENTION_* here, in the replica's process and environment.
        self.settings = with_actor_threads(Settings(**(settings or {})))
        sd_dir = metrics_sd_dir or os.environ.get(METRICS_SD_DIR_ENV)
        self.metrics_sd_dir = Path(sd_dir) if sd_dir else None
        self.local: InProcessApp | None = None
        self.sidecar: MetricsSidecar | None = None
        self.target_file: Path | None = None

    def __serve_build_asgi_app__(self) -> Any:
        app = create_app(self.settings)
        self.local = InProcessApp(app)
        return app

    async def check_health(self) -> None:
        """Serve's health check = the app's /readyz (waits only while the first load runs)."""
        assert self.local is not None, "the app is built before the first health check"
        await self.local.wait_ready(READY_WAIT_S)
        if self.sidecar is None:
            self._start_metrics()

    def _start_metrics(self) -> None:
        assert self.local is not None
        self.sidecar = MetricsSidecar(self.local, asyncio.get_running_loop(), get_node_ip_address())
        if self.metrics_sd_dir is None:
            return
        context = serve.get_replica_context()
        labels = {"app": context.app_name, "deployment": context.deployment, "replica": self.replica_id}
        self.target_file = write_target(self.metrics_sd_dir, self.replica_id, self.sidecar.target, labels)

    @property
    def replica_id(self) -> str:
        return str(serve.get_replica_context().replica_id.unique_id)

    @property
    def metrics_target(self) -> str | None:
        """host:port of this replica's own /metrics (None before the first health check)."""
        return self.sidecar.target if self.sidecar is not None else None

    async def __del__(self) -> None:
        if self.target_file is not None:
            self.target_file.unlink(missing_ok=True)
        if self.sidecar is not None:
            self.sidecar.close()
        if self.local is not None:
            await self.local.aclose()


def build_app(args: dict[str, Any]) -> Application:
    """Serve application builder (``import_path: service.ray_serve:build_app``): ``args`` are Settings
    overrides (``models_dir: /mnt/models``), plus ``metrics_sd_dir``."""
    overrides = dict(args)
    metrics_sd_dir = overrides.pop("metrics_sd_dir", None)
    return RetentionService.bind(overrides, metrics_sd_dir)  # type: ignore[attr-defined]
