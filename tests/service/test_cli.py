"""``python -m service``: a real process; SIGHUP reloads the models directory, SIGTERM exits cleanly."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from benchmarks._http import free_port
from tests.service.conftest import copy_models, wait_until

REPO = Path(__file__).resolve().parents[2]


def test_cli_serves_reloads_on_sighup_and_stops_on_sigterm(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    root = copy_models(tiny_models, tmp_path / "models", ("classification",))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "RETENTION_INTRA_OP_THREADS": "1", "RETENTION_LOG_LEVEL": "warning"}
    command = [
        sys.executable,
        "-m",
        "service",
        "--models-dir",
        str(root),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def get(path: str) -> httpx.Response | None:
        try:
            return httpx.get(url + path, timeout=5)
        except httpx.HTTPError:
            return None

    def names() -> set[str]:
        response = get("/models")
        return {m["name"] for m in response.json()["models"]} if response is not None else set()

    try:
        wait_until(lambda: (r := get("/readyz")) is not None and r.status_code == 200, 60, "service ready")
        assert names() == {"tiny-classification"}
        response = httpx.post(url + "/classify?rho=0.5", json={"text": "from a real process"}, timeout=10)
        assert response.status_code == 200 and response.headers["x-rho-effective"] == "0.5"

        shutil.copytree(tiny_models["summarization"], root / "summaries")
        process.send_signal(signal.SIGHUP)
        wait_until(lambda: "tiny-summarization" in names(), 60, "SIGHUP reload")
        assert process.poll() is None

        process.send_signal(signal.SIGTERM)
        # uvicorn drains, runs the lifespan shutdown, then re-raises the signal it captured
        assert process.wait(timeout=60) in (0, -signal.SIGTERM)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        output = process.stdout.read().decode() if process.stdout else ""
    assert "Traceback" not in output, output
