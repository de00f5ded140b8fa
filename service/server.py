"""The model server: one ``Batcher`` per model of the repository, hot reload, the concurrency cap.

``ModelServer`` implements ``service.serving.Server``, all the HTTP layer sees: it resolves a request's
model, hands the request to that model's batcher (admission and the rho=auto controller,
``service.scheduling``) and swaps in what the repository (``service.repository``) loads on a reload.

A model the repository drops (its directory removed or replaced) keeps its batcher until the requests
it holds are answered and its runs have ended; then its backend is closed (``Backend.close``: the
onnxruntime session released, the torch backend's CUDA graphs freed). Every backend still serving is
closed the same way when the server stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from retention_core.codecs.base import Row
from service.backends import check_settings
from service.errors import ModelNotFound, NotReady, Overloaded, ShuttingDown, TaskMismatch
from service.metrics import Metrics, ModelBackend
from service.repository import Catalog, ModelRepository, Signature
from service.runtime import LoadedModel
from service.scheduling.batcher import Batcher
from service.serving import AutoBudget, InferenceResult, ReloadReport, ServedModel, Server, ServerState
from service.settings import Settings

log = logging.getLogger("service")


def model_backend(model: LoadedModel) -> ModelBackend:
    """A model's backend as its metrics label it, with its device memory when it has an accelerator."""
    backend = model.backend

    def device_memory() -> tuple[int, int]:
        memory = backend.device_memory()
        return (0, 0) if memory is None else (memory.in_use_bytes, memory.peak_bytes)

    on_device = backend.device_memory() is not None
    return ModelBackend(
        model.backend_kind, model.device, device_memory if on_device else None, backend.info.graphs
    )


def release(model: LoadedModel) -> None:
    """Close ``model``'s backend (no run of it may be in flight): a failure is logged, never raised."""
    try:
        model.backend.close()
    except Exception:
        log.exception("model %s: closing its backend failed", model.name)


