"""How clients reach embeddings: ``POST /embed``, one text (``text``) or several (``texts``), whose route
also reads TEI's body; OpenAI's ``POST /v1/embeddings`` and TEI's ``/``, ``/info`` and ``/tokenize`` are
mounted beside it (the face's companions, ``service.api.routers``' compatibility routers).

Its bodies stay in ``service.api.schemas``: TEI's ``/embed`` reads either shape there."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from retention_tasks.embedding.spec import SPEC
from service.api.early import OPENAI_EMBEDDINGS_PATH
from service.api.faces import Answer, each_text, item_face, max_embedding_inputs, vectors
from service.api.routers import openai_compat, tei_compat
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


FACE = replace(
    item_face(
        SPEC.name,
        "/embed",
        (EmbedRequest, EmbedResponse),
        each_text,
        embed_reply,
        item_limit=max_embedding_inputs,
        view=Path(__file__).with_name("explorer.js"),
    ),
    router=tei_compat.embed_router,
    companions=(openai_compat.router, tei_compat.embed_root, tei_compat.router),
    companion_paths=(OPENAI_EMBEDDINGS_PATH, tei_compat.TEI_EMBED_PATH),
)
