"""GET /livez, GET /readyz, and GET /health (TEI's name for readiness)"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from service.api.deps import ServerDep
from service.api.schemas import Health

router = APIRouter(tags=["health"])


@router.get("/livez", response_model=Health)
async def livez() -> Health:
    """The process is up and its event loop answers."""
    return Health(status="alive")


@router.get("/readyz", response_model=Health, responses={503: {"model": Health}})
async def readyz(server: ServerDep) -> JSONResponse:
    """200 once every model directory was tried and every loaded model is warmed up (and at least one
    model is loaded); 503 while loading, with no model, or while shutting down."""
    state = server.state()
    names = [m.name for m in state.models]
    if state.ready:
        return JSONResponse(Health(status="ready", models=names, errors=state.errors).model_dump())
    status = "shutting_down" if state.stopping else "loading" if not state.started else "no_models"
    return JSONResponse(
        Health(status=status, models=names, errors=state.errors).model_dump(), status_code=503
    )


@router.get("/health", response_model=Health, responses={503: {"model": Health}})
async def health(server: ServerDep) -> JSONResponse:
    """/readyz under TEI's name: what TEI clients (huggingface_hub's ``health_check``) and TEI
    deployments' probes ask."""
    return await readyz(server)
