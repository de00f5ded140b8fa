"""benchmarks._http.wait_ready, the one readiness poll: against a real HTTP server that answers 503
before 200, a real process that exits, and a server that never becomes ready."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from benchmarks._http import NotReady, free_port, wait_ready

NOT_READY_ANSWERS = 3  # /readyz answers 503 this many times before 200


@contextmanager
def warming_server(not_ready: int) -> Iterator[tuple[str, list[int]]]:
    """/readyz is 503 for the first ``not_ready`` requests, then 200; yields (URL, statuses sent)."""
    sent: list[int] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status = 503 if len(sent) < not_ready else 200
            sent.append(status)
            self.send_response(status)
            self.end_headers()
            self.wfile.write(b'{"status": "ok"}' if status == 200 else b'{"status": "loading"}')

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", sent
    finally:
        server.shutdown()
        thread.join(timeout=10)


def test_waits_through_503_and_returns_the_first_ready_answer() -> None:
    with warming_server(NOT_READY_ANSWERS) as (url, sent):
        response = wait_ready(url, timeout_s=30)
    assert response.status_code == 200 and response.json() == {"status": "ok"}
    assert sent == [503] * NOT_READY_ANSWERS + [200]


def test_a_server_that_never_gets_ready_times_out_with_its_last_answer() -> None:
    with warming_server(not_ready=10**6) as (url, _), pytest.raises(NotReady) as raised:
        wait_ready(url, timeout_s=1, name="the warming server", details=lambda: "log tail here")
    message = str(raised.value)
    assert "the warming server" in message and "not ready after 1 s" in message
    assert "503" in message and message.endswith("log tail here")


def test_an_exited_process_fails_at_once_not_after_the_timeout() -> None:
    process = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    process.wait(timeout=30)
    with pytest.raises(NotReady, match=r"exited \(3\)"):
        wait_ready(f"http://127.0.0.1:{free_port()}", timeout_s=600, process=process, name="the server")
