"""rho=auto: the server picks rho to hold a latency target, never below the client's min_rho."""

from __future__ import annotations

import math
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.scheduling.batcher import Batcher
from tests.service.conftest import blocked_inference, running, server_of, settings_for, wait_until

TEXT = "auto budget under pressure"
MODEL = "tiny-classification"


def test_auto_without_pressure_is_full_quality(client: TestClient) -> None:
    usage = client.post("/classify?rho=auto", json={"text": TEXT}).json()["usage"]
    assert usage["rho_requested"] == "auto" and usage["rho_effective"] == 1.0 and usage["degraded"] is False


@pytest.mark.parametrize("min_rho", [0.05, 0.25, 0.6])
def test_auto_under_pressure_never_goes_below_min_rho(models_root: Path, min_rho: float) -> None:
    # A target no batch can meet: every auto request is under pressure.
    with running(settings_for(models_root, auto_latency_target_s=1e-9)) as (_, client):
        for path, body in (
            (f"/classify?rho=auto&min_rho={min_rho}", {"text": TEXT}),
            ("/classify", {"text": TEXT, "rho": "auto", "min_rho": min_rho}),
            (f"/qa?rho=auto&min_rho={min_rho}", {"question": "what?", "context": TEXT}),
            (f"/summarize?rho=auto&min_rho={min_rho}", {"text": "One here. Two there."}),
        ):
            response = client.post(path, json=body)
            assert response.status_code == 200, response.text
            usage = response.json()["usage"]
            assert usage["rho_effective"] >= min_rho
            assert usage["rho_effective"] == pytest.approx(min_rho)
            assert usage["degraded"] is True and usage["min_rho"] == min_rho
            assert float(response.headers["x-rho-effective"]) == pytest.approx(min_rho)
        metrics = client.get("/metrics").text
        assert 'retention_degraded_requests_total{endpoint="classify",task="classification"} 2.0' in metrics
        assert 'retention_degraded_requests_total{endpoint="qa",task="qa"} 1.0' in metrics


def slow_machine(batcher: Batcher, per_kept_token: float = 0.05) -> Callable[[float], float]:
    """Teach the batcher's real cost model, through its own learning path, a machine on which a kept
    token costs ``per_kept_token`` s (the tiny model is far too fast to build a backlog otherwise).
    Returns the taught cost of one 16-token row at a rho."""
    for tokens in (16, 32, 48, 64) * 50:
        for rho in (0.1, 0.5, 1.0):
            kept = tokens * batcher.costs.fraction(rho)
            batcher.costs.cost.observe(tokens, kept, 0.001 + per_kept_token * kept)
    return lambda rho: batcher.costs.cost.seconds(16, rho, batcher.settings.max_batch_tokens)


def queue_holds(batcher: Batcher, count: int) -> Callable[[], bool]:
    return lambda: len(batcher.queue) == count


def pressure_settings(models_root: Path, **overrides: Any) -> Any:
    """One 16-token row per batch, so the queue is the backlog the controller reasons about."""
    return settings_for(models_root, max_batch_tokens=16, max_batch_wait_ms=0.0, **overrides)


def post_in_background(
    pool: ThreadPoolExecutor, client: TestClient, path: str, body: dict[str, Any]
) -> Future[Any]:
    return pool.submit(client.post, path, json=body)


def test_auto_rho_is_decided_when_the_batch_forms_from_the_work_then_queued(models_root: Path) -> None:
    with running(pressure_settings(models_root)) as (app, client), ThreadPoolExecutor(8) as pool:
        batcher = server_of(app).batcher_of(MODEL)
        cost = slow_machine(batcher)
        assert 6 * cost(0.1) < 2.0 < 6 * cost(1.0)  # the backlog fits the target only below rho=1
        with blocked_inference(app, MODEL):
            filler = post_in_background(pool, client, "/classify?rho=1", {"text": TEXT})
            wait_until(lambda: batcher.busy, what="the filler batch formed")
            first = post_in_background(
                pool, client, "/classify?rho=auto", {"text": TEXT, "max_latency_ms": 20000}
            )
            wait_until(lambda: len(batcher.queue) == 1, what="the auto request queued, alone")
            behind = []
            for count in range(2, 7):  # auto requests that need the backlog served below rho=1
                behind.append(
                    post_in_background(
                        pool, client, "/classify?rho=auto", {"text": TEXT, "max_latency_ms": 3000}
                    )
                )
                wait_until(queue_holds(batcher, count), what="queued behind")
        assert filler.result().status_code == 200
        usage = first.result().json()["usage"]
        # at enqueue nothing was queued behind it; the batch saw five requests with 3 s targets
        assert usage["rho_effective"] < 1.0 and usage["degraded"] is True
        assert usage["rho_reason"] in ("auto:backlog", "auto:floor")
        assert usage["latency_target_s"] == 20.0
        assert all(f.result().status_code == 200 for f in behind)


