"""The toy reranker over HTTP: ``POST /toy_rerank`` with ``{query, passages}`` in and ``{scores,
ranking}`` out, at most ``MAX_PASSAGES`` passages a body (its own item limit)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, Field

from retention_core.codecs.base import Encoded
from service.api.faces import Answer, TaskFace, encode_each
from service.api.schemas import ExplainOptions, Explanation, NonEmptyText, Usage
from service.settings import Settings
from tests.task_packages.toy_rerank.spec import SPEC

PATH = "/toy_rerank"
MAX_PASSAGES = 8  # per request: the face's own item limit


class RerankRequest(ExplainOptions):
    """One query and the passages to rank for it."""

    query: NonEmptyText
    passages: Annotated[list[NonEmptyText], Field(min_length=1)]


class RerankResponse(BaseModel):
    model: str
    scores: list[float] = Field(description="the relevance of each passage, in input order")
    ranking: list[int] = Field(description="the passages' indices, most relevant first")
    usage: Usage
    explanations: list[Explanation] | None = None


async def encode_query(codec: Any, body: RerankRequest) -> list[Encoded]:
    """One input: the query with all its passages (a row each)."""
    return await encode_each(codec, [(body.query, *body.passages)])


def rerank_reply(answer: Answer[RerankRequest]) -> RerankResponse:
    """The relevance of each passage to the query, and the passages ordered by it."""
    (decoded,) = answer.served.decoded()
    return RerankResponse(**answer.envelope, scores=decoded["scores"], ranking=decoded["ranking"])


def passage_limit(settings: Settings) -> int:
    return MAX_PASSAGES


FACE = TaskFace(
    task=SPEC.name,
    path=PATH,
    request=RerankRequest,
    response=RerankResponse,
    fields=("query", "passages"),
    count=lambda body: len(body.passages),
    encode=encode_query,
    respond=rerank_reply,
    item_limit=passage_limit,
)
