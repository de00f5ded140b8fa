"""The inference engine behind a small protocol, independent of HTTP (TGI style).

``RetentionEngine`` owns the model repository (every model directory under ``settings.models_dir``),
one ``Batcher`` per model (admission and the rho=auto controller, ``service.admission``), hot reload and
the ``max_concurrent_requests`` cap. HTTP handlers only talk to the
``Engine`` protocol; they never see onnxruntime.

Repository layout::

    models/<dir>/manifest.json            served as manifest.name
    models/<dir>/<version>/manifest.json  served as "<manifest.name>@<version>"; "<manifest.name>"
                                          is an alias of the highest version
    models/.<anything>/                   ignored at both levels (the exporter's staging directories)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from retention_core.codecs.base import Row
from retention_core.contract import MANIFEST_FILE
from service.batcher import AutoBudget, Batcher, JobResult
from service.errors import ModelNotFound, NotReady, Overloaded, ShuttingDown, TaskMismatch
from service.metrics import Metrics
from service.runtime import LoadedModel, ModelLoadError, fingerprint, load_model
from service.settings import Settings

log = logging.getLogger("service")


@dataclass
class ReloadReport:
    loaded: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)  # directory (relative to the root) -> message


class Engine(Protocol):
    """Everything the HTTP layer needs from inference (it never sees onnxruntime or batchers)."""

    started: bool  # the first load of the models directory finished
    stopping: bool  # graceful shutdown began

    @property
    def ready(self) -> bool: ...

    @property
    def errors(self) -> dict[str, str]: ...

    def models(self) -> list[LoadedModel]: ...

    def aliases(self) -> dict[str, str]: ...

    def get(self, name: str) -> LoadedModel: ...

    def default_for(self, task: str) -> LoadedModel: ...

    def resolve(self, name: str | None, task: str) -> LoadedModel: ...

    async def infer(
        self,
        model: LoadedModel,
        rows: list[Row],
        rho: float,
        deadline: float,
        auto: AutoBudget | None = None,
    ) -> JobResult: ...

    def shed_early(self, model: LoadedModel, due: float, by_target: bool) -> None: ...

    async def reload(self) -> ReloadReport: ...


def visible_dirs(parent: Path) -> list[Path]:
    """Sub-directories, sorted, without hidden ones: the exporter stages a model in ``.<name>.staging*``
    next to the live directory and swaps it in when complete, so a dot-directory is never served."""
    return sorted(p for p in parent.iterdir() if p.is_dir() and not p.name.startswith("."))


def _version_key(name: str) -> tuple[object, ...]:
    """Natural order: v2 < v10."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name))


