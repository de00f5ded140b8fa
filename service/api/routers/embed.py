"""POST /embed"""

from __future__ import annotations

from fastapi import APIRouter

from service.api.deps import ExplainQueryDep, InferenceContext, InferenceDep
from service.api.inference import explain_requested, explanations, infer, off_loop_if_long, shed_early
from service.api.routers.common import ERROR_RESPONSES, serving
from service.api.schemas import EmbedRequest, EmbedResponse, Explanation, InferenceOptions, Usage
from service.runtime import LoadedModel

EMBEDDING = "embedding"  # the task name in retention_core.tasks

router = APIRouter(tags=["inference"], route_class=serving(EMBEDDING))


async def embed_texts(
    ctx: InferenceContext,
    endpoint: str,
    model: LoadedModel,
    texts: list[str],
    options: InferenceOptions,
    normalize: bool | None,
    explain: bool = False,
) -> tuple[list[list[float]], Usage, list[Explanation] | None]:
    """One vector per text, in order (``normalize`` None: the model's default), the request's usage and,
    with ``explain``, the texts' survival depths. Shared by /embed and the OpenAI-compatible
    /v1/embeddings (which never explains)."""
    shed_early(ctx, model, options)
    codec = model.codec
    encoded = await off_loop_if_long(sum(map(len, texts)), lambda: [codec.encode(text) for text in texts])
    outcome = await infer(ctx, endpoint, model, encoded, options)
    vectors = [
        list(codec.decode(item, outputs, normalize=normalize)["embedding"])
        for item, outputs in zip(encoded, outcome.outputs, strict=True)
    ]
    return vectors, outcome.usage, explanations(model, encoded, outcome) if explain else None


@router.post("/embed", response_model=EmbedResponse, responses=ERROR_RESPONSES)
async def embed(body: EmbedRequest, ctx: InferenceDep, explain: ExplainQueryDep) -> EmbedResponse:
    """The vector of one text (``text``) or of several (``texts``): the model's pooling (mean, or [CLS])
    of the final token states."""
    texts = body.items()
    ctx.check_items(len(texts))
    model = ctx.model_for(EMBEDDING)
    explained = explain_requested(model, body.explain, explain)
    vectors, usage, explained_tokens = await embed_texts(
        ctx, "embed", model, texts, body, body.normalize, explained
    )
    return EmbedResponse(
        model=model.name,
        embedding=vectors[0] if body.text is not None else None,
        embeddings=vectors,
        usage=usage,
        explanations=explained_tokens,
    )
