"""The HTTP face of each task: its route, request and response bodies, how a body becomes codec rows and
how the graph's answers become the response.

The task registry (``retention_core.tasks``) says what a task is; this registry, beside it and keyed by
the same name, says how clients reach it. ONE generic handler (``service.api.routers.tasks``) serves
every face, so a task registered in both (a test may do it) is served over HTTP, counted in the metrics
under its ``task`` label and listed in the OpenAPI document with no route of its own. ``GET /models``
lists each model's route and the body fields of one input (``TaskFace.fields``), so clients that talk
HTTP (the batch client, the explorer page) learn a new task from the server rather than from a table of
their own. The core knows nothing of HTTP: the faces live in the service, which alone imports FastAPI.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import cache
from typing import Any, Generic, TypeVar

from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from retention_core.codecs.base import Encoded
from retention_core.tasks import task_spec
from retention_core.text import split_sentences
from service.api.inference import Served, off_loop_if_long
from service.api.schemas import (
    ClassificationResult,
    ClassifyRequest,
    ClassifyResponse,
    EmbedRequest,
    EmbedResponse,
    ExplainOptions,
    Explanation,
    QARequest,
    QAResponse,
    QAResult,
    SelectedSentence,
    SummarizeRequest,
    SummarizeResponse,
    TextsRequest,
)
from service.errors import InvalidRequest, PayloadTooLarge, UnsupportedValue
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


FACES: dict[str, TaskFace[Any, Any]] = {}


def register_face(face: TaskFace[Body, Reply]) -> TaskFace[Body, Reply]:
    """Add (or replace) a task's face. A KeyError for a task the core registry does not know; a
    ValueError for a path another task's face already serves, or for declared input fields its request
    body does not have (clients would build bodies the route refuses)."""
    task_spec(face.task)
    taken = {other.path: other.task for other in FACES.values() if other.task != face.task}
    if face.path in taken:
        raise ValueError(f"{face.path} already serves task {taken[face.path]!r}")
    unknown = [name for name in face.fields if name not in face.request.model_fields]
    if not face.fields or unknown:
        raise ValueError(
            f"{face.path}: input fields {list(face.fields)} are not fields of {face.request.__name__}"
        )
    FACES[face.task] = face
    return face


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
    )


def each_text(body: TextsRequest) -> list[tuple[str, ...]]:
    """One input per text (``text`` or ``texts``)."""
    return [(text,) for text in body.items()]


def at_top(results: list[Any], single: bool) -> dict[str, Any]:
    """A request of one input (``text``; ``question`` + ``context``) also gets its result's fields at the
    top of the response; a request of several (``texts``, ``items``) leaves them null."""
    return dict(results[0]) if single else {}


# ---------------------------------------------------------------------- classification: POST /classify
def classify_reply(answer: Answer[ClassifyRequest]) -> ClassifyResponse:
    """Label and per-label scores of one text (``text``) or several (``texts``)."""
    results = [ClassificationResult.model_validate(item) for item in answer.served.decoded()]
    single = at_top(results, answer.body.text is not None)
    return ClassifyResponse(**answer.envelope, **single, results=results)


register_face(
    item_face("classification", "/classify", (ClassifyRequest, ClassifyResponse), each_text, classify_reply)
)


# ---------------------------------------------------------------------- qa: POST /qa
def each_pair(body: QARequest) -> list[tuple[str, ...]]:
    """One input per (question, context)."""
    return [(item.question, item.context) for item in body.pairs()]


def qa_reply(answer: Answer[QARequest]) -> QAResponse:
    """Extractive answer (text, character offsets ``[start, end)`` in the context, score) of one
    question (``question`` + ``context``) or several (``items``). Long contexts are read in windows."""
    results = [QAResult.model_validate(item) for item in answer.served.decoded()]
    return QAResponse(**answer.envelope, **at_top(results, answer.body.items is None), results=results)


register_face(item_face("qa", "/qa", (QARequest, QAResponse), each_pair, qa_reply, ("question", "context")))


# ---------------------------------------------------------------------- summarization: POST /summarize
MAX_SENTENCES = 2048


def document_sentences(body: SummarizeRequest) -> list[str]:
    """The client's sentences, or the server's rule-based split of ``text`` (``retention_core.text``).
    A text the splitter finds no sentence in (only whitespace, e.g. a no-break space) is one sentence:
    the schema accepts any non-empty text, so the server answers it (an empty summary) rather than
    refuse it."""
    if body.sentences is not None:
        return list(body.sentences)
    text = body.text or ""
    return split_sentences(text) or [text]


def one_document(body: SummarizeRequest) -> int:
    return 1


async def encode_document(codec: Any, body: SummarizeRequest) -> list[Encoded]:
    """The document's sentences (split in the thread pool: a document may be long), one input."""
    sentences = await run_in_threadpool(document_sentences, body)
    if not sentences:
        raise InvalidRequest("the document has no sentences")
    if len(sentences) > MAX_SENTENCES:
        raise PayloadTooLarge(f"at most {MAX_SENTENCES} sentences per request")
    return [await run_in_threadpool(codec.encode, sentences)]


def summary_reply(answer: Answer[SummarizeRequest]) -> SummarizeResponse:
    """Extractive summary: the selected sentences in document order, with their scores. Choose the length
    with ``max_sentences`` or ``ratio`` (fraction of the document's sentences); default 3 sentences."""
    body = answer.body
    (decoded,) = answer.served.decoded(max_sentences=body.max_sentences, ratio=body.ratio)
    selected = sorted(
        (SelectedSentence.model_validate(s) for s in decoded["sentences"]), key=lambda s: s.index
    )
    return SummarizeResponse(
        **answer.envelope, summary=" ".join(s.text for s in selected), sentences=selected
    )


register_face(
    TaskFace(
        task="summarization",
        path="/summarize",
        request=SummarizeRequest,
        response=SummarizeResponse,
        fields=("text",),  # or the client's own ``sentences``; one of them per document
        count=one_document,
        encode=encode_document,
        respond=summary_reply,
    )
)


# ---------------------------------------------------------------------- embedding: POST /embed
# also served by OpenAI's POST /v1/embeddings and TEI's API (routers/openai_compat.py, tei_compat.py)
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


def embed_reply(answer: Answer[EmbedRequest]) -> EmbedResponse:
    """The vector of one text (``text``) or of several (``texts``): the model's pooling (mean, or [CLS])
    of the final token states."""
    embeddings = vectors(answer.served, answer.body.normalize)
    return EmbedResponse(
        **answer.envelope,
        embedding=embeddings[0] if answer.body.text is not None else None,
        embeddings=embeddings,
    )


register_face(
    item_face(
        EMBEDDING,
        "/embed",
        (EmbedRequest, EmbedResponse),
        each_text,
        embed_reply,
        item_limit=max_embedding_inputs,
    )
)
