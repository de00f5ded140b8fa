"""The torch backend's CUDA graphs without a GPU: two models served by one process under concurrent load,
a capture that fails, a model placed on ``cuda:1``, the plans captured at load.

Real parts: tiny models through the real exporter, the real runner capturing its real forward, the real
app over HTTP (TestClient). What cannot run on a CPU is ``torch.cuda``'s device and capture API: it is
replaced by ``tests.service.fake_cuda`` (a capture records the forward's aten ops, a replay runs them
again on the static buffers, so stale outputs would show), and each served model's runner is rebuilt
on a placement whose tensors stay on the CPU while its CUDA context is device N (``Placement(cpu,
N)``), the only way to walk the capture path here. On a lent GPU the same paths run for real in the
prepared check (``scripts/gpu_check.sh``)."""

from __future__ import annotations

import itertools
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from fastapi import FastAPI
from fastapi.testclient import TestClient

from retention_core.contract import Manifest, Schedule
from retention_core.tasks import task_spec
from retention_torch.capture import CAPTURE_ERROR_MODE, Placement, capture_lock
from retention_torch.runner import BATCH_BUCKETS, LENGTH_BUCKETS, LoadBudget, Runner, load_plans
from service.backends import open_backend
from service.backends.torch_backend import TorchBackend, resolve_device, server_plans
from service.runtime import load_model
from service.settings import Settings
from tests.service.conftest import copy_models, running, server_of, settings_for
from tests.service.fake_cuda import FakeCuda
from training.export.graph import example_inputs

EMBEDDING, CLASSIFIER = "tiny-embedding", "tiny-classification"
CPU = torch.device("cpu")
TEXTS = [
    "a fine film with a slow start",
    "a dull one",
    "rivers carry stones to the sea " * 3,
    "x " * 40,
    "the harbour market opens at dawn and closes when the boats are gone",
]
RHOS = (0.3, 1.0, 0.5)
CLIENT_THREADS = 8
ROUNDS = 3  # every (model, text, ρ) request sent this many times, all at once
ANSWER_ATOL = 1e-4  # a row batched with others equals it alone (tests/service/test_batching.py)
VOCAB = 30522  # example_inputs' ids are drawn below it


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> FakeCuda:
    return FakeCuda().install(monkeypatch)


def graphed(backend: TorchBackend, index: int, max_graphs: int = 64) -> Runner:
    """The backend's runner rebuilt on CUDA device ``index``'s context (tensors on the CPU), graphs on."""
    current = backend.runner
    runner = Runner(
        current.weights,
        current.schedule,
        current.head,
        current.length_buckets[-1],
        graphs=True,
        max_graphs=max_graphs,
        placement=Placement(CPU, index),
    )
    backend.runner = runner
    return runner


def opened(directory: Path) -> TorchBackend:
    """The model directory opened on the torch backend (the CPU, as this machine has no GPU)."""
    manifest = Manifest.read(directory)
    backend = open_backend(
        directory, manifest, task_spec(manifest.task), settings_for(directory.parent, backend="torch")
    )
    assert isinstance(backend, TorchBackend)
    return backend


def torch_backend_of(app: FastAPI, model: str) -> TorchBackend:
    backend = server_of(app).get(model).backend
    assert isinstance(backend, TorchBackend)
    return backend


def ask(client: TestClient, model: str, text: str, rho: float) -> Any:
    """One request; its answer as numbers (the vector, or the class scores)."""
    if model == EMBEDDING:
        response = client.post("/v1/embeddings", json={"model": model, "input": [text], "rho": rho})
        assert response.status_code == 200, response.text
        return np.array(response.json()["data"][0]["embedding"])
    response = client.post("/classify", json={"text": text, "rho": rho})  # its task's one model
    assert response.status_code == 200, response.text
    scores = response.json()["scores"]
    return np.array([scores[label] for label in sorted(scores)])


def requests_of(models: tuple[str, ...]) -> list[tuple[str, str, float]]:
    return list(itertools.product(models, TEXTS, RHOS))


def answers(client: TestClient, asked: list[tuple[str, str, float]], threads: int) -> list[Any]:
    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(lambda request: ask(client, *request), asked))


