"""``scripts/serve.sh`` (``make serve``): serve the first model, build the others in the background, hot-load
them, and stop everything on Ctrl-C.

A real process group, as a terminal runs it: the first recipe's model is already present (a tiny
embedding model in the directory of the product it stands in for, so ``training build`` skips it; the
stand-in's swap itself: tests/training/test_build_stand_in.py), the background build is the real
IMDb quick build (stopped seconds after it starts) and a model directory appearing while it serves is
hot-loaded without SIGHUP.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.service.conftest import wait_until
from tests.service.test_cli import free_port

pytestmark = pytest.mark.integration  # subprocess servers

REPO = Path(__file__).resolve().parents[2]


def group_members(pgid: int) -> list[str]:
    """Command lines of the live processes in process group ``pgid`` (from /proc)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            state, group = fields[0], int(fields[2])
            command = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, IndexError, ValueError):
            continue  # exited while we looked
        if group == pgid and state != "Z":
            members.append(command)
    return members


def test_serve_script_hot_loads_and_ctrl_c_stops_service_and_background_build(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    models = tmp_path / "models"
    shutil.copytree(tiny_models["embedding"], models / "minilm-embed")  # the name the first stands in for
    build_log = tmp_path / "logs" / "background.log"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "BIN": str(Path(sys.executable).parent),
        "MODELS_DIR": str(models),
        "RUNS_DIR": str(tmp_path / "runs"),
        "PORT": str(port),
        "BACKGROUND_RECIPES": "models/recipes/imdb.yaml",
        "BUILD_LOG": str(build_log),
        "RETENTION_RELOAD_INTERVAL_S": "0.2",
        "RETENTION_INTRA_OP_THREADS": "1",
        "RETENTION_LOG_LEVEL": "warning",
        "HF_HUB_OFFLINE": "1",
    }
    process = subprocess.Popen(
        ["scripts/serve.sh"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group, as a terminal's foreground job
        # as a terminal's: SIGINT not ignored, even when pytest itself runs as a background job
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )

    def status(path: str, body: dict[str, str]) -> int:
        try:
            return httpx.post(url + path, json=body, timeout=10).status_code
        except httpx.HTTPError:
            return 0

    try:
        wait_until(lambda: status("/embed", {"text": "first answer"}) == 200, 120, "first answer")
        assert any("training build models/recipes/imdb.yaml" in c for c in group_members(process.pid))

        shutil.copytree(tiny_models["classification"], models / "sentiment")  # as a finished build
        wait_until(lambda: status("/classify", {"text": "hot-loaded"}) == 200, 60, "hot-load")

        os.killpg(process.pid, signal.SIGINT)  # Ctrl-C: the whole foreground group gets SIGINT
        assert process.wait(timeout=60) != 0
        wait_until(lambda: not group_members(process.pid), 60, "service and background build stopped")
    finally:
        if group_members(process.pid):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    output = process.stdout.read().decode() if process.stdout else ""
    assert f"tail -f {build_log}" in output and "background build stopped" in output, output
    assert "minilm-embed: present" in output, output
    assert build_log.is_file()


def test_make_serve_answers_with_the_frozen_stand_in_and_builds_the_two_path_model_last() -> None:
    """What ``make serve`` hands the script: the frozen quick retrofit first, as minilm-embed (≤ 5 minutes
    on 2 cores), then the other defaults, then the two-path product, which replaces the stand-in."""
    dry_run = subprocess.run(
        ["make", "-n", "serve", "VENV=.venv-absent"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    first = 'FIRST_RECIPES="models/recipes/minilm-embed-frozen.yaml" FIRST_STAND_IN_FOR="minilm-embed"'
    assert first in dry_run
    background = dry_run.split('BACKGROUND_RECIPES="')[1].split('"')[0].split()
    assert background[-1] == "models/recipes/minilm-embed.yaml" and "models/recipes/imdb.yaml" in background
