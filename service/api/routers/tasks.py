"""POST <face.path> for every task with an HTTP face (``service.api.faces``): ONE handler serves them all.

Which routes mount follows the registries, as TEI's router mounts its routes by model type: a task with
a face gets its route, the embedding task also OpenAI's /v1/embeddings (``openai_compat``).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from service.api.deps import ExplainQueryDep, InferenceContext, InferenceDep
from service.api.faces import Answer, TaskFace
from service.api.inference import explain_requested, run
from service.api.routers.common import ERROR_RESPONSES, serving
from service.api.schemas import ExplainOptions


def item_limit(face: TaskFace[Any, Any], ctx: InferenceContext) -> int:
    """Inputs one request may carry: the face's own limit under this server's settings (``max_items``
    unless it says otherwise; the embedding task: OpenAI's embeddings limit)."""
    return face.item_limit(ctx.settings)


async def answer(
    face: TaskFace[Any, Any], body: ExplainOptions, ctx: InferenceContext, explain: bool | None
) -> Any:
    """The one pipeline of a task route: the body's inputs checked, the task's model, explain checked
    before any inference, then ``inference.run`` (budget, shedding, encoding, the batcher) and the
    face's response."""
    ctx.check_items(face.count(body), limit=item_limit(face, ctx))
    model = ctx.model_for(face.task)
    explained = explain_requested(model, body.explain, explain)
    served = await run(ctx, face.endpoint, model, body, lambda: face.encode(model.codec, body))
    return face.respond(Answer(body, served, served.explanations() if explained else None))


def task_router(face: TaskFace[Any, Any]) -> APIRouter:
    """The router of one face: ``POST face.path``, its body and response models in the OpenAPI document,
    its requests counted under its task (``serving``)."""
    router = APIRouter(tags=["inference"], route_class=serving(face.task))

    async def endpoint(body: ExplainOptions, ctx: InferenceDep, explain: ExplainQueryDep) -> Any:
        return await answer(face, body, ctx, explain)

    # FastAPI reads the body's model from the annotation: the face's, known only at run time.
    endpoint.__annotations__ = {**endpoint.__annotations__, "body": face.request}
    router.add_api_route(
        face.path,
        endpoint,
        methods=["POST"],
        name=face.endpoint,
        description=face.description,
        response_model=face.response,
        responses=ERROR_RESPONSES,
    )
    return router