def metric(client: TestClient, name: str, **labels: str) -> float:
    """One sample of /metrics (labels in the exposition's sorted order)."""
    wanted = name + "{" + ",".join(f'{key}="{value}"' for key, value in sorted(labels.items())) + "} "
    found = [line for line in client.get("/metrics").text.splitlines() if line.startswith(wanted)]
    assert found, wanted
    return float(found[0].split()[-1])


def listed_graphs(client: TestClient) -> dict[str, Any]:
    return {m["name"]: m["cuda_graphs"] for m in client.get("/models").json()["models"]}


def test_two_torch_models_in_one_process_capture_one_at_a_time_and_answer_under_load(
    tiny_models: dict[str, Path], tmp_path: Path, fake_cuda: FakeCuda
) -> None:
    """Two models on one device, their workers and a load capturing at once: never two captures on the
    device at a time, each in thread-local mode on its runner's own stream; every answer equals the
    eager one (a replay that missed its data would answer stale values); /metrics and /models count the
    captures."""
    root = copy_models(tiny_models, tmp_path / "models", ("embedding", "classification"))
    with running(settings_for(root, backend="torch")) as (app, client):
        asked = requests_of((EMBEDDING, CLASSIFIER))
        assert listed_graphs(client) == {EMBEDDING: None, CLASSIFIER: None}  # the CPU captures nothing
        eager = [ask(client, *request) for request in asked]
        runners = {model: graphed(torch_backend_of(app, model), 0) for model in (EMBEDDING, CLASSIFIER)}
        model = server_of(app).get(CLASSIFIER)
        backend = torch_backend_of(app, CLASSIFIER)
        plans = server_plans(backend.runner, model.manifest, Settings(max_batch_tokens=512))
        with ThreadPoolExecutor(1) as loader:  # a load capturing while both models serve
            loading = loader.submit(backend.capture_at_load, plans, LoadBudget(len(plans)))
            served = answers(client, asked * ROUNDS, CLIENT_THREADS)
            assert loading.result(timeout=120) == len(plans)
        for got, expected in zip(served, eager * ROUNDS, strict=True):
            np.testing.assert_allclose(got, expected, atol=ANSWER_ATOL)

        assert fake_cuda.most_at_once == {0: 1} and fake_cuda.failed == 0
        streams = {name: runner.capturer.stream for name, runner in runners.items() if runner.capturer}
        assert len(streams) == 2 and streams[EMBEDDING] is not streams[CLASSIFIER]
        assert all(c.mode == CAPTURE_ERROR_MODE == "thread_local" for c in fake_cuda.captures)
        assert all(any(c.stream is s for s in streams.values()) for c in fake_cuda.captures)
        listed = listed_graphs(client)
        for name, runner in runners.items():
            stats = runner.stats
            assert stats.captured_on_request > 0 and stats.capture_failures == stats.eager_runs == 0
            captured = metric(client, "retention_cuda_graph_captures_total", model=name, phase="request")
            assert captured == stats.captured_on_request
            assert listed[name]["held"] == stats.captured == len(runner.compiled)
        assert listed[CLASSIFIER]["captured_at_load"] == listed[CLASSIFIER]["planned_at_load"] == len(plans)
        assert len(fake_cuda.captures) == sum(runner.stats.captured for runner in runners.values())


