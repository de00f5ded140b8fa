"""Fixtures for the deployment checks: paths, tools, free ports, the client's stub server."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks._http import free_port as free_port  # re-exported: the deploy tests take it from here
from tests.deploy.stub_server import StubServer

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
BIN = Path(sys.executable).parent


def tool(name: str) -> str:
    """A CLI tool from the venv next to this interpreter, else from PATH; fails (never skips) if absent."""
    candidate = BIN / name
    if candidate.exists():
        return str(candidate)
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed (see docs/deploy.md, 'Checks')")
    return found


@pytest.fixture
def stub_server() -> Iterator[StubServer]:
    with StubServer() as server:
        yield server
