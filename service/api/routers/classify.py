"""POST /classify"""

from __future__ import annotations

from fastapi import APIRouter, Response
from starlette.concurrency import run_in_threadpool

from service.api.deps import DeadlineDep, EngineDep, MetricsDep, QueryDep, SettingsDep
from service.api.inference import check_items, infer
from service.api.routers.common import ERROR_RESPONSES
from service.api.schemas import ClassificationResult, ClassifyRequest, ClassifyResponse

router = APIRouter(tags=["inference"])


@router.post("/classify", response_model=ClassifyResponse, responses=ERROR_RESPONSES)
async def classify(
    body: ClassifyRequest,
    query: QueryDep,
    deadline: DeadlineDep,
    engine: EngineDep,
    settings: SettingsDep,
    metrics: MetricsDep,
    response: Response,
) -> ClassifyResponse:
    """Label and per-label scores of one text (``text``) or several (``texts``)."""
    texts = body.items()
    check_items(len(texts), settings)
    model = engine.resolve(query.model, "classification")
    codec = model.codec
    encoded = await run_in_threadpool(lambda: [codec.encode(text) for text in texts])
    outcome = await infer(
        endpoint="classify",
        model=model,
        encoded=encoded,
        body=body,
        query=query,
        deadline=deadline,
        engine=engine,
        settings=settings,
        metrics=metrics,
        response=response,
    )
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
    )
