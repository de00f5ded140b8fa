"""Ray Serve against plain uvicorn, and Ray Data against the single-process batch client, on this machine.

    python -m experiments.ray_serve --out results/experiments/ray-serve/ray_serve.json \
        [--model-dir /root/models-out/minilm-embed] [--quick]

Online (``POST /embed``, short texts): requests/s and p50/p99 at 8 and 32 clients for

* ``uvicorn``: ``python -m service``, one process, ORT's default threads (one per core);
* ``uvicorn-1t``: the same with one ORT intra-op thread (what one replica gets);
* ``serve-1``: Ray Serve, one replica of one CPU (one ORT thread), through Ray's HTTP proxy;
* ``serve-2``: two such replicas behind the same proxy.

All four run at once (each variant idles while another is measured) and the cells are interleaved
(round after round, every variant in turn), so a load change on the shared machine hits every variant
alike; ``os.getloadavg()`` is recorded before and after each cell. Serve runs on a one-node Ray started
here with ``LOGICAL_CPUS`` logical CPUs (three replicas of one CPU placed on two physical cores: only one
variant is busy at a time).

Offline: rows/s of ``retention-batch --endpoint embed`` over the same rows, through plain uvicorn
(``--concurrency 8``, one process) and with ``--engine ray`` (a Ray Data pool of two actors, one ORT
thread each); the Ray figure includes starting the actors and loading their models, as a user waits
for it. The model directory is copied to a temporary models root (never modified). ``--quick``: one
short round at 8 clients and a few rows (seconds, for a smoke run).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx

from benchmarks._http import free_port, wait_ready
from benchmarks.harness import describe, write_result
from benchmarks.load import Cell, make_texts, run_cell
from clients import batch

DEFAULT_MODEL_DIR = Path("/root/models-out/minilm-embed")
CLIENTS = (8, 32)
ROUNDS = 2
CELL_SECONDS = 10.0
MAX_REQUESTS_PER_CELL = 100_000  # cells end on time, not on count
BATCH_ROWS = 3000
BATCH_ROUNDS = 2
BATCH_CONCURRENCY = 8
RAY_ACTORS = 2
RAY_ROWS_PER_BATCH = 256
LOGICAL_CPUS = 3  # serve-1's replica + serve-2's two; later the two Ray Data actors
REPLICA_CPUS = 1
READY_TIMEOUT_S = 300.0
REQUEST_TIMEOUT_S = 120.0
TEXTS = 256
MIN_WORDS, MAX_WORDS = 8, 40
SERVE_APPS = {"serve-1": 1, "serve-2": 2}  # variant -> replicas (app name and route prefix /<variant>)
PLAIN_THREADS = {"uvicorn": 0, "uvicorn-1t": 1}  # variant -> ORT intra-op threads (0: ORT's default)


@contextmanager
def plain_server(models_dir: Path, threads: int) -> Iterator[str]:
    """``python -m service`` in a subprocess; yields its base URL."""
    port = free_port()
    command = [sys.executable, "-m", "service", "--models-dir", str(models_dir), "--host", "127.0.0.1"]
    command += ["--port", str(port), "--intra-op-threads", str(threads), "--log-level", "warning"]
    process = subprocess.Popen(command)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, READY_TIMEOUT_S, process=process)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=60)


@contextmanager
def serve_apps(models_dir: Path) -> Iterator[dict[str, str]]:
    """Ray Serve with one app per ``SERVE_APPS`` entry; yields variant -> base URL (via the proxy)."""
    import ray
    from ray import serve

    from service.ray_serve import RetentionService

    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    urls = {}
    for name, replicas in SERVE_APPS.items():
        deployment = RetentionService.options(  # type: ignore[attr-defined]
            autoscaling_config={"min_replicas": replicas, "max_replicas": replicas},
            ray_actor_options={"num_cpus": REPLICA_CPUS},
        )
        settings = {"models_dir": str(models_dir), "intra_op_threads": REPLICA_CPUS}
        serve.run(deployment.bind(settings), name=name, route_prefix=f"/{name}")
        urls[name] = f"http://127.0.0.1:{port}/{name}"
    try:
        for url in urls.values():
            wait_ready(url, READY_TIMEOUT_S)
        yield urls
    finally:
        serve.shutdown()
        assert ray.is_initialized()


def loadavg() -> list[float]:
    return [round(value, 2) for value in os.getloadavg()]


async def online_cells(
    urls: dict[str, str], clients: tuple[int, ...], rounds: int, seconds: float
) -> list[Any]:
    bodies = [{"text": text} for text in make_texts(TEXTS, MIN_WORDS, MAX_WORDS)]
    cells = []
    limits = httpx.Limits(max_connections=max(clients) + 4)
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S, limits=limits) as client:
        for round_index in range(rounds):
            for concurrency in clients:
                for variant, url in urls.items():
                    await client.post(f"{url}/embed", json=bodies[0])  # warm the connection
                    before = loadavg()
                    cell = Cell(variant, "1", concurrency)
                    await run_cell(client, f"{url}/embed", cell, bodies, MAX_REQUESTS_PER_CELL, seconds, {})
                    row = {"round": round_index, **asdict(cell), "loadavg_before": before}
                    row["loadavg_after"] = loadavg()
                    cells.append(row)
                    print(online_line(row), flush=True)
    return cells


def online_line(row: dict[str, Any]) -> str:
    return (
        f"{row['target']:10s} c={row['concurrency']:2d} ok={row['ok']:5d} err={row['errors']:3d} "
        f"{row['throughput_rps']:7.1f} req/s p50={row['p50_ms'] or 0:.0f} ms p99={row['p99_ms'] or 0:.0f} ms "
        f"load {row['loadavg_before'][0]}->{row['loadavg_after'][0]}"
    )


def batch_cells(rows_path: Path, work: Path, plain_url: str, models_dir: Path, rounds: int) -> list[Any]:
    """The batch client over ``rows_path``: HTTP to plain uvicorn, then ``--engine ray``, per round."""
    common = ["--endpoint", "embed", "--id-field", "id", "--no-progress", "--overwrite"]
    engines = {
        "http-client": ["--url", plain_url, "--concurrency", str(BATCH_CONCURRENCY)],
        "ray-data": [
            *("--engine", "ray", "--models-dir", str(models_dir), "--actors", str(RAY_ACTORS)),
            *("--rows-per-batch", str(RAY_ROWS_PER_BATCH)),
        ],
    }
    cells = []
    for round_index in range(rounds):
        for engine, extra in engines.items():
            summary_path = work / f"{engine}-summary.json"
            out = work / f"{engine}.jsonl"
            before = loadavg()
            code = batch.main(
                [str(rows_path), str(out), *common, *extra, "--summary-json", str(summary_path)]
            )
            summary = json.loads(summary_path.read_text(encoding="utf-8"))
            after = loadavg()
            cells.append(
                {"round": round_index, "engine": engine, "exit_code": code}
                | {"loadavg_before": before, "loadavg_after": after, "summary": summary}
            )
            print(
                f"{engine:12s} rows={summary['processed']} errors={summary['errors']} "
                f"{summary['rows_per_s']:.1f} rows/s load {before[0]}->{after[0]}",
                flush=True,
            )
    return cells


def markdown(report: dict[str, Any]) -> str:
    meta = report["machine"]
    lines = [
        "# Ray Serve vs plain uvicorn, Ray Data vs the batch client",
        "",
        f"`python -m experiments.ray_serve` on {meta['cpu']} ({meta['cores']} cores, shared: load "
        f"averages per cell in the JSON), model `{report['model']}`, POST /embed, "
        f"{report['cell_seconds']:.0f} s cells, {report['rounds']} interleaved rounds.",
        "",
        "| variant | clients | round | ok | errors | req/s | p50 ms | p99 ms | load 1 min before/after |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in report["online"]:
        lines.append(
            f"| {row['target']} | {row['concurrency']} | {row['round']} | {row['ok']} | {row['errors']} | "
            f"{row['throughput_rps']:.1f} | {row['p50_ms'] or 0:.0f} | {row['p99_ms'] or 0:.0f} | "
            f"{row['loadavg_before'][0]} / {row['loadavg_after'][0]} |"
        )
    lines += [
        "",
        f"Batch: {report['batch_rows']} rows, `retention-batch --endpoint embed`.",
        "",
        "| engine | round | rows | errors | seconds | rows/s | load 1 min before/after |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for row in report["batch"]:
        summary = row["summary"]
        lines.append(
            f"| {row['engine']} | {row['round']} | {summary['processed']} | {summary['errors']} | "
            f"{summary['elapsed_s']:.1f} | {summary['rows_per_s']:.1f} | "
            f"{row['loadavg_before'][0]} / {row['loadavg_after'][0]} |"
        )
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> dict[str, Any]:
    import ray

    clients, rounds, seconds = ((8,), 1, 2.0) if args.quick else (CLIENTS, ROUNDS, CELL_SECONDS)
    rows, batch_rounds = (64, 1) if args.quick else (BATCH_ROWS, BATCH_ROUNDS)
    with tempfile.TemporaryDirectory(prefix="bench-ray-") as tmp:
        work = Path(tmp)
        models_dir = work / "models"
        shutil.copytree(args.model_dir, models_dir / args.model_dir.name)
        rows_path = work / "rows.jsonl"
        texts = make_texts(rows, MIN_WORDS, MAX_WORDS, seed=1)
        rows_path.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(texts)))
        ray.init(num_cpus=LOGICAL_CPUS, include_dashboard=False, log_to_driver=False)
        try:
            with plain_server(models_dir, PLAIN_THREADS["uvicorn"]) as plain:
                with (
                    plain_server(models_dir, PLAIN_THREADS["uvicorn-1t"]) as plain_1t,
                    serve_apps(models_dir) as serve_urls,
                ):
                    urls = {"uvicorn": plain, "uvicorn-1t": plain_1t, **serve_urls}
                    online = asyncio.run(online_cells(urls, clients, rounds, seconds))
                # uvicorn-1t and Serve are down: their CPUs go to the Ray Data actors
                offline = batch_cells(rows_path, work, plain, models_dir, batch_rounds)
        finally:
            ray.shutdown()
    return {
        "machine": {**describe(), "ray": ray.__version__},
        "model": args.model_dir.name,
        "quick": args.quick,
        "endpoint": "/embed",
        "texts": {"count": TEXTS, "min_words": MIN_WORDS, "max_words": MAX_WORDS},
        "clients": list(clients),
        "rounds": rounds,
        "cell_seconds": seconds,
        "variants": {
            **{
                name: {"server": "python -m service", "ort_intra_op_threads": t}
                for name, t in PLAIN_THREADS.items()
            },
            **{
                name: {"server": "ray serve", "replicas": n, "cpus_per_replica": REPLICA_CPUS}
                for name, n in SERVE_APPS.items()
            },
        },
        "ray_logical_cpus": LOGICAL_CPUS,
        "online": online,
        "batch_rows": rows,
        "batch": offline,
        "batch_engines": {
            "http-client": {"concurrency": BATCH_CONCURRENCY, "server": "uvicorn"},
            "ray-data": {"actors": RAY_ACTORS, "rows_per_batch": RAY_ROWS_PER_BATCH},
        },
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.ray_serve", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--out", type=Path, required=True, help="JSON output (a .md table is written next to it)"
    )
    parser.add_argument(
        "--model-dir", type=Path, default=DEFAULT_MODEL_DIR, help="an exported model directory"
    )
    parser.add_argument("--quick", action="store_true", help="one short round, a few rows (smoke run)")
    args = parser.parse_args(argv)
    report = run(args)
    write_result(args.out, report, markdown(report))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
