"""A scripted HTTP server on loopback for the batch client's own tests (retry, order, resume).

It is not the retention service: it answers ``POST /classify|/qa|/summarize`` with a response shaped
like the service's (``usage`` included), lists those routes and their input fields in ``GET /models``
as the service does (what the client reads its default fields from), and behaves according to the
request text:

* ``throttle:...`` -> 429 with ``Retry-After: 0.05`` the first ``THROTTLE_TIMES`` times, then 200
* ``invalid:...``  -> 422 (not retried)
* ``flaky:...``    -> 503 once, then 200
* ``block:...``    -> waits until ``release`` is set (used to interrupt the client mid-run)
* ``sleep:<s>:...`` -> sleeps s seconds, then 200

The integration test (test_stack.py) runs the real service instead.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

THROTTLE_TIMES = 2
# route -> the body fields of one input, as the service's GET /models lists them
ROUTES = {"/classify": ["text"], "/qa": ["question", "context"], "/summarize": ["text"]}


def models_listing() -> dict[str, Any]:
    """A ``GET /models`` answer with one model per route (the fields the batch client reads)."""
    models = [
        {"name": f"stub{route.replace('/', '-')}", "route": route, "fields": fields, "list_fields": []}
        for route, fields in ROUTES.items()
    ]
    return {"models": models, "aliases": {}, "errors": {}}


class StubState:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.attempts: Counter[str] = Counter()  # text -> requests received
        self.answered: Counter[str] = Counter()  # text -> 200 answers sent
        self.headers: list[dict[str, str]] = []
        self.queries: list[dict[str, list[str]]] = []
        self.bodies: list[dict[str, Any]] = []
        self.release = threading.Event()
        self.max_in_flight = 0
        self.in_flight = 0


def make_handler(state: StubState) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            return

        def _send(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if urlsplit(self.path).path == "/models":
                self._send(200, models_listing())
            else:
                self._send(404, {"detail": "not found"})

        def do_POST(self) -> None:
            url = urlsplit(self.path)
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
            text = str(body.get("text", body.get("question", "")))
            with state.lock:
                state.attempts[text] += 1
                attempt = state.attempts[text]
                state.headers.append(dict(self.headers.items()))
                state.queries.append(parse_qs(url.query))
                state.bodies.append(body)
                state.in_flight += 1
                state.max_in_flight = max(state.max_in_flight, state.in_flight)
            try:
                if url.path not in ROUTES:
                    self._send(404, {"detail": "not found"})
                    return
                if text.startswith("throttle:") and attempt <= THROTTLE_TIMES:
                    self._send(429, {"detail": "queue full"}, {"Retry-After": "0.05"})
                    return
                if text.startswith("invalid:"):
                    self._send(422, {"detail": "invalid input"})
                    return
                if text.startswith("flaky:") and attempt == 1:
                    self._send(503, {"detail": "not ready"})
                    return
                if text.startswith("block:"):
                    state.release.wait(timeout=60)
                if text.startswith("sleep:"):
                    time.sleep(float(text.split(":")[1]))
                rho = float(parse_qs(url.query).get("rho", ["1.0"])[0])
                tokens = len(text.split()) + 2
                with state.lock:
                    state.answered[text] += 1
                self._send(
                    200,
                    {
                        "label": "positive",
                        "echo": text,
                        "usage": {
                            "input_tokens": tokens,
                            "kept_tokens_per_layer": [tokens, max(1, round(rho * tokens))],
                            "token_work_fraction": (1 + rho) / 2,
                            "rho_requested": rho,
                            "rho_effective": rho,
                            "truncated": False,
                            "degraded": False,
                        },
                    },
                )
            finally:
                with state.lock:
                    state.in_flight -= 1

    return Handler


class StubServer:
    def __init__(self) -> None:
        self.state = StubState()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(self.state))
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> StubServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.state.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()
