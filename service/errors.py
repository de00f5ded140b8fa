"""Service errors and the ONE place they become HTTP responses.

The model server and the handlers raise ``ServiceError`` subclasses; ``install_error_handlers`` maps them (and
request-validation errors, unknown routes and any unexpected exception) to JSON bodies of the form
``{"error": {"code": ..., "message": ...}}``. Under ``/v1/`` (the OpenAI-compatible routes) the same
errors take OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``, so OpenAI clients
raise their usual exceptions; ``error_payload`` is the one function that picks the shape. Bodies never
carry ``str(exc)`` of unexpected errors, stack traces or file paths; those go to the log only.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger("service")

# reason label of retention_shed_requests_total (every 429), bounded
SHED_REASONS = (
    "queue_full",  # the model's queue holds max_queue_requests
    "over_target",  # rho=auto: predicted completion (work ahead at its min_rho) misses its latency target
    "over_deadline",  # predicted completion misses the request deadline
    "expired_queued",  # admitted, but its deadline passed while still queued: nothing was computed
    "late_queued",  # rho=auto, admitted, still queued auto_late_after_targets targets after it arrived
    "concurrency",  # max_concurrent_requests requests already in the server
)
# Seconds admission predicted the work ahead would take: on a 429 (beside Retry-After, unrounded) and on
# every answer (beside x-queue-time, what it then took).
PREDICTED_WAIT_HEADER = "x-predicted-wait"
# reason label of retention_rejections_total, bounded
REJECTION_REASONS = (
    *SHED_REASONS,
    "deadline",
    "payload_too_large",
    "input_too_long",
    "unauthorized",
    "invalid",
)


class ServiceError(Exception):
    status: int = 500
    code: str = "internal_error"
    reason: str | None = None  # retention_rejections_total{reason}
    message: str = "internal error"

    def __init__(
        self, message: str | None = None, headers: dict[str, str] | None = None, param: str | None = None
    ) -> None:
        super().__init__(message or self.message)
        self.message = message or self.message
        self.headers = headers or {}
        self.param = param  # the request field at fault, when one is (OpenAI bodies report it)


class UnsupportedValue(ServiceError):
    """A well-formed value this server cannot honour (e.g. ``dimensions`` other than the model's)."""

    status, code, reason = 400, "unsupported_value", "invalid"


class InvalidRequest(ServiceError):
    status, code, reason = 422, "invalid_request", "invalid"


class InvalidHeader(InvalidRequest):
    """A header the server reads (``x-request-timeout``, ``x-latency-target``) that is not a positive
    number of seconds: one rule for every such header, a 422 that names it (its value cut short)."""

    def __init__(self, header: str, value: str) -> None:
        super().__init__(f"{header} must be a positive number of seconds, got {value[:40]!r}", param=header)


class ModelNotFound(ServiceError):
    status, code = 404, "model_not_found"


class TaskMismatch(ServiceError):
    status, code, reason = 422, "task_mismatch", "invalid"


class PayloadTooLarge(ServiceError):
    status, code, reason, message = 413, "payload_too_large", "payload_too_large", "request body too large"


class InputTooLong(ServiceError):
    status, code, reason = 413, "input_too_long", "input_too_long"


class Overloaded(ServiceError):
    """429 with ``Retry-After``: the request was shed at admission (``reason``: one of SHED_REASONS). The
    scheduler gives the facts (``retry_after_s``, ``predicted_wait_s``); their headers are written here."""

    status, code, message = 429, "overloaded", "server overloaded, retry later"

    def __init__(
        self,
        reason: str,
        retry_after_s: int,
        message: str | None = None,
        predicted_wait_s: float | None = None,
    ) -> None:
        headers = {"Retry-After": str(retry_after_s)}
        if predicted_wait_s is not None:
            headers[PREDICTED_WAIT_HEADER] = f"{predicted_wait_s:.6f}"
        super().__init__(message, headers=headers)
        self.reason = reason
        self.retry_after_s = retry_after_s
        self.predicted_wait_s = predicted_wait_s


class QueueFull(Overloaded):
    def __init__(self, retry_after_s: int) -> None:
        super().__init__("queue_full", retry_after_s)


class DeadlineExceeded(ServiceError):
    status, code, reason, message = 504, "deadline_exceeded", "deadline", "request deadline exceeded"


class Unauthorized(ServiceError):
    status, code, reason, message = 401, "unauthorized", "unauthorized", "missing or invalid API key"

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message, headers={"WWW-Authenticate": "Bearer"})


