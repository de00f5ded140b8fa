"""FastAPI dependencies (``Annotated[..., Depends]``): app state, API keys, query options, the timeout and
latency-target headers, and ``InferenceDep``, the one bundle an inference endpoint takes besides its
body. They parse what the client sent (422 on junk); the request's budget is decided from it in
``service.api.budget``."""

from __future__ import annotations

import hmac
import math
import time
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Header, Query, Request, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import SecretStr

from retention_core.rho import DECIMAL, parse_rho
from service.errors import InvalidHeader, InvalidRequest, PayloadTooLarge, Unauthorized
from service.metrics import Metrics
from service.serving import ServedModel, Server
from service.settings import Settings

# What the OpenAPI schema promises for rho parameters (parsed by ``retention_core.rho.parse_rho``, which reads
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


async def get_server(request: Request) -> Server:
    server: Server = request.app.state.server
    return server


async def get_metrics(request: Request) -> Metrics:
    metrics: Metrics = request.app.state.metrics
    return metrics


SettingsDep = Annotated[Settings, Depends(get_settings)]
ServerDep = Annotated[Server, Depends(get_server)]
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
        Query(description="rho=auto's lowest rho, in (0, 1]", json_schema_extra={"anyOf": [RHO_SCHEMA]}),
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


def positive_decimal(text: str) -> float | None:
    """The finite positive number a decimal literal spells (``retention_core.rho.DECIMAL``), else None."""
    number = float(text) if DECIMAL.fullmatch(text) else math.nan
    return number if math.isfinite(number) and number > 0 else None


def positive_number(text: str | None, name: str) -> float | None:
    """A positive decimal query parameter (milliseconds), or a 422 naming it."""
    if text is None:
        return None
    number = positive_decimal(text)
    if number is None:
        raise InvalidRequest(f"{name} must be a positive number of milliseconds", param=name)
    return number


def header_seconds(text: str | None, header: str) -> float | None:
    """A header that holds seconds (``x-request-timeout``, ``x-latency-target``): absent, or a positive
    decimal, else a 422 naming it. One rule for every header the server reads: junk is never ignored."""
    if text is None:
        return None
    seconds = positive_decimal(text)
    if seconds is None:
        raise InvalidHeader(header, text)
    return seconds


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


TIMEOUT_HEADER = "x-request-timeout"
LATENCY_TARGET_HEADER = "x-latency-target"
SECONDS_SCHEMA = {"anyOf": [POSITIVE_SCHEMA]}


async def request_timeout(
    timeout: Annotated[
        str | None,
        Header(
            alias=TIMEOUT_HEADER,
            description="seconds; capped by the server's request_timeout_s",
            json_schema_extra=SECONDS_SCHEMA,
        ),
    ] = None,
) -> float | None:
    """The ``x-request-timeout`` header in seconds (the deadline: ``budget.deadline_at``). None when
    absent; junk is a 422."""
    return header_seconds(timeout, TIMEOUT_HEADER)


TimeoutDep = Annotated[float | None, Depends(request_timeout)]


async def latency_target(
    target: Annotated[
        str | None,
        # Read, but left out of the OpenAPI document: a second optional header there makes schemathesis
        # (4.32) expect unknown headers to be refused. ``max_latency_ms`` is the documented way.
        Header(alias=LATENCY_TARGET_HEADER, include_in_schema=False),
    ] = None,
) -> float | None:
    """The ``x-latency-target`` header: rho=auto's latency target in seconds, capped by the server;
    ``max_latency_ms`` (body or query) wins over it. None when absent; junk is a 422."""
    return header_seconds(target, LATENCY_TARGET_HEADER)


LatencyTargetDep = Annotated[float | None, Depends(latency_target)]


@dataclass(frozen=True)
class InferenceContext:
    """Everything an inference endpoint needs besides its body, resolved once per request: what its
    query and headers asked (its budget is decided from them and the body: ``service.api.budget``)."""

    query: QueryOptions
    server: Server
    settings: Settings
    metrics: Metrics
    response: Response  # where the x-* headers go
    arrival: float = 0.0  # time.monotonic() it arrived: its deadline and rho=auto target count from it
    timeout_s: float | None = None  # the x-request-timeout header
    latency_target_s: float | None = None  # the x-latency-target header (body and query win over it)

    def model_for(self, task: str, named: str | None = None) -> ServedModel:
        """The model ``named`` (a body field, which wins) or the query names, checked against ``task``;
        else the task's default."""
        return self.server.resolve(named or self.query.model, task)

    def check_items(self, count: int, param: str | None = None, limit: int | None = None) -> None:
        """413 past ``limit`` inputs (default: ``max_items``)."""
        most = self.settings.max_items if limit is None else limit
        if count > most:
            raise PayloadTooLarge(f"at most {most} items per request, got {count}", param=param)


async def inference_context(
    request: Request,
    query: QueryDep,
    timeout: TimeoutDep,
    target: LatencyTargetDep,
    server: ServerDep,
    settings: SettingsDep,
    metrics: MetricsDep,
    response: Response,
) -> InferenceContext:
    arrival = float(getattr(request.state, "start", None) or time.monotonic())
    return InferenceContext(query, server, settings, metrics, response, arrival, timeout, target)


InferenceDep = Annotated[InferenceContext, Depends(inference_context)]
