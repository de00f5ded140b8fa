"""Shared OpenAPI bits of the routers."""

from __future__ import annotations

from typing import Any

from service.api.schemas import ErrorBody, OpenAIErrorBody

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorBody, "description": "unreadable body (e.g. not UTF-8)"},
    401: {"model": ErrorBody, "description": "missing or wrong API key"},
    404: {"model": ErrorBody, "description": "unknown model"},
    413: {"model": ErrorBody, "description": "payload too large, or input too long with truncate=false"},
    422: {"model": ErrorBody, "description": "invalid request (e.g. rho outside (0, 1])"},
    429: {"model": ErrorBody, "description": "overloaded; see Retry-After"},
    503: {"model": ErrorBody, "description": "not ready or shutting down"},
    504: {"model": ErrorBody, "description": "request deadline exceeded"},
}

# The same statuses under /v1/ (service.errors.error_payload), where errors take OpenAI's shape.
OPENAI_ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    **{status: {**spec, "model": OpenAIErrorBody} for status, spec in ERROR_RESPONSES.items()},
    400: {"model": OpenAIErrorBody, "description": "unreadable body, or 'dimensions' other than the model's"},
}
