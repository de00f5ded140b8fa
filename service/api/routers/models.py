"""GET /models, GET /models/{name}, GET /models/{name}/schedule"""

from __future__ import annotations

from dataclasses import asdict

from fastapi import APIRouter, Query

from retention_core.schedule import token_work_curve
from service.api.deps import ServerDep, SettingsDep
from service.api.faces import FACES
from service.api.routers.common import ERROR_RESPONSES
from service.api.schemas import CudaGraphs, ModelDetail, ModelList, ModelSummary, ScheduleCurve
from service.serving import ServedModel, ServerState

router = APIRouter(prefix="/models", tags=["models"])
SCHEDULE_GRID = tuple(step / 20 for step in range(1, 21))  # the rho values GET /models/{name}/schedule gives
MAX_SCHEDULE_LENGTH = 1_000_000


def summarize_model(model: ServedModel, state: ServerState) -> ModelSummary:
    """One model as clients see it, with how to reach it: its task's route and input fields (from the
    face registry, so a client needs no table of tasks of its own)."""
    manifest = model.manifest
    is_default = state.defaults.get(model.task) == model.name
    face = FACES.get(manifest.task)
    graphs = None if model.graphs is None else model.graphs()
    return ModelSummary(
        name=model.name,
        task=manifest.task,
        backbone=manifest.backbone.name_or_path,
        precision=model.precision,
        default_rho=manifest.default_rho,
        default_rho_rule=manifest.default_rho_rule,
        max_length=manifest.max_length,
        labels=list(manifest.labels),
        providers=list(model.providers),
        backend=model.backend_kind,
        device=model.device,
        cuda_graphs=None if graphs is None else CudaGraphs(**asdict(graphs)),
        pruned_branch_bytes=None
        if manifest.pruned_branch is None
        else manifest.pruned_branch.bytes.get(model.precision),
        is_default=is_default,
        explain=model.explains,
        route=None if face is None else face.path,
        fields=[] if face is None else list(face.fields),
        list_fields=[] if face is None else list(face.list_fields),
    )


@router.get("", response_model=ModelList, responses={401: ERROR_RESPONSES[401]})
async def list_models(server: ServerDep, settings: SettingsDep) -> ModelList:
    """Every loaded model, aliases (``name`` -> ``name@version``) and directories that failed to load."""
    state = server.state()
    return ModelList(
        models=[summarize_model(m, state) for m in state.models], aliases=state.aliases, errors=state.errors
    )


@router.get(
    "/{name}", response_model=ModelDetail, responses={401: ERROR_RESPONSES[401], 404: ERROR_RESPONSES[404]}
)
async def get_model(name: str, server: ServerDep) -> ModelDetail:
    """One model with its manifest (backbone, schedule, quality-vs-rho curve, training recipe)."""
    model = server.get(name)
    return ModelDetail(
        summary=summarize_model(model, server.state()), manifest=model.manifest.model_dump(mode="json")
    )


@router.get(
    "/{name}/schedule",
    response_model=ScheduleCurve,
    responses={401: ERROR_RESPONSES[401], 404: ERROR_RESPONSES[404]},
)
async def get_schedule(
    name: str, server: ServerDep, length: int = Query(default=128, ge=1, le=MAX_SCHEDULE_LENGTH)
) -> ScheduleCurve:
    """Token-work of one row of ``length`` tokens against rho under the model's schedule (what the
    explorer page draws; the formula stays on the server, ``retention_core.schedule.token_work_curve``)."""
    schedule = server.get(name).manifest.schedule
    return ScheduleCurve(
        length=length, rho=list(SCHEDULE_GRID), token_work=token_work_curve(schedule, length, SCHEDULE_GRID)
    )
