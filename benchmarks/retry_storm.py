"""Retry storm on the server ``make serve`` runs: ``--clients`` closed-loop clients, each sending its next
text as soon as it is answered and, refused (429), the same text again ``--retry-delay`` s later whatever
the ``Retry-After`` (hand-written retry loops, impatient SDKs). One server with every model of
``--models-dir`` loaded (the product embeds on a server that also holds the other defaults); each mode
(``rho=auto`` and fixed budgets) drives the embedding model in turn, ``--rounds`` times interleaved.

Per mode: answered /s (200s whose answer came inside the window), the accepted attempts' p50 / p99
latency (from their send), refusals /s, 5xx and connection errors, the mean served ρ. The issue's bar
(issue 64): ``auto`` answers at least fixed ρ 0.3's /s with a lower p99 than every fixed mode, zero 5xx.

    python -m benchmarks.retry_storm --models-dir models --out results/experiments/rho-auto-storm/storm.json
    python -m benchmarks.retry_storm --models-dir <tiny models> --out /tmp/storm.json --quick   # seconds

``--busy-cpus`` runs a busy loop beside a pinned server (about half a core left to it: a slower CPU);
``--server-env KEY=VALUE`` sets the server's settings (e.g. the fixed retry budget of before:
``RETENTION_REFUSALS_PER_ANSWER=0``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.harness import cli, fmt, publish
from benchmarks.load import make_texts
from benchmarks.overload import Load, Policy, drive, outcomes, pinning_and_text_args, server
from service.api.faces import FACES

TASK = "embedding"
MODES = ("auto", "0.3", "1")
CLIENTS = 300
RETRY_DELAY_S = 0.05  # the storm: 50 ms after a 429
SECONDS = 20.0


@dataclass
class Mode:
    """One mode's run: ``rho`` the query value every request sends."""

    rho: str
    round: int
    seconds: float
    sent: int = 0
    ok: int = 0
    refused: int = 0
    server_errors: int = 0
    connection_errors: int = 0
    ok_per_s: float = 0.0
    refused_per_s: float = 0.0
    p50_ms: float | None = None
    p99_ms: float | None = None
    mean_rho: float | None = None
    refusal_reasons: dict[str, int] = field(default_factory=dict)
    load_average: list[float] = field(default_factory=list)  # 1/5/15 min, at the mode's end


def summarize(mode: Mode, records: list[dict[str, Any]]) -> Mode:
    seen = outcomes(records, mode.seconds)
    mode.sent, mode.ok, mode.refused, mode.server_errors = (
        seen.sent,
        seen.ok,
        seen.refused,
        seen.server_errors,
    )
    mode.connection_errors = sum(r["status"] == 0 for r in records)
    mode.ok_per_s = seen.in_window / mode.seconds
    mode.refused_per_s = mode.refused / mode.seconds
    mode.p50_ms, mode.p99_ms, mode.mean_rho = seen.p50_ms, seen.p99_ms, seen.mean_rho
    mode.load_average = [round(value, 2) for value in os.getloadavg()]
    return mode


def run(args: argparse.Namespace) -> dict[str, Any]:
    texts = make_texts(args.texts, args.min_words, args.max_words, args.seed)
    face = FACES[TASK]
    extra = {"RETENTION_DEFAULT_MODELS": json.dumps({TASK: args.model})} if args.model else {}
    modes: list[Mode] = []
    with tempfile.TemporaryDirectory(prefix="storm-") as tmp:
        workdir = Path(tmp)
        bodies = workdir / "bodies.json"
        bodies.write_text(json.dumps([face.example_body(text) for text in texts]))
        env = {**extra, **dict(setting.split("=", 1) for setting in args.server_env)}
        storm = Policy("storm", "auto")  # the query's rho is each mode's; the policy names the server
        with busy(args.busy_cpus), server(args.models_dir, storm, env, workdir, args.server_cpus) as (url, _):
            models = loaded_models(url)
            for round_index in range(args.rounds):
                for rho in args.modes:
                    mode = Mode(rho, round_index, args.seconds)
                    load = Load(
                        "closed", args.seconds, concurrency=args.clients, retry_delay_s=args.retry_delay
                    )
                    records = drive(
                        url, f"{face.path}?rho={rho}", load, bodies, args.grace, workdir, args.client_cpus
                    )
                    modes.append(summarize(mode, records))
                    print(line(mode), flush=True)
                    time.sleep(args.pause)  # the queue drains before the next mode
    return {
        "task": TASK,
        "model": args.model,
        "models_loaded": models,
        "clients": args.clients,
        "retry_delay_s": args.retry_delay,
        "seconds_per_mode": args.seconds,
        "rounds": args.rounds,
        "server_cpus": args.server_cpus,
        "client_cpus": args.client_cpus,
        "busy_cpus": args.busy_cpus,
        "server_env": args.server_env,
        "texts": {"count": args.texts, "min_words": args.min_words, "max_words": args.max_words},
        "results": [asdict(mode) for mode in modes],
    }


