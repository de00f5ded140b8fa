"""Dynamic micro-batching: batched results equal single-request results; backpressure and deadlines."""

from __future__ import annotations

import asyncio
import itertools
import math
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from retention_core.codecs.base import Encoded, Row
from service.metrics import Metrics
from service.runtime import load_model
from service.scheduling.batcher import Batcher
from service.scheduling.delivery import Delivery
from service.scheduling.jobs import Job, RowResult, Slice
from service.scheduling.planner import plan_path_runs, plan_runs, shape_length
from service.serving import InferenceResult
from tests.service.conftest import blocked_inference, running, server_of, settings_for, wait_until

TEXTS = [
    "short",
    "a somewhat longer sentence about a movie that was fine",
    "great",
    "this one rambles on and on about nothing in particular, for quite a few more tokens than the rest",
    "meh, not my cup of tea",
    "x",
]
RHOS = [1.0, 0.3, 0.5, 0.1, 0.7, 1.0]


def test_plan_runs_sorts_by_length_and_respects_the_token_budget() -> None:
    lengths = [5, 50, 7, 30, 6, 64]
    runs = plan_runs(lengths, max_tokens=64)
    assert sorted(i for run in runs for i in run) == list(range(len(lengths)))
    for run in runs:
        assert len(run) == 1 or len(run) * max(lengths[i] for i in run) <= 64
    flat = [lengths[i] for run in runs for i in run]
    assert flat == sorted(flat)


def padded_cost(runs: list[list[int]], lengths: list[int], overhead: float) -> float:
    return sum(overhead + len(run) * max(lengths[i] for i in run) for run in runs)


def test_plan_runs_splits_short_rows_from_long_ones_when_padding_costs_more_than_a_run() -> None:
    lengths = [400, 30, 384, 32, 28, 392]
    runs = plan_runs(lengths, max_tokens=8192, run_overhead_tokens=100.0)
    assert [sorted(lengths[i] for i in run) for run in runs] == [[28, 30, 32], [384, 392, 400]]
    # a run that costs more than all the padding: one run
    assert len(plan_runs(lengths, max_tokens=8192, run_overhead_tokens=5000.0)) == 1


def test_plan_runs_is_optimal_among_cuts_of_the_sorted_rows() -> None:
    """Against brute force over every way to cut the sorted rows into consecutive runs."""
    generator = random.Random(7)
    for _ in range(200):
        lengths = [generator.choice([8, 16, 24, 64, 128, 256, 512]) for _ in range(generator.randint(1, 8))]
        budget = generator.choice([512, 1024, 4096])
        overhead = generator.choice([0.0, 16.0, 200.0, 2000.0])
        runs = plan_runs(lengths, budget, overhead)
        assert sorted(i for run in runs for i in run) == list(range(len(lengths)))
        assert all(len(run) == 1 or len(run) * max(lengths[i] for i in run) <= budget for run in runs)
        order = sorted(range(len(lengths)), key=lambda i: lengths[i])
        best = math.inf
        for mask in range(2 ** (len(order) - 1)):
            cuts = [0] + [k + 1 for k in range(len(order) - 1) if mask >> k & 1] + [len(order)]
            plan = [order[a:b] for a, b in itertools.pairwise(cuts)]
            if all(len(run) == 1 or len(run) * max(lengths[i] for i in run) <= budget for run in plan):
                best = min(best, padded_cost(plan, lengths, overhead))
        assert padded_cost(runs, lengths, overhead) == pytest.approx(best)


def test_a_two_path_models_runs_never_mix_dense_rows_with_pruned_ones() -> None:
    lengths = [30, 400, 32, 390, 31, 35]
    dense = [True, False, False, True, True, False]
    for buckets in (None, (1, 2, 4, 8)):
        runs = plan_path_runs(
            lengths, dense, max_tokens=8192, run_overhead_tokens=5000.0, batch_buckets=buckets
        )
        assert sorted(i for run in runs for i in run) == list(range(len(lengths)))
        assert [{dense[i] for i in run} for run in runs] == [{True}, {False}]  # one run per side, dense first
    assert len(plan_runs(lengths, max_tokens=8192, run_overhead_tokens=5000.0)) == 1  # one path: one run


