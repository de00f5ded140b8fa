"""POST /v1/embeddings: OpenAI's embeddings API (request, response and error shapes), so the ``openai``
client and tools built on it work against this server unchanged. rho, rho=auto and min_rho come as
extra body fields (``extra_body={"rho": 0.3}``) or query parameters, as on every inference route."""

from __future__ import annotations

import base64

import numpy as np
from fastapi import APIRouter

from service.api.deps import InferenceDep
from service.api.faces import EMBEDDING, check_dimensions, encode_each, vectors
from service.api.inference import run
from service.api.routers.common import OPENAI_ERROR_RESPONSES, serving
from service.api.schemas import (
    OpenAIEmbedding,
    OpenAIEmbeddingRequest,
    OpenAIEmbeddingResponse,
    OpenAIUsage,
)

router = APIRouter(prefix="/v1", tags=["openai"], route_class=serving(EMBEDDING))


def encoded_vector(vector: list[float], encoding_format: str) -> list[float] | str:
    """``base64``: the little-endian float32 bytes, which the openai client decodes itself."""
    if encoding_format == "base64":
        return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
    return vector


@router.post("/embeddings", response_model=OpenAIEmbeddingResponse, responses=OPENAI_ERROR_RESPONSES)
async def create_embeddings(body: OpenAIEmbeddingRequest, ctx: InferenceDep) -> OpenAIEmbeddingResponse:
    """OpenAI-compatible embeddings (always L2-normalised, as OpenAI's are). Errors in OpenAI's shape."""
    texts = body.texts()
    ctx.check_items(len(texts), param="input", limit=ctx.settings.max_embedding_inputs)
    model = ctx.model_for(EMBEDDING, body.model)
    check_dimensions(model, body.dimensions)
    served = await run(
        ctx, "v1/embeddings", model, body, lambda: encode_each(model.codec, [(text,) for text in texts])
    )
    usage = served.outcome.usage
    return OpenAIEmbeddingResponse(
        data=[
            OpenAIEmbedding(index=index, embedding=encoded_vector(vector, body.encoding_format))
            for index, vector in enumerate(vectors(served, normalize=True))
        ],
        model=model.name,
        usage=OpenAIUsage(
            prompt_tokens=usage.processed_tokens, total_tokens=usage.processed_tokens, **usage.model_dump()
        ),
    )
