"""Retry storms over real HTTP (uvicorn on loopback): early refusal decided before the body is read, the
bounded hold of a 429, and zero 5xx while a client retries as fast as it can."""

from __future__ import annotations

import asyncio
import functools
import json
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from service.api.app import create_app
from service.api.refusal import RefusalHold
from service.scheduling.batcher import Batcher
from tests.service.conftest import blocked_inference, served, server_of, settings_for, wait_until

MODEL = "tiny-classification"
TEXT = "a storm of retries"
TIGHT = "/classify?rho=auto&max_latency_ms=0.001"  # a target no backlog leaves room for


@contextmanager
def live(models_root: Path, **overrides: Any) -> Iterator[tuple[FastAPI, str]]:
    """Our app behind uvicorn; one 16-token row per batch, so a few queued requests are a backlog."""
    settings = settings_for(models_root, max_batch_tokens=16, max_batch_wait_ms=0.0, **overrides)
    app = create_app(settings)
    with served(app=app) as url:
        yield app, url


@contextmanager
def backlog(app: FastAPI, url: str, queued: int = 3, key: str | None = None) -> Iterator[Batcher]:
    """The model's worker blocked with ``queued`` requests waiting behind it (all served afterwards)."""
    batcher = server_of(app).batcher_of(MODEL)
    with ThreadPoolExecutor(queued + 1) as pool, blocked_inference(app, MODEL):
        waiting: list[Future[httpx.Response]] = []
        for count in range(queued + 1):
            auth = {"Authorization": f"Bearer {key}"} if key else {}
            post = functools.partial(httpx.post, json={"text": TEXT}, headers=auth, timeout=30)
            waiting.append(pool.submit(post, f"{url}/classify?rho=1"))
            if count == 0:
                wait_until(lambda: batcher.busy, what="the first batch formed")
            else:
                wait_until(lambda n=count: len(batcher.queue) == n, what="backlog queued")
        yield batcher
    assert all(f.result().status_code == 200 for f in waiting)


