"""CPU seconds one request costs the server, per thread: the event loop against the inference thread.

    python -m experiments.request_cpu --models-dir <dir with minilm-embed> --server-cpus 0 --client-cpus 1 \
        --out results/experiments/request-cpu/request-cpu.json

A real ``python -m service`` (pinned, one intra-op thread) and a sequential client, so nothing queues
and each thread's CPU time (``/proc``, user + system) divides by the requests sent. ``/proc`` counts
CPU in clock ticks (10 ms where ``CLK_TCK`` is 100; the report records it) charged to the thread running
at each tick, so a cell is a sample: its requests times its cost must span many ticks. Three kinds, each
over a kept-alive connection and over a new connection per request (a storm's arrivals are new clients):

- ``served``: one ``/embed`` input at ``--rho`` (the texts of the overload benchmark, 2 to 200 words);
- ``invalid``: the same request with rho = 7: parsed, validated and answered 422 without the model;
- ``early_refusal``: ``rho=auto`` with a 0.001 ms target while a large request keeps the model busy,
  so admission answers 429 from the request line and headers before the body is read (held refusals
  off: ``RETENTION_MAX_HELD_REFUSALS=0``). The event loop's CPU while the large request runs alone for
  as long is subtracted.

What a retry storm costs: the early-refusal row times the attempts a second it must answer.
"""

from __future__ import annotations

import argparse
import functools
import http.client
import json
import os
import shutil
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import psutil

from benchmarks.harness import publish
from benchmarks.load import make_texts
from benchmarks.overload import Policy, cpu_env, server

KINDS = ("served", "invalid", "early_refusal")
CONNECTIONS = ("keep_alive", "new_connection")
EVENT_LOOP = "event_loop"
OTHER_THREADS = "other_threads"
TIGHT_TARGET = "max_latency_ms=0.001"
CPU_CLOCK_TICK_MS = 1000 / os.sysconf("SC_CLK_TCK")  # the resolution of /proc's per-thread CPU times
# The occupier's words per text (its row count: --occupier-texts): enough rows at rho 1 to keep the
# model busy through the early-refusal window.
OCCUPIER_WORDS = 120
REFUSAL_WAIT_S = 30.0  # the longest to wait for the occupier's first batch to make requests late
SERVER_ENV = {"RETENTION_MAX_HELD_REFUSALS": "0"}  # a refusal answered at once: sequential requests


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) of the server's event-loop thread (the main thread) and of all its
    other threads together (the inference thread; the loop's executor; the loop-lag probe's timer)."""
    totals = {EVENT_LOOP: 0.0, OTHER_THREADS: 0.0}
    for thread in psutil.Process(pid).threads():
        totals[EVENT_LOOP if thread.id == pid else OTHER_THREADS] += thread.user_time + thread.system_time
    return totals


def measure(pid: int, send: Callable[[], int], count: int, expect: int) -> dict[str, Any]:
    """``count`` sequential calls of ``send``; CPU ms per request by thread and wall ms per request."""
    before, start = thread_cpu(pid), time.perf_counter()
    statuses = [send() for _ in range(count)]
    wall, after = time.perf_counter() - start, thread_cpu(pid)
    unexpected = sum(status != expect for status in statuses)
    return {
        "requests": count,
        "unexpected_status": unexpected,
        "wall_s": wall,
        "wall_ms_per_request": 1000 * wall / count,
        "cpu_ms_per_request": {k: 1000 * (after[k] - before[k]) / count for k in after},
    }


Post = Callable[[str, dict[str, Any]], int]


def sender(host: str, port: int, keep_alive: bool) -> Post:
    """POST JSON with the standard library's client (cheap to create, so a new connection per request
    costs the client little): over one kept-alive connection, or a new TCP connection each time."""
    kept = http.client.HTTPConnection(host, port, timeout=600)

    def send(path: str, body: dict[str, Any]) -> int:
        connection = kept if keep_alive else http.client.HTTPConnection(host, port, timeout=600)
        connection.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        response.read()
        if not keep_alive:
            connection.close()
        return response.status

    return send


def early_refusals(url: str, pid: int, post: Post, args: argparse.Namespace) -> dict[str, Any]:
    """Early refusals while the occupier runs, less the loop's CPU of the occupier alone as long."""
    texts = make_texts(args.occupier_texts, OCCUPIER_WORDS, OCCUPIER_WORDS, seed=1)
    occupier = threading.Thread(
        target=lambda: httpx.post(f"{url}/embed?rho=1", json={"texts": texts}, timeout=600), daemon=True
    )
    occupier.start()
    refuse = functools.partial(post, f"/embed?rho=auto&{TIGHT_TARGET}", {"texts": ["hello"]})
    deadline = time.monotonic() + REFUSAL_WAIT_S
    while refuse() != HTTPStatus.TOO_MANY_REQUESTS and time.monotonic() < deadline:
        time.sleep(0.05)  # the occupier still tokenizing: the model is idle
    refused = measure(pid, refuse, args.requests, HTTPStatus.TOO_MANY_REQUESTS)
    alone_before = thread_cpu(pid)
    time.sleep(refused["wall_s"])
    alone_after = thread_cpu(pid)
    refused["occupier_outlasted_the_window"] = occupier.is_alive()
    occupier.join()
    background = 1000 * (alone_after[EVENT_LOOP] - alone_before[EVENT_LOOP]) / args.requests
    refused["cpu_ms_per_request"][EVENT_LOOP] -= background
    refused["cpu_ms_per_request"][OTHER_THREADS] = None  # the occupier's runs, not the refusals'
    refused["event_loop_background_ms_per_request"] = background
    return refused


