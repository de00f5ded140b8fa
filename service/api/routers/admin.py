"""POST /admin/reload"""

from __future__ import annotations

from fastapi import APIRouter

from service.api.deps import ServerDep
from service.api.routers.common import ERROR_RESPONSES
from service.api.schemas import ReloadResponse

router = APIRouter(prefix="/admin", tags=["admin"])


@router.post("/reload", response_model=ReloadResponse, responses={401: ERROR_RESPONSES[401]})
async def reload(server: ServerDep) -> ReloadResponse:
    """Rescan the models directory (same as SIGHUP). In-flight requests finish on the model they started
    on; a broken directory is listed in ``errors`` and the model it held before keeps serving."""
    report = await server.reload()
    return ReloadResponse(
        status="partial" if report.errors else "ok",
        loaded=report.loaded,
        unchanged=report.unchanged,
        removed=report.removed,
        errors=report.errors,
    )
