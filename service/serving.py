"""What the HTTP layer sees of inference: a served model without its onnxruntime session (``ServedModel``),
the server it asks (``Server``), what it asks for (``AutoBudget``) and gets back (``InferenceResult``,
``RhoReason``), the server's state (``ServerState``) and what a reload did (``ReloadReport``).

Nothing here imports onnxruntime or ``service.scheduling``, and ``service.api`` imports none of the
modules that do (only its composition root, ``service.api.app``, builds the
``service.server.ModelServer``): the handlers are written against these types, so they cannot reach a
session or the scheduler; ``tests/test_layering.py`` checks the imports. The server hands them
``service.runtime.LoadedModel`` objects, a ``ServedModel`` plus the session, tokenizer and directory the
HTTP layer has no business with. The scheduler answers with facts (``InferenceResult``; an
``Overloaded`` carries its predicted wait): the HTTP layer writes the headers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, get_args

import numpy as np

from retention_core.codecs.base import Row
from retention_core.contract import Manifest
from retention_core.tasks import TaskSpec

# Why a request got its rho (usage.rho_reason; the values are the HTTP contract).
RhoReason = Literal["requested", "default", "auto:idle", "auto:backlog", "auto:floor"]
REASON_REQUESTED: RhoReason = "requested"  # a number from the client
REASON_DEFAULT: RhoReason = "default"  # the model's default_rho (no rho sent)
REASON_IDLE: RhoReason = "auto:idle"  # rho=auto at its max_rho: the target holds without degrading
REASON_BACKLOG: RhoReason = "auto:backlog"  # lowered (above min_rho) so the queued work meets its targets
# at min_rho: the target holds only there, or not even there ("auto:floor" is the contract's name for it)
REASON_MIN_RHO: RhoReason = "auto:floor"
RHO_REASONS: tuple[RhoReason, ...] = get_args(RhoReason)


@dataclass(frozen=True)
class AutoBudget:
    """A rho=auto request: its rho is chosen in [min_rho, max_rho] when its batch is formed."""

    min_rho: float
    max_rho: float  # auto_max_rho (or min_rho, when that is higher)
    due: float  # time.monotonic() by which it should be answered: arrival + its latency target


def due_at(deadline: float, auto_due: float | None) -> float:
    """The one due-time rule: by when a request should be answered (``time.monotonic()``), its deadline
    or its rho=auto due time (``AutoBudget.due``) when sooner. Its rho=auto target, not its deadline, is
    what a late answer would miss exactly when this is before the deadline."""
    return min(deadline, auto_due) if auto_due is not None else deadline


@dataclass
class InferenceResult:
    """What one inference request gets back: the graph's answers and the facts of how it was served
    (the HTTP layer's usage and ``x-*`` headers are written from them)."""

    outputs: list[np.ndarray]  # first graph output per row, unpadded
    kept_counts: np.ndarray  # (R, L) int64
    queue_time: float  # enqueue -> start of the first run holding its rows
    inference_time: float  # that start -> end of the last run holding its rows
    rho: float  # the rho its rows were served at (x-rho-effective)
    rho_reason: RhoReason | None = None  # rho=auto: why that rho
    predicted_wait: float = 0.0  # admission's predicted wait for the work queued ahead
    depths: list[np.ndarray] | None = None  # survival depth (T_i,) per row; None: the graph has none


@dataclass(frozen=True)
class GraphCache:
    """A backend's CUDA graphs at one moment (the torch backend on a GPU): ``GET /models`` states them,
    ``/metrics`` counts them."""

    limit: int  # graphs the cache keeps (traffic's room + those captured at load)
    held: int  # graphs held now
    planned_at_load: int  # plans the load wanted captured: the buckets the server's runs use
    captured_at_load: int  # of them, captured (bounded by a count and the device's free memory)
    load_stopped: str | None  # why the load captured fewer than planned (None: it did not stop early)
    captured_on_request: int  # captured the first time a request met their plan
    capture_failures: int  # plans whose capture failed: they run eagerly, never captured again
    eager_runs: int  # runs answered eagerly because their plan's capture had failed
    evictions: int  # graphs dropped from the cache, least recently used first


@dataclass(kw_only=True)
class ServedModel:
    """A loaded model as the HTTP layer knows it: its name, manifest, codec and task."""

    name: str  # manifest.name, or "<manifest.name>@<version>" for a versioned directory
    manifest: Manifest
    precision: str
    codec: Any  # the task's codec (retention_core.tasks)
    spec: TaskSpec  # the task's registry entry, taken at load: its inputs are the graph's feeds
    providers: list[str]  # onnxruntime's execution providers, by name (GET /models shows them)
    backend_kind: str = "onnxruntime"  # the backend that runs it (service.backends): onnxruntime | torch
    device: str = "cpu"  # where: cpu, cuda:0
    # reads its backend's CUDA graphs now (GET /models states them); None: the backend captures none
    graphs: Callable[[], GraphCache | None] | None = None
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


@dataclass(frozen=True)
class ServerState:
    """The server at one moment, as ``/health``, ``/models`` and the early refusal read it."""

    started: bool  # the first load of the models directory finished
    stopping: bool  # graceful shutdown began
    ready: bool  # started, not stopping, and every loaded model warmed up
    models: Sequence[ServedModel]  # by name
    aliases: dict[str, str]
    errors: dict[str, str]  # directory (relative to the root) -> why it did not load
    defaults: dict[str, str]  # task -> name of the model a request that names none gets


class Server(Protocol):
    """Everything the HTTP layer needs from inference (``service.server.ModelServer`` implements it)."""

    def state(self) -> ServerState: ...

    def get(self, name: str) -> ServedModel:
        """The model ``name`` (a name, version or alias) of any task; 404 (``ModelNotFound``) else."""
        ...

    def resolve(self, name: str | None, task: str) -> ServedModel:
        """The model a request for ``task`` gets: ``name``, else the task's default."""
        ...

    async def infer(
        self, model: ServedModel, rows: list[Row], rho: float, deadline: float, auto: AutoBudget | None = None
    ) -> InferenceResult:
        """``rows`` at ``rho`` (with ``auto``, at the rho their batch gets); 429 (``Overloaded``) when
        shed."""
        ...

    def shed(self, model: ServedModel, due: float, by_target: bool, queued_only: bool = False) -> None:
        """429 (``Overloaded``) before the request is tokenized when the work already queued for ``model``
        ends after ``due``. ``queued_only`` (before its body is read): only when requests are queued (a
        backlog, not only a batch finishing)."""
        ...

    async def reload(self) -> ReloadReport: ...
