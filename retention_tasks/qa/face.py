"""How clients reach extractive QA: ``POST /qa``, one (``question``, ``context``) or several (``items``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from retention_tasks.qa.spec import SPEC
from service.api.faces import Answer, at_top, item_face
from service.api.schemas import (
    EXPLANATIONS_FIELD,
    ExplainOptions,
    Explanation,
    NonEmptyText,
    Omittable,
    Usage,
)


class QAItem(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    question: NonEmptyText
    context: NonEmptyText


class QARequest(ExplainOptions):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "oneOf": [
                {"required": ["question", "context"], "not": {"required": ["items"]}},
                {
                    "required": ["items"],
                    "not": {"anyOf": [{"required": ["question"]}, {"required": ["context"]}]},
                },
            ]
        },
    )
    question: Omittable[NonEmptyText] = None
    context: Omittable[NonEmptyText] = None
    items: Omittable[Annotated[list[QAItem], Field(min_length=1)]] = Field(
        default=None, description="several (question, context)"
    )

    @model_validator(mode="after")
    def one_input(self) -> QARequest:
        single = self.question is not None or self.context is not None
        if single == (self.items is not None):
            raise ValueError("send either 'question' and 'context', or 'items'")
        if single and (self.question is None or self.context is None):
            raise ValueError("'question' and 'context' go together")
        return self

    def pairs(self) -> list[QAItem]:
        if self.items is not None:
            return list(self.items)
        return [QAItem(question=self.question or "", context=self.context or "")]


class QAResult(BaseModel):
    model_config = ConfigDict(extra="allow")
    answer: str
    start: int = Field(description="character offset of the answer in the context")
    end: int = Field(description="character offset just past the answer")
    score: float


class QAResponse(BaseModel):
    model: str
    answer: str | None = None
    start: int | None = None
    end: int | None = None
    score: float | None = None
    results: list[QAResult]
    usage: Usage
    explanations: list[Explanation] | None = EXPLANATIONS_FIELD


def each_pair(body: QARequest) -> list[tuple[str, ...]]:
    """One input per (question, context)."""
    return [(item.question, item.context) for item in body.pairs()]


def qa_reply(answer: Answer[QARequest]) -> QAResponse:
    """Extractive answer (text, character offsets ``[start, end)`` in the context, score) of one
    question (``question`` + ``context``) or several (``items``). Long contexts are read in windows."""
    results = [QAResult.model_validate(item) for item in answer.served.decoded()]
    return QAResponse(**answer.envelope, **at_top(results, answer.body.items is None), results=results)


def question_about(text: str) -> dict[str, Any]:
    """A body around a caller's text: one question asked of it as the context."""
    return {"question": "what does the model keep?", "context": text}


FACE = item_face(
    SPEC.name,
    "/qa",
    (QARequest, QAResponse),
    each_pair,
    qa_reply,
    ("question", "context"),
    example=question_about,
    view=Path(__file__).with_name("explorer.js"),
)