class RetentionEngine:
    def __init__(self, settings: Settings, metrics: Metrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self._models: dict[str, LoadedModel] = {}
        self._aliases: dict[str, str] = {}
        self._batchers: dict[str, Batcher] = {}
        self._errors: dict[str, str] = {}
        self._lock = asyncio.Lock()
        self._closing: set[asyncio.Task[None]] = set()
        self._watcher: asyncio.Task[None] | None = None  # the periodic rescan (reload_interval_s)
        self._in_flight = 0  # inference requests inside infer (max_concurrent_requests)
        self.started = False  # first load finished
        self.stopping = False

    # ------------------------------------------------------------------ queries
    @property
    def ready(self) -> bool:
        return (
            self.started
            and not self.stopping
            and bool(self._models)
            and all(m.warmed_up for m in self._models.values())
        )

    @property
    def errors(self) -> dict[str, str]:
        return dict(self._errors)

    def models(self) -> list[LoadedModel]:
        return [self._models[name] for name in sorted(self._models)]

    def aliases(self) -> dict[str, str]:
        return dict(self._aliases)

    def get(self, name: str) -> LoadedModel:
        model = self._models.get(self._aliases.get(name, name))
        if model is None:
            raise ModelNotFound(f"unknown model {name!r}")
        return model

    def default_for(self, task: str) -> LoadedModel:
        wanted = self.settings.default_models.get(task)
        if wanted:
            model = self._models.get(self._aliases.get(wanted, wanted))
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

    def batcher(self, model: LoadedModel) -> Batcher:
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
        model: LoadedModel,
        rows: list[Row],
        rho: float,
        deadline: float,
        auto: AutoBudget | None = None,
    ) -> JobResult:
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

    def shed_early(self, model: LoadedModel, due: float, by_target: bool) -> None:
        """429 before tokenizing when the work already queued for ``model`` ends after ``due``."""
        self.batcher(model).shed_early(time.monotonic(), due, by_target)

    # ------------------------------------------------------------------ repository
    def _scan(self) -> tuple[list[tuple[Path, str | None, str | None]], list[Path]]:
        """(directory, version, alias group) of every model directory under the root, and the
        directories this process may not read (e.g. another user's mode 0700): those are reported by
        name, and must not hide the readable ones."""
        root = self.settings.models_dir
        found: list[tuple[Path, str | None, str | None]] = []
        unreadable: list[Path] = []
        if not root.is_dir():
            return found, unreadable
        for child in visible_dirs(root):
            try:
                if (child / MANIFEST_FILE).is_file():
                    found.append((child, None, None))
                    continue
                versions = sorted(
                    (p for p in visible_dirs(child) if (p / MANIFEST_FILE).is_file()),
                    key=lambda p: _version_key(p.name),
                )
            except PermissionError:
                unreadable.append(child)
                continue
            found.extend((version, version.name, child.name) for version in versions)
        return found, unreadable

    def _relative(self, directory: Path) -> str:
        try:
            return str(directory.relative_to(self.settings.models_dir))
        except ValueError:
            return directory.name

    def _signature(self) -> tuple[tuple[str, str], ...]:
        """(directory, fingerprint) of every model directory: equal signatures mean nothing to reload."""
        try:
            found, unreadable = self._scan()
            readable = tuple((str(directory), fingerprint(directory)) for directory, _, _ in found)
            return readable + tuple((str(directory), "unreadable") for directory in unreadable)
        except OSError:  # a directory swapped away mid-scan (the exporter's rename): unlike any real look
            return (("", "unreadable"),)

    async def load_all(self) -> ReloadReport:
        """The first load; then, with ``reload_interval_s`` set, rescan the root periodically."""
        signature = self._signature()
        report = await self.reload()
        self.started = True
        interval = self.settings.reload_interval_s
        if interval > 0 and not self.stopping:
            self._watcher = asyncio.get_running_loop().create_task(self._rescan_every(interval, signature))
        return report

    async def _rescan_every(self, interval: float, signature: tuple[tuple[str, str], ...]) -> None:
        """Hot-load: reload whenever the repository's signature changed (a model built while serving,
        as ``make serve``'s background build does, appears without SIGHUP). An unchanged repository is
        not reloaded, so a broken directory is not retried (nor logged) every interval until it changes."""
        while not self.stopping:
            await asyncio.sleep(interval)
            current = self._signature()
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
        """Rescan the root. Unchanged models keep running; changed ones are swapped in only once they
        loaded and warmed up; a broken directory is reported and whatever served before keeps serving.
        Old batchers drain their queues in the background (in-flight requests are not dropped)."""
        async with self._lock:
            loop = asyncio.get_running_loop()
            report = ReloadReport()
            by_dir = {m.directory.resolve(): m for m in self._models.values()}
            new_models: dict[str, LoadedModel] = {}
            new_aliases: dict[str, str] = {}
            latest: dict[str, tuple[tuple[object, ...], str]] = {}
            errors: dict[str, str] = {}
            found, unreadable = self._scan()
            for directory in unreadable:
                rel = self._relative(directory)
                errors[rel] = f"{directory.name}: not readable by the service (check its permissions)"
                log.error("model directory %s not loaded: permission denied", rel)
            for directory, version, _group in found:
                rel = self._relative(directory)
                old = by_dir.get(directory.resolve())
                model: LoadedModel | None = None
                try:
                    if old is not None and old.fingerprint == fingerprint(directory):
                        model = old
                    else:
                        model = await loop.run_in_executor(None, load_model, directory, self.settings)
                        base = model.manifest.name
                        model.name = f"{base}@{version}" if version else base
                except ModelLoadError as exc:
                    errors[rel] = str(exc)
                    log.error("model directory %s not loaded: %s", rel, exc)
                    model = old  # keep serving the previous version of this directory
                except Exception as exc:  # never let one directory break the reload
                    errors[rel] = f"{directory.name}: unexpected error while loading"
                    log.exception("model directory %s not loaded", rel, exc_info=exc)
                    model = old
                if model is None:
                    continue
                if model.name in new_models:
                    errors[rel] = f"{directory.name}: duplicate model name {model.name!r}"
                    log.error("model directory %s not loaded: duplicate name %s", rel, model.name)
                    continue
                new_models[model.name] = model
                if version:
                    base = model.manifest.name
                    key = _version_key(version)
                    if base not in latest or key > latest[base][0]:
                        latest[base] = (key, model.name)
            for base, (_key, name) in latest.items():
                if base not in new_models:
                    new_aliases[base] = name

            for name, model in new_models.items():
                if self._models.get(name) is model:
                    report.unchanged.append(name)
                else:
                    report.loaded.append(name)
            report.removed = sorted(name for name in self._models if name not in new_models)
            report.errors = errors
            self._swap(new_models, new_aliases)
            self._errors = errors
            return report

    def _swap(self, new_models: dict[str, LoadedModel], new_aliases: dict[str, str]) -> None:
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
            self.metrics.init_model(name, manifest.task, manifest.backbone.name_or_path, model.precision)
        retired = [b for name, b in old_batchers.items() if batchers.get(name) is not b]
        self._models, self._aliases, self._batchers = new_models, new_aliases, batchers
        for batcher in retired:
            old = batcher.model
            if old.name not in new_models or new_models[old.name].precision != old.precision:
                self.metrics.forget_model(
                    old.name, old.task, old.manifest.backbone.name_or_path, old.precision
                )
            task = asyncio.get_running_loop().create_task(batcher.close(self.settings.drain_timeout_s))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        """Graceful shutdown: not ready any more, queued work finishes (up to drain_timeout_s)."""
        self.stopping = True
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
        batchers = list(self._batchers.values())
        await asyncio.gather(*(b.close(self.settings.drain_timeout_s) for b in batchers), *self._closing)


def as_engine(engine: RetentionEngine) -> Engine:
    """Static check (mypy) that ``RetentionEngine`` implements the ``Engine`` protocol."""
    return engine
