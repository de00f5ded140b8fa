"""FastAPI dependencies (``Annotated[..., Depends]``): app state, API key, query options, deadline."""

from __future__ import annotations

import hmac
import math
import time
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Header, Query, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from service.engine import Engine
from service.errors import InvalidRequest, Unauthorized
from service.metrics import Metrics
from service.rho import parse_rho
from service.settings import Settings

# What the OpenAPI schema promises for rho parameters (parsed by ``service.rho.parse_rho``, which also
# accepts these as strings and explains anything else in its 422).
RHO_SCHEMA = {"type": "number", "exclusiveMinimum": 0, "maximum": 1}

bearer = HTTPBearer(auto_error=False, description="needed only when the server sets RETENTION_API_KEY")


def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def get_engine(request: Request) -> Engine:
    engine: Engine = request.app.state.engine
    return engine


def get_metrics(request: Request) -> Metrics:
    metrics: Metrics = request.app.state.metrics
    return metrics


SettingsDep = Annotated[Settings, Depends(get_settings)]
EngineDep = Annotated[Engine, Depends(get_engine)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]


async def require_api_key(
    settings: SettingsDep, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
) -> None:
    if settings.api_key is None:
        return
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise Unauthorized()
    if not hmac.compare_digest(credentials.credentials.encode(), settings.api_key.encode()):
        raise Unauthorized()


@dataclass(frozen=True)
class QueryOptions:
    model: str | None
    rho: float | str | None
    min_rho: float | None
    truncate: bool | None


def query_options(
    model: Annotated[str | None, Query(description="model name; default: the task's default model")] = None,
    rho: Annotated[
        str | None,
        Query(
            description="number in (0, 1] or 'auto'; a body 'rho' wins over this",
            examples=["0.3", "auto"],
            json_schema_extra={"anyOf": [RHO_SCHEMA, {"const": "auto"}]},
        ),
    ] = None,
    min_rho: Annotated[
        str | None,
        Query(description="floor for rho=auto, in (0, 1]", json_schema_extra={"anyOf": [RHO_SCHEMA]}),
    ] = None,
    truncate: Annotated[
        bool | None, Query(description="false: 413 instead of truncating long inputs")
    ] = None,
) -> QueryOptions:
    try:
        parsed_rho = parse_rho(rho, "rho", allow_auto=True)
        parsed_min = parse_rho(min_rho, "min_rho", allow_auto=False)
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None
    assert parsed_min is None or isinstance(parsed_min, float)
    return QueryOptions(model=model, rho=parsed_rho, min_rho=parsed_min, truncate=truncate)


QueryDep = Annotated[QueryOptions, Depends(query_options)]


def request_deadline(
    request: Request,
    settings: SettingsDep,
    timeout: Annotated[
        str | None,
        Header(alias="x-request-timeout", description="seconds; capped by the server's request_timeout_s"),
    ] = None,
) -> float:
    """Absolute deadline (time.monotonic) of this request, counted from its arrival."""
    budget = settings.request_timeout_s
    if timeout is not None:
        try:
            asked = float(timeout)
        except ValueError:
            raise InvalidRequest("x-request-timeout must be a number of seconds") from None
        if not math.isfinite(asked) or asked <= 0:
            raise InvalidRequest("x-request-timeout must be a positive number of seconds")
        budget = min(budget, asked)
    start = getattr(request.state, "start", None) or time.monotonic()
    return float(start) + budget


DeadlineDep = Annotated[float, Depends(request_deadline)]
