"""GET /metrics (Prometheus text format)"""

from __future__ import annotations

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST

from service.api.deps import MetricsDep

router = APIRouter(tags=["metrics"])


@router.get("/metrics", response_class=Response, responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}})
async def metrics(registry: MetricsDep) -> Response:
    return Response(registry.render(), media_type=CONTENT_TYPE_LATEST)
