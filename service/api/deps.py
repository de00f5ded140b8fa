"""FastAPI dependencies (``Annotated[..., Depends]``): app state, API keys, query options, deadline, and
``InferenceDep``, the one bundle an inference endpoint takes besides its body."""

from __future__ import annotations

import hmac
import math
import time
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Header, Query, Request, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import SecretStr

from service.engine import Engine
from service.errors import InvalidRequest, PayloadTooLarge, Unauthorized
from service.metrics import Metrics
from service.rho import DECIMAL, parse_rho
from service.runtime import LoadedModel
from service.settings import Settings

# What the OpenAPI schema promises for rho parameters (parsed by ``service.rho.parse_rho``, which reads
# the decimal text of a query parameter and explains anything else in its 422).
RHO_SCHEMA = {"type": "number", "exclusiveMinimum": 0, "maximum": 1}
POSITIVE_SCHEMA = {"type": "number", "exclusiveMinimum": 0}

# Two schemes under their own names, so the OpenAPI document tells the inference key from the admin key.
# ``create_app`` mounts each only when its key is set: the document then declares security exactly where
# the server enforces it.
api_bearer = HTTPBearer(scheme_name="ApiKey", auto_error=False, description="the server's RETENTION_API_KEY")
admin_bearer = HTTPBearer(
    scheme_name="AdminKey", auto_error=False, description="the server's RETENTION_ADMIN_API_KEY"
)
Credentials = HTTPAuthorizationCredentials | None


async def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def get_engine(request: Request) -> Engine:
    engine: Engine = request.app.state.engine
    return engine


async def get_metrics(request: Request) -> Metrics:
    metrics: Metrics = request.app.state.metrics
    return metrics


SettingsDep = Annotated[Settings, Depends(get_settings)]
EngineDep = Annotated[Engine, Depends(get_engine)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]


def check_bearer(credentials: Credentials, key: SecretStr | None) -> None:
    """401 unless the request carries ``Authorization: Bearer <key>`` (constant-time compare). Fails
    closed: with no key configured nobody passes."""
    if key is None or credentials is None or credentials.scheme.lower() != "bearer":
        raise Unauthorized()
    if not hmac.compare_digest(credentials.credentials.encode(), key.get_secret_value().encode()):
        raise Unauthorized()


async def require_api_key(
    settings: SettingsDep, credentials: Annotated[Credentials, Depends(api_bearer)]
) -> None:
    check_bearer(credentials, settings.api_key)


async def require_admin_key(
    settings: SettingsDep, credentials: Annotated[Credentials, Depends(admin_bearer)]
) -> None:
    check_bearer(credentials, settings.admin_api_key)


@dataclass(frozen=True)
class QueryOptions:
    model: str | None
    rho: float | str | None
    min_rho: float | None
    truncate: bool | None
    max_latency_ms: float | None = None  # rho=auto's latency target (a body value wins)


async def query_options(
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
    max_latency_ms: Annotated[
        str | None,
        Query(
            description="rho=auto: latency target in ms (capped by the server); a body value wins",
            json_schema_extra={"anyOf": [POSITIVE_SCHEMA]},
        ),
    ] = None,
) -> QueryOptions:
    parsed_min = parsed_rho(min_rho, "min_rho", allow_auto=False)
    assert parsed_min is None or isinstance(parsed_min, float)
    return QueryOptions(
        model=model,
        rho=parsed_rho(rho, "rho", allow_auto=True),
        min_rho=parsed_min,
        truncate=truncate,
        max_latency_ms=positive_number(max_latency_ms, "max_latency_ms"),
    )


def positive_number(text: str | None, name: str) -> float | None:
    """A positive decimal (query parameter or header), or a 422 naming it."""
    if text is None:
        return None
    number = float(text) if DECIMAL.fullmatch(text) else math.nan
    if not math.isfinite(number) or number <= 0:
        raise InvalidRequest(f"{name} must be a positive number of milliseconds", param=name)
    return number


def parsed_rho(text: str | None, name: str, allow_auto: bool) -> float | str | None:
    """A rho query parameter, or a 422 naming it."""
    try:
        return parse_rho(text, name, allow_auto=allow_auto)
    except ValueError as exc:
        raise InvalidRequest(str(exc), param=name) from None


QueryDep = Annotated[QueryOptions, Depends(query_options)]


async def explain_query(
    explain: Annotated[
        bool | None,
        Query(description="true: add every input token's survival depth; a body 'explain' wins over this"),
    ] = None,
) -> bool | None:
    """The ``explain`` query parameter of the routes that can explain (not /v1/embeddings)."""
    return explain


ExplainQueryDep = Annotated[bool | None, Depends(explain_query)]


async def request_deadline(
    request: Request,
    settings: SettingsDep,
    timeout: Annotated[
        str | None,
        Header(
            alias="x-request-timeout",
            description="seconds; capped by the server's request_timeout_s",
            json_schema_extra={"anyOf": [{"type": "number", "exclusiveMinimum": 0}]},
        ),
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


@dataclass(frozen=True)
class InferenceContext:
    """Everything an inference endpoint needs besides its body, resolved once per request."""

    query: QueryOptions
    deadline: float  # time.monotonic()
    engine: Engine
    settings: Settings
    metrics: Metrics
    response: Response  # where the x-* headers go
    arrival: float = 0.0  # time.monotonic() the request arrived: rho=auto targets count from it

    def model_for(self, task: str, named: str | None = None) -> LoadedModel:
        """The model ``named`` (a body field, which wins) or the query names, checked against ``task``;
        else the task's default."""
        return self.engine.resolve(named or self.query.model, task)

    def check_items(self, count: int, param: str | None = None) -> None:
        if count > self.settings.max_items:
            raise PayloadTooLarge(
                f"at most {self.settings.max_items} items per request, got {count}", param=param
            )


async def inference_context(
    request: Request,
    query: QueryDep,
    deadline: DeadlineDep,
    engine: EngineDep,
    settings: SettingsDep,
    metrics: MetricsDep,
    response: Response,
) -> InferenceContext:
    arrival = float(getattr(request.state, "start", None) or time.monotonic())
    return InferenceContext(query, deadline, engine, settings, metrics, response, arrival)


InferenceDep = Annotated[InferenceContext, Depends(inference_context)]