def test_backlog_is_refused_at_once_with_retry_after_growing_with_it(models_root: Path) -> None:
    with running(pressure_settings(models_root)) as (app, client), ThreadPoolExecutor(16) as pool:
        batcher = server_of(app).batcher_of(MODEL)
        slow_machine(batcher)
        waits: list[float] = []
        retries: list[int] = []
        queued = []
        with blocked_inference(app, MODEL):
            queued.append(post_in_background(pool, client, "/classify?rho=1", {"text": TEXT}))
            wait_until(lambda: batcher.busy, what="the first batch formed")
            for count in range(1, 13):
                queued.append(post_in_background(pool, client, "/classify?rho=1", {"text": TEXT}))
                wait_until(queue_holds(batcher, count), what="backlog grew")
                refused = client.post("/classify?rho=auto&max_latency_ms=5", json={"text": TEXT})
                assert refused.status_code == 429, refused.text
                assert refused.json()["error"]["code"] == "overloaded"
                retries.append(int(refused.headers["retry-after"]))
                waits.append(float(refused.headers["x-predicted-wait"]))
        assert all(f.result().status_code == 200 for f in queued)  # the admitted ones are all served
        assert waits == sorted(waits) and waits[0] < waits[-1]
        assert retries == sorted(retries) and retries[0] >= 1 and retries[-1] == math.ceil(waits[-1])
        assert retries[-1] > retries[0]
        metrics = client.get("/metrics").text
        assert 'retention_shed_requests_total{reason="over_target"} 12.0' in metrics
        assert 'retention_rejections_total{reason="over_target"} 12.0' in metrics
        # once the backlog drained, the same request is served
        assert client.post("/classify?rho=auto&max_latency_ms=5", json={"text": TEXT}).status_code == 200
        # the refused were refused before tokenizing: only the 13 queued and this last one reached the queue
        counted = f'retention_predicted_wait_seconds_count{{model="{MODEL}",task="classification"}} 14.0'
        assert counted in client.get("/metrics").text


def test_a_flood_gets_only_200_or_429_and_the_accepted_meet_their_target(models_root: Path) -> None:
    """Far more concurrent requests than the model's queue should hold: every answer is a 200 or a 429 with
    a Retry-After, and every accepted rho=auto request was queued and run within its (generous) target."""
    target_s = 2.0
    settings = settings_for(models_root, max_batch_tokens=64, max_batch_wait_ms=0.0, max_queue_requests=64)
    bodies = [
        {"text": f"{TEXT} {index}", "rho": "auto", "max_latency_ms": target_s * 1000}
        if index % 4
        else {"text": f"{TEXT} {index}", "rho": 1}
        for index in range(240)
    ]
    with running(settings) as (_, client), ThreadPoolExecutor(24) as pool:
        responses = list(pool.map(lambda body: client.post("/classify", json=body), bodies))
    assert {r.status_code for r in responses} <= {200, 429}
    for response in responses:
        if response.status_code == 429:
            assert int(response.headers["retry-after"]) >= 1
            continue
        usage = response.json()["usage"]
        if usage["rho_requested"] == "auto":
            assert usage["rho_reason"].startswith("auto:")
            assert usage["queue_time_s"] + usage["inference_time_s"] <= target_s
        else:
            assert usage["rho_reason"] == "requested" and usage["rho_effective"] == 1.0


def test_latency_target_from_query_or_body_capped_by_the_server(models_root: Path) -> None:
    with running(settings_for(models_root, max_latency_target_s=2.0)) as (_, client):

        def target(path: str, body: dict[str, Any]) -> Any:
            response = client.post(path, json={"text": TEXT, **body})
            assert response.status_code == 200, response.text
            return response.json()["usage"]["latency_target_s"]

        assert target("/classify?rho=auto", {}) == 30.0  # the server default (settings_for)
        assert target("/classify?rho=auto&max_latency_ms=300", {}) == 0.3
        assert target("/classify?rho=auto&max_latency_ms=300", {"max_latency_ms": 200}) == 0.2  # body wins
        assert target("/classify?rho=auto", {"max_latency_ms": 60000}) == 2.0  # capped
        assert target("/classify?rho=0.5", {"max_latency_ms": 200}) is None  # fixed rho: the deadline rules
        for bad in ("0", "soon", "inf", "-5"):
            assert (
                client.post(f"/classify?rho=auto&max_latency_ms={bad}", json={"text": TEXT}).status_code
                == 422
            )
        body = {"text": TEXT, "rho": "auto", "max_latency_ms": -1}
        assert client.post("/classify", json=body).status_code == 422
        usage = client.post("/classify", json={"text": TEXT}).json()["usage"]
        assert usage["rho_reason"] == "default"


