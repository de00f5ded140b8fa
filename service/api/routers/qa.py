"""POST /qa"""

from __future__ import annotations

from fastapi import APIRouter

from service.api.deps import ExplainQueryDep, InferenceDep
from service.api.inference import explain_requested, explanations, infer, off_loop_if_long, shed_early
from service.api.routers.common import ERROR_RESPONSES, serving
from service.api.schemas import QARequest, QAResponse, QAResult

QA = "qa"  # the task name in retention_core.tasks

router = APIRouter(tags=["inference"], route_class=serving(QA))


@router.post("/qa", response_model=QAResponse, responses=ERROR_RESPONSES)
async def qa(body: QARequest, ctx: InferenceDep, explain: ExplainQueryDep) -> QAResponse:
    """Extractive answer (text, character offsets ``[start, end)`` in the context, score) of one
    question (``question`` + ``context``) or several (``items``). Long contexts are read in windows."""
    pairs = body.pairs()
    ctx.check_items(len(pairs))
    model = ctx.model_for(QA)
    explained = explain_requested(model, body.explain, explain)
    shed_early(ctx, model, body)
    codec = model.codec
    chars = sum(len(item.question) + len(item.context) for item in pairs)
    encoded = await off_loop_if_long(
        chars, lambda: [codec.encode(item.question, item.context) for item in pairs]
    )
    outcome = await infer(ctx, "qa", model, encoded, body)
    results = [
        QAResult.model_validate(codec.decode(item, outputs))
        for item, outputs in zip(encoded, outcome.outputs, strict=True)
    ]
    single = results[0] if body.items is None else None
    return QAResponse(
        model=model.name,
        answer=single.answer if single else None,
        start=single.start if single else None,
        end=single.end if single else None,
        score=single.score if single else None,
        results=results,
        usage=outcome.usage,
        explanations=explanations(model, encoded, outcome) if explained else None,
    )