def test_shape_length_rounds_up_to_the_multiple_but_not_past_max_length() -> None:
    assert [shape_length(n, 8, 64) for n in (1, 8, 9, 60, 64)] == [8, 8, 16, 64, 64]
    assert shape_length(61, 8, 62) == 62  # rounding would pass max_length: capped there
    assert shape_length(70, 8, 64) == 70  # a row longer than max_length keeps its own length


def test_delivery_answers_each_job_as_soon_as_the_runs_holding_its_rows_are_done() -> None:
    """Two jobs, three rows, two runs: the first run holds the short job's row and one of the long
    job's; the short job is answered then, the long one only with the second run."""

    def row_result(row: int) -> RowResult:
        return np.full(2, float(row)), np.array([row, row], dtype=np.int64), None

    async def scenario() -> tuple[InferenceResult, InferenceResult, bool]:
        loop = asyncio.get_running_loop()
        short = Job([Row((1, 2))], 0.5, loop.create_future(), 1e9, enqueued=1.0)
        long = Job([Row((1, 2, 3)), Row((1, 2, 3, 4))], 0.3, loop.create_future(), 1e9, enqueued=0.0)
        delivery = Delivery([Slice.whole(short), Slice.whole(long)], start=2.0)
        delivery.add([(0, row_result(0)), (2, row_result(2))], 3.0)  # first run: rows 0 and 2
        long_waited = short.future.done() and not long.future.done() and not delivery.answered
        delivery.add([(1, row_result(1))], 5.0)
        assert delivery.answered  # every job answered: the batch no longer holds the model busy
        return short.future.result(), long.future.result(), long_waited

    short, long, long_waited = asyncio.run(scenario())
    assert long_waited
    assert (short.queue_time, short.inference_time, short.rho) == (1.0, 1.0, 0.5)
    assert (long.queue_time, long.inference_time, long.rho) == (2.0, 3.0, 0.3)
    assert [output[0] for output in long.outputs] == [1.0, 2.0]  # its rows in their own order
    assert long.kept_counts.tolist() == [[1, 1], [2, 2]] and long.depths is None


def test_a_job_served_across_batches_is_answered_once_its_last_slice_is_done() -> None:
    def row_result(row: int) -> RowResult:
        return np.full(2, float(row)), np.array([row, row], dtype=np.int64), None

    async def scenario() -> tuple[InferenceResult, bool]:
        loop = asyncio.get_running_loop()
        big = Job([Row((1, 2))] * 3, 0.5, loop.create_future(), 1e9, enqueued=0.0)
        Delivery([Slice(big, 0, 2, 32)], start=1.0).add([(0, row_result(0)), (1, row_result(1))], 2.0)
        early = big.future.done()
        Delivery([Slice(big, 2, 3, 16)], start=4.0).add([(0, row_result(2))], 5.0)
        return big.future.result(), early

    result, early = asyncio.run(scenario())
    assert not early
    assert (result.queue_time, result.inference_time) == (1.0, 4.0)  # from its first batch to its last
    assert [output[0] for output in result.outputs] == [0.0, 1.0, 2.0]