def test_a_failing_capture_answers_every_request_eagerly_and_is_not_retried(
    tiny_models: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every capture fails (as a capture invalidated by an unsafe call does): every request is answered,
    eagerly, with the eager answers; each plan's capture was tried once, at load or on its first request,
    never again; /metrics counts the failures and the eager runs, /models states them."""
    fake_cuda = FakeCuda(fail=True).install(monkeypatch)
    root = copy_models(tiny_models, tmp_path / "models", ("embedding",))
    with running(settings_for(root, backend="torch")) as (app, client):
        asked = requests_of((EMBEDDING,))
        eager = [ask(client, *request) for request in asked]
        backend = torch_backend_of(app, EMBEDDING)
        runner = graphed(backend, 0)
        plans = server_plans(runner, server_of(app).get(EMBEDDING).manifest, Settings(max_batch_tokens=256))
        assert backend.capture_at_load(plans, LoadBudget(len(plans))) == 0
        assert runner.stats.capture_failures == fake_cuda.failed == len(plans) == len(runner.eager_plans)
        for _ in range(ROUNDS):
            for got, expected in zip(answers(client, asked, CLIENT_THREADS), eager, strict=True):
                np.testing.assert_allclose(got, expected, atol=ANSWER_ATOL)
        answers(client, asked, 1)  # one request per run: the plans of single requests
        tried = fake_cuda.failed
        assert tried == len(runner.eager_plans) and runner.stats.capture_failures == tried
        answers(client, asked, 1)  # the same runs, the same plans again: no capture is tried
        assert fake_cuda.failed == tried and runner.stats.captured == 0

        runs = runner.stats.eager_runs
        assert runs >= len(asked)  # every run was eager (concurrent requests may share one)
        assert metric(client, "retention_cuda_graph_capture_failures_total", model=EMBEDDING) == tried
        assert metric(client, "retention_cuda_graph_eager_runs_total", model=EMBEDDING) == runs
        assert metric(client, "retention_cuda_graphs", model=EMBEDDING) == 0
        listed = listed_graphs(client)[EMBEDDING]
        assert listed["capture_failures"] == tried and listed["held"] == listed["captured_at_load"] == 0


def test_a_model_on_cuda_1_does_everything_on_device_1(
    tiny_models: dict[str, Path], fake_cuda: FakeCuda
) -> None:
    """RETENTION_TORCH_DEVICE=cuda:1: the placement names device 1; its pool, every stream and every
    capture are made with device 1 current, while the worker's own current device stays 0; each device
    has its own capture lock, so models on two devices capture independently, one at a time on each."""
    assert resolve_device("cuda:1") == torch.device("cuda:1")
    assert Placement.of(torch.device("cuda:1")) == Placement(torch.device("cuda:1"), 1)
    with fake_cuda.device(1):  # a bare "cuda" is the current device, named
        assert Placement.of(torch.device("cuda")) == Placement(torch.device("cuda:1"), 1)
    assert Placement.of(CPU) == Placement(CPU, None)
    assert capture_lock(1) is capture_lock(1) and capture_lock(1) is not capture_lock(0)

    directory = tiny_models["embedding"]
    manifest = Manifest.read(directory)
    spec = task_spec(manifest.task)
    on_1 = graphed(opened(directory), 1)
    on_0 = graphed(opened(directory), 0)
    feeds = []
    for seed, rhos in enumerate(((0.3, 1.0, 0.5), (0.3, 0.3, 0.7), (1.0, 1.0), (0.5,))):
        example = example_inputs(len(rhos), 12 + 9 * seed, VOCAB, rhos, seed)
        feeds.append({name.name: example[name.name].numpy() for name in spec.inputs})
    eager = Runner(on_1.weights, on_1.schedule, on_1.head, manifest.max_length, graphs=False)
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda job: job[0].run(job[1]), itertools.product((on_1, on_0), feeds * 2)))
    for (_, batch), result in zip(itertools.product((on_1, on_0), feeds * 2), results, strict=True):
        expected = eager.run(batch)
        np.testing.assert_allclose(result.main, expected.main, atol=1e-6)
        np.testing.assert_array_equal(result.survival_depth, expected.survival_depth)
    assert fake_cuda.current_device() == 0

    assert on_1.capturer is not None
    on_device_1 = [c for c in fake_cuda.captures if c.stream is on_1.capturer.stream]
    on_device_0 = [c for c in fake_cuda.captures if c.stream is not on_1.capturer.stream]
    assert len(on_device_1) == on_1.stats.captured > 0 and len(on_device_0) == on_0.stats.captured > 0
    assert all(c.device == c.stream_device == c.pool_device == 1 for c in on_device_1)
    assert all(c.device == c.stream_device == c.pool_device == 0 for c in on_device_0)
    made_on_1 = [s for s in fake_cuda.streams if s.device_index == 1]
    assert len(made_on_1) == 1 + on_1.stats.captured  # its capture stream, and one side stream per warm-up
    assert max(fake_cuda.most_at_once.values()) == 1 and set(fake_cuda.most_at_once) == {0, 1}


def test_the_plans_of_the_servers_runs_are_captured_at_load_within_bounds(
    tiny_models: dict[str, Path], fake_cuda: FakeCuda
) -> None:
    """The plans of every bucket the server's runs use (under the batch token budget), fewest padded
    tokens first; captured at load up to the count and while the device has memory free; the cache
    grows by what the load captured; a warm-up's and a request's plans among them capture nothing on
    the request path; past the cache's size the least recently used leave, counted."""
    directory = tiny_models["embedding"]
    settings = settings_for(directory.parent, backend="torch", max_batch_tokens=256, max_cuda_graphs=2)
    model = load_model(directory, settings)
    backend = model.backend
    assert isinstance(backend, TorchBackend)
    runner = graphed(backend, 0, max_graphs=settings.max_cuda_graphs)
    plans = server_plans(runner, model.manifest, settings)
    rhos = (model.manifest.default_rho, 1.0)
    buckets = (runner.batch_buckets, runner.length_buckets)
    assert plans == load_plans(model.manifest.schedule, rhos, *buckets, settings.max_batch_tokens)
    assert len(set(plans)) == len(plans) and all(p.batch * p.length <= 256 for p in plans)
    sizes = [p.batch * p.length for p in plans]
    assert sizes == sorted(sizes) and {p.batch for p in plans} == {b for b in BATCH_BUCKETS if b * 16 <= 256}
    assert any(not p.masked for p in plans) and any(p.masked for p in plans)

    fake_cuda.free_bytes = fake_cuda.total_bytes // 10  # under a quarter free: nothing is captured
    assert backend.capture_at_load(plans, LoadBudget(len(plans))) == 0
    assert runner.stats.load_stopped is not None and "device memory" in runner.stats.load_stopped
    fake_cuda.free_bytes = fake_cuda.total_bytes // 2
    assert backend.capture_at_load(plans, LoadBudget(5)) == 5
    assert runner.stats.load_stopped == "the limit of 5 plans"
    captured = backend.capture_at_load(plans, LoadBudget(len(plans)))  # the rest, as a load with room
    assert captured == len(plans) and runner.stats.load_stopped is None
    assert runner.max_graphs == settings.max_cuda_graphs + len(plans) and runner.stats.evictions == 0
    cache = backend.graph_cache()
    assert cache is not None and cache.held == cache.captured_at_load == cache.planned_at_load == len(plans)

    model.warm_up()  # what the load runs next, at ρ 1 and the default ρ
    assert runner.stats.captured_on_request == 0  # no capture on the request path
    wide = example_inputs(3, 60, VOCAB, (0.3,) * 3, seed=5)  # 4 x 64 padded: past the load's budget
    for rho in (0.2, 0.4, 0.6, 0.8, 1.0):
        feeds = {s.name: wide[s.name].numpy() for s in model.spec.inputs}
        feeds["rho"] = np.full(3, rho, dtype=np.float32)
        backend.run(feeds)
    new = runner.stats.captured_on_request
    assert new >= 3 and runner.stats.evictions == new - settings.max_cuda_graphs
    assert len(runner.compiled) == runner.max_graphs


def test_plans_at_load_cover_each_bucket_of_the_token_budget() -> None:
    """Every batch × length bucket pair under the budget has its plans, the longest row anywhere in the
    length bucket; none past the budget."""
    schedule = Schedule(num_points=6, power=0.5, min_kept_tokens=4, pruning_interval=2, merge_dropped=True)
    plans = load_plans(schedule, (0.5, 1.0), BATCH_BUCKETS, LENGTH_BUCKETS, 8192)
    pairs = {(p.batch, p.length) for p in plans}
    assert pairs == {(b, n) for b in BATCH_BUCKETS for n in LENGTH_BUCKETS if b * n <= 8192}
    dense = [p for p in plans if not p.selecting]
    assert {(p.batch, p.length) for p in dense} == pairs  # ρ = 1 (and the floor) on every pair
    assert all(p.masked for p in plans if p.selecting)  # merging: attention always has its mask
