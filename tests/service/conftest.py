"""Fixtures for the service tests: tiny models exported through the real exporter, real onnxruntime
sessions and tokenizers, and apps run with their lifespan (``with TestClient(app)``)."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from benchmarks._http import free_port, wait_ready
from service.api.app import create_app
from service.server import ModelServer
from service.settings import Settings
from tests.tiny import build_tiny_model_dir

TASKS = ("classification", "qa", "summarization", "embedding")
SERVED_READY_S = 20.0  # an app in this process on tiny models


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One exported tiny model directory per task (built once per session)."""
    root = tmp_path_factory.mktemp("tiny-models")
    return {task: _build(root / f"tiny-{task}", task) for task in TASKS}


def _build(path: Path, task: str) -> Path:
    build_tiny_model_dir(path, task)
    return path


@pytest.fixture(scope="session")
def models_root(tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A read-only models root holding one tiny model per task."""
    root = tmp_path_factory.mktemp("models-root")
    for task, source in tiny_models.items():
        shutil.copytree(source, root / f"tiny-{task}")
    return root


def copy_models(tiny_models: dict[str, Path], root: Path, tasks: tuple[str, ...] = TASKS) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for task in tasks:
        shutil.copytree(tiny_models[task], root / f"tiny-{task}")
    return root


ADMIN_KEY = "admin-s3cret"  # settings_for(root, admin_api_key=ADMIN_KEY) mounts POST /admin/reload


def reload_models(client: TestClient) -> dict[str, Any]:
    """POST /admin/reload with the admin key; the report."""
    response = client.post("/admin/reload", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    assert response.status_code == 200, response.text
    report: dict[str, Any] = response.json()
    return report


def settings_for(root: Path, **overrides: Any) -> Settings:
    base: dict[str, Any] = {
        "models_dir": root,
        "intra_op_threads": 1,
        "max_batch_wait_ms": 1.0,
        "auto_latency_target_s": 30.0,  # no accidental pressure on a busy machine; tests that want it set it
        "refusal_hold_s": 0.0,  # 429s answered at once; the tests of the hold set it
    }
    base.update(overrides)
    return Settings(**base)


def wait_until(condition: Callable[[], bool], timeout: float = 20.0, what: str = "condition") -> None:
    """Poll (this is synchronisation, not a timing assertion)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if condition():
            return
        time.sleep(0.005)
    raise AssertionError(f"timed out waiting for {what}")


def server_of(app: FastAPI) -> ModelServer:
    server: ModelServer = app.state.server
    return server


@contextmanager
def running(settings: Settings) -> Iterator[tuple[FastAPI, TestClient]]:
    app = create_app(settings)
    with TestClient(app) as client:
        wait_ready(str(client.base_url), SERVED_READY_S, probe=lambda: client.get("/readyz"), name="the app")
        yield app, client


@contextmanager
def blocked_inference(app: FastAPI, model: str) -> Iterator[threading.Event]:
    """Occupy the model's inference thread until the block exits: batches queue up behind it.
    (The real executor of the real batcher: nothing of ours is mocked.)"""
    release = threading.Event()
    blocker = server_of(app).batcher_of(model).executor.submit(release.wait, 30)
    try:
        yield release
    finally:
        release.set()
        blocker.result(timeout=30)


@pytest.fixture(scope="module")
def app_client(models_root: Path) -> Iterator[tuple[FastAPI, TestClient]]:
    with running(settings_for(models_root)) as pair:
        yield pair


@pytest.fixture(scope="module")
def client(app_client: tuple[FastAPI, TestClient]) -> TestClient:
    return app_client[1]


@contextmanager
def served(settings: Settings | None = None, app: Any = None, ready_path: str = "/readyz") -> Iterator[str]:
    """An app (ours from ``settings``, or any ASGI ``app``) behind a real uvicorn server on a free loopback
    port, in a thread. Yields the base URL."""
    import uvicorn

    port = free_port()
    application = app if app is not None else create_app(settings)
    config = uvicorn.Config(application, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn-test", daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(
            url, SERVED_READY_S, probe=lambda: httpx.get(f"{url}{ready_path}", timeout=2), name="uvicorn"
        )
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=30)