@pytest.mark.parametrize("task", ["classification", "qa", "summarization", "embedding"])
def test_batched_equals_unbatched(tiny_models: dict[str, Path], task: str) -> None:
    """Different lengths and rhos in one batch give the same outputs and kept counts as one by one."""
    settings = settings_for(tiny_models[task].parent, max_batch_wait_ms=50.0, max_batch_tokens=4096)
    model = load_model(tiny_models[task], settings)
    codec = model.codec
    encoded: list[Encoded]
    if task in ("classification", "embedding"):
        encoded = [codec.encode(text) for text in TEXTS]
    elif task == "qa":
        encoded = [codec.encode("what is it?", text + " " + TEXTS[1]) for text in TEXTS]
    else:
        encoded = [codec.encode([text, "Another sentence here.", TEXTS[3]]) for text in TEXTS]

    async def scenario() -> tuple[list, list, Metrics]:
        metrics = Metrics()
        batcher = Batcher(model, settings, metrics)
        batcher.start()
        deadline = time.monotonic() + 60
        try:
            together = await asyncio.gather(
                *(batcher.submit(e.rows, rho, deadline) for e, rho in zip(encoded, RHOS, strict=True))
            )
            alone = [
                await batcher.submit(e.rows, rho, deadline) for e, rho in zip(encoded, RHOS, strict=True)
            ]
        finally:
            await batcher.close(5)
        return together, alone, metrics

    together, alone, metrics = asyncio.run(scenario())
    for batched, single in zip(together, alone, strict=True):
        np.testing.assert_array_equal(batched.kept_counts, single.kept_counts)
        for a, b in zip(batched.outputs, single.outputs, strict=True):
            assert a.shape == b.shape
            np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
    # it really was batched: one run held several requests
    sizes = metrics.registry.get_sample_value("retention_batch_size_sum", {"model": model.name})
    runs = metrics.registry.get_sample_value("retention_batch_size_count", {"model": model.name})
    assert sizes is not None and runs is not None and sizes > runs


def test_batched_equals_unbatched_over_http(models_root: Path) -> None:
    with running(settings_for(models_root, max_batch_wait_ms=30.0)) as (_, client):
        singles = [
            client.post("/classify", json={"text": t, "rho": r}).json()
            for t, r in zip(TEXTS, RHOS, strict=True)
        ]
        with ThreadPoolExecutor(len(TEXTS)) as pool:
            futures = [
                pool.submit(client.post, "/classify", json={"text": t, "rho": r})
                for t, r in zip(TEXTS, RHOS, strict=True)
            ]
            batched = [f.result().json() for f in futures]
        for a, b in zip(singles, batched, strict=True):
            assert a["usage"]["kept_tokens_per_layer"] == b["usage"]["kept_tokens_per_layer"]
            for label in a["scores"]:
                assert a["scores"][label] == pytest.approx(b["scores"][label], abs=1e-5)


def test_queue_full_is_429_with_retry_after(models_root: Path) -> None:
    settings = settings_for(models_root, max_queue_requests=1, max_batch_wait_ms=0.0, retry_after_s=3)
    with running(settings) as (app, client), ThreadPoolExecutor(2) as pool:
        batcher = server_of(app).batcher_of("tiny-classification")
        with blocked_inference(app, "tiny-classification"):
            first = pool.submit(client.post, "/classify", json={"text": "first"})
            wait_until(lambda: batcher.busy, what="first request taken into a batch")
            second = pool.submit(client.post, "/classify", json={"text": "second"})
            wait_until(lambda: len(batcher.queue) == 1, what="second request queued")
            third = client.post("/classify", json={"text": "third"})
            assert third.status_code == 429
            assert third.headers["retry-after"] == "3"
            assert third.json()["error"]["code"] == "overloaded"
            # other models have their own queues
            assert client.post("/qa", json={"question": "q?", "context": "some context"}).status_code == 200
        assert first.result().status_code == 200
        assert second.result().status_code == 200
        metrics = client.get("/metrics").text
        assert 'retention_rejections_total{reason="queue_full"} 1.0' in metrics


