"""Servers in another process or thread: a free loopback port, one readiness poll that every benchmark,
study script and test uses (``wait_ready``), and a server subprocess started and stopped (``serving``)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import psutil

POLL_S = 0.2  # between probes: a server's start takes seconds, so a finer poll only adds requests
PROBE_TIMEOUT_S = 5.0  # one probe's own timeout (a loaded model answers /readyz at once)
LOG_TAIL_CHARS = 3000

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


@contextlib.contextmanager
def serving(
    command: list[str],
    timeout_s: float,
    *,
    name: str = "the server",
    log_dir: Path | None = None,
    env: dict[str, str] | None = None,
    probe: Callable[[str], httpx.Response] | None = None,
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``command --port <free port>`` in its own process group, its output in ``log_dir/<name>-<port>.log``
    (inherited without ``log_dir``); yields (base URL, process) once ``wait_ready`` passes (``probe(url)``,
    default ``GET /readyz``; a failure shows the log's tail); stopped on the way out (``stop``)."""
    port = free_port()
    url, log = f"http://127.0.0.1:{port}", None if log_dir is None else log_dir / f"{name}-{port}.log"
    with log.open("wb") if log is not None else contextlib.nullcontext() as sink:
        process = subprocess.Popen(
            [*command, "--port", str(port)],
            stdout=sink,
            stderr=None if sink is None else subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )

    def tail() -> str:
        return log.read_text(errors="replace")[-LOG_TAIL_CHARS:] if log is not None and log.is_file() else ""

    try:
        check = None if probe is None else (lambda: probe(url))
        wait_ready(url, timeout_s, process=process, probe=check, name=name, details=tail)
        yield url, process
    finally:
        stop(process)


def stop(process: subprocess.Popen[bytes], grace_s: float = 30.0) -> None:
    """SIGTERM to the process group ``serving`` made (its id is the server's pid), SIGKILL after
    ``grace_s``: a server's worker processes stop with it."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def tree_rss(pid: int) -> int:
    """Resident bytes of the process and its children (0 once it has gone)."""
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            total += process.memory_info().rss
    return total