class NotReady(ServiceError):
    status, code, message = 503, "not_ready", "service not ready"


class ShuttingDown(ServiceError):
    status, code, message = 503, "shutting_down", "service is shutting down"


class InferenceFailed(ServiceError):
    status, code, message = 500, "inference_failed", "inference failed"


class DeviceMemoryExhausted(ServiceError):
    """A row the accelerator cannot hold even alone (its batch was split down to it first): the request
    may succeed when other work has left the device, so it is a 503 with Retry-After, not a 500."""

    status, code = 503, "device_out_of_memory"
    message = "the accelerator ran out of memory for this input; retry later or send it shorter"

    def __init__(self, retry_after_s: int) -> None:
        super().__init__(headers={"Retry-After": str(retry_after_s)})


def error_body(code: str, message: str, details: Any = None) -> dict[str, Any]:
    body: dict[str, Any] = {"error": {"code": code, "message": message}}
    if details is not None:
        body["error"]["details"] = details
    return body


OPENAI_PREFIX = "/v1/"  # routes that speak OpenAI's API, errors included


def openai_error_type(status: int) -> str:
    """OpenAI's ``error.type`` for a status: what its clients and dashboards group errors by."""
    if status == 401:
        return "authentication_error"
    if status == 429:
        return "rate_limit_error"
    return "server_error" if status >= 500 else "invalid_request_error"


def openai_error_body(status: int, code: str, message: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": openai_error_type(status), "param": param, "code": code}}


def error_payload(
    path: str, status: int, code: str, message: str, details: Any = None, param: str | None = None
) -> dict[str, Any]:
    """The error body for a request to ``path``: OpenAI's shape under ``/v1/``, ours elsewhere."""
    if path.startswith(OPENAI_PREFIX):
        return openai_error_body(status, code, message, param)
    return error_body(code, message, details)


def _clean_validation_errors(exc: RequestValidationError) -> list[dict[str, Any]]:
    """loc / msg / type only: no echo of the (maybe huge) input, no ctx objects."""
    cleaned = []
    for err in exc.errors()[:20]:
        loc = [part if isinstance(part, int | str) else str(part) for part in err.get("loc", ())]
        msg = str(err.get("msg", "invalid value"))
        cleaned.append({"loc": loc, "msg": msg[:300], "type": str(err.get("type", "value_error"))})
    return cleaned


def _param_of(loc: Sequence[Any]) -> str | None:
    """The request field a validation error names: ``["body", "input", 0]`` -> ``"input"``."""
    names = [part for part in loc[1:] if isinstance(part, str)]
    return names[0] if names else None


def install_error_handlers(app: FastAPI) -> None:
    def metrics_of(request: Request) -> Any:
        return getattr(request.app.state, "metrics", None)

    def count_rejection(request: Request, reason: str | None, shed: bool = False) -> None:
        metrics = metrics_of(request)
        if metrics is not None and reason is not None:
            metrics.rejections.labels(reason=reason).inc()
            if shed:
                metrics.shed.labels(reason=reason).inc()

    def respond(
        request: Request,
        status: int,
        code: str,
        message: str,
        details: Any = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> JSONResponse:
        body = error_payload(request.url.path, status, code, message, details, param)
        return JSONResponse(body, status_code=status, headers=headers)

    @app.exception_handler(ServiceError)
    async def service_error(request: Request, exc: ServiceError) -> JSONResponse:
        count_rejection(request, exc.reason, shed=exc.status == 429)
        if exc.status >= 500 and exc.status not in (503, 504):
            log.error("request failed: %s", exc.code, exc_info=exc.__cause__ or exc)
        return respond(request, exc.status, exc.code, exc.message, param=exc.param, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        count_rejection(request, "invalid")
        details = _clean_validation_errors(exc)
        first = details[0] if details else {"loc": [], "msg": "invalid request"}
        where = ".".join(str(part) for part in first["loc"])
        message = f"{where}: {first['msg']}" if where else str(first["msg"])
        return respond(request, 422, "invalid_request", message, details, param=_param_of(first["loc"]))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        codes = {404: "not_found", 405: "method_not_allowed"}
        message = exc.detail if isinstance(exc.detail, str) and exc.status_code < 500 else "error"
        code = codes.get(exc.status_code, "http_error")
        return respond(request, exc.status_code, code, message, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return respond(request, 500, "internal_error", "internal error")