def test_deadline_is_504_once_running_and_a_late_shed_429_while_queued(models_root: Path) -> None:
    with running(settings_for(models_root)) as (app, client):
        with blocked_inference(app, "tiny-classification"):
            # taken into a batch at once (the model is idle), then its run waits behind the block: 504
            late = client.post("/classify", json={"text": TEXTS[0]}, headers={"x-request-timeout": "0.05"})
            assert late.status_code == 504
            assert late.json()["error"]["code"] == "deadline_exceeded"
        batcher = server_of(app).batcher_of("tiny-classification")
        wait_until(lambda: batcher.idle and not batcher.busy, what="the late request's batch closed")
        pool = ThreadPoolExecutor(1)
        with blocked_inference(app, "tiny-classification"):
            running_job = pool.submit(client.post, "/classify", json={"text": TEXTS[1]})
            wait_until(lambda: batcher.busy and not batcher.queue, what="that request's batch running")
            # queued behind that batch, its deadline passes before any of it runs: shed late, 429
            queued = client.post("/classify", json={"text": TEXTS[2]}, headers={"x-request-timeout": "0.2"})
        assert queued.status_code == 429 and int(queued.headers["retry-after"]) >= 1
        assert queued.json()["error"]["code"] == "overloaded"
        assert running_job.result().status_code == 200
        pool.shutdown()
        assert client.post("/classify", json={"text": TEXTS[0]}).status_code == 200
        assert (
            client.post("/classify", json={"text": "x"}, headers={"x-request-timeout": "nope"}).status_code
            == 422
        )
        assert 'retention_rejections_total{reason="deadline"} 1.0' in client.get("/metrics").text


@pytest.mark.parametrize("late_after_targets", [0.0, 2.0])
def test_a_queued_auto_request_past_its_late_time_is_refused_not_answered_late(
    models_root: Path, late_after_targets: float
) -> None:
    """Admitted (admission off, so the prediction cannot refuse it), then queued behind a blocked run
    for several latency targets: with auto_late_after_targets it gets 429 late_queued when the next
    batch is formed; without it, its late answer."""
    settings = settings_for(models_root, admission_control=False, auto_late_after_targets=late_after_targets)
    with running(settings) as (app, client), ThreadPoolExecutor(2) as pool:
        batcher = server_of(app).batcher_of("tiny-classification")
        with blocked_inference(app, "tiny-classification"):
            first = pool.submit(client.post, "/classify", json={"text": TEXTS[1]})
            wait_until(lambda: batcher.busy and not batcher.queue, what="the first batch running")
            auto = pool.submit(client.post, "/classify?rho=auto&max_latency_ms=50", json={"text": TEXTS[2]})
            wait_until(lambda: len(batcher.queue) == 1, what="the rho=auto request queued")
            time.sleep(0.2)  # four targets
        assert first.result().status_code == 200
        answer = auto.result()
        if late_after_targets == 0:
            assert answer.status_code == 200
            return
        assert answer.status_code == 429 and int(answer.headers["retry-after"]) >= 1
        assert answer.json()["error"]["code"] == "overloaded"
        assert 'retention_shed_requests_total{reason="late_queued"} 1.0' in client.get("/metrics").text
        assert client.post("/classify?rho=auto", json={"text": TEXTS[2]}).status_code == 200


def test_shutdown_drains_in_flight_requests(models_root: Path) -> None:
    """Requests queued when the model server closes (lifespan shutdown) still get their answer."""
    from service.server import ModelServer

    async def scenario() -> list:
        server = ModelServer(settings_for(models_root), Metrics())
        await server.load_all()
        model = server.get("tiny-classification")
        batcher = server.batcher_of(model.name)
        release = threading.Event()
        blocker = batcher.executor.submit(release.wait, 30)
        deadline = time.monotonic() + 60
        rows = [model.codec.encode(text).rows for text in TEXTS[:3]]
        jobs = [asyncio.create_task(server.infer(model, rows[0], 0.5, deadline))]
        while not batcher.busy:  # the first batch waits on the blocked onnxruntime thread
            await asyncio.sleep(0.005)
        jobs += [asyncio.create_task(server.infer(model, r, 0.5, deadline)) for r in rows[1:]]
        while len(batcher.queue) < 2:
            await asyncio.sleep(0.005)
        closing = asyncio.create_task(server.close())
        await asyncio.sleep(0.05)
        assert not server.ready and not closing.done()
        release.set()
        results = await asyncio.gather(*jobs)
        await closing
        blocker.result()
        return results

    results = asyncio.run(scenario())
    assert [r.kept_counts.shape for r in results] == [(1, 2)] * 3