def cells(
    url: str, pid: int, post: Post, texts: list[str], args: argparse.Namespace, connection: str
) -> list[dict[str, Any]]:
    """The three kinds over one connection mode."""
    for text in texts[:8]:  # warm-up: arena, caches, the cost model
        post(f"/embed?rho={args.rho}", {"texts": [text]})
    served = iter(texts * (args.requests // len(texts) + 1))
    kinds: dict[str, Callable[[], dict[str, Any]]] = {
        "served": lambda: measure(
            pid, lambda: post(f"/embed?rho={args.rho}", {"texts": [next(served)]}), args.requests, 200
        ),
        "invalid": lambda: measure(
            pid, lambda: post("/embed?rho=7", {"texts": [texts[0]]}), args.requests, 422
        ),
        "early_refusal": lambda: early_refusals(url, pid, post, args),
    }
    measured = {kind: kinds[kind]() for kind in args.kinds}
    rows = []
    for kind, cell in measured.items():
        rows.append({"kind": kind, "connection": connection, **cell})
        print(fmt_cell(rows[-1]))
    return rows


def run(args: argparse.Namespace) -> dict[str, Any]:
    texts = make_texts(64, args.min_words, args.max_words, seed=args.seed)
    results: list[dict[str, Any]] = []
    policy = Policy("request-cpu", str(args.rho), SERVER_ENV)
    log = args.out.with_suffix(".server-logs")  # the server's log, kept only when it failed
    log.mkdir(parents=True, exist_ok=True)
    with server(args.models_dir, policy, {}, log, args.server_cpus) as (url, pid):
        host, port = urlsplit(url).hostname or "127.0.0.1", urlsplit(url).port or 80
        for connection in CONNECTIONS:
            results.extend(
                cells(url, pid, sender(host, port, connection == "keep_alive"), texts, args, connection)
            )
    shutil.rmtree(log)
    return {
        "benchmark": "request_cpu",
        "rho": args.rho,
        "server_cpus": args.server_cpus,
        "cpu_clock_tick_ms": CPU_CLOCK_TICK_MS,
        "server_env": {**cpu_env(args.server_cpus), **SERVER_ENV},
        "results": results,
    }


def fmt_cell(cell: dict[str, Any]) -> str:
    cpu = cell["cpu_ms_per_request"]
    other = "-" if cpu[OTHER_THREADS] is None else f"{cpu[OTHER_THREADS]:.2f}"
    return (
        f"{cell['kind']:14s} {cell['connection']:14s} event loop {cpu[EVENT_LOOP]:6.2f} ms  other threads "
        f"{other:>6s} ms  wall {cell['wall_ms_per_request']:6.2f} ms  "
        f"unexpected {cell['unexpected_status']}"
    )


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"# CPU per request (ρ = {report['rho']}, server on CPUs {report['server_cpus']})",
        "",
        "| request | connection | event loop CPU ms | other threads CPU ms | wall ms | unexpected status |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for cell in report["results"]:
        cpu = cell["cpu_ms_per_request"]
        other = "–" if cpu[OTHER_THREADS] is None else f"{cpu[OTHER_THREADS]:.2f}"
        lines.append(
            f"| {cell['kind']} | {cell['connection']} | {cpu[EVENT_LOOP]:.2f} | {other} | "
            f"{cell['wall_ms_per_request']:.2f} | {cell['unexpected_status']} |"
        )
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.request_cpu", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--models-dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--requests", type=int, default=300, help="per kind and connection")
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    parser.add_argument("--rho", type=float, default=0.1)
    parser.add_argument(
        "--occupier-texts", type=int, default=512, help="rows of the request keeping the model busy"
    )
    parser.add_argument("--min-words", type=int, default=2)
    parser.add_argument("--max-words", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--server-cpus", type=int, nargs="+")
    parser.add_argument("--client-cpus", type=int, nargs="+", help="pin this process (the client)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.client_cpus:
        os.sched_setaffinity(0, args.client_cpus)
    report = run(args)
    publish(report, markdown, args.out, "experiments.request_cpu", argv, machine=True, show=False)
    print(f"wrote {args.out}, {args.out.with_suffix('.md')}")
    return report


if __name__ == "__main__":
    main()
