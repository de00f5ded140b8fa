"""A model directory the service may not read (another user's mode 0700, as a container's non-root user
meets it) is reported by name in /readyz and /models, and does not hide the readable models.

The real service in a subprocess, on loopback. As root (CI, containers' builders) the directory belongs
to ``nobody`` with mode 0700 and the service runs without the capabilities that let root read anyone's
files (util-linux ``setpriv``), exactly a non-root reader's view; otherwise the directory is made mode
000, unreadable to its owner too."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from benchmarks._http import free_port, wait_ready
from tests.service.conftest import copy_models

LOCKED = "locked-model"
READY_S = 120.0  # a real process loading a model on a shared 2-core machine


@pytest.fixture()
def models_with_a_locked_dir(tiny_models: dict[str, Path]) -> Iterator[Path]:
    # Not under pytest's tmp_path: that is 0700 root, which `nobody` could not even traverse.
    root = Path(tempfile.mkdtemp(prefix="unreadable-models-", dir="/tmp"))
    try:
        root.chmod(0o755)
        copy_models(tiny_models, root, ("classification",))
        shutil.copytree(tiny_models["embedding"], root / LOCKED)
        for path in root.rglob("*"):
            path.chmod(0o755 if path.is_dir() else 0o644)
        if os.geteuid() == 0:
            shutil.chown(root / LOCKED, user="nobody")
            (root / LOCKED).chmod(0o700)
        else:
            (root / LOCKED).chmod(0o000)
        yield root
    finally:
        (root / LOCKED).chmod(0o755)
        shutil.rmtree(root, ignore_errors=True)


# Root reads every file through these two capabilities; without them a 0700 directory of another user
# is closed to it, as to any other user.
WITHOUT_READ_OVERRIDE = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--"]


def test_an_unreadable_model_dir_is_reported_and_the_others_serve(models_with_a_locked_dir: Path) -> None:
    root = models_with_a_locked_dir
    port = free_port()
    command = [sys.executable, "-m", "service", "--models-dir", str(root), "--port", str(port)]
    if os.geteuid() == 0:
        command = WITHOUT_READ_OVERRIDE + command
    env = {**os.environ, "RETENTION_INTRA_OP_THREADS": "1"}
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        ready = wait_ready(url, READY_S, process=process, name="the service with one unreadable model")
        body = ready.json()
        assert body["models"] == ["tiny-classification"]
        assert "not readable" in body["errors"][LOCKED]
        assert str(root) not in ready.text  # named, never a path
        assert httpx.post(f"{url}/classify", json={"text": "fine"}, timeout=30).status_code == 200
        assert LOCKED in httpx.get(f"{url}/models", timeout=10).json()["errors"]
    finally:
        process.terminate()
        process.wait(timeout=30)