def test_a_request_is_answered_when_its_run_ends_not_the_batch(tiny_models: dict[str, Path]) -> None:
    """A batch cut into runs (a short row, then a long one) answers the short request when the first
    run ends (its inference time); the long one when the second does. Answered together at the end of
    the batch, both would report the same inference time."""
    settings = settings_for(tiny_models["classification"].parent, max_batch_wait_ms=50.0)
    model = load_model(tiny_models["classification"], settings)
    short, long = model.codec.encode("x").rows, model.codec.encode(" ".join(["word"] * 500)).rows

    async def scenario() -> tuple[InferenceResult, InferenceResult, Metrics]:
        metrics = Metrics()
        batcher = Batcher(model, settings, metrics)
        batcher.start()
        deadline = time.monotonic() + 60
        try:
            first, second = await asyncio.gather(
                batcher.submit(short, 1.0, deadline), batcher.submit(long, 1.0, deadline)
            )
            return first, second, metrics
        finally:
            await batcher.close(5)

    short_result, long_result, metrics = asyncio.run(scenario())
    runs = metrics.registry.get_sample_value("retention_batch_size_count", {"model": model.name})
    assert runs == 2  # the setting up: one batch, two runs (the long row's padding outweighs a run)
    assert short_result.inference_time < long_result.inference_time


def test_a_batch_of_auto_requests_stops_at_a_share_of_their_latency_target(
    tiny_models: dict[str, Path],
) -> None:
    """Fifty queued requests: rho=auto ones are taken only up to BATCH_TARGET_SHARE of their target (at
    their min_rho, by the cost model), fixed-rho ones up to the token budget."""
    from service.scheduling.batcher import BATCH_TARGET_SHARE
    from service.scheduling.jobs import Job
    from service.serving import AutoBudget

    settings = settings_for(tiny_models["classification"].parent, max_batch_tokens=8192)
    model = load_model(tiny_models["classification"], settings)
    rows = model.codec.encode(" ".join(["word"] * 40)).rows
    target = 0.002  # seconds: a tiny model's runs take well under a millisecond

    async def taken(auto: bool) -> tuple[list[Slice], Batcher]:
        batcher = Batcher(model, settings, Metrics())  # not started: the queue is filled by hand
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        for _ in range(50):
            budget = AutoBudget(0.1, 1.0, now + target) if auto else None
            job = Job(rows, 0.1, loop.create_future(), now + 30, budget, enqueued=now)
            job.tokens, job.length = batcher.shaped(rows), len(rows[0])
            batcher.queue.append(job)
            batcher._count(job, +1)
        return batcher._take(), batcher

    auto_jobs, batcher = asyncio.run(taken(auto=True))
    fixed_jobs, _ = asyncio.run(taken(auto=False))
    assert len(fixed_jobs) == 50  # 50 x 48 padded tokens: within the token budget
    assert 1 <= len(auto_jobs) < 50

    def seconds(pieces: list[Slice]) -> float:
        tokens = sum(piece.tokens for piece in pieces)
        return batcher.costs.tail_seconds(
            tokens, sum(piece.tokens * batcher.costs.fraction(0.1, piece.job.length) for piece in pieces)
        )

    assert len(auto_jobs) == 1 or seconds(auto_jobs) <= BATCH_TARGET_SHARE * target
    assert seconds(auto_jobs + auto_jobs[:1]) > BATCH_TARGET_SHARE * target  # one more would pass it


def test_a_failing_batch_fails_its_requests_and_the_worker_survives(tiny_models: dict[str, Path]) -> None:
    from retention_core.codecs.base import Row
    from service.errors import InferenceFailed

    settings = settings_for(tiny_models["classification"].parent)
    model = load_model(tiny_models["classification"], settings)

    async def scenario() -> InferenceResult:
        batcher = Batcher(model, settings, Metrics())
        batcher.start()
        deadline = time.monotonic() + 60
        try:
            with pytest.raises(InferenceFailed):  # token id far outside the vocabulary: onnxruntime raises
                await batcher.submit([Row((101, 10**9, 102))], 0.5, deadline)
            return await batcher.submit(model.codec.encode("still serving").rows, 0.5, deadline)
        finally:
            await batcher.close(5)

    assert asyncio.run(scenario()).kept_counts.shape == (1, 2)
