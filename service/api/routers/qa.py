"""POST /qa"""

from __future__ import annotations

from fastapi import APIRouter, Response
from starlette.concurrency import run_in_threadpool

from service.api.deps import DeadlineDep, EngineDep, MetricsDep, QueryDep, SettingsDep
from service.api.inference import check_items, infer
from service.api.routers.common import ERROR_RESPONSES
from service.api.schemas import QARequest, QAResponse, QAResult

router = APIRouter(tags=["inference"])


@router.post("/qa", response_model=QAResponse, responses=ERROR_RESPONSES)
async def qa(
    body: QARequest,
    query: QueryDep,
    deadline: DeadlineDep,
    engine: EngineDep,
    settings: SettingsDep,
    metrics: MetricsDep,
    response: Response,
) -> QAResponse:
    """Extractive answer (text, character offsets ``[start, end)`` in the context, score) of one
    question (``question`` + ``context``) or several (``items``). Long contexts are read in windows."""
    pairs = body.pairs()
    check_items(len(pairs), settings)
    model = engine.resolve(query.model, "qa")
    codec = model.codec
    encoded = await run_in_threadpool(lambda: [codec.encode(item.question, item.context) for item in pairs])
    outcome = await infer(
        endpoint="qa",
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
    )
