"""What the HTTP layer sees of inference: a served model without its onnxruntime session (``ServedModel``),
the server it asks (``Server``) and what a reload did (``ReloadReport``).

Nothing here imports onnxruntime, and ``service.api`` imports none of the modules that do (only its
composition root, ``service.api.app``, builds the ``service.server.ModelServer``): the handlers are
written against these types, so they cannot reach a session; ``tests/test_layering.py`` checks the
imports. The server hands them ``service.runtime.LoadedModel`` objects, a ``ServedModel`` plus the
session, tokenizer and directory the HTTP layer has no business with.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from retention_core.codecs.base import Row
from retention_core.contract import Manifest
from retention_core.tasks import TaskSpec
from service.scheduling.jobs import AutoBudget, JobResult


@dataclass(kw_only=True)
class ServedModel:
    """A loaded model as the HTTP layer knows it: its name, manifest, codec and task."""

    name: str  # manifest.name, or "<manifest.name>@<version>" for a versioned directory
    manifest: Manifest
    precision: str
    codec: Any  # the task's codec (retention_core.tasks)
    spec: TaskSpec  # the task's registry entry, taken at load: its inputs are the graph's feeds
    providers: list[str]  # onnxruntime's execution providers, by name (GET /models shows them)
    loaded_at: float = field(default_factory=time.time)
    warmed_up: bool = False

    @property
    def task(self) -> str:
        return self.manifest.task

    @property
    def num_layers(self) -> int:
        return self.manifest.schedule.num_points

    @property
    def explains(self) -> bool:
        """The graph reports per-token survival depth (``explain=true`` is served)."""
        return self.manifest.has_survival_depth


@dataclass
class ReloadReport:
    loaded: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)  # directory (relative to the root) -> message


class Server(Protocol):
    """Everything the HTTP layer needs from inference (``service.server.ModelServer`` implements it)."""

    started: bool  # the first load of the models directory finished
    stopping: bool  # graceful shutdown began

    @property
    def ready(self) -> bool: ...

    @property
    def errors(self) -> dict[str, str]: ...

    def models(self) -> Sequence[ServedModel]: ...

    def aliases(self) -> dict[str, str]: ...

    def get(self, name: str) -> ServedModel: ...

    def default_for(self, task: str) -> ServedModel: ...

    def resolve(self, name: str | None, task: str) -> ServedModel: ...

    async def infer(
        self,
        model: ServedModel,
        rows: list[Row],
        rho: float,
        deadline: float,
        auto: AutoBudget | None = None,
    ) -> JobResult: ...

    def shed_early(self, model: ServedModel, due: float, by_target: bool) -> None: ...

    def shed_before_body(self, model: ServedModel, due: float, by_target: bool) -> None:
        """429 (``Overloaded``) before the request's body is read: requests are queued for ``model``
        (a backlog, not only a batch finishing) and that work ends after ``due``."""
        ...

    async def reload(self) -> ReloadReport: ...