def raw_headers_only(url: str, path: str, declared_body: int) -> bytes:
    """Send a request line and headers promising ``declared_body`` bytes, send none of them, and read
    whatever the server answers (it can only answer without the body)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=20) as sock:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {declared_body}\r\n\r\n"
        )
        sock.sendall(head.encode())
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
        return answer


def test_refused_before_the_body_is_read_with_the_late_paths_429(models_root: Path) -> None:
    with live(models_root) as (app, url), backlog(app, url):
        answer = raw_headers_only(url, TIGHT, declared_body=10_000)
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 429"), answer[:200]
        headers = dict(line.split(b": ", 1) for line in head.split(b"\r\n")[1:])
        assert int(headers[b"retry-after"]) >= 1
        assert float(headers[b"x-predicted-wait"]) > 0
        assert json.loads(body)["error"]["code"] == "overloaded"
        # a body that would be a 422 is never read: the refusal comes first
        invalid = httpx.post(f"{url}{TIGHT}", content=b"{not json", timeout=20)
        assert invalid.status_code == 429 and int(invalid.headers["retry-after"]) >= 1
        v1 = httpx.post(
            f"{url}/v1/embeddings?rho=auto&max_latency_ms=0.001&model={MODEL}", content=b"[", timeout=20
        )
        assert v1.status_code != 429  # a classification backlog says nothing about another task's model
        metrics = httpx.get(f"{url}/metrics").text
        assert 'retention_shed_requests_total{reason="over_target"} 2.0' in metrics
        assert 'retention_requests_total{endpoint="classify",status_class="4xx",task="classification"}' in (
            metrics
        )


def test_no_early_refusal_without_a_backlog_or_for_unreadable_requests(models_root: Path) -> None:
    with live(models_root, api_key="k") as (app, url):
        auth = {"Authorization": "Bearer k"}
        assert httpx.post(f"{url}{TIGHT}", json={"text": TEXT}, headers=auth).status_code == 200  # idle
        with backlog(app, url, key="k"):
            assert httpx.post(f"{url}{TIGHT}", json={"text": TEXT}).status_code == 401  # no key: no 429
            junk = httpx.post(
                f"{url}{TIGHT}", json={"text": TEXT}, headers={**auth, "x-request-timeout": "x"}
            )
            assert junk.status_code == 422  # the header it would read is junk: the normal path says so
            unknown = httpx.post(f"{url}{TIGHT}&model=nope", json={"text": TEXT}, headers=auth)
            assert unknown.status_code == 404
            assert httpx.post(f"{url}{TIGHT}", json={"text": TEXT}, headers=auth).status_code == 429


def test_refusals_are_held_the_setting_while_calm_and_longer_under_a_storm(models_root: Path) -> None:
    hold = 0.3
    with live(models_root, refusal_hold_s=hold) as (app, url), backlog(app, url):
        begin = time.monotonic()
        refused = httpx.post(f"{url}{TIGHT}", json={"text": TEXT}, timeout=20)
        assert refused.status_code == 429 and time.monotonic() - begin >= hold
    # the bound: the setting, never past the Retry-After (a pure rule, checked without a clock)
    holds = RefusalHold(settings_for(models_root, refusal_hold_s=5.0))
    assert holds.seconds([(b"retry-after", b"2")]) == 2.0
    assert holds.seconds([(b"retry-after", b"9")]) == 5.0
    assert holds.seconds([]) == 5.0
    # under a storm: long enough that the held clients return at most the budget a second, capped
    storm = RefusalHold(
        settings_for(
            models_root,
            refusal_hold_s=1.0,
            refusal_retry_budget_per_s=200.0,
            max_refusal_hold_s=8.0,
            refusals_per_answer=0.0,  # the fixed budget
        )
    )
    storm.held = 99  # + this one: 100 held / 200 a second = 0.5 s, under the calm hold
    assert storm.seconds([(b"retry-after", b"3")]) == 1.0
    storm.held = 999  # 1,000 held: 5 s, longer than the Retry-After
    assert storm.seconds([(b"retry-after", b"3")]) == 5.0
    storm.held = 3999  # 20 s wanted: the cap
    assert storm.seconds([(b"retry-after", b"3")]) == 8.0
    assert RefusalHold(settings_for(models_root, refusal_hold_s=0.0)).seconds([]) == 0.0  # no hold at all


def test_the_storm_budget_follows_the_rate_the_server_answers_at(models_root: Path) -> None:
    """``refusals_per_answer``: a server answering 30 requests a second lets the held clients return 60
    times a second, not the fixed 200 (a slow CPU's refusals would take the model's time); no answers:
    the floor; a fast server: the fixed budget caps it."""
    settings = settings_for(
        models_root,
        refusal_hold_s=1.0,
        refusal_retry_budget_per_s=200.0,
        refusals_per_answer=2.0,
        min_refusal_retry_budget_per_s=10.0,
    )
    holds = RefusalHold(settings)
    assert holds.budget_per_s(100.0) == 10.0  # nothing answered yet: the floor
    for i in range(600):  # 30 answers a second for 20 s (ten time constants)
        holds.answered(80.0 + i / 30)
    assert holds.budget_per_s(100.0) == pytest.approx(60.0, rel=0.05)
    holds.held = 299  # 300 held / 60 a second: 5 s
    assert holds.seconds([(b"retry-after", b"1")], now=100.0) == pytest.approx(5.0, rel=0.05)
    for i in range(4000):  # 200 answers a second: the fixed budget caps the following one
        holds.answered(100.0 + i / 200)
    assert holds.budget_per_s(120.0) == 200.0
    assert holds.budget_per_s(200.0) == 10.0  # the answers stopped long ago: the floor again


def test_held_refusals_beyond_the_cap_are_answered_at_once(models_root: Path) -> None:
    holds = RefusalHold(settings_for(models_root, refusal_hold_s=30.0, max_held_refusals=1))

    async def two() -> list[float]:
        async def one() -> float:
            begin = time.monotonic()
            await holds.hold([(b"retry-after", b"1")])
            return time.monotonic() - begin

        first = asyncio.ensure_future(one())
        await asyncio.sleep(0)  # the first is held now
        second = await one()
        return [await first, second]

    held, immediate = asyncio.run(two())
    assert held >= 1.0 > immediate and holds.held == 0


def test_a_fast_retrying_client_gets_no_5xx(models_root: Path) -> None:
    """Eight clients that retry at once after every 429, for a short storm: only 200s and 429s."""
    statuses: Counter[int] = Counter()
    lock = threading.Lock()
    with live(models_root, auto_latency_target_s=0.001) as (_, url):
        stop = time.monotonic() + 2.0

        def client() -> None:
            with httpx.Client(timeout=30) as session:
                while time.monotonic() < stop:
                    status = session.post(f"{url}/classify?rho=auto", json={"text": TEXT}).status_code
                    with lock:
                        statuses[status] += 1

        threads = [threading.Thread(target=client) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert httpx.get(f"{url}/readyz").status_code == 200
    assert set(statuses) <= {200, 429} and statuses[200] > 0, statuses


@pytest.mark.parametrize("path,field", [("/embed", "texts"), ("/v1/embeddings", "input")])
def test_embedding_requests_take_up_to_the_setting(models_root: Path, path: str, field: str) -> None:
    with live(models_root, max_embedding_inputs=100, max_items=4) as (_, url):
        many = httpx.post(f"{url}{path}", json={field: [f"text {i}" for i in range(100)]}, timeout=60)
        assert many.status_code == 200, many.text
        vectors = many.json()["embeddings"] if path == "/embed" else many.json()["data"]
        assert len(vectors) == 100
        over = httpx.post(f"{url}{path}", json={field: ["a"] * 101}, timeout=30)
        assert over.status_code == 413 and "at most 100" in over.text
        assert httpx.post(f"{url}/classify", json={"texts": ["a"] * 5}).status_code == 413  # max_items


def test_a_1000_input_openai_request_keeps_its_order_and_does_not_hold_a_small_one(models_root: Path) -> None:
    """1,000 inputs through the real openai client come back as 1,000 vectors in input order; a
    one-input request sent while the big one is being served is answered before it (interleaved: held
    at most the batch that was running when it arrived)."""
    import numpy as np
    import openai

    texts = [f"document number {i} " + "word " * (i % 7) for i in range(1000)]
    settings = settings_for(models_root, max_batch_tokens=256, max_batch_wait_ms=0.0)
    app = create_app(settings)
    with served(app=app) as url, ThreadPoolExecutor(2) as pool:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
        model = "tiny-embedding"
        batcher = server_of(app).batcher_of(model)
        done: dict[str, float] = {}

        def embed(name: str, inputs: list[str]) -> list[list[float]]:
            response = client.embeddings.create(model=model, input=inputs, encoding_format="float")
            done[name] = time.monotonic()
            return [item.embedding for item in response.data]

        with blocked_inference(app, model):
            big = pool.submit(embed, "big", texts)
            wait_until(lambda: batcher.busy and bool(batcher.queue), what="the big request's first slice")
            small = pool.submit(embed, "small", [texts[500]])
            wait_until(lambda: len(batcher.queue) == 2, what="the small request queued behind it")
        vectors, alone = big.result(), small.result()
        assert len(vectors) == 1000 and done["small"] < done["big"]
        # in input order: each vector is that input's own (as a request of it alone gives)
        for index in (0, 1, 499, 500, 998, 999):
            np.testing.assert_allclose(vectors[index], embed("check", [texts[index]])[0], atol=1e-5)
        np.testing.assert_allclose(alone[0], vectors[500], atol=1e-5)
