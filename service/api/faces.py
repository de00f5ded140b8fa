"""The HTTP face of each task: its route, request and response bodies, how a body becomes codec rows and
how the graph's answers become the response.

The task registry (``retention_core.tasks``) says what a task is; this registry, beside it and keyed by
the same name, says how clients reach it. Both fill themselves from the one list of task packages
(``retention_core.tasks.task_packages``): this one from each package's ``face.py`` (its ``FACE``, its
bodies beside it). ONE generic handler (``service.api.routers.tasks``) serves every face (a face may
build its own route, ``TaskFace.router``, and mount routers beside it, ``companions``), so a task on
the list (a test package too) is served over HTTP, counted in the metrics under its ``task`` label and
listed in the OpenAPI document with no route of its own. ``GET /models``
lists each model's route and the body fields of one input (``TaskFace.fields``), so clients that talk
HTTP (the batch client, the explorer page) learn a new task from the server rather than from a table of
their own. The core knows nothing of HTTP: the faces live in the service, which alone imports FastAPI.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any, Generic, TypeVar

from fastapi import APIRouter
from pydantic import BaseModel

from retention_core.codecs.base import Encoded
from retention_core.tasks import TaskRegistry, task_spec
from service.api.inference import Served, off_loop_if_long
from service.api.schemas import ExplainOptions, Explanation, TextsRequest
from service.errors import UnsupportedValue
from service.serving import ServedModel
from service.settings import Settings

Body = TypeVar("Body", bound=ExplainOptions)
Reply = TypeVar("Reply", bound=BaseModel)


@dataclass(frozen=True)
class Answer(Generic[Body]):
    """What a face turns into its response: the request, what serving it produced, its explanations
    (``explain=true`` only)."""

    body: Body
    served: Served
    explanations: list[Explanation] | None

    @property
    def envelope(self) -> dict[str, Any]:
        """The fields every inference response carries: the model, the usage, the explanations."""
        usage = self.served.outcome.usage
        return {"model": self.served.model.name, "usage": usage, "explanations": self.explanations}


def max_items(settings: Settings) -> int:
    """The inputs one request may carry unless its face says otherwise: ``max_items`` (each input may
    be many windows)."""
    return settings.max_items


@cache
def array_properties(request: type[BaseModel]) -> frozenset[str]:
    """The properties of a request body whose JSON Schema type is an array (a list of texts). The
    schema, not the annotation, is what clients read, so the two cannot disagree."""
    properties = request.model_json_schema()["properties"]
    return frozenset(name for name, schema in properties.items() if schema.get("type") == "array")


@dataclass(frozen=True)
class TaskFace(Generic[Body, Reply]):
    """How clients reach one task of the registry over HTTP (``POST path``)."""

    task: str  # its name in retention_core.tasks
    path: str  # "/classify"
    request: type[Body]
    response: type[Reply]
    # The body fields of ONE input, each read from a column of a row by the batch client (identity
    # mapping by default) and shown as one form input by the explorer: ("text",); ("question", "context").
    fields: tuple[str, ...]
    count: Callable[[Body], int]  # the inputs of a body, checked against item_limit
    encode: Callable[[Any, Body], Awaitable[list[Encoded]]]  # (the model's codec, the body) -> rows
    respond: Callable[[Answer[Body]], Reply]
    item_limit: Callable[[Settings], int] = max_items  # the most inputs (``count``) one body may carry
    # A valid body of one input built around a caller's text (load benchmarks, the image test); None: each
    # of ``fields`` is the text (a list field: [text]). A task whose fields mean different things (a QA
    # question and its context) says how.
    example: Callable[[str], dict[str, Any]] | None = None
    # A route of its own in place of the generic handler's (``routers.tasks.task_router``; the
    # embedding's /embed also reads TEI's body), routers mounted beside it (after every task's route), and
    # the paths among theirs that run this task's models (what early refusal reads a request's task from).
    router: Callable[[TaskFace[Any, Any]], APIRouter] | None = None
    companions: tuple[APIRouter, ...] = ()
    companion_paths: tuple[str, ...] = ()
    # The explorer page's own view of this task: a script beside the face (its ``explorer.js``) that sets
    # ``VIEWS[task]`` (title, form, shading, answer), served in ``/explorer/views.js``; None: the page's
    # generic view (one box per field, the answer as a table).
    view: Path | None = None

    def example_body(self, text: str) -> dict[str, Any]:
        """A request body of one input around ``text``: what a client that has texts and knows only the
        face sends (every consumer builds bodies here, none from a table of its own)."""
        if self.example is not None:
            return self.example(text)
        lists = self.list_fields
        return {name: [text] if name in lists else text for name in self.fields}

    @property
    def list_fields(self) -> tuple[str, ...]:
        """Those of ``fields`` whose value is a list of texts (a reranker's passages): a form shows one
        item per line, a batch row holds a JSON list."""
        arrays = array_properties(self.request)
        return tuple(name for name in self.fields if name in arrays)

    @property
    def description(self) -> str:
        """The OpenAPI operation's: ``respond``'s docstring, which says what the response holds."""
        return inspect.cleandoc(self.respond.__doc__ or "")

    @property
    def endpoint(self) -> str:
        """The route's name: the metrics' ``endpoint`` label and the OpenAPI operation's."""
        return self.path.strip("/")


def face_entries(module: ModuleType) -> list[tuple[str, TaskFace[Any, Any]]]:
    """A task package's ``face.py``: its ``FACE``."""
    face: TaskFace[Any, Any] = module.FACE
    return [(face.task, face)]


def check_faces(faces: Mapping[str, TaskFace[Any, Any]]) -> None:
    """A KeyError for a face of a task the core registry does not know; a ValueError for two faces at one
    path, or for declared input fields its request body does not have (clients would build bodies the
    route refuses)."""
    paths: dict[str, str] = {}
    for face in faces.values():
        task_spec(face.task)
        if paths.setdefault(face.path, face.task) != face.task:
            raise ValueError(f"{face.path} already serves task {paths[face.path]!r}")
        unknown = [name for name in face.fields if name not in face.request.model_fields]
        if not face.fields or unknown:
            raise ValueError(
                f"{face.path}: input fields {list(face.fields)} are not fields of {face.request.__name__}"
            )


FACES: TaskRegistry[TaskFace[Any, Any]] = TaskRegistry("face", face_entries, check_faces)


async def encode_each(codec: Any, items: list[tuple[str, ...]]) -> list[Encoded]:
    """``codec.encode(*item)`` for every input: on the event loop when the texts are short, else in the
    thread pool (``off_loop_if_long``)."""
    chars = sum(len(text) for item in items for text in item)
    return await off_loop_if_long(chars, lambda: [codec.encode(*item) for item in items])


def item_face(
    task: str,
    path: str,
    bodies: tuple[type[Body], type[Reply]],
    items_of: Callable[[Body], list[tuple[str, ...]]],
    respond: Callable[[Answer[Body]], Reply],
    fields: tuple[str, ...] = ("text",),
    item_limit: Callable[[Settings], int] = max_items,
    example: Callable[[str], dict[str, Any]] | None = None,
    view: Path | None = None,
) -> TaskFace[Body, Reply]:
    """The face of a task whose body lists its inputs: ``items_of(body)`` gives each one's arguments to
    the codec's ``encode`` (texts), counted against ``item_limit`` and encoded by ``encode_each``;
    ``fields``: the body fields of one input (one ``text`` unless told)."""
    request, response = bodies

    async def encode(codec: Any, body: Body) -> list[Encoded]:
        return await encode_each(codec, items_of(body))

    return TaskFace(
        task=task,
        path=path,
        request=request,
        response=response,
        fields=fields,
        count=lambda body: len(items_of(body)),
        encode=encode,
        respond=respond,
        item_limit=item_limit,
        example=example,
        view=view,
    )


def each_text(body: TextsRequest) -> list[tuple[str, ...]]:
    """One input per text (``text`` or ``texts``)."""
    return [(text,) for text in body.items()]


def at_top(results: list[Any], single: bool) -> dict[str, Any]:
    """A request of one input (``text``; ``question`` + ``context``) also gets its result's fields at the
    top of the response; a request of several (``texts``, ``items``) leaves them null."""
    return dict(results[0]) if single else {}


# ---------------------------------------------------------------------- embeddings, shared
# The embedding task's face (retention_tasks/embedding/face.py) and OpenAI's POST /v1/embeddings and TEI's
# API (routers/openai_compat.py, tei_compat.py) share these.
EMBEDDING = "embedding"


def max_embedding_inputs(settings: Settings) -> int:
    """OpenAI's embeddings limit (a large request is served across batches), as /v1/embeddings."""
    return settings.max_embedding_inputs


def vector_size(model: ServedModel) -> int:
    """The size of the model's vectors: the manifest's embedding record, else the encoder width."""
    info = model.manifest.embedding
    return info.dimensions if info is not None else model.manifest.backbone.hidden_size


def check_dimensions(model: ServedModel, dimensions: int | None) -> None:
    """Vectors are served at the model's size (OpenAI's and TEI's ``dimensions``); any other size is
    refused rather than truncated (vLLM does the same for models not trained for shorter vectors)."""
    size = vector_size(model)
    if dimensions is not None and dimensions != size:
        raise UnsupportedValue(
            f"model {model.name!r} produces {size}-dimensional embeddings; 'dimensions' must be {size} "
            f"or left out, got {dimensions}",
            param="dimensions",
        )


def vectors(served: Served, normalize: bool | None) -> list[list[float]]:
    """One vector per input, in order (``normalize`` None: the model's default)."""
    return [list(item["embedding"]) for item in served.decoded(normalize=normalize)]
