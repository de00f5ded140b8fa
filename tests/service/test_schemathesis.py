"""Property-based API test over the OpenAPI schema (schemathesis 4): no input ever yields a 5xx."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from service.api.app import create_app
from service.settings import Settings
from tests.service.conftest import served, settings_for

# The schema does not depend on the models, so it can be read at import time.
schema = schemathesis.openapi.from_dict(create_app(Settings(models_dir=Path("unused"))).openapi())


@pytest.fixture(scope="module")
def base_url(models_root: Path) -> Iterator[str]:
    with served(settings_for(models_root, max_body_bytes=20_000)) as url:
        yield url


@schema.parametrize()
@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_no_server_errors(case: schemathesis.Case, base_url: str) -> None:
    if case.headers:
        case.headers.pop("x-request-timeout", None)  # a deadline the client sets too short is a legit 504
    response = case.call(base_url=base_url, timeout=30)
    assert response.status_code < 500, (
        f"{case.method} {case.path}: {response.status_code} {response.text[:300]}"
    )