@contextmanager
def busy(cpus: list[int] | None) -> Iterator[None]:
    """A busy loop pinned to each of ``cpus`` while the storm runs: the server pinned there gets about
    half of its core, for the event loop and the model alike (a CPU about half as fast)."""
    loops = [
        subprocess.Popen(["taskset", "-c", str(cpu), sys.executable, "-c", "while True: pass"])
        for cpu in cpus or ()
    ]
    try:
        yield
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


def loaded_models(url: str) -> list[str]:
    import httpx

    return [model["name"] for model in httpx.get(f"{url}/models", timeout=30).json()["models"]]


def line(mode: Mode) -> str:
    return (
        f"round {mode.round} rho={mode.rho}: {mode.ok_per_s:.1f} ok/s, p99 {fmt(mode.p99_ms, 0)} ms, "
        f"{mode.refused_per_s:.0f} refused/s, 5xx {mode.server_errors}, errors {mode.connection_errors}"
    )


def markdown(report: dict[str, Any]) -> str:
    delay_ms = 1000 * report["retry_delay_s"]
    models = ", ".join(report["models_loaded"])
    rows = [
        f"# Retry storm: {report['clients']} clients retrying {delay_ms:.0f} ms after a 429, "
        f"{report['seconds_per_mode']:.0f} s per mode, models loaded: {models}",
        "",
        "| round | rho | ok/s | p50 ms | p99 ms | refused/s | 5xx | conn. errors | mean ρ | load avg |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for mode in report["results"]:
        rows.append(
            f"| {mode['round']} | {mode['rho']} | {mode['ok_per_s']:.1f} | {fmt(mode['p50_ms'], 0)} | "
            f"{fmt(mode['p99_ms'], 0)} | {mode['refused_per_s']:.0f} | {mode['server_errors']} | "
            f"{mode['connection_errors']} | {fmt(mode['mean_rho'], 2)} | "
            f"{' / '.join(f'{v:.1f}' for v in mode['load_average'])} |"
        )
    return "\n".join(rows) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = cli("benchmarks.retry_storm", __doc__)
    parser.add_argument("--models-dir", type=Path, required=True)
    parser.add_argument("--model", help="the embedding model to drive (default: the task's default)")
    parser.add_argument("--out", type=Path, required=True, help="JSON (+ .md beside it)")
    parser.add_argument("--modes", nargs="+", default=list(MODES), help="rho values: auto or a number")
    parser.add_argument("--clients", type=int, default=CLIENTS)
    parser.add_argument("--retry-delay", type=float, default=RETRY_DELAY_S, help="seconds after a 429")
    parser.add_argument("--seconds", type=float, default=SECONDS, help="per mode")
    parser.add_argument("--rounds", type=int, default=2, help="every mode this many times, interleaved")
    parser.add_argument("--grace", type=float, default=30.0, help="wait this long for the last answers")
    parser.add_argument("--pause", type=float, default=5.0, help="seconds between modes")
    pinning_and_text_args(parser, texts=200, min_words=2, max_words=200)
    parser.add_argument("--busy-cpus", type=int, nargs="+", help="a busy loop on each (a slower CPU)")
    parser.add_argument("--server-env", nargs="*", default=[], help="KEY=VALUE settings of the server")
    parser.add_argument("--quick", action="store_true", help="seconds: few clients, short modes")
    args = parser.parse_args(argv)
    if args.quick:
        args.clients, args.seconds, args.rounds, args.grace, args.pause = 8, 2.0, 1, 10.0, 0.5
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    started = time.perf_counter()
    args = parse_args(argv)
    return publish(
        run(args), markdown, args.out, "benchmarks.retry_storm", argv, machine=True, started=started
    )


if __name__ == "__main__":
    main()
