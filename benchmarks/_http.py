"""Waiting for a server started in another process or thread: a free loopback port, and one readiness
poll that every benchmark, study script and test uses (``wait_ready``)."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from collections.abc import Callable

import httpx

POLL_S = 0.2  # between probes: a server's start takes seconds, so a finer poll only adds requests
PROBE_TIMEOUT_S = 5.0  # one probe's own timeout (a loaded model answers /readyz at once)

Probe = Callable[[], httpx.Response]
Accept = Callable[[httpx.Response], bool]


class NotReady(RuntimeError):
    """The server exited, or did not pass the probe in time (the message says which, and why)."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def is_ok(response: httpx.Response) -> bool:
    return response.status_code == 200


def wait_ready(
    url: str,
    timeout_s: float,
    *,
    process: subprocess.Popen[bytes] | None = None,
    probe: Probe | None = None,
    accept: Accept = is_ok,
    name: str = "the server",
    details: Callable[[], str] = str,
) -> httpx.Response:
    """Poll until ``probe`` (default: ``GET <url>/readyz``) gives a response ``accept`` takes; return it.

    Raises ``NotReady`` at once when ``process`` has exited, and after ``timeout_s``; either message
    ends with ``details()`` (e.g. the tail of the server's log). Connection errors while the server
    starts are part of waiting, not failures.
    """
    probe = probe or (lambda: httpx.get(f"{url}/readyz", timeout=PROBE_TIMEOUT_S))
    end = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < end:
        if process is not None and process.poll() is not None:
            exited = f"{name} exited ({process.returncode}) before it was ready"
            raise NotReady(f"{exited}\n{details()}".rstrip())
        with contextlib.suppress(httpx.HTTPError):
            response = probe()
            if accept(response):
                return response
            last = f"{response.status_code} {response.text[:200]}"
        time.sleep(POLL_S)
    waited = f"{name} at {url} not ready after {timeout_s:.0f} s (last answer: {last})"
    raise NotReady(f"{waited}\n{details()}".rstrip())
