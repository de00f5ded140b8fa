"""The task registry: everything about a task that training and serving must agree on, as data.

A ``TaskSpec`` names the graph's inputs and outputs (the ONNX contract), the kind of head the encoder
ends in and the codec that turns requests into graph rows and graph outputs into answers. Training
adds the torch side of a task (batches, loss, evaluation) in ``training.tasks.registry``; the service its HTTP
face in ``service.api.faces``.

A task is one package found by one list (``task_packages``: the shipped ``SHIPPED_TASKS``, then those
``$RETENTION_TASKS`` names). Each package holds its parts: ``spec.py`` (``SPEC``: imports only the core),
``training.py`` (``TRAINING``, ``DATASETS``: the torch side) and ``face.py`` (``FACE``: the service side).
Every registry is a ``TaskRegistry`` of one part, filled from the list when first read and again whenever
the list changes, so adding a task is adding a package to the list, with no edit anywhere else.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Literal, TypeVar

import numpy as np
from tokenizers import Tokenizer

from retention_core.codecs.base import TOKEN_FEEDS, Row, TaskCodec, pad_rows
from retention_core.contract import DEFAULT_MAX_WINDOWS, OPTIONAL_OUTPUTS, Manifest, TensorSpec

# "sequence": the head reads [CLS] only → (B, C); the last layer then computes one query.
# "token": the head reads every position → (B, T, C); dropped tokens are restored with their last state.
# "pooled": the mean of the final states of the tokens that reach the end → (B, d), no parameters; at
# ρ = 1 every real token does, so it is exactly the dense model's mean pooling. Nothing is restored:
# dropped tokens' earlier-layer states would pull the mean away from the model's
# (retention_tasks/embedding/learn.py).
# A CLS-pooled model (manifest.embedding.pooling == "cls") pools the final [CLS] state instead; the graph
# outputs the pooled vector either way, so serving does not depend on the pooling.
HeadKind = Literal["sequence", "token", "pooled"]
RHO_INPUT = "rho"  # the graph input that is per row, not per token: the kept fraction (B,)


@dataclass(frozen=True)
class CodecOptions:
    """Serving-time limits a codec applies; evaluation uses the same defaults."""

    max_windows: int = DEFAULT_MAX_WINDOWS


CodecFactory = Callable[[Manifest, Tokenizer, CodecOptions], TaskCodec]


def plain_row(ids: tuple[int, ...]) -> Row:
    return Row(ids)


@dataclass(frozen=True)
class TaskSpec:
    name: str
    head: HeadKind
    inputs: tuple[TensorSpec, ...]  # graph inputs, in order
    outputs: tuple[TensorSpec, ...]  # (main output, kept_counts): what every model directory has
    make_codec: CodecFactory
    num_outputs: int | None = None  # width of the head; None = one per label
    # A well-formed row of this task's graph from token ids (warm-up, export examples).
    example_row: Callable[[tuple[int, ...]], Row] = plain_row

    def __post_init__(self) -> None:
        unknown = [spec.name for spec in self.inputs if spec.name not in (*TOKEN_FEEDS, RHO_INPUT)]
        if unknown:
            raise ValueError(f"task {self.name!r}: no row field feeds the graph inputs {unknown}")

    @property
    def token_inputs(self) -> tuple[str, ...]:
        """The graph inputs read off the rows (every input but rho), in order."""
        return tuple(spec.name for spec in self.inputs if spec.name != RHO_INPUT)

    def feeds(
        self, rows: list[Row], rhos: Sequence[float], pad_id: int, length: int | None = None
    ) -> dict[str, np.ndarray]:
        """One padded batch of this task's graph: exactly its ``inputs``, the per-token ones from the rows'
        fields (``codecs.base.TOKEN_FEEDS``), rho one per row (B,)."""
        feeds = pad_rows(rows, pad_id, length, self.token_inputs)
        feeds[RHO_INPUT] = np.asarray(rhos, dtype=np.float32)  # (B,)
        return feeds

    @property
    def exported_outputs(self) -> tuple[TensorSpec, ...]:
        """What export writes today: the task's outputs, then the optional ones (survival depth)."""
        return (*self.outputs, *OPTIONAL_OUTPUTS)

    def output_contract(self, declared: int) -> tuple[TensorSpec, ...]:
        """The outputs a model directory declaring ``declared`` of them must have: the task's own, then
        as many of the optional ones (older exports stop after kept_counts). Any other count gets the
        full list, which then fails to match."""
        if len(self.outputs) <= declared <= len(self.exported_outputs):
            return self.exported_outputs[:declared]
        return self.exported_outputs

    @property
    def last_layer_queries(self) -> int | None:
        """A head that reads only [CLS] lets the last layer compute one query. A pooled head's depends on
        the model's pooling (CLS pooling: 1, training.engine.model.RetentionModel.last_layer_queries); the
        manifest's ``schedule.last_layer_queries`` records what each graph does."""
        return 1 if self.head == "sequence" else None

    @property
    def restores_tokens(self) -> bool:
        """Token heads need every position: dropped tokens come back with their last state."""
        return self.head == "token"

    def head_width(self, labels: list[str] | tuple[str, ...]) -> int:
        if self.num_outputs is not None:
            return self.num_outputs
        if not labels:
            raise ValueError(f"a {self.name} model needs labels")
        return len(labels)


