"""What the routers share: OpenAPI error responses, and the route class that names a route's task."""

from __future__ import annotations

from typing import Any, ClassVar

from fastapi.routing import APIRoute

from retention_core.tasks import task_spec
from service.api.schemas import ErrorBody, OpenAIErrorBody


class TaskRoute(APIRoute):
    """A route that runs the models of one task of the registry (``retention_core.tasks``). The request
    metrics carry that task as their ``task`` label, whatever the answer (a 422 or a 5xx included)."""

    task: ClassVar[str] = ""


def serving(task: str) -> type[TaskRoute]:
    """The ``route_class`` of a router whose routes serve ``task``; a KeyError for a task the registry
    does not know."""
    name = task_spec(task).name

    class Route(TaskRoute):
        task = name

    return Route


def route_task(route: object) -> str:
    """The task a route serves; "" for the routes that run no model (health, metrics, models, ...)."""
    return route.task if isinstance(route, TaskRoute) else ""


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

# The routes that read TEI's bodies (``tei_compat``; /embed reads both shapes): errors in this server's
# shape, and TEI's ``dimensions`` may be refused as OpenAI's is.
TEI_ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    **ERROR_RESPONSES,
    400: {"model": ErrorBody, "description": "unreadable body, or 'dimensions' other than the model's"},
}
