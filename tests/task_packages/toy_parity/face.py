"""The toy parity task over HTTP: ``POST /toy_parity``, its own request and response bodies."""

from __future__ import annotations

from pydantic import BaseModel, Field

from service.api.faces import Answer, each_text, item_face
from service.api.schemas import Explanation, TextsRequest, Usage
from tests.task_packages.toy_parity.spec import SPEC

PATH = "/toy_parity"


class ParityRequest(TextsRequest):
    """One text (``text``) or several (``texts``)."""


class ParityResponse(BaseModel):
    model: str
    parities: list[str] = Field(description="the parity label of each text, in input order")
    usage: Usage
    explanations: list[Explanation] | None = None


def parity_reply(answer: Answer[ParityRequest]) -> ParityResponse:
    """The parity of each text's first word."""
    return ParityResponse(**answer.envelope, parities=[item["label"] for item in answer.served.decoded()])


FACE = item_face(SPEC.name, PATH, (ParityRequest, ParityResponse), each_text, parity_reply)