def test_max_concurrent_requests_caps_the_server_with_429(models_root: Path) -> None:
    settings = settings_for(models_root, max_concurrent_requests=2, retry_after_s=2, max_batch_wait_ms=0.0)
    with running(settings) as (app, client), ThreadPoolExecutor(2) as pool:
        batcher = server_of(app).batcher_of(MODEL)
        with blocked_inference(app, MODEL):
            held = [post_in_background(pool, client, "/classify?rho=1", {"text": TEXT})]
            wait_until(lambda: batcher.busy, what="the first request in a batch")
            held.append(post_in_background(pool, client, "/classify?rho=1", {"text": TEXT}))
            wait_until(lambda: len(batcher.queue) == 1, what="the second request queued")
            refused = client.post("/classify?rho=1", json={"text": TEXT})
            assert refused.status_code == 429 and refused.headers["retry-after"] == "2"
        assert [f.result().status_code for f in held] == [200, 200]
        assert client.post("/classify?rho=1", json={"text": TEXT}).status_code == 200
        assert 'retention_shed_requests_total{reason="concurrency"} 1.0' in client.get("/metrics").text


def test_padding_rows_to_shape_buckets_changes_no_output(tiny_models: dict[str, Path]) -> None:
    """Rows are padded up to a multiple of pad_multiple (few shapes for ORT's arena): same outputs."""
    texts = ["short", "a somewhat longer sentence about a film", "x y z"]
    results = {}
    for multiple in (1, 64):
        with running(settings_for(tiny_models["qa"].parent, pad_multiple=multiple)) as (_, client):
            results[multiple] = [
                client.post("/qa?rho=0.5", json={"question": "what?", "context": text}).json()
                for text in texts
            ]
    for plain, padded in zip(results[1], results[64], strict=True):
        assert plain["answer"] == padded["answer"] and plain["start"] == padded["start"]
        assert plain["score"] == pytest.approx(padded["score"], abs=1e-5)
        assert plain["usage"]["kept_tokens_per_layer"] == padded["usage"]["kept_tokens_per_layer"]


def test_controller_metrics_are_exported(client: TestClient) -> None:
    client.post("/classify?rho=auto", json={"text": TEXT})
    metrics = client.get("/metrics").text
    for line in (
        f'retention_served_rho_count{{model="{MODEL}",reason="auto:idle",task="classification"}}',
        f'retention_predicted_wait_seconds_count{{model="{MODEL}",task="classification"}}',
        f'retention_predicted_drain_seconds{{model="{MODEL}"}}',
        f'retention_cost_model_token_seconds{{model="{MODEL}",rho_bucket="0.1"}}',
        f'retention_cost_model_run_seconds{{model="{MODEL}"}}',
        'retention_shed_requests_total{reason="queue_full"} 0.0',
    ):
        assert line in metrics, line


def test_sessions_open_and_serve_without_the_cpu_arena(models_root: Path) -> None:
    """RETENTION_CPU_MEM_ARENA=false (the overload benchmark's --no-arena) reaches onnxruntime."""
    with running(settings_for(models_root, cpu_mem_arena=False)) as (app, client):
        session = server_of(app).get(MODEL).backend.session  # type: ignore[attr-defined]
        assert session.get_session_options().enable_cpu_mem_arena is False
        assert client.post("/classify?rho=auto", json={"text": TEXT}).status_code == 200


def test_one_rho_decision_per_request(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """The budget is decided once per request, and early shedding and the batcher read that one."""
    from service.api import inference
    from service.api.budget import Budget

    decided: list[Budget] = []
    decide = inference.decide

    def counted(*args: Any) -> Budget:
        decided.append(decide(*args))
        return decided[-1]

    monkeypatch.setattr(inference, "decide", counted)
    for path, body in (
        ("/classify?rho=auto&max_latency_ms=500", {"text": TEXT}),
        ("/embed", {"text": TEXT, "rho": 0.5}),
        ("/v1/embeddings", {"input": TEXT}),
    ):
        before = len(decided)
        response = client.post(path, json=body)
        assert response.status_code == 200, response.text
        assert len(decided) == before + 1
    assert decided[0].auto is not None and decided[0].target_s == pytest.approx(0.5)
    assert decided[1].rho == 0.5 and decided[1].auto is None


@pytest.mark.parametrize(("quantile", "factor"), [(0.5, 1.0), (0.9, 5.0)])
def test_tail_quantile_setting_decides_how_far_admission_scales_its_predictions(
    models_root: Path, quantile: float, factor: float
) -> None:
    with running(settings_for(models_root, auto_tail_quantile=quantile)) as (app, _):
        costs = server_of(app).batcher_of(MODEL).costs
        for overran in [False] * 13 + [True] * 7:  # 7 of 20 batches ran 5x their prediction
            costs.tail.observe(predicted_s=0.1, actual_s=0.5 if overran else 0.1)
        assert costs.tail.value == pytest.approx(factor)
        assert costs.tail_seconds(256, 128) == pytest.approx(factor * costs.mean_seconds(256, 128))
