"""Refusing before the body is read: a 429 decided from the path, the query and the headers alone.

Under a retry storm (clients that retry 50 ms after a 429 and ignore ``Retry-After``) the server spends
its cores on refusals: reading and parsing bodies, resolving dependencies, building error responses.
This decides the refusal from what the request line and headers say, in the ASGI middleware, before
FastAPI reads a byte of the body: the same rule as the late path (``Server.shed``: the work
already queued for the model ends after the request's due time, so even a minimal request of it
would be late), the same 429 (``service.errors``). Only with a backlog (requests queued, not only a
batch running): a request arriving as a batch finishes is left to the normal path, which sees the
model idle a moment later.

What the early decision reads: the route's task (its path), ``model``, ``rho``, ``max_latency_ms`` from
the query, ``x-request-timeout`` and ``x-latency-target`` from the headers. A body may still name a
model or a rho the query does not; the decision is conservative where it cannot know:

- no ``model`` in the query: the request is refused only when EVERY loaded model of the task would
  refuse it (whichever model the body names, it would be late);
- the due time is decided by the route's own rule (``service.api.budget.due_time``);
- no ``rho=auto`` in the query: the due time is the request deadline (the loosest a request can have),
  so a body that asks for ``rho=auto`` is only ever refused early by its deadline, the rest later;
- anything unreadable (a malformed number or rho, read by the route's own parsers, an unknown model, a
  missing or wrong API key): no early decision; the normal path answers it (422, 404, 401).

A query ``rho=auto`` with a body that sends a fixed rho is judged by the auto target here (the query
is what the client sent before its body; sending both is contradictory).
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import parse_qs

from starlette.types import Scope

from retention_core.rho import parse_rho
from service.api.budget import Asked, Due, SentFields, due_time
from service.api.deps import LATENCY_TARGET_HEADER, TIMEOUT_HEADER, positive_decimal
from service.errors import Overloaded
from service.serving import Server
from service.settings import Settings

OPENAI_EMBEDDINGS_PATH = "/v1/embeddings"
# Query strings longer than this are left to the normal path (no early decision on odd requests).
MAX_QUERY_BYTES = 2048


@dataclass(frozen=True)
class Hint:
    """What the request line and headers say about a request's due time and model."""

    task: str
    model: str | None  # the query's model; None: any model of the task
    due: Due  # by when it must be answered (the loosest its body may make it)


def header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers") or ():
        if key == name:
            return str(value.decode("latin-1"))
    return None


def authorized(scope: Scope, settings: Settings) -> bool:
    """With an API key set, only requests carrying it are refused early (the rest get their 401)."""
    if settings.api_key is None:
        return True
    value = header(scope, b"authorization") or ""
    scheme, _, token = value.partition(" ")
    expected = settings.api_key.get_secret_value().encode()
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), expected)


def seconds_or_none(text: str | None) -> tuple[bool, float | None]:
    """(readable, value): an absent value is readable; junk is not (the normal path answers 422)."""
    if text is None:
        return True, None
    value = positive_decimal(text)
    return value is not None, value


def hint(scope: Scope, tasks: Mapping[str, str], settings: Settings, arrival: float) -> Hint | None:
    """The request's ``Hint``, or None when the early decision cannot (or must not) be made."""
    task = tasks.get(str(scope.get("path", "")))
    if task is None or scope.get("method") != "POST" or not authorized(scope, settings):
        return None
    raw: bytes = scope.get("query_string") or b""
    if len(raw) > MAX_QUERY_BYTES:
        return None
    query = parse_qs(raw.decode("latin-1"))
    ok_timeout, timeout = seconds_or_none(header(scope, TIMEOUT_HEADER.encode()))
    if not ok_timeout:
        return None
    model = query.get("model", [None])[-1] or None
    try:
        rho = parse_rho(query.get("rho", [None])[-1], "rho", allow_auto=True)
    except ValueError:  # the route's 422
        return None
    if rho != "auto":  # due at its deadline: the targets are not read
        return Hint(task, model, due_time(settings, Asked(arrival, timeout, rho)))
    ok_query, target_ms = seconds_or_none(query.get("max_latency_ms", [None])[-1])
    ok_header, target_header_s = seconds_or_none(header(scope, LATENCY_TARGET_HEADER.encode()))
    if not (ok_query and ok_header):
        return None
    asked = Asked.of(arrival, timeout, target_header_s, SentFields(rho, max_latency_ms=target_ms))
    return Hint(task, model, due_time(settings, asked))


def refusal(server: Server, found: Hint) -> Overloaded | None:
    """The 429 the request gets now, or None (it goes on to the normal path): refused only when every
    model it may reach has requests queued (a backlog, not only a batch that is finishing: its answers
    go out before the worker notices it is done) and would refuse even a minimal request of it."""
    state = server.state()
    if state.stopping or not state.started:
        return None
    try:
        candidates = (
            [server.get(found.model)]
            if found.model
            else [model for model in state.models if model.task == found.task]
        )
    except Exception:  # unknown model: the normal path says so
        return None
    first: Overloaded | None = None
    for model in candidates:
        if model.task != found.task:
            return None  # a model of another task: the normal path's 422
        try:
            server.shed(model, found.due.at, found.due.by_target, queued_only=True)
        except Overloaded as error:
            first = first or error
            continue
        except Exception:  # unloaded meanwhile, or anything else: the normal path decides
            return None
        return None  # this model would take it
    return first
