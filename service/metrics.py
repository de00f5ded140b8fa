"""All Prometheus metrics of the service, one ``CollectorRegistry`` per app (tests build several apps).

Names are a contract with the Grafana dashboards and alert rules: do not rename. Labels are bounded
(endpoint = route name, model = loaded model name, reason from a fixed list); a request's rho is never
a label (the cost model's estimates carry ``rho_bucket``, one of the five fixed ``EXPORTED_RHOS``).

Every per-request metric carries ``task``: the task (``retention_core.tasks``) of the route, and so of
the model, that served it; "" on the routes that run no model (/livez, /metrics, /models, ...), which
Prometheus stores as no label. Dashboards and alerts select inference traffic with ``task!=""``.
Per-batch and per-model state (batch size and tokens, inference time per run, queue depth, cost model)
carries ``model`` only; ``retention_model_info`` maps a model to its task.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import psutil
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from service.errors import REJECTION_REASONS, SHED_REASONS
from service.serving import RHO_REASONS, GraphCache

STATUS_CLASSES = ("2xx", "4xx", "5xx")
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
RHO_BUCKETS = (0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 1.0)
TOKEN_BUCKETS = (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
LOOP_LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
MEMORY_BUCKETS = tuple(float(2**k) for k in range(12, 34, 2))  # 4 KiB .. 8 GiB
# rho values the cost model's per-token estimate is exported at (the rho_bucket label, so bounded)
EXPORTED_RHOS = (0.1, 0.3, 0.5, 0.7, 1.0)


def rho_label(rho: float) -> str:
    return f"{rho:.1f}"


def status_class(status: int) -> str:
    return "2xx" if status < 400 else "4xx" if status < 500 else "5xx"


@dataclass(frozen=True)
class ModelBackend:
    """What runs a model, as its metrics label it, and where its device memory is read (None: no
    accelerator allocator to read)."""

    kind: str  # onnxruntime | torch
    device: str  # cpu, cuda:0
    device_memory: Callable[[], tuple[int, int]] | None = None  # (bytes in use, allocator peak)
    graphs: Callable[[], GraphCache | None] | None = None  # its CUDA graphs (torch backend on a GPU)


GraphReaders = dict[str, Callable[[], GraphCache | None]]


class GraphCollector:
    """The CUDA graphs of every model whose backend captures them, read at each scrape from the backend
    (whose runner counts them): captures by phase (``load``: before any request; ``request``: the first
    time a request met the plan), failed captures and the runs their plans answered eagerly, evictions,
    and the graphs held against the cache's size."""

    def __init__(self, readers: GraphReaders) -> None:
        self._readers = readers  # model -> reader; Metrics adds and drops models

    def describe(self) -> list[Metric]:
        return list(self._families({}))

    def collect(self) -> Iterator[Metric]:
        caches = {model: read() for model, read in list(self._readers.items())}
        return self._families({model: cache for model, cache in caches.items() if cache is not None})

    @staticmethod
    def _families(caches: dict[str, GraphCache]) -> Iterator[Metric]:
        captures = CounterMetricFamily(
            "retention_cuda_graph_captures",
            "CUDA graphs captured, by phase: load (the plans of the server's runs, before any request) or "
            "request (a plan first met by a request, captured on its path)",
            labels=["model", "phase"],
        )
        failures = CounterMetricFamily(
            "retention_cuda_graph_capture_failures",
            "CUDA graph captures that failed: the plan runs eagerly from then on, never captured again",
            labels=["model"],
        )
        eager = CounterMetricFamily(
            "retention_cuda_graph_eager_runs",
            "runs answered eagerly because their plan's CUDA graph capture had failed",
            labels=["model"],
        )
        evictions = CounterMetricFamily(
            "retention_cuda_graph_evictions",
            "CUDA graphs dropped from a full cache (least recently used first); a plan met again is "
            "captured again",
            labels=["model"],
        )
        held = GaugeMetricFamily("retention_cuda_graphs", "CUDA graphs held now", labels=["model"])
        limit = GaugeMetricFamily(
            "retention_cuda_graph_cache_size", "CUDA graphs the model's cache keeps", labels=["model"]
        )
        for model, cache in sorted(caches.items()):
            captures.add_metric([model, "load"], cache.captured_at_load)
            captures.add_metric([model, "request"], cache.captured_on_request)
            failures.add_metric([model], cache.capture_failures)
            eager.add_metric([model], cache.eager_runs)
            evictions.add_metric([model], cache.evictions)
            held.add_metric([model], cache.held)
            limit.add_metric([model], cache.limit)
        yield from (captures, failures, eager, evictions, held, limit)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._backends: dict[str, ModelBackend] = {}  # model -> the labels its backend series carry
        self._graph_readers: GraphReaders = {}  # model -> its backend's CUDA graphs (GraphCollector)
        self.registry.register(GraphCollector(self._graph_readers))
        r = self.registry
        self.requests = Counter(
            "retention_requests_total", "HTTP requests", ["endpoint", "task", "status_class"], registry=r
        )
        self.request_duration = Histogram(
            "retention_request_duration_seconds",
            "HTTP request latency",
            ["endpoint", "task"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_duration = Histogram(
            "retention_queue_duration_seconds",
            "time from enqueue to batch start",
            ["model", "task"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.inference_duration = Histogram(
            "retention_inference_duration_seconds",
            "seconds of one backend run (a batch is cut into runs)",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_depth = Gauge("retention_queue_depth", "requests waiting", ["model"], registry=r)
        self.in_flight = Gauge("retention_in_flight_requests", "HTTP requests being served", registry=r)
        self.rejections = Counter("retention_rejections_total", "rejected requests", ["reason"], registry=r)
        self.batch_size = Histogram(
            "retention_batch_size", "rows per backend run", ["model"], buckets=BATCH_SIZE_BUCKETS, registry=r
        )
        self.batch_tokens = Histogram(
            "retention_batch_tokens",
            "padded tokens per backend run",
            ["model"],
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        self.input_tokens = Histogram(
            "retention_input_tokens",
            "input tokens per request",
            ["endpoint", "task"],
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        self.requested_rho = Histogram(
            "retention_requested_rho",
            "numeric rho asked for",
            ["endpoint", "task"],
            buckets=RHO_BUCKETS,
            registry=r,
        )
        self.effective_rho = Histogram(
            "retention_effective_rho",
            "rho actually used",
            ["endpoint", "task"],
            buckets=RHO_BUCKETS,
            registry=r,
        )
        self.token_layers_computed = Counter(
            "retention_token_layers_computed_total", "token-layers computed", ["model", "task"], registry=r
        )
        self.token_layers_saved = Counter(
            "retention_token_layers_saved_total",
            "token-layers skipped vs dense",
            ["model", "task"],
            registry=r,
        )
        self.degraded = Counter(
            "retention_degraded_requests_total",
            "rho=auto requests served below auto_max_rho",
            ["endpoint", "task"],
            registry=r,
        )
        self.model_memory = Gauge(
            "retention_model_memory_bytes",
            "resident memory the process grew by while the model loaded and warmed up (weights, "
            "the backend's buffers): what serving it costs beside the others",
            ["model"],
            registry=r,
        )
        self.resident_memory = Gauge(
            "retention_process_resident_memory_bytes", "resident set size of this process", registry=r
        )
        process = psutil.Process()
        self.resident_memory.set_function(lambda: float(process.memory_info().rss))
        self.event_loop_lag = Histogram(
            "retention_event_loop_lag_seconds",
            "how late the event loop ran a timer (service.api.loop_lag): HTTP parsing, admission and "
            "answers all wait this long",
            buckets=LOOP_LAG_BUCKETS,
            registry=r,
        )
        self.activation_memory = Histogram(
            "retention_activation_memory_estimate_bytes",
            "estimated peak activation bytes per request",
            ["model", "task"],
            buckets=MEMORY_BUCKETS,
            registry=r,
        )
        self.shed = Counter(
            "retention_shed_requests_total", "requests refused with 429 (shed)", ["reason"], registry=r
        )
        self.served_rho = Histogram(
            "retention_served_rho",
            "rho each request was served at, by why (usage.rho_reason)",
            ["model", "task", "reason"],
            buckets=RHO_BUCKETS,
            registry=r,
        )
        self.predicted_wait = Histogram(
            "retention_predicted_wait_seconds",
            "admission: predicted wait for the work queued ahead (at its lowest rho)",
            ["model", "task"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.predicted_drain = Gauge(
            "retention_predicted_drain_seconds",
            "predicted time to run the queued work at its lowest rho (last admission or batch)",
            ["model"],
            registry=r,
        )
        self.cost_per_token = Gauge(
            "retention_cost_model_token_seconds",
            "cost model: marginal seconds per padded token at rho_bucket",
            ["model", "rho_bucket"],
            registry=r,
        )
        self.cost_per_run = Gauge(
            "retention_cost_model_run_seconds",
            "cost model: fixed seconds per backend run",
            ["model"],
            registry=r,
        )
        self.cost_tail_factor = Gauge(
            "retention_cost_model_tail_factor",
            "admission: predictions are scaled by this high quantile of (actual / predicted) batch time",
            ["model"],
            registry=r,
        )
        self.model_info = Gauge(
            "retention_model_info", "loaded models", ["model", "task", "backbone", "precision"], registry=r
        )
        self.model_backend = Gauge(
            "retention_model_backend_info",
            "what runs each model (RETENTION_BACKEND): its backend and device",
            ["model", "backend", "device"],
            registry=r,
        )
        self.device_oom = Counter(
            "retention_device_oom_total",
            "device out-of-memory events: a run retried in halves (split), a row refused with 503 (refused)",
            ["model", "outcome"],
            registry=r,
        )
        self.device_memory = Gauge(
            "retention_device_memory_bytes",
            "accelerator memory allocated on the model's device now (torch backend on a GPU)",
            ["model"],
            registry=r,
        )
        self.device_memory_peak = Gauge(
            "retention_device_memory_peak_bytes",
            "the device allocator's high-water mark since the process started (torch backend on a GPU)",
            ["model"],
            registry=r,
        )

    def init_endpoints(self, endpoints: Iterable[tuple[str, str]]) -> None:
        """Create the series of every mounted route, given as (endpoint, task), at 0 so dashboards see
        them before traffic: request count and latency for all, the inference families for the routes
        that serve a task."""
        for endpoint, task in endpoints:
            for cls in STATUS_CLASSES:
                self.requests.labels(endpoint=endpoint, task=task, status_class=cls)
            self.request_duration.labels(endpoint=endpoint, task=task)
            if task:
                for family in (self.input_tokens, self.requested_rho, self.effective_rho, self.degraded):
                    family.labels(endpoint=endpoint, task=task)
        for reason in REJECTION_REASONS:
            self.rejections.labels(reason=reason)
        for reason in SHED_REASONS:
            self.shed.labels(reason=reason)

    def init_model(
        self,
        model: str,
        task: str,
        backbone: str,
        precision: str,
        memory_bytes: int,
        backend: ModelBackend | None = None,
    ) -> None:
        for family in (
            self.inference_duration,
            self.queue_depth,
            self.batch_size,
            self.batch_tokens,
            self.predicted_drain,
            self.cost_per_run,
        ):
            family.labels(model=model)
        for per_request in (
            self.queue_duration,
            self.token_layers_computed,
            self.token_layers_saved,
            self.activation_memory,
            self.predicted_wait,
        ):
            per_request.labels(model=model, task=task)
        for reason in RHO_REASONS:
            self.served_rho.labels(model=model, task=task, reason=reason)
        for outcome in ("split", "refused"):
            self.device_oom.labels(model=model, outcome=outcome)
        self.model_info.labels(model=model, task=task, backbone=backbone, precision=precision).set(1)
        self.model_memory.labels(model=model).set(memory_bytes)
        if backend is not None:
            self._backends[model] = backend
            self.model_backend.labels(model=model, backend=backend.kind, device=backend.device).set(1)
            if backend.device_memory is not None:
                read = backend.device_memory
                self.device_memory.labels(model=model).set_function(lambda: float(read()[0]))
                self.device_memory_peak.labels(model=model).set_function(lambda: float(read()[1]))
            if backend.graphs is not None:
                self._graph_readers[model] = backend.graphs

    def forget_model(self, model: str, task: str, backbone: str, precision: str) -> None:
        """A model left the repository: drop its info series (history stays in Prometheus)."""
        with contextlib.suppress(KeyError):
            self.model_info.remove(model, task, backbone, precision)
        with contextlib.suppress(KeyError):
            self.model_memory.remove(model)
        self._graph_readers.pop(model, None)
        backend = self._backends.pop(model, None)
        if backend is not None:
            with contextlib.suppress(KeyError):
                self.model_backend.remove(model, backend.kind, backend.device)
        for family in (self.device_memory, self.device_memory_peak):
            with contextlib.suppress(KeyError):
                family.remove(model)
        self.queue_depth.labels(model=model).set(0)
        self.predicted_drain.labels(model=model).set(0)
        for rho in EXPORTED_RHOS:
            with contextlib.suppress(KeyError):
                self.cost_per_token.remove(model, rho_label(rho))

    def record_run(self, model: str, rows: int, padded_tokens: int, seconds: float) -> None:
        """One backend run of a batch."""
        self.batch_size.labels(model=model).observe(rows)
        self.batch_tokens.labels(model=model).observe(padded_tokens)
        self.inference_duration.labels(model=model).observe(seconds)

    def record_cost_model(
        self, model: str, per_run: float, per_token: dict[float, float], tail_factor: float
    ) -> None:
        self.cost_per_run.labels(model=model).set(per_run)
        self.cost_tail_factor.labels(model=model).set(tail_factor)
        for rho, seconds in per_token.items():
            self.cost_per_token.labels(model=model, rho_bucket=rho_label(rho)).set(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
