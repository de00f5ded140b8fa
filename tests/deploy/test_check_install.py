"""The serving image's install steps, performed in a fresh virtualenv by scripts/check_install.sh."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.deploy.conftest import REPO

pytestmark = pytest.mark.integration  # builds a fresh serving virtualenv


def test_serving_install_has_no_torch_and_no_training() -> None:
    env = {**os.environ, "PYTHON": os.environ.get("CHECK_INSTALL_PYTHON", sys.executable)}
    env.pop("VIRTUAL_ENV", None)
    result = subprocess.run(
        ["bash", str(REPO / "scripts" / "check_install.sh")],
        capture_output=True,
        text=True,
        timeout=540,
        env=env,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "torch must NOT be importable" in output
    assert "training must NOT be importable" in output
    assert "OK: serving install works without torch or training" in output


def test_check_install_follows_the_dockerfile() -> None:
    """The script copies the COPY sources of stage serve-build and runs the same pip commands: the
    hashed serving lock, then the project without its dependencies."""
    dockerfile = (REPO / "Dockerfile").read_text()
    script = (REPO / "scripts" / "check_install.sh").read_text()
    stage = dockerfile.split("AS serve-build\n", 1)[1].split("\nFROM ", 1)[0]
    assert "COPY constraints/serve.lock.txt " in stage
    assert "pip install --no-compile --require-hashes -r constraints/serve.lock.txt" in stage
    assert "pip install --no-compile --no-deps ." in stage
    assert "LOCK=constraints/serve.lock.txt" in script
    assert '--no-compile --require-hashes -r "$LOCK"' in script and "--no-compile --no-deps ." in script
    assert "AS serve-build" in dockerfile and "serve-build" in script


def serve_build_sources() -> list[str]:
    """The sources of the COPY lines of stage serve-build (what the serving image is built from)."""
    stage = (REPO / "Dockerfile").read_text().split("AS serve-build\n", 1)[1].split("\nFROM ", 1)[0]
    return [
        source.rstrip("/")
        for line in stage.splitlines()
        if line.startswith("COPY ") and "--from" not in line
        for source in line.split()[1:-1]
    ]


def test_serving_image_copies_the_core_and_not_training() -> None:
    sources = serve_build_sources()
    assert {"retention_core", "retention_ort", "service"} <= set(sources)
    assert "training" not in sources
