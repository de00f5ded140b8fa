"""Property-based API test over the OpenAPI schema (schemathesis 4) with EVERY check: no 5xx, status
codes, content types, headers and bodies as documented, positive data accepted, negative data
rejected, and authentication enforced exactly where the document declares it.

Run twice, because the document describes the server as configured: without keys (no security scheme,
no admin routes) and with an API key and an admin key (both declared and both enforced).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from service.api.app import create_app
from service.settings import Settings
from tests.service.conftest import ADMIN_KEY, served, settings_for
from tests.tiny import TINY_HIDDEN

API_KEY = "api-s3cret"
KEYS: dict[str, Any] = {"api_key": API_KEY, "admin_api_key": ADMIN_KEY}
ALL_CHECKS = schemathesis.Config.from_dict({"checks": {"enabled": True}})


def schema_of(**overrides: Any) -> Any:
    """The document the server serves with these settings (it does not depend on the models)."""
    raw = create_app(Settings(models_dir=Path("unused"), **overrides)).openapi()
    return schemathesis.openapi.from_dict(raw, config=ALL_CHECKS)


open_schema = schema_of()
keyed_schema = schema_of(**KEYS)


def serve(models_root: Path, **overrides: Any) -> Iterator[str]:
    with served(settings_for(models_root, max_body_bytes=20_000, **overrides)) as url:
        yield url


@pytest.fixture(scope="module")
def open_url(models_root: Path) -> Iterator[str]:
    yield from serve(models_root)


@pytest.fixture(scope="module")
def keyed_url(models_root: Path) -> Iterator[str]:
    yield from serve(models_root, **KEYS)


def without_short_deadline(case: schemathesis.Case) -> None:
    """A valid deadline the generator picks may be too short to serve anything: a documented 504, yet a
    5xx for not_a_server_error. Valid deadlines become generous; invalid ones stay (they must be 422)."""
    value = (case.headers or {}).get("x-request-timeout")
    try:
        valid = value is not None and math.isfinite(float(value)) and float(value) > 0
    except ValueError:
        valid = False
    if valid:
        assert case.headers is not None
        case.headers["x-request-timeout"] = "30"


# The routes whose bodies carry a ``dimensions`` (OpenAI's, TEI's on /embed and /)
DIMENSIONED_PATHS = ("/v1/embeddings", "/embed", "/")
TRUE_TEXTS = {"1", "on", "t", "true", "y", "yes"}  # what a bool query parameter reads as true


def with_served_dimensions(case: schemathesis.Case) -> None:
    """The document cannot know the served model's vector size, so a valid ``dimensions`` the generator
    picks is usually another size: a documented 400, yet a rejection of valid data. Valid sizes become
    the tiny model's; invalid ones (not a positive integer) stay (they must be 422)."""
    body = case.body
    if case.path not in DIMENSIONED_PATHS or not isinstance(body, dict):
        return
    size = body.get("dimensions")
    if (
        isinstance(size, int | float)
        and not isinstance(size, bool)
        and float(size).is_integer()
        and size >= 1
    ):
        body["dimensions"] = TINY_HIDDEN


def without_explain_for_tei_bodies(case: schemathesis.Case) -> None:
    """TEI's answer (a bare list of vectors) has no room for explanations, so ``?explain=true`` with TEI's
    body on /embed is a documented 422, yet a rejection of valid data (the document cannot tie a query
    parameter to one of the body's shapes). A valid true becomes false; an invalid value stays (422)."""
    query = case.query
    if case.path != "/embed" or not isinstance(case.body, dict) or "inputs" not in case.body or not query:
        return
    if str(query.get("explain")).lower() in TRUE_TEXTS:
        query["explain"] = "false"


SETTINGS = settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


@open_schema.parametrize()
@SETTINGS
def test_open_server_conforms(case: schemathesis.Case, open_url: str) -> None:
    without_short_deadline(case)
    with_served_dimensions(case)
    without_explain_for_tei_bodies(case)
    case.call_and_validate(base_url=open_url, timeout=30)


@keyed_schema.parametrize()
@SETTINGS
def test_keyed_server_conforms(case: schemathesis.Case, keyed_url: str) -> None:
    without_short_deadline(case)
    with_served_dimensions(case)
    without_explain_for_tei_bodies(case)
    key = ADMIN_KEY if case.path.startswith("/admin/") else API_KEY
    case.call_and_validate(base_url=keyed_url, headers={"Authorization": f"Bearer {key}"}, timeout=30)
