"""Load benchmark: throughput and p50/p99 latency of a running service at several rho and concurrency
levels (asyncio workers sharing one httpx client), against the hand-built baseline
(``benchmarks/baseline_server.py``: FastAPI + transformers). ``--quick`` runs in seconds.

    python -m benchmarks.load http://127.0.0.1:8000 --out results/bench/load.json \
        [--baseline-url http://127.0.0.1:8001] [--task classification] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from benchmarks.harness import cli, fmt, percentile, publish
from service.api.faces import FACES

RHOS = ("1", "0.5", "0.3", "auto")
WORD_TEXT = (  # make_texts draws its words from these
    "the model reads every token once and keeps only the salient ones for the deeper layers while "
    "the budget decides how many survive at the last layer a film review a news story a question "
    "about history science sports and an answer hidden somewhere in a long context paragraph"
)
WORDS = WORD_TEXT.split()


@dataclass
class Cell:
    target: str  # "service" or "baseline"
    rho: str  # "1", "0.5", "0.3", "auto"; "-" for the baseline
    concurrency: int
    sent: int = 0
    ok: int = 0
    errors: int = 0
    status: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    throughput_rps: float = 0.0
    p50_ms: float | None = None
    p99_ms: float | None = None
    mean_ms: float | None = None
    mean_work_fraction: float | None = None
    mean_rho_effective: float | None = None
    degraded: int = 0


def make_texts(count: int, min_words: int, max_words: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [
        " ".join(rng.choice(WORDS) for _ in range(rng.randint(min_words, max_words))) for _ in range(count)
    ]


def payload(task: str, text: str) -> dict[str, Any]:
    """A body of one input around ``text``, as the task's face declares it (``TaskFace.example_body``):
    a task added to the face registry is benchmarked with no edit here."""
    return FACES[task].example_body(text)


async def run_cell(
    client: httpx.AsyncClient,
    url: str,
    cell: Cell,
    bodies: list[dict[str, Any]],
    requests: int,
    max_seconds: float,
    headers: dict[str, str],
) -> Cell:
    latencies: list[float] = []
    work: list[float] = []
    rhos: list[float] = []
    counter = iter(range(requests))
    start = time.perf_counter()
    stop_at = start + max_seconds

    async def worker() -> None:
        for index in counter:
            if time.perf_counter() > stop_at:
                return
            body = bodies[index % len(bodies)]
            begin = time.perf_counter()
            cell.sent += 1
            try:
                response = await client.post(url, json=body, headers=headers)
            except httpx.HTTPError:
                cell.errors += 1
                cell.status["error"] = cell.status.get("error", 0) + 1
                continue
            elapsed = time.perf_counter() - begin
            code = str(response.status_code)
            cell.status[code] = cell.status.get(code, 0) + 1
            if response.status_code != 200:
                cell.errors += 1
                continue
            cell.ok += 1
            latencies.append(elapsed)
            usage = response.json().get("usage") if cell.target == "service" else None
            if isinstance(usage, dict):
                work.append(float(usage["token_work_fraction"]))
                rhos.append(float(usage["rho_effective"]))
                cell.degraded += int(bool(usage.get("degraded")))

    await asyncio.gather(*(worker() for _ in range(cell.concurrency)))
    cell.seconds = time.perf_counter() - start
    cell.throughput_rps = cell.ok / cell.seconds if cell.seconds > 0 else 0.0
    if latencies:
        cell.p50_ms = 1000 * percentile(latencies, 0.50)
        cell.p99_ms = 1000 * percentile(latencies, 0.99)
        cell.mean_ms = 1000 * statistics.fmean(latencies)
    if work:
        cell.mean_work_fraction = statistics.fmean(work)
        cell.mean_rho_effective = statistics.fmean(rhos)
    return cell


async def run(args: argparse.Namespace) -> dict[str, Any]:
    texts = make_texts(args.texts, args.min_words, args.max_words, args.seed)
    bodies = [payload(args.task, text) for text in texts]
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    endpoint = FACES[args.task].path  # its route, from the face registry
    # (target, rho, url, headers) of every cell at one concurrency: the service at each ρ, then the baseline
    targets = [("service", rho, f"{args.url.rstrip('/')}{endpoint}?rho={rho}", headers) for rho in args.rhos]
    if args.baseline_url:
        targets.append(("baseline", "-", f"{args.baseline_url.rstrip('/')}{endpoint}", {}))
    cells: list[Cell] = []
    limits = httpx.Limits(max_connections=max(args.concurrency) + 4)
    async with httpx.AsyncClient(timeout=args.timeout, limits=limits) as client:
        for concurrency in args.concurrency:
            for target, rho, url, sent_headers in targets:
                await client.post(url, json=bodies[0], headers=sent_headers)  # warm the connection
                cell = Cell(target, rho, concurrency)
                cells.append(
                    await run_cell(client, url, cell, bodies, args.requests, args.max_seconds, sent_headers)
                )
                print(summary_line(cell), flush=True)
    return {
        "url": args.url,
        "baseline_url": args.baseline_url,
        "task": args.task,
        "quick": args.quick,
        "texts": {"count": args.texts, "min_words": args.min_words, "max_words": args.max_words},
        "requests_per_cell": args.requests,
        "max_seconds_per_cell": args.max_seconds,
        "results": [asdict(cell) for cell in cells],
    }


def summary_line(cell: Cell) -> str:
    return (
        f"{cell.target:8s} rho={cell.rho:4s} c={cell.concurrency:3d} ok={cell.ok:5d} err={cell.errors:4d} "
        f"{cell.throughput_rps:8.1f} req/s p50={fmt(cell.p50_ms)} ms p99={fmt(cell.p99_ms)} ms"
    )


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"# Load benchmark ({report['task']})",
        "",
        f"Service `{report['url']}`"
        + (f", baseline `{report['baseline_url']}`" if report["baseline_url"] else ""),
        "",
        "| target | rho | concurrency | ok | errors | req/s | p50 ms | p99 ms | work fraction | rho eff. |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for cell in report["results"]:
        lines.append(
            f"| {cell['target']} | {cell['rho']} | {cell['concurrency']} | {cell['ok']} | {cell['errors']} | "
            f"{fmt(cell['throughput_rps'])} | {fmt(cell['p50_ms'])} | {fmt(cell['p99_ms'])} | "
            f"{fmt(cell['mean_work_fraction'], 3)} | {fmt(cell['mean_rho_effective'], 2)} |"
        )
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = cli("benchmarks.load", __doc__)
    parser.add_argument("url", help="base URL of the running service, e.g. http://127.0.0.1:8000")
    parser.add_argument("--out", type=Path, required=True, help="JSON output (its .md table beside it)")
    parser.add_argument("--baseline-url", help="base URL of benchmarks/baseline_server.py (optional)")
    parser.add_argument("--task", choices=sorted(FACES), default="classification")
    parser.add_argument("--rhos", nargs="+", default=list(RHOS))
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 4, 16, 64])
    parser.add_argument("--requests", type=int, default=400, help="at most this many requests per cell")
    parser.add_argument("--max-seconds", type=float, default=60.0, help="and at most this long per cell")
    parser.add_argument("--texts", type=int, default=64)
    parser.add_argument("--min-words", type=int, default=20)
    parser.add_argument("--max-words", type=int, default=300)
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--api-key")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="seconds: few requests, concurrency 1 and 4")
    args = parser.parse_args(argv)
    if args.quick:
        args.concurrency, args.requests, args.max_seconds = [1, 4], min(args.requests, 12), 5.0
        args.texts, args.min_words, args.max_words = 8, 3, 30
    for rho in args.rhos:
        if rho != "auto" and not 0.0 < float(rho) <= 1.0:
            parser.error(f"rho must be in (0, 1] or 'auto', got {rho}")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    report = asyncio.run(run(args))
    publish(report, markdown, args.out, "benchmarks.load", argv, machine=True, show=False)
    print(f"wrote {args.out} and {args.out.with_suffix('.md')}")
    return report


if __name__ == "__main__":
    main()
