"""A device that runs out of memory costs requests, never the server: a run the device cannot hold is
split and retried; a row that does not fit even alone is a 503 with Retry-After; the next request is
answered and /readyz stays truthful.

On the CPU through the backend seam: the real torch backend over a runner that raises torch's own
``torch.OutOfMemoryError`` (what CUDA raises) for runs past a token budget, as a small device would. The
rest is the real service over HTTP (TestClient)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

from retention_torch.runner import Runner, RunResult
from service.backends.torch_backend import TorchBackend
from service.scheduling.execution import RowsOutOfMemory, execute
from service.scheduling.jobs import RowResult
from tests.service.conftest import running, server_of, settings_for, wait_until

MODEL = "tiny-embedding"
DEVICE_TOKENS = 48  # the pretend device holds runs of at most this many padded tokens (tiny max_length: 64)


class SmallDeviceRunner(Runner):
    """The real runner, on a device that holds ``DEVICE_TOKENS`` padded tokens per run."""

    runs: list[tuple[int, int]]

    def run(self, feeds: dict[str, np.ndarray]) -> RunResult:
        rows, length = feeds["input_ids"].shape
        self.runs.append((rows, length))
        if rows * length > DEVICE_TOKENS:
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {rows * length} tokens")
        return super().run(feeds)


def on_a_small_device(app: Any) -> SmallDeviceRunner:
    model = server_of(app).get(MODEL)
    backend = model.backend
    assert isinstance(backend, TorchBackend)
    current = backend.runner
    small = SmallDeviceRunner(current.weights, current.schedule, current.head, model.manifest.max_length)
    small.runs = []
    backend.runner = small
    return small


def embed(client: TestClient, texts: list[str]) -> Any:
    return client.post("/v1/embeddings", json={"model": MODEL, "input": texts, "rho": 0.5})


def oom_count(client: TestClient, outcome: str) -> float:
    line = f'retention_device_oom_total{{model="{MODEL}",outcome="{outcome}"}} '
    found = [row for row in client.get("/metrics").text.splitlines() if row.startswith(line)]
    assert found, line
    return float(found[0].split()[-1])


def test_out_of_memory_splits_the_run_refuses_what_never_fits_and_keeps_serving(models_root: Path) -> None:
    settings = settings_for(models_root, backend="torch", retry_after_s=2, max_batch_wait_ms=20.0)
    with running(settings) as (app, client):
        device = on_a_small_device(app)
        texts = [f"document {i}: a fine film with a slow start and a wonderful last hour" for i in range(6)]
        alone = embed(client, texts)
        assert alone.status_code == 200, alone.text
        assert len(alone.json()["data"]) == 6
        assert max(rows for rows, _ in device.runs) > 1
        # counted when the batch ends, which may be just after its answers went out (each run's go at once)
        wait_until(lambda: oom_count(client, "split") >= 1, what="the batch's splits counted")
        answered = np.array([item["embedding"] for item in alone.json()["data"]])

        too_long = "a very long document " * 40  # > DEVICE_TOKENS alone
        refused = embed(client, [texts[0], too_long])
        assert refused.status_code == 503, refused.text
        assert refused.headers["Retry-After"] == "2"
        assert refused.json()["error"]["code"] == "device_out_of_memory"
        assert oom_count(client, "refused") == 1

        again = embed(client, texts)  # the server is up, ready and answers the same
        assert again.status_code == 200
        np.testing.assert_allclose(
            np.array([item["embedding"] for item in again.json()["data"]]), answered, atol=1e-6
        )
        assert client.get("/readyz").status_code == 200
        assert (
            'retention_requests_total{endpoint="v1/embeddings",status_class="5xx",task="embedding"} 1.0'
            in (client.get("/metrics").text)
        )


def test_a_short_row_split_off_a_long_one_runs_at_its_own_length(models_root: Path) -> None:
    """The planner may put a short and a long row in one run (padded to the long one); after the split
    each half is padded to its own longest row, so only the long row is refused."""
    with running(settings_for(models_root, backend="torch")) as (app, _):
        device = on_a_small_device(app)
        model = server_of(app).get(MODEL)
        short, long = (
            model.spec.example_row(tuple(model.tokenizer.encode(text).ids[: model.manifest.max_length]))
            for text in ("a short document", "a very long document " * 40)
        )
        lengths = [len(short.input_ids), len(long.input_ids)]
        assert lengths[0] <= DEVICE_TOKENS < lengths[1]
        answered: dict[int, RowResult] = {}

        def run_done(done: list[tuple[int, RowResult]], _end: float) -> None:
            answered.update(done)

        with pytest.raises(RowsOutOfMemory) as refused:
            execute(model, lambda rho, length: 1.0, [short, long], [0.5, 0.5], lengths, [[0, 1]], run_done)
        assert refused.value.rows == [1]
        assert list(answered) == [0]
        assert device.runs == [(2, lengths[1]), (1, lengths[0]), (1, lengths[1])]


def test_device_memory_is_exported_for_a_backend_on_an_accelerator_and_dropped_with_its_model() -> None:
    """A backend that reads its device allocator (the torch backend on a GPU) gets in-use and peak
    gauges, read at every scrape; a CPU backend gets none; a model that leaves takes its series along."""
    from service.metrics import Metrics, ModelBackend

    metrics = Metrics()
    allocated = [1_000, 5_000]
    metrics.init_model(
        "on-gpu", "embedding", "b", "bf16", 0, ModelBackend("torch", "cuda:0", lambda: tuple(allocated))
    )
    metrics.init_model("on-cpu", "embedding", "b", "fp32", 0, ModelBackend("onnxruntime", "cpu"))
    allocated[0] = 2_000  # read when scraped, not when registered
    text = metrics.render().decode()
    assert 'retention_device_memory_bytes{model="on-gpu"} 2000.0' in text
    assert 'retention_device_memory_peak_bytes{model="on-gpu"} 5000.0' in text
    assert 'retention_model_backend_info{backend="torch",device="cuda:0",model="on-gpu"} 1.0' in text
    assert 'retention_device_memory_bytes{model="on-cpu"}' not in text
    metrics.forget_model("on-gpu", "embedding", "b", "bf16")
    text = metrics.render().decode()
    assert 'model="on-gpu"} 2000.0' not in text and 'backend="torch"' not in text