class ModelServer:
    """The repository's models, each behind its own ``Batcher`` (``service.serving.Server``)."""

    def __init__(self, settings: Settings, metrics: Metrics) -> None:
        check_settings(settings)  # the chosen backend's own settings fail here, not at each load
        self.settings = settings
        self.metrics = metrics
        self.repository = ModelRepository(settings)
        self.catalog = Catalog()
        self._batchers: dict[str, Batcher] = {}
        self._lock = asyncio.Lock()
        self._closing: set[asyncio.Task[None]] = set()
        self._watcher: asyncio.Task[None] | None = None  # the periodic rescan (reload_interval_s)
        self._in_flight = 0  # inference requests inside infer (max_concurrent_requests)
        self.started = False  # first load finished
        self.stopping = False

    # ------------------------------------------------------------------ queries
    def state(self) -> ServerState:
        models = self.models()
        defaults = {task: self.default_for(task).name for task in sorted({m.task for m in models})}
        return ServerState(
            started=self.started,
            stopping=self.stopping,
            ready=self.ready,
            models=models,
            aliases=self.aliases(),
            errors=self.errors,
            defaults=defaults,
        )

    @property
    def ready(self) -> bool:
        models = self.catalog.models
        return (
            self.started and not self.stopping and bool(models) and all(m.warmed_up for m in models.values())
        )

    @property
    def errors(self) -> dict[str, str]:
        return dict(self.catalog.errors)

    def models(self) -> list[LoadedModel]:
        models = self.catalog.models
        return [models[name] for name in sorted(models)]

    def aliases(self) -> dict[str, str]:
        return dict(self.catalog.aliases)

    def get(self, name: str) -> LoadedModel:
        model = self.catalog.find(name)
        if model is None:
            raise ModelNotFound(f"unknown model {name!r}")
        return model

    def default_for(self, task: str) -> LoadedModel:
        wanted = self.settings.default_models.get(task)
        if wanted:
            model = self.catalog.find(wanted)
            if model is not None and model.task == task:
                return model
        for model in self.models():
            if model.task == task:
                return model
        if not self.started:
            raise NotReady("models are still loading")
        raise ModelNotFound(f"no model for task {task!r} is loaded")

    def resolve(self, name: str | None, task: str) -> LoadedModel:
        if self.stopping:
            raise ShuttingDown()
        if not name:
            return self.default_for(task)
        model = self.get(name)
        if model.task != task:
            raise TaskMismatch(f"model {name!r} serves task {model.task!r}, not {task!r}")
        return model

    def batcher(self, model: ServedModel) -> Batcher:
        batcher = self._batchers.get(model.name)
        if batcher is None or batcher.model is not model:
            raise ModelNotFound(f"model {model.name!r} was unloaded")
        return batcher

    def batcher_of(self, name: str) -> Batcher:
        """The batcher currently serving model ``name`` (or alias)."""
        return self.batcher(self.get(name))

    # ------------------------------------------------------------------ inference
    async def infer(
        self,
        model: ServedModel,
        rows: list[Row],
        rho: float,
        deadline: float,
        auto: AutoBudget | None = None,
    ) -> InferenceResult:
        """Run ``rows`` at ``rho`` (or, with ``auto``, at the rho its batch gets). 429 (``Overloaded``)
        when ``max_concurrent_requests`` requests are already in, or admission sheds it."""
        cap = self.settings.max_concurrent_requests
        if cap and self._in_flight >= cap:
            raise Overloaded("concurrency", self.settings.retry_after_s)
        self._in_flight += 1
        try:
            return await self.batcher(model).submit(rows, rho, deadline, auto)
        finally:
            self._in_flight -= 1

    def shed(self, model: ServedModel, due: float, by_target: bool, queued_only: bool = False) -> None:
        """429 before tokenizing when the work already queued for ``model`` ends after ``due``.
        ``queued_only``, before the body is read (``service.api.early``): only when requests are queued;
        a request arriving as a batch finishes (its answers go out before the worker notices it is done)
        is left to the normal path."""
        batcher = self.batcher(model)
        if queued_only and not batcher.queue:
            return
        batcher.shed_early(time.monotonic(), due, by_target)

    # ------------------------------------------------------------------ loading
    async def load_all(self) -> ReloadReport:
        """The first load; then, with ``reload_interval_s`` set, rescan the root periodically."""
        signature = self.repository.signature()
        report = await self.reload()
        self.started = True
        interval = self.settings.reload_interval_s
        if interval > 0 and not self.stopping:
            self._watcher = asyncio.get_running_loop().create_task(self._rescan_every(interval, signature))
        return report

    async def _rescan_every(self, interval: float, signature: Signature) -> None:
        """Hot-load: reload whenever the repository's signature changed (a model built while serving,
        as ``make serve``'s background build does, appears without SIGHUP). An unchanged repository is
        not reloaded, so a broken directory is not retried (nor logged) every interval until it changes."""
        while not self.stopping:
            await asyncio.sleep(interval)
            current = self.repository.signature()
            if current == signature:
                continue
            signature = current  # taken before the reload: a change during it is seen next time
            try:
                report = await self.reload()
            except Exception:  # keep watching: the next change gets another chance
                log.exception("periodic reload failed")
                continue
            if report.loaded or report.removed:
                log.info("models directory changed: loaded %s, removed %s", report.loaded, report.removed)

    async def reload(self) -> ReloadReport:
        """Rescan the repository. Unchanged models keep running; changed ones are swapped in only once they
        loaded and warmed up; a broken directory is reported and whatever served before keeps serving.
        Old batchers drain their queues in the background (in-flight requests are not dropped)."""
        async with self._lock:
            catalog = await self.repository.load(self.catalog)
            report = catalog.report_since(self.catalog)
            self._swap(catalog)
            return report

    def _swap(self, catalog: Catalog) -> None:
        """Install ``catalog`` with a batcher per model (kept where the model is unchanged), at once."""
        new_models = catalog.models
        dropped = {id(model) for model in catalog.dropped_since(self.catalog)}
        old_batchers = self._batchers
        batchers: dict[str, Batcher] = {}
        for name, model in new_models.items():
            current = old_batchers.get(name)
            if current is not None and current.model is model:
                batchers[name] = current
                continue
            batcher = Batcher(model, self.settings, self.metrics)
            batcher.start()
            batchers[name] = batcher
            manifest = model.manifest
            self.metrics.init_model(
                name,
                manifest.task,
                manifest.backbone.name_or_path,
                model.precision,
                model.memory_bytes,
                model_backend(model),
            )
        retired = [b for name, b in old_batchers.items() if batchers.get(name) is not b]
        self.catalog, self._batchers = catalog, batchers
        for batcher in retired:
            old = batcher.model
            if old.name not in new_models or new_models[old.name].precision != old.precision:
                self.metrics.forget_model(
                    old.name, old.task, old.manifest.backbone.name_or_path, old.precision
                )
            task = asyncio.get_running_loop().create_task(self._retire(batcher, id(old) in dropped))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def _retire(self, batcher: Batcher, dropped: bool) -> None:
        """Drain a batcher the swap replaced (its queued requests answered, up to drain_timeout_s, and its
        runs ended); then, when its model left the repository, close that model's backend."""
        await batcher.close(self.settings.drain_timeout_s)
        if dropped:
            release(batcher.model)

    async def close(self) -> None:
        """Graceful shutdown: not ready any more, queued work finishes (up to drain_timeout_s), then every
        backend is closed."""
        self.stopping = True
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
        batchers = list(self._batchers.values())
        await asyncio.gather(*(b.close(self.settings.drain_timeout_s) for b in batchers), *self._closing)
        for model in self.catalog.models.values():
            release(model)


def as_server(server: ModelServer) -> Server:
    """Static check (mypy) that ``ModelServer`` implements the ``Server`` protocol."""
    return server
