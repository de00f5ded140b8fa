"""How clients reach embeddings: ``POST /embed``, one text (``text``) or several (``texts``); TEI's body at
the same route and OpenAI's ``POST /v1/embeddings`` are mounted beside it (``service.api.routers``).

Its bodies stay in ``service.api.schemas``: TEI's ``/embed`` reads either shape there."""

from __future__ import annotations

from retention_tasks.embedding.spec import SPEC
from service.api.faces import Answer, each_text, item_face, max_embedding_inputs, vectors
from service.api.schemas import EmbedRequest, EmbedResponse


def embed_reply(answer: Answer[EmbedRequest]) -> EmbedResponse:
    """The vector of one text (``text``) or of several (``texts``): the model's pooling (mean, or [CLS])
    of the final token states."""
    embeddings = vectors(answer.served, answer.body.normalize)
    return EmbedResponse(
        **answer.envelope,
        embedding=embeddings[0] if answer.body.text is not None else None,
        embeddings=embeddings,
    )


FACE = item_face(
    SPEC.name,
    "/embed",
    (EmbedRequest, EmbedResponse),
    each_text,
    embed_reply,
    item_limit=max_embedding_inputs,
)
