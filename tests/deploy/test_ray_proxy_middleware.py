"""The proxy middleware alone, over ASGI: what Ray 2.60's proxy app does when the replica serving a
request dies (returns without starting a response, or raises, or after the replica's start went out
but before its body did) becomes 503 + Retry-After with our error
body; any response the replica started passes through untouched. The same middleware inside a real
proxy, with a replica SIGKILLed under load: tests/deploy/test_ray.py."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from ray.serve._private import http_util
from ray.serve.config import HTTPOptions
from starlette.types import Receive, Scope, Send

from service.ray_serve import PROXY_CALLBACK, REPLICA_LOST_RETRY_AFTER_S, ReplicaLostAs503

JSON_200_START = {
    "type": "http.response.start",
    "status": 200,
    "headers": [(b"content-type", b"application/json")],
}


async def returns_without_response(scope: Scope, receive: Receive, send: Send) -> None:
    """Ray's proxy for a request whose replica died: the RayActorError becomes a 500 it never sends."""
    return


async def raises(scope: Scope, receive: Receive, send: Send) -> None:
    raise RuntimeError("proxy failure")


async def starts_then_returns(scope: Scope, receive: Receive, send: Send) -> None:
    """The replica died between its two message batches: the start reached the proxy, the body never."""
    await send(JSON_200_START)


async def starts_then_raises(scope: Scope, receive: Receive, send: Send) -> None:
    await send(JSON_200_START)
    raise RuntimeError("proxy failure")


async def answers_500(scope: Scope, receive: Receive, send: Send) -> None:
    """A replica that did answer, with a plain 500: passed through, not disguised as retryable."""
    await send({"type": "http.response.start", "status": 500, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"Internal Server Error"})


def post(app: object, path: str = "/classify", wrap: bool = True) -> httpx.Response:
    async def go() -> httpx.Response:
        asgi = ReplicaLostAs503(app) if wrap else app  # type: ignore[arg-type]
        transport = httpx.ASGITransport(app=asgi)  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as client:
            return await client.post(path, json={"text": "x"})

    return asyncio.run(go())


@pytest.mark.parametrize(
    "app",
    [returns_without_response, raises, starts_then_returns, starts_then_raises],
    ids=["no-response", "raised", "start-only", "start-then-raised"],
)
def test_a_request_whose_replica_died_gets_503_with_retry_after(app: object) -> None:
    response = post(app)
    assert response.status_code == 503
    assert response.headers["retry-after"] == str(REPLICA_LOST_RETRY_AFTER_S)
    assert response.json()["error"]["code"] == "replica_unavailable"
    assert "proxy failure" not in response.text  # never the exception's text
    assert post(app, "/v1/embeddings").json()["error"]["type"] == "server_error"  # OpenAI's shape there


def test_a_started_response_passes_through() -> None:
    response = post(answers_500)
    assert (response.status_code, response.text) == (500, "Internal Server Error")
    assert "retry-after" not in response.headers


def test_the_proxy_callback_wraps_ray_s_proxy_app(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a proxy started with ``RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH=PROXY_CALLBACK`` runs: Ray
    imports and calls the callback, validates its middlewares and wraps its proxy app in them (Ray reads
    the variable when it is imported, so the test sets Ray's copy of it)."""
    monkeypatch.setattr(http_util, "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH", PROXY_CALLBACK)
    options = http_util.configure_http_middlewares(HTTPOptions())
    proxy = http_util._apply_middlewares(returns_without_response, options.middlewares)
    response = post(proxy, wrap=False)  # only the middlewares Ray applied
    assert response.status_code == 503 and response.json()["error"]["code"] == "replica_unavailable"
    assert response.headers["retry-after"] == str(REPLICA_LOST_RETRY_AFTER_S)
