"""How clients reach extractive summarization: ``POST /summarize``, one document (``text``, or the
client's own ``sentences``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator
from starlette.concurrency import run_in_threadpool

from retention_core.codecs.base import Encoded
from retention_tasks.summarization.sentences import split_sentences
from retention_tasks.summarization.spec import SPEC
from service.api.faces import Answer, TaskFace
from service.api.schemas import (
    EXPLANATIONS_FIELD,
    ExplainOptions,
    Explanation,
    NonEmptyText,
    NonEmptyTexts,
    Omittable,
    Usage,
    whole_float_to_int,
)
from service.errors import InvalidRequest, PayloadTooLarge

SentenceCount = Annotated[int, Field(ge=1, le=1000), BeforeValidator(whole_float_to_int)]


class SummarizeRequest(ExplainOptions):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "oneOf": [{"required": ["text"]}, {"required": ["sentences"]}],
            "not": {"required": ["max_sentences", "ratio"]},
        },
    )
    text: Omittable[NonEmptyText] = None
    sentences: Omittable[NonEmptyTexts] = None
    max_sentences: Omittable[SentenceCount] = None
    ratio: Omittable[Annotated[float, Field(gt=0.0, le=1.0, allow_inf_nan=False)]] = None

    @model_validator(mode="after")
    def one_input(self) -> SummarizeRequest:
        if (self.text is None) == (self.sentences is None):
            raise ValueError("send exactly one of 'text' or 'sentences'")
        if self.max_sentences is not None and self.ratio is not None:
            raise ValueError("send at most one of 'max_sentences' or 'ratio'")
        return self


class SelectedSentence(BaseModel):
    model_config = ConfigDict(extra="allow")
    index: int = Field(description="position of the sentence in the document")
    text: str
    score: float


class SummarizeResponse(BaseModel):
    model: str
    summary: str
    sentences: list[SelectedSentence] = Field(description="selected sentences in document order")
    usage: Usage
    explanations: list[Explanation] | None = EXPLANATIONS_FIELD


MAX_SENTENCES = 2048


def document_sentences(body: SummarizeRequest) -> list[str]:
    """The client's sentences, or the server's rule-based split of ``text`` (``sentences.py``).
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


def document_of(text: str) -> dict[str, Any]:
    """A body around a caller's text: its clauses made sentences (a summary needs several), two kept."""
    return {"text": text.replace(" and ", ". And "), "max_sentences": 2}


FACE = TaskFace(
    task=SPEC.name,
    path="/summarize",
    request=SummarizeRequest,
    response=SummarizeResponse,
    fields=("text",),  # or the client's own ``sentences``; one of them per document
    count=one_document,
    encode=encode_document,
    respond=summary_reply,
    example=document_of,
    view=Path(__file__).with_name("explorer.js"),
)
