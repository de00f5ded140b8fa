"""The request path's cheap steps stay on the event loop: under overload every hand-off to the thread pool
and back cost the loop more than the step itself (profiled:
docs/experiments/2026-11-25-rho-auto-overload.md)."""

from __future__ import annotations

import asyncio
import inspect
import threading
from pathlib import Path

from fastapi import FastAPI
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute

from service.api.app import create_app
from service.api.inference import INLINE_TEXT_CHARS, off_loop_if_long
from tests.service.conftest import settings_for

INFERENCE_PATHS = ("/classify", "/embed", "/qa", "/summarize", "/v1/embeddings")


def calls(dependant: Dependant) -> list[object]:
    """Every dependency callable under ``dependant`` (depth first)."""
    found: list[object] = []
    for sub in dependant.dependencies:
        found.append(sub.call)
        found.extend(calls(sub))
    return found


def api_routes(app: FastAPI) -> list[APIRoute]:
    """The app's API routes; FastAPI may keep an included router's routes behind a wrapper."""
    found: list[APIRoute] = []
    for route in app.routes:
        included = getattr(route, "original_router", None)
        found.extend(
            r for r in (included.routes if included is not None else [route]) if isinstance(r, APIRoute)
        )
    return found


def test_inference_dependencies_run_on_the_loop(models_root: Path) -> None:
    """FastAPI runs a plain ``def`` dependency in the thread pool; ours are all ``async def`` (or the
    framework's own security classes, which are async callables)."""
    app = create_app(settings_for(models_root, api_key="k"))  # with a key: the auth dependency too
    routes = [r for r in api_routes(app) if r.path in INFERENCE_PATHS]
    assert {r.path for r in routes} == set(INFERENCE_PATHS)
    for route in routes:
        assert inspect.iscoroutinefunction(route.endpoint), route.path
        for call in calls(route.dependant):
            target = call if inspect.isfunction(call) else getattr(call, "__call__", call)  # noqa: B004
            assert inspect.iscoroutinefunction(target), f"{route.path}: {call!r} would run in the thread pool"


def test_short_text_is_tokenized_inline_and_long_text_in_the_pool() -> None:
    async def where(chars: int) -> int:
        return await off_loop_if_long(chars, threading.get_ident)

    async def both() -> tuple[int, int, int]:
        loop_thread = threading.get_ident()
        return loop_thread, await where(INLINE_TEXT_CHARS), await where(INLINE_TEXT_CHARS + 1)

    loop_thread, short, long = asyncio.run(both())
    assert short == loop_thread
    assert long != loop_thread