# ---------------------------------------------------------------------- the one list of tasks
# The shipped tasks, in the order every registry lists them (routes mount, /models sorts, CLIs offer).
SHIPPED_TASKS = (
    "retention_tasks.classification",
    "retention_tasks.qa",
    "retention_tasks.summarization",
    "retention_tasks.embedding",
)
# More task packages, comma-separated (a test package, a task kept out of the tree): appended to the list.
TASKS_VARIABLE = "RETENTION_TASKS"


def task_packages() -> tuple[str, ...]:
    """The task packages: the shipped ones, then ``$RETENTION_TASKS``'s (each once, in order)."""
    extra = (name.strip() for name in os.environ.get(TASKS_VARIABLE, "").split(","))
    return tuple(dict.fromkeys((*SHIPPED_TASKS, *(name for name in extra if name))))


def task_part(package: str, part: str) -> ModuleType | None:
    """``package.part`` imported (``spec``, ``training``, ``face``), or None when the package has no such
    part. Imported by name: the core never imports a training or service part itself, its caller asks."""
    name = f"{package}.{part}"
    if importlib.util.find_spec(name) is None:
        return None
    return importlib.import_module(name)


V = TypeVar("V")


class TaskRegistry(Mapping[str, V]):
    """One part's registry (task name → entry; the dataset registry: dataset name → splits): read-only,
    filled from ``task_packages()`` on first read and again when the list changes, so a package added to
    (or removed from) ``$RETENTION_TASKS`` is in (or out of) every registry at once."""

    def __init__(
        self,
        part: str,
        entries: Callable[[ModuleType], Iterable[tuple[str, V]]],
        check: Callable[[Mapping[str, V]], None] | None = None,
    ) -> None:
        self.part = part
        self._entries = entries  # the part's module → its (name, entry) pairs
        self._check = check  # refuses a registry that cannot be served (two faces at one path, ...)
        self._filled: tuple[tuple[str, ...], dict[str, V]] | None = None
        self._lock = threading.RLock()  # one fill at a time (the service reads from several threads)

    def _current(self) -> dict[str, V]:
        packages = task_packages()
        filled = self._filled
        if filled is not None and filled[0] == packages:
            return filled[1]
        with self._lock:
            if self._filled is not None and self._filled[0] == packages:
                return self._filled[1]
            found: dict[str, V] = {}
            for package in packages:
                module = task_part(package, self.part)
                for name, entry in () if module is None else self._entries(module):
                    if name in found:
                        raise ValueError(f"{package}.{self.part}: {name!r} is registered twice")
                    found[name] = entry
            if self._check is not None:
                self._check(found)
            self._filled = (packages, found)
            return found

    def __getitem__(self, name: str) -> V:
        return self._current()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._current())

    def __len__(self) -> int:
        return len(self._current())

    def __repr__(self) -> str:
        return f"TaskRegistry({self.part!r}, {sorted(self)})"


def spec_entries(module: ModuleType) -> list[tuple[str, TaskSpec]]:
    spec: TaskSpec = module.SPEC
    return [(spec.name, spec)]


TASKS: TaskRegistry[TaskSpec] = TaskRegistry("spec", spec_entries)


def task_spec(name: str) -> TaskSpec:
    if name not in TASKS:
        raise KeyError(f"unknown task {name!r}; known: {sorted(TASKS)}")
    return TASKS[name]
