"""How clients reach classification: ``POST /classify``, one text (``text``) or several (``texts``)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field

from retention_tasks.classification.spec import SPEC
from service.api.faces import Answer, at_top, each_text, item_face
from service.api.schemas import EXPLANATIONS_FIELD, Explanation, TextsRequest, Usage


class ClassifyRequest(TextsRequest):
    pass


class ClassificationResult(BaseModel):
    label: str
    scores: dict[str, float]


class ClassifyResponse(BaseModel):
    model: str
    label: str | None = Field(default=None, description="single 'text' requests only")
    scores: dict[str, float] | None = Field(default=None, description="single 'text' requests only")
    results: list[ClassificationResult]
    usage: Usage
    explanations: list[Explanation] | None = EXPLANATIONS_FIELD


def classify_reply(answer: Answer[ClassifyRequest]) -> ClassifyResponse:
    """Label and per-label scores of one text (``text``) or several (``texts``)."""
    results = [ClassificationResult.model_validate(item) for item in answer.served.decoded()]
    single = at_top(results, answer.body.text is not None)
    return ClassifyResponse(**answer.envelope, **single, results=results)


FACE = item_face(
    SPEC.name,
    "/classify",
    (ClassifyRequest, ClassifyResponse),
    each_text,
    classify_reply,
    view=Path(__file__).with_name("explorer.js"),
)
