"""The serving image's install steps, performed in a fresh virtualenv by scripts/check_install.sh."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.deploy.conftest import REPO


def test_serving_install_has_no_torch() -> None:
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
    assert "OK: serving install works without torch" in output


def test_check_install_follows_the_dockerfile() -> None:
    """The script copies the COPY sources of stage serve-build and runs the same pip command."""
    dockerfile = (REPO / "Dockerfile").read_text()
    script = (REPO / "scripts" / "check_install.sh").read_text()
    assert "pip install --no-compile ." in dockerfile
    assert "install --quiet --disable-pip-version-check --no-compile ." in script
    assert "AS serve-build" in dockerfile and "serve-build" in script
