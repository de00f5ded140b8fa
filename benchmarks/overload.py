"""Overload benchmark: open-loop arrivals (locust) at multiples of fixed rho=1's capacity for four
policies (``auto``, ``rho1``, ``rho_min``, ``tei_cap``: rho=1 with a TEI-style concurrency cap), each
against its own ``python -m service`` on loopback. Per (policy, rate): goodput, p50/p99 of the accepted,
shed ratio, errors, mean rho, RSS, idle latency after; ``--soak-seconds`` adds a long run per policy
reporting RSS growth. (Clients that retry a 429, polite or not, and ``--server-env``: the finished
retry-storm study's, ``git show 91c46ac:benchmarks/overload.py``.)

    python -m benchmarks.overload --models-dir models --model <classification model> \
        --out results/bench/overload.json --plot docs/plots/overload.png    # + overload.md
    python -m benchmarks.overload --models-dir <tiny models> --out /tmp/overload.json --quick   # seconds
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from benchmarks._http import serving
from benchmarks.harness import cli, figure, fmt, label_axes, percentile, publish
from benchmarks.load import make_texts
from service.api.faces import FACES

LOCUSTFILE = Path(__file__).with_name("overload_locust.py")
MULTIPLES = (0.5, 1.0, 2.0, 5.0, 10.0)
READY_TIMEOUT_S = 300.0  # a server loading its model on shared cores


def text_tasks() -> list[str]:
    """The tasks whose route takes one ``text`` per input (the service's face registry): the bodies this
    benchmark sends."""
    return [task for task, face in FACES.items() if face.fields == ("text",)]


@dataclass(frozen=True)
class Policy:
    name: str
    rho: str  # the query value every request sends
    env: dict[str, str] = field(default_factory=dict)  # the server's settings (RETENTION_*)


def policies(min_rho: float, tei_max_concurrent: int) -> list[Policy]:
    cap = {
        "RETENTION_ADMISSION_CONTROL": "false",
        "RETENTION_MAX_CONCURRENT_REQUESTS": str(tei_max_concurrent),
    }
    return [
        Policy("auto", "auto"),
        Policy("rho1", "1"),
        Policy("rho_min", f"{min_rho:g}"),
        Policy("tei_cap", "1", cap),  # rho=1 behind a TEI-style concurrency cap, admission control off
    ]


@dataclass
class Cell:
    policy: str
    multiple: float  # of the measured capacity of fixed rho=1
    offered_rps: float
    seconds: float
    round: int = 0  # --rounds: every round runs every policy once more (a fresh server), interleaved
    sent: int = 0
    ok: int = 0
    shed: int = 0  # 429
    server_errors: int = 0  # 5xx
    other: int = 0  # other statuses and connection errors
    # 200s answered while the arrivals lasted, per second: the sustained rate. A queue that is still full
    # when the arrivals stop keeps answering afterwards (fixed rho: up to max_queue_requests, for up to its
    # deadline); those answers count in answered_rps, not here, or a 10 s cell would credit a policy
    # with a 30 s queue for its backlog as if it were throughput.
    goodput_rps: float = 0.0
    answered_rps: float = 0.0  # every 200 / the arrival seconds (includes the drain after the last send)
    shed_ratio: float = 0.0
    p50_ms: float | None = None
    p99_ms: float | None = None
    mean_rho: float | None = None
    reasons: dict[str, int] = field(default_factory=dict)
    retry_after_max_s: int | None = None
    rss_start_mib: float = 0.0
    rss_peak_mib: float = 0.0
    rss_end_mib: float = 0.0
    idle_after_p50_ms: float | None = None  # sequential requests once the load stopped
    send_lag_p99_ms: float | None = None  # how late the generator sent (scheduled -> sent)
    # Where the accepted requests' time went: in the batcher (queue + inference, the part admission
    # predicts) and outside it (client, HTTP, tokenizing, decoding): latency minus the batcher's part.
    batcher_p50_ms: float | None = None
    batcher_p99_ms: float | None = None
    outside_p50_ms: float | None = None
    outside_p99_ms: float | None = None
    # (the retry-storm study's event-loop lag, load average and queue-over-prediction columns:
    # git show 91c46ac:benchmarks/overload.py)


def pinned(command: list[str], cpus: list[int] | None) -> list[str]:
    """``command`` restricted to ``cpus`` (taskset), or as is."""
    return ["taskset", "-c", ",".join(map(str, cpus)), *command] if cpus else command


def cpu_env(cpus: list[int] | None) -> dict[str, str]:
    """A server pinned to some cores runs ORT with one intra-op thread per core (ORT's default counts the
    machine's cores, not the process's)."""
    return {"RETENTION_INTRA_OP_THREADS": str(len(cpus))} if cpus else {}


@contextmanager
def server(
    models_dir: Path, policy: Policy, extra_env: dict[str, str], logs: Path, cpus: list[int] | None = None
) -> Iterator[tuple[str, int]]:
    """``python -m service`` for one policy on a free loopback port (on ``cpus`` when given), its log
    under ``logs``; yields (base URL, pid)."""
    env = {**cpu_env(cpus), **extra_env, **policy.env, "RETENTION_LOG_LEVEL": "warning"}
    command = pinned([sys.executable, "-m", "service", "--models-dir", str(models_dir)], cpus)
    with serving(command, READY_TIMEOUT_S, name=policy.name, log_dir=logs, env=env) as (url, process):
        yield url, process.pid


class RssSampler:
    """The server process's resident set size, sampled every ``interval`` s in a thread."""

    def __init__(self, pid: int, interval: float = 0.2) -> None:
        self.process = psutil.Process(pid)
        self.interval = interval
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def mib(self) -> float:
        return self.process.memory_info().rss / 2**20

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(self.mib())
            self._stop.wait(self.interval)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(self.mib())


@dataclass(frozen=True)
class Load:
    """One locust run: ``open`` arrivals at ``rate``/s, or a ``closed`` loop of ``concurrency`` clients."""

    mode: str
    seconds: float
    rate: float = 0.0
    concurrency: int = 0
    retry_delay_s: float | None = None  # closed loop: a 429's body sent again after this long


def drive(
    url: str,
    path: str,
    load: Load,
    bodies: Path,
    grace: float,
    workdir: Path,
    cpus: list[int] | None = None,
) -> list[dict[str, Any]]:
    """One locust run (headless, one user that drives everything; on ``cpus`` when given); its
    per-request records."""
    out = workdir / f"records-{time.monotonic_ns()}.jsonl"
    env = {
        **os.environ,
        "OVERLOAD_MODE": load.mode,
        "OVERLOAD_RATE": str(load.rate),
        "OVERLOAD_SECONDS": str(load.seconds),
        "OVERLOAD_CONCURRENCY": str(load.concurrency),
        "OVERLOAD_PATH": path,
        "OVERLOAD_OUT": str(out),
        "OVERLOAD_BODIES": str(bodies),
        "OVERLOAD_GRACE_S": str(grace),
        "OVERLOAD_RETRY_DELAY_S": "" if load.retry_delay_s is None else str(load.retry_delay_s),
    }
    locust = Path(sys.executable).with_name("locust")
    command = [
        str(locust) if locust.exists() else "locust",
        "-f", str(LOCUSTFILE), "--headless", "--host", url, "-u", "1", "-r", "1",
        "--run-time", f"{int(load.seconds + grace + 15)}s", "--only-summary", "--loglevel", "WARNING",
    ]  # fmt: skip
    limit = load.seconds + grace + 60
    subprocess.run(pinned(command, cpus), env=env, check=False, stdout=subprocess.DEVNULL, timeout=limit)
    if not out.exists():
        raise RuntimeError("locust wrote no records")
    return [json.loads(line) for line in out.read_text().splitlines() if line.strip()]


@dataclass(frozen=True)
class Outcomes:
    """What one locust run's records say: attempts by status, the answers that came inside the window
    (``seconds`` from the first send), the accepted attempts' latency percentiles and mean served rho."""

    sent: int
    ok: int
    refused: int
    server_errors: int
    in_window: int
    p50_ms: float | None = None
    p99_ms: float | None = None
    mean_rho: float | None = None


def outcomes(records: list[dict[str, Any]], seconds: float) -> Outcomes:
    accepted = [r for r in records if r["status"] == 200]
    counts = (
        len(records),
        len(accepted),
        sum(r["status"] == 429 for r in records),
        sum(r["status"] >= 500 for r in records),
        sum(r["at_s"] + r["latency_s"] <= seconds for r in accepted),
    )
    if not accepted:
        return Outcomes(*counts)
    latencies = [r["latency_s"] for r in accepted]
    rhos = [r["rho"] for r in accepted if r.get("rho") is not None]
    return Outcomes(
        *counts,
        p50_ms=1000 * percentile(latencies, 0.50),
        p99_ms=1000 * percentile(latencies, 0.99),
        mean_rho=statistics.fmean(rhos) if rhos else None,
    )


def summarize(cell: Cell, records: list[dict[str, Any]]) -> Cell:
    accepted = [r for r in records if r["status"] == 200]
    seen = outcomes(records, cell.seconds)
    cell.sent, cell.ok, cell.shed, cell.server_errors = seen.sent, seen.ok, seen.refused, seen.server_errors
    cell.other = cell.sent - cell.ok - cell.shed - cell.server_errors
    cell.goodput_rps = seen.in_window / cell.seconds
    cell.answered_rps = cell.ok / cell.seconds
    cell.shed_ratio = cell.shed / cell.sent if cell.sent else 0.0
    if accepted:
        cell.p50_ms, cell.p99_ms, cell.mean_rho = seen.p50_ms, seen.p99_ms, seen.mean_rho
        split = [r for r in accepted if "queue_s" in r]
        if split:
            batcher = [r["queue_s"] + r["inference_s"] for r in split]
            outside = [r["latency_s"] - b for r, b in zip(split, batcher, strict=True)]
            cell.batcher_p50_ms, cell.batcher_p99_ms = (1000 * percentile(batcher, q) for q in (0.5, 0.99))
            cell.outside_p50_ms, cell.outside_p99_ms = (1000 * percentile(outside, q) for q in (0.5, 0.99))
    for record in accepted:
        reason = str(record.get("rho_reason"))
        cell.reasons[reason] = cell.reasons.get(reason, 0) + 1
    lags = [r["send_lag_s"] for r in records if "send_lag_s" in r]
    cell.send_lag_p99_ms = 1000 * percentile(lags, 0.99) if lags else None
    retries = [int(r["retry_after"]) for r in records if r["status"] == 429 and r.get("retry_after")]
    cell.retry_after_max_s = max(retries) if retries else None
    return cell


def idle_latency_ms(url: str, path: str, body: dict[str, Any], count: int = 5) -> float:
    """p50 of ``count`` sequential requests (after the queue drained): back to idle latency?"""
    latencies = []
    with httpx.Client(timeout=60) as client:
        for _ in range(count):
            begin = time.perf_counter()
            client.post(f"{url}{path}", json=body)
            latencies.append(time.perf_counter() - begin)
    return 1000 * statistics.median(latencies)


def run(args: argparse.Namespace) -> dict[str, Any]:
    texts = make_texts(args.texts, args.min_words, args.max_words, args.seed)
    endpoint = FACES[args.task].path
    extra = {"RETENTION_DEFAULT_MODELS": json.dumps({args.task: args.model})} if args.model else {}
    if not args.arena:
        extra["RETENTION_CPU_MEM_ARENA"] = "false"
    cells: list[Cell] = []
    soaks: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="overload-") as tmp:
        workdir = Path(tmp)
        bodies = workdir / "bodies.json"
        bodies.write_text(json.dumps([FACES[args.task].example_body(text) for text in texts]))
        every = policies(args.min_rho, args.tei_max_concurrent)
        chosen = [p for p in every if p.name in args.policies]
        capacity = measure_capacity(args, every[1], extra, endpoint, bodies, workdir)
        print(f"capacity of fixed rho=1: {capacity:.1f} requests/s", flush=True)
        for round_index, policy in itertools.product(range(args.rounds), chosen):
            path = f"{endpoint}?rho={policy.rho}"
            with server(args.models_dir, policy, extra, workdir, args.server_cpus) as (url, pid):
                for multiple in args.multiples:
                    cell = Cell(policy.name, multiple, multiple * capacity, args.seconds, round_index)
                    with RssSampler(pid) as rss:
                        cell.rss_start_mib = rss.mib()
                        load = Load("open", args.seconds, cell.offered_rps)
                        records = drive(url, path, load, bodies, args.grace, workdir, args.client_cpus)
                    summarize(cell, records)
                    cell.rss_peak_mib, cell.rss_end_mib = max(rss.samples), rss.samples[-1]
                    idle_body = FACES[args.task].example_body(texts[0])
                    cell.idle_after_p50_ms = idle_latency_ms(url, path, idle_body)
                    cells.append(cell)
                    print(summary_line(cell), flush=True)
                if args.soak_seconds and round_index == 0:
                    soaks.append(soak(args, policy, (url, pid, path), bodies, capacity, workdir))
    return {
        "task": args.task,
        "model": args.model,
        "quick": args.quick,
        "capacity_rho1_rps": capacity,
        "probe": {"concurrency": args.probe_concurrency, "seconds": args.probe_seconds},
        "seconds_per_cell": args.seconds,
        "rounds": args.rounds,
        "server_cpus": args.server_cpus,
        "client_cpus": args.client_cpus,
        "arena": args.arena,
        "tei_max_concurrent": args.tei_max_concurrent,
        "texts": {"count": args.texts, "min_words": args.min_words, "max_words": args.max_words},
        "results": [asdict(cell) for cell in cells],
        "soak": soaks,
    }


