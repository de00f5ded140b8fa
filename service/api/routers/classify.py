"""POST /classify"""

from __future__ import annotations

from fastapi import APIRouter

from service.api.deps import ExplainQueryDep, InferenceDep
from service.api.inference import explain_requested, explanations, infer, off_loop_if_long, shed_early
from service.api.routers.common import ERROR_RESPONSES, serving
from service.api.schemas import ClassificationResult, ClassifyRequest, ClassifyResponse

CLASSIFICATION = "classification"  # the task name in retention_core.tasks

router = APIRouter(tags=["inference"], route_class=serving(CLASSIFICATION))


@router.post("/classify", response_model=ClassifyResponse, responses=ERROR_RESPONSES)
async def classify(body: ClassifyRequest, ctx: InferenceDep, explain: ExplainQueryDep) -> ClassifyResponse:
    """Label and per-label scores of one text (``text``) or several (``texts``)."""
    texts = body.items()
    ctx.check_items(len(texts))
    model = ctx.model_for(CLASSIFICATION)
    explained = explain_requested(model, body.explain, explain)
    shed_early(ctx, model, body)
    codec = model.codec
    encoded = await off_loop_if_long(sum(map(len, texts)), lambda: [codec.encode(text) for text in texts])
    outcome = await infer(ctx, "classify", model, encoded, body)
    results = [
        ClassificationResult.model_validate(codec.decode(item, outputs))
        for item, outputs in zip(encoded, outcome.outputs, strict=True)
    ]
    single = results[0] if body.text is not None else None
    return ClassifyResponse(
        model=model.name,
        label=single.label if single else None,
        scores=single.scores if single else None,
        results=results,
        usage=outcome.usage,
        explanations=explanations(model, encoded, outcome) if explained else None,
    )