def measure_capacity(
    args: argparse.Namespace, rho1: Policy, extra: dict[str, str], endpoint: str, bodies: Path, workdir: Path
) -> float:
    """200s/s of fixed rho=1 under a closed loop of ``probe_concurrency`` clients."""
    with server(args.models_dir, rho1, extra, workdir, args.server_cpus) as (url, _pid):
        load = Load("closed", args.probe_seconds, concurrency=args.probe_concurrency)
        records = drive(url, f"{endpoint}?rho=1", load, bodies, args.grace, workdir, args.client_cpus)
    ok = sum(r["status"] == 200 for r in records)
    return max(ok / args.probe_seconds, 0.5)


def soak(
    args: argparse.Namespace,
    policy: Policy,
    target: tuple[str, int, str],
    bodies: Path,
    capacity: float,
    workdir: Path,
) -> dict[str, Any]:
    """One long open-loop run against ``policy``'s running server (``target``: its URL, its process to
    watch, the endpoint and query to send to): RSS at its start, peak and end (growth in %)."""
    url, pid, path = target
    cell = Cell(policy.name, args.soak_multiple, args.soak_multiple * capacity, args.soak_seconds)
    with RssSampler(pid, interval=1.0) as rss:
        cell.rss_start_mib = rss.mib()
        load = Load("open", args.soak_seconds, rate=cell.offered_rps)
        records = drive(url, path, load, bodies, args.grace, workdir, args.client_cpus)
    summarize(cell, records)
    cell.rss_peak_mib, cell.rss_end_mib = max(rss.samples), rss.samples[-1]
    growth = 100 * (cell.rss_end_mib - cell.rss_start_mib) / cell.rss_start_mib
    # RSS at every tenth of the soak: still growing at the end, or a plateau reached early?
    marks = [rss.samples[min(len(rss.samples) - 1, i * len(rss.samples) // 10)] for i in range(11)]
    print(f"soak {policy.name}: RSS {cell.rss_start_mib:.0f} -> {cell.rss_end_mib:.0f} MiB ({growth:+.1f}%)")
    return {**asdict(cell), "rss_growth_percent": growth, "rss_tenths_mib": [round(m, 1) for m in marks]}


def summary_line(cell: Cell) -> str:
    return " ".join(
        [
            f"{cell.policy:8s} x{cell.multiple:<4g} offered {cell.offered_rps:7.1f}/s",
            f"goodput {cell.goodput_rps:7.1f}/s (answered {cell.answered_rps:.1f}/s)",
            f"p50 {fmt(cell.p50_ms)} ms p99 {fmt(cell.p99_ms)} ms",
            f"shed {cell.shed_ratio:.2f} 5xx {cell.server_errors} rho {fmt(cell.mean_rho, 2)}",
            f"RSS {cell.rss_peak_mib:.0f} MiB idle-after {fmt(cell.idle_after_p50_ms)} ms",
            f"client lag p99 {fmt(cell.send_lag_p99_ms)} ms",
            f"batcher p50/p99 {fmt(cell.batcher_p50_ms)}/{fmt(cell.batcher_p99_ms)} ms",
            f"outside p50/p99 {fmt(cell.outside_p50_ms)}/{fmt(cell.outside_p99_ms)} ms",
        ]
    )


def markdown(report: dict[str, Any]) -> str:
    capacity = report["capacity_rho1_rps"]
    lines = [
        f"# Overload benchmark ({report['task']}, capacity of rho=1: {capacity:.1f} req/s)",
        "",
        "Open-loop arrivals (locust), loopback. Latency counts from the scheduled arrival; client lag = how",
        "late the load generator sent (a large lag means the generator, not the server, was the limit).",
        "",
        "Goodput: 200s answered while the arrivals lasted, per second; answered: every 200 per second of",
        "arrivals, including the answers a still-full queue gives after the last send.",
        "",
        "| policy | x capacity | offered /s | goodput /s | answered /s | p50 ms | p99 ms | shed | 5xx |"
        " other | mean rho | RSS peak MiB | idle after ms | client lag p99 ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in report["results"]:
        lines.append(
            f"| {c['policy']} | {c['multiple']:g} | {c['offered_rps']:.1f} | "
            f"{c['goodput_rps']:.1f} | {fmt(c.get('answered_rps'))} | "
            f"{fmt(c['p50_ms'])} | {fmt(c['p99_ms'])} | {c['shed_ratio']:.2f} | {c['server_errors']} | "
            f"{c['other']} | {fmt(c['mean_rho'], 2)} | {c['rss_peak_mib']:.0f} | "
            f"{fmt(c['idle_after_p50_ms'])} | {fmt(c['send_lag_p99_ms'])} |"
        )
    if report.get("rounds", 1) > 1:
        lines += ["", *rounds_table(report["results"])]
    for s in report["soak"]:
        lines += [
            "",
            f"Soak {s['policy']} at {s['multiple']:g}x for {s['seconds']:.0f} s: RSS "
            f"{s['rss_start_mib']:.0f} → {s['rss_end_mib']:.0f} MiB ({s['rss_growth_percent']:+.1f}%), "
            f"peak {s['rss_peak_mib']:.0f} MiB",
        ]
    return "\n".join(lines) + "\n"


def across_rounds(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (policy, multiple), in run order: the mean and sample SD of goodput and accepted p99
    over its rounds, and their ranges."""
    groups: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for cell in results:
        groups.setdefault((cell["policy"], cell["multiple"]), []).append(cell)
    rows = []
    for (policy, multiple), cells in groups.items():
        goodput = [c["goodput_rps"] for c in cells]
        p99 = [c["p99_ms"] for c in cells if c["p99_ms"] is not None]
        rows.append(
            {
                "policy": policy,
                "multiple": multiple,
                "rounds": len(cells),
                "goodput_mean": statistics.fmean(goodput),
                "goodput_sd": statistics.stdev(goodput) if len(goodput) > 1 else 0.0,
                "goodput_range": (min(goodput), max(goodput)),
                "p99_mean_ms": statistics.fmean(p99) if p99 else None,
                "p99_range_ms": (min(p99), max(p99)) if p99 else None,
                "server_errors": sum(c["server_errors"] for c in cells),
            }
        )
    return rows


def rounds_table(results: list[dict[str, Any]]) -> list[str]:
    lines = [
        "Across rounds (each round: every policy once, a fresh server; mean ± sample SD, [min, max]):",
        "",
        "| policy | x capacity | rounds | goodput /s | p99 of accepted ms | 5xx |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row in across_rounds(results):
        low, high = row["goodput_range"]
        p99 = "-"
        if row["p99_range_ms"] is not None:
            p99 = f"{row['p99_mean_ms']:.0f} [{row['p99_range_ms'][0]:.0f}, {row['p99_range_ms'][1]:.0f}]"
        lines.append(
            f"| {row['policy']} | {row['multiple']:g} | {row['rounds']} | {row['goodput_mean']:.1f} ± "
            f"{row['goodput_sd']:.1f} [{low:.1f}, {high:.1f}] | {p99} | {row['server_errors']} |"
        )
    return lines


def plot(report: dict[str, Any], out: Path) -> Path | None:
    """p99 of the accepted and goodput vs offered load, one line per policy, saved at ``out`` (None without
    matplotlib)."""
    if importlib.util.find_spec("matplotlib") is None:
        return None
    rows = across_rounds(report["results"])  # the mean over rounds (one round: the cell itself)
    multiples = sorted({c["multiple"] for c in report["results"]})
    with figure(out, 1, 2, figsize=(11, 4)) as (latency, goodput):
        for name in dict.fromkeys(row["policy"] for row in rows):
            mine = sorted((row for row in rows if row["policy"] == name), key=lambda row: row["multiple"])
            xs = [row["multiple"] for row in mine]
            latency.plot(xs, [row["p99_mean_ms"] or float("nan") for row in mine], marker="o", label=name)
            goodput.plot(xs, [row["goodput_mean"] for row in mine], marker="o", label=name)
        for axis, title in ((latency, "p99 of accepted (ms)"), (goodput, "goodput (200s / s)")):
            axis.set_xscale("log")
            axis.set_xticks(multiples, [f"{m:g}x" for m in multiples])
            axis.minorticks_off()
            axis.set_title(title)
            label_axes(axis, "offered load (x capacity of rho=1)", None, legend_size=None)
        latency.set_yscale("log")
        goodput.legend()
    return out


def pinning_and_text_args(
    parser: argparse.ArgumentParser, texts: int, min_words: int, max_words: int
) -> None:
    """Where the server and the load generator run, and the texts sent (``make_texts``): the options of
    this benchmark and of ``benchmarks.retry_storm``."""
    parser.add_argument("--server-cpus", type=int, nargs="+", help="pin the server here (ORT: a thread each)")
    parser.add_argument("--client-cpus", type=int, nargs="+", help="pin the load generator to these CPUs")
    parser.add_argument("--texts", type=int, default=texts)
    parser.add_argument("--min-words", type=int, default=min_words)
    parser.add_argument("--max-words", type=int, default=max_words)
    parser.add_argument("--seed", type=int, default=0)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = cli("benchmarks.overload", __doc__)
    parser.add_argument("--models-dir", type=Path, required=True)
    parser.add_argument("--model", help="model to drive (default: the task's default model)")
    parser.add_argument("--task", choices=text_tasks(), default="classification")
    parser.add_argument("--out", type=Path, required=True, help="JSON (+ .md table and .png plot beside it)")
    parser.add_argument("--plot", type=Path, help="the plot's path (default: --out with .png)")
    parser.add_argument("--policies", nargs="+", default=["auto", "rho1", "rho_min", "tei_cap"])
    parser.add_argument("--multiples", nargs="+", type=float, default=list(MULTIPLES))
    parser.add_argument("--seconds", type=float, default=20.0, help="arrivals per cell")
    parser.add_argument("--rounds", type=int, default=1, help="every policy this many times, interleaved")
    parser.add_argument("--grace", type=float, default=35.0, help="wait this long for the last answers")
    parser.add_argument("--probe-seconds", type=float, default=15.0)
    parser.add_argument("--probe-concurrency", type=int, default=32)
    parser.add_argument("--min-rho", type=float, default=0.1, help="the fixed rho of the rho_min policy")
    parser.add_argument("--tei-max-concurrent", type=int, default=64)
    parser.add_argument("--soak-seconds", type=float, default=0.0, help="e.g. 600 for the 10-minute soak")
    parser.add_argument("--soak-multiple", type=float, default=2.0)
    parser.add_argument(
        "--no-arena", dest="arena", action="store_false", help="RETENTION_CPU_MEM_ARENA=false"
    )
    pinning_and_text_args(parser, texts=64, min_words=20, max_words=300)
    parser.add_argument("--quick", action="store_true", help="seconds: tiny models, two rates, short cells")
    args = parser.parse_args(argv)
    if args.quick:
        args.multiples, args.seconds, args.grace = [0.5, 2.0], 1.0, 10.0
        args.probe_seconds, args.probe_concurrency = 1.0, 4
        args.texts, args.min_words, args.max_words = 8, 3, 30
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    report = run(args)
    publish(report, markdown, args.out, "benchmarks.overload", argv, machine=True, show=False)
    image = plot(report, args.plot or args.out.with_suffix(".png"))
    print(
        f"wrote {args.out}, {args.out.with_suffix('.md')}"
        + (f", {image}" if image else " (no matplotlib: no plot)")
    )
    return report


if __name__ == "__main__":
    main()
