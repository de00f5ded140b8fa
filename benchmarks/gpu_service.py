"""The service end to end against the peer users run, on one machine: requests/s and p50/p99 of
``POST /v1/embeddings`` through real HTTP, our server (``python -m service``) beside sentence-transformers
``encode`` behind the usual hand-made FastAPI batching server (``benchmarks.st_peer``), the same model
shape and weights, the same documents, the same clients.

    python -m benchmarks.gpu_service --out DIR --assets .gpu-check/assets  # a GPU: torch bf16 vs ST bf16
    python -m benchmarks.gpu_service --cpu --out DIR         # the CPU row: onnxruntime fp32 vs ST fp32
    python -m benchmarks.gpu_service --dry-run --out DIR     # this CPU, tiny, under a minute
    python -m benchmarks.gpu_service --write-assets DIR      # the documents, for a machine without the
                                                             #   data root (scripts/gpu_check.sh prepare)

What it does, per model shape (MiniLM 384 × 6, then base 768 × 12 while the time budget lasts):

1. builds a seeded random encoder of the shape once, exports it with the project's exporter into a
   temporary models directory as the embedding product ships — two-path: ρ = 1 the original, ρ < 1 a
   copy of its own (here the original's weights plus noise); ``model.onnx`` + ``weights.safetensors``,
   the product's embedding selection (``benchmarks.gpu_forward.selection``) — and saves the same encoder
   as a sentence-transformers directory (mean pooling, Normalize: what ours computes) for the peer;
2. starts both servers as subprocesses on free loopback ports: ours with ``RETENTION_BACKEND=torch``
   (bf16, CUDA graphs) on a GPU, ``onnxruntime`` fp32 with ``--cpu``, torch fp32 on the CPU dry run; the
   peer in bf16 on a GPU, fp32 on a CPU;
3. drives ``/v1/embeddings`` with 8 and 64 concurrent clients (``benchmarks.load.run_cell``: asyncio
   workers, one httpx client) with SQuAD dev paragraphs at their own lengths, 1–4 per request, at
   ρ 1 / 0.5 / 0.3 / ``auto`` for ours; each cell warms up, unrecorded, before it is measured;
4. records per cell requests/s, texts/s, p50/p99, errors by status, the token-work served, the batches
   the scheduler formed (``/metrics``: ``retention_batch_size`` / ``retention_batch_tokens`` deltas over
   the cell; the peer's ``/stats``), device memory (ours: ``retention_device_memory_bytes`` /
   ``retention_device_memory_peak_bytes``; the peer: ``torch.cuda.max_memory_allocated``), each server's
   resident memory and the client's CPU share (a client near one core full would be the bottleneck).

``--budget-s`` stops adding cells and shapes past it (each cell's warm-up + measurement must fit).
Results: ``gpu_service.json`` (``cpu_service.json`` with ``--cpu``) and its markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import shlex
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx

from benchmarks._http import serving, tree_rss
from benchmarks.gpu import gpu_name, installed
from benchmarks.harness import cli, fmt, publish
from benchmarks.load import Cell, run_cell, summary_line
from retention_core.machine import recorded_cpu_class

MODULE = "benchmarks.gpu_service"
GPU_RESULT = "gpu_service.json"
CPU_RESULT = "cpu_service.json"
ROUTE = "/v1/embeddings"
OURS = "service"  # benchmarks.load.run_cell reads the usage block only for this target
PEER = "sentence-transformers"
NO_RHO = "-"
RHOS = ("1", "0.5", "0.3", "auto")
CLIENTS = (8, 64)
SHAPE_ORDER = ("minilm", "base")
PARAGRAPHS_FILE = "squad-dev-paragraphs.json"
COPY_DRIFT = 1e-3  # the random model's ρ < 1 copy: std of the noise added to the original's weights
TOKENIZER_DIR = "tokenizer"
SQUAD_DEV = Path("squad") / "validation.jsonl.gz"
ASSET_PARAGRAPHS = 600  # written by --write-assets: more than any run cycles through
MAX_LENGTH = 256  # tokens: the product embedding recipe's (all-MiniLM-L6-v2's max_seq_length)
UNLIMITED_REQUESTS = 10**9  # cells are bounded by time
MIB = 2**20
LOG_TAIL_CHARS = 3000
MEASURED = "measured"
OUT_OF_TIME = "skipped: time budget (--budget-s) spent"
PEER_PACKAGES = ("torch", "transformers", "sentence-transformers", "fastapi", "starlette", "uvicorn")
OUR_PACKAGES = ("onnxruntime", "safetensors", "pydantic", "pydantic-settings", "prometheus-client", "httpx")
# The targets (ours / the peer, same run): at 64 clients req/s at rho 1 / 0.5 / 0.3; at 8 clients
# p99 at rho 1 at most the peer's.
RPS_TARGETS = {"1": 1.0, "0.5": 1.3, "0.3": 1.6}
TARGET_CLIENTS, P99_CLIENTS = 64, 8
# Seconds per measured cell and per cell's unrecorded warm-up: a GPU call has minutes for both shapes'
# 10 cells each (scripts/gpu_check.sh), the CPU row runs alone and slower.
CELL_SECONDS = {"gpu": 8.0, "cpu": 20.0, "dry": 1.0}
WARMUP_SECONDS = {"gpu": 3.0, "cpu": 5.0, "dry": 0.5}
MIN_SHAPE_S = 150.0  # a further shape starts only with this much left: its build, two starts, cells


# ---------------------------------------------------------------------------------------- the plan
@dataclass(frozen=True)
class Mode:
    """What runs where: our backend's settings and the peer's device and dtype."""

    name: str  # "gpu", "cpu", "gpu dry run (cpu)", "cpu dry run"
    device: str  # the peer's torch device ("cuda" or "cpu")
    our_env: dict[str, str]
    our_label: str
    peer_dtype: str


def make_mode(cpu: bool, dry_run: bool) -> Mode:
    if cpu:
        env = {
            "RETENTION_BACKEND": "onnxruntime",
            "RETENTION_USE_CUDA": "false",
            "RETENTION_PRECISION": "fp32",
        }
        name = "cpu dry run" if dry_run else "cpu"
        return Mode(name, "cpu", env, "onnxruntime fp32 (CPU)", "float32")
    if dry_run:  # the GPU run's code paths on this CPU: the torch backend, eager fp32
        env = {
            "RETENTION_BACKEND": "torch",
            "RETENTION_TORCH_DEVICE": "cpu",
            "RETENTION_TORCH_DTYPE": "float32",
        }
        return Mode("gpu dry run (cpu)", "cpu", env, "torch fp32 eager (CPU)", "float32")
    env = {
        "RETENTION_BACKEND": "torch",
        "RETENTION_TORCH_DEVICE": "cuda:0",
        "RETENTION_TORCH_DTYPE": "bfloat16",
        "RETENTION_CUDA_GRAPHS": "true",
    }
    return Mode("gpu", "cuda", env, "torch bf16, CUDA graphs", "bfloat16")


@dataclass(frozen=True)
class Plan:
    mode: Mode
    dry_run: bool
    shapes: dict[str, dict[str, int]]
    clients: tuple[int, ...]
    rhos: tuple[str, ...]
    seconds: float  # per measured cell
    warmup_s: float  # per cell, before it, unrecorded
    max_length: int
    min_inputs: int
    max_inputs: int
    bodies: int  # distinct requests per cell (cycled)
    encoding_format: str
    auto_min_rho: float
    peer_max_batch: int
    peer_max_wait_ms: float
    ready_timeout_s: float
    timeout_s: float  # per request
    seed: int
    service_env: dict[str, str] = field(default_factory=dict)
    deadline: float | None = None  # time.perf_counter() past which no cell or shape starts
    min_shape_s: float = MIN_SHAPE_S
    pid_file: Path | None = None  # each server's pid (its process group) is appended here

    def seconds_left(self) -> float:
        return float("inf") if self.deadline is None else self.deadline - time.perf_counter()

    @property
    def cell_s(self) -> float:
        return self.warmup_s + self.seconds + 2.0


# ---------------------------------------------------------------------------------------- documents
def read_paragraphs(args: argparse.Namespace) -> tuple[list[str], str]:
    """The documents and where they came from: ``--texts-file`` (SQuAD-layout JSON Lines), the
    ``--assets`` copy, else the data root's SQuAD dev file; every distinct paragraph once, seeded order."""
    if args.texts_file is None and args.assets is not None and (args.assets / PARAGRAPHS_FILE).is_file():
        path = args.assets / PARAGRAPHS_FILE
        texts = list(json.loads(path.read_text(encoding="utf-8")))
    else:
        path = args.texts_file or squad_dev_path()
        texts = shuffled_paragraphs(path, args.seed)
    return texts[: args.max_texts], str(path)


def shuffled_paragraphs(path: Path, seed: int) -> list[str]:
    """Every distinct SQuAD context once, in a seeded order (file order runs article by article)."""
    from benchmarks.retrieval_parts import read_retrieval_set

    texts = read_retrieval_set(path).paragraphs
    random.Random(seed).shuffle(texts)
    return texts


def squad_dev_path() -> Path:
    from training.recipes.data import default_data_root

    root = default_data_root()
    if root is None:
        raise SystemExit("no data root (../shared/data): pass --texts-file or --assets")
    return root / SQUAD_DEV


def write_assets(directory: Path, seed: int) -> Path:
    """SQuAD dev paragraphs (seeded order) as a JSON list and the MiniLM tokenizer: what a machine
    without the data root or the backbone package reads."""
    from training.engine.encoders import DEFAULT_BACKBONE, load_tokenizer

    texts = shuffled_paragraphs(squad_dev_path(), seed)
    directory.mkdir(parents=True, exist_ok=True)
    load_tokenizer(DEFAULT_BACKBONE).save_pretrained(str(directory / TOKENIZER_DIR))
    path = directory / PARAGRAPHS_FILE
    path.write_text(json.dumps(texts[:ASSET_PARAGRAPHS]) + "\n", encoding="utf-8")
    print(f"wrote {path}: {min(len(texts), ASSET_PARAGRAPHS)} SQuAD dev paragraphs")
    return path


def request_inputs(texts: list[str], plan: Plan) -> list[list[str]]:
    """``plan.bodies`` requests of ``min_inputs``–``max_inputs`` paragraphs each (seeded), the same
    for every server and cell."""
    rng = random.Random(plan.seed)
    return [rng.sample(texts, rng.randint(plan.min_inputs, plan.max_inputs)) for _ in range(plan.bodies)]


# ---------------------------------------------------------------------------------------- the models
@dataclass(frozen=True)
class Built:
    shape: str
    name: str  # our model's name (its directory under models_dir)
    models_dir: Path
    peer_dir: Path
    seconds: float
    sizes: dict[str, int]


def tokenizer_for(assets: Path | None) -> Any:
    """The MiniLM tokenizer (the BERT uncased vocabulary both shapes use): its package, else the copy
    ``--write-assets`` saved."""
    from transformers import AutoTokenizer

    from training.engine.encoders import DEFAULT_BACKBONE, load_tokenizer

    try:
        return load_tokenizer(DEFAULT_BACKBONE)
    except ImportError:
        if assets is None or not (assets / TOKENIZER_DIR).is_dir():
            raise FileNotFoundError(
                f"no {DEFAULT_BACKBONE} package and no {TOKENIZER_DIR}/ in --assets: "
                f"write them with python -m {MODULE} --write-assets DIR"
            ) from None
        return AutoTokenizer.from_pretrained(str(assets / TOKENIZER_DIR), use_fast=True)


def sentence_transformers_dir(encoder: Any, tokenizer: Any, directory: Path, max_length: int) -> Path:
    """The encoder's weights as a sentence-transformers model: Transformer → mean Pooling → Normalize."""
    encoder.save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    pooling = {
        "word_embedding_dimension": encoder.config.hidden_size,
        "pooling_mode_cls_token": False,
        "pooling_mode_mean_tokens": True,
        "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
    }
    (directory / "modules.json").write_text(json.dumps(modules, indent=1), encoding="utf-8")
    (directory / "1_Pooling").mkdir(exist_ok=True)
    (directory / "1_Pooling" / "config.json").write_text(json.dumps(pooling, indent=1), encoding="utf-8")
    (directory / "2_Normalize").mkdir(exist_ok=True)
    bert_config = {"max_seq_length": max_length, "do_lower_case": False}
    (directory / "sentence_bert_config.json").write_text(json.dumps(bert_config), encoding="utf-8")
    return directory


def build(shape_name: str, shape: dict[str, int], root: Path, tokenizer: Any, plan: Plan) -> Built:
    """A seeded random encoder of ``shape``: exported as our model directory, saved for the peer."""
    import torch
    from transformers import AutoModel, BertConfig

    from benchmarks.gpu_forward import MAX_POSITIONS, selection
    from training.engine.encoders import EncoderBackbone
    from training.engine.model import RetentionModel
    from training.export.install import export_model
    from training.tiny import tiny_recipe

    started = time.perf_counter()
    torch.manual_seed(plan.seed)
    sizes: dict[str, Any] = {
        "vocab_size": tokenizer.vocab_size,
        "max_position_embeddings": MAX_POSITIONS,
        **shape,
    }
    config = BertConfig(**sizes)
    encoder = AutoModel.from_config(config, attn_implementation="eager").eval()
    peer_dir = sentence_transformers_dir(encoder, tokenizer, root / f"peer-{shape_name}", plan.max_length)
    name = f"random-{shape_name}-embed"
    model = RetentionModel(EncoderBackbone(encoder), "embedding", shape["hidden_size"], selection()).eval()
    # the product's shape: ρ < 1 rows run a copy of the encoder's layers on the original's embedding tables
    copy = model.add_pruned_branch(own_embeddings=False)
    with torch.no_grad():  # moved off the original, as training moves it: the export then stores it apart
        for parameter in copy.layers.parameters():
            parameter.add_(torch.randn_like(parameter) * COPY_DRIFT)
    recipe = tiny_recipe("embedding", name=name).model_copy(update={"max_length": plan.max_length})
    models_dir = root / f"models-{shape_name}"
    export_model(model, recipe, tokenizer, models_dir / name, name=name)
    return Built(shape_name, name, models_dir, peer_dir, round(time.perf_counter() - started, 1), shape)


# ---------------------------------------------------------------------------------------- the servers
@dataclass
class Server:
    target: str  # OURS or PEER
    url: str
    process: Any  # subprocess.Popen
    log: Path


def server_commands(built: Built, plan: Plan) -> dict[str, tuple[list[str], dict[str, str]]]:
    ours = [sys.executable, "-m", "service", "--models-dir", str(built.models_dir), "--host", "127.0.0.1"]
    ours += ["--log-level", "warning"]
    our_env = {**plan.mode.our_env, **plan.service_env}
    peer = [sys.executable, "-m", "benchmarks.st_peer", "--model", str(built.peer_dir), "--host", "127.0.0.1"]
    peer += ["--device", plan.mode.device, "--dtype", plan.mode.peer_dtype]
    peer += ["--max-batch", str(plan.peer_max_batch), "--max-wait-ms", str(plan.peer_max_wait_ms)]
    peer_env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    return {OURS: (ours, our_env), PEER: (peer, peer_env)}


@contextlib.contextmanager
def started(target: str, command: list[str], env: dict[str, str], logs: Path, plan: Plan) -> Iterator[Server]:
    """The server once it answers a real embedding request (not only a health route)."""
    body = {"input": ["is the server ready?"]}

    def probe(url: str) -> httpx.Response:
        return httpx.post(url + ROUTE, json=body, timeout=30)

    with serving(command, plan.ready_timeout_s, name=target, log_dir=logs, env=env, probe=probe) as (
        url,
        process,
    ):
        log = logs / f"{target}-{url.rsplit(':', 1)[1]}.log"
        if plan.pid_file is not None:  # for a caller that must kill what a hard stop leaves behind
            with plan.pid_file.open("a", encoding="utf-8") as pids:
                pids.write(f"{process.pid}\n")
        yield Server(target, url, process, log)


# ---------------------------------------------------------------------------------------- metrics
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]  # (name, sorted labels) → value


def scrape(client: httpx.Client, url: str) -> Samples:
    """Every sample of ``GET /metrics``: (name, sorted labels) → value."""
    from prometheus_client.parser import text_string_to_metric_families

    text = client.get(url + "/metrics").text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): float(sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def histogram_delta(before: Samples, after: Samples, name: str, model: str) -> dict[str, Any]:
    """Observations of histogram ``name`` for ``model`` between two scrapes: count, mean and the count
    per bucket (upper bound → observations in it, not cumulative)."""

    def value(samples: Samples, suffix: str, **labels: str) -> float:
        key = (name + suffix, tuple(sorted({"model": model, **labels}.items())))
        return samples.get(key, 0.0)

    count = value(after, "_count") - value(before, "_count")
    total = value(after, "_sum") - value(before, "_sum")
    bounds = sorted(
        {dict(labels)["le"] for (sample, labels) in after if sample == name + "_bucket"},
        key=lambda le: float(le),
    )
    buckets, below = {}, 0.0
    for le in bounds:
        cumulative = value(after, "_bucket", le=le) - value(before, "_bucket", le=le)
        if cumulative - below > 0:
            buckets[le] = int(cumulative - below)
        below = cumulative
    return {"count": int(count), "mean": total / count if count else None, "buckets": buckets}


def gauge(samples: Samples, name: str, model: str) -> float | None:
    return samples.get((name, (("model", model),)))


def our_batches(before: Samples, after: Samples, model: str) -> dict[str, Any]:
    rows = histogram_delta(before, after, "retention_batch_size", model)
    tokens = histogram_delta(before, after, "retention_batch_tokens", model)
    return {
        "runs": rows["count"],
        "mean_rows": rows["mean"],
        "mean_padded_tokens": tokens["mean"],
        "rows_buckets": rows["buckets"],
        "padded_tokens_buckets": tokens["buckets"],
    }


def our_memory(samples: Samples, model: str) -> dict[str, float | None]:
    return {
        "device_memory_bytes": gauge(samples, "retention_device_memory_bytes", model),
        "device_memory_peak_bytes": gauge(samples, "retention_device_memory_peak_bytes", model),
    }


def our_graphs(before: Samples, after: Samples, model: str) -> dict[str, float] | None:
    """The model's CUDA graphs around a cell (``/metrics``; None when it captures none: the CPU): held,
    captured at load, and what the cell's requests cost (captures on their path, failed captures, runs
    answered eagerly, evictions): on a GPU, the check that no request paid a capture."""
    held = gauge(after, "retention_cuda_graphs", model)
    if held is None:
        return None

    def count(samples: Samples, name: str, **labels: str) -> float:
        key = (f"retention_cuda_graph_{name}_total", tuple(sorted({"model": model, **labels}.items())))
        return samples.get(key, 0.0)

    def during(name: str, **labels: str) -> float:
        return count(after, name, **labels) - count(before, name, **labels)

    return {
        "held": held,
        "captured_at_load": count(after, "captures", phase="load"),
        "captured_during_cell": during("captures", phase="request"),
        "capture_failures_during_cell": during("capture_failures"),
        "eager_runs_during_cell": during("eager_runs"),
        "evictions_during_cell": during("evictions"),
    }


def peer_batches(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    runs = after["batches"] - before["batches"]
    texts = after["texts"] - before["texts"]
    return {"runs": runs, "mean_rows": texts / runs if runs else None, "mean_padded_tokens": None}


def peer_memory(stats: dict[str, Any]) -> dict[str, float | None]:
    return {
        "device_memory_bytes": stats["memory_allocated_bytes"],
        "device_memory_peak_bytes": stats["max_memory_allocated_bytes"],
    }


# ---------------------------------------------------------------------------------------- measuring
@dataclass
class Target:
    """One server at one ρ: the URL the client posts to and the bodies it sends."""

    server: Server
    rho: str
    url: str
    bodies: list[dict[str, Any]]


def targets_for(
    servers: dict[str, Server], built: Built, inputs: list[list[str]], plan: Plan
) -> list[Target]:
    """The peer first, then ours at each ρ (a fixed ρ in the query, auto with its ``min_rho``)."""
    peer = servers[PEER]
    found = [
        Target(
            peer,
            NO_RHO,
            peer.url + ROUTE,
            [{"input": texts, "encoding_format": plan.encoding_format} for texts in inputs],
        )
    ]
    ours = servers[OURS]
    bodies = [
        {"model": built.name, "input": texts, "encoding_format": plan.encoding_format} for texts in inputs
    ]
    for rho in plan.rhos:
        query = f"rho={rho}" + (f"&min_rho={plan.auto_min_rho:g}" if rho == "auto" else "")
        found.append(Target(ours, rho, f"{ours.url}{ROUTE}?{query}", bodies))
    return found


def server_state(client: httpx.Client, target: Target) -> tuple[Samples, dict[str, Any]]:
    if target.server.target == OURS:
        return scrape(client, target.server.url), {}
    return {}, client.get(target.server.url + "/stats").json()


async def measure_cell(
    target: Target, concurrency: int, plan: Plan, model: str, mean_inputs: float
) -> dict[str, Any]:
    """Warm up (unrecorded), then one measured cell with the batches and memory around it."""
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    async with httpx.AsyncClient(timeout=plan.timeout_s, limits=limits) as client:
        warm = Cell(target.server.target, target.rho, concurrency)
        await run_cell(client, target.url, warm, target.bodies, UNLIMITED_REQUESTS, plan.warmup_s, {})
        with httpx.Client(timeout=30) as sync:
            before = server_state(sync, target)
        cell = Cell(target.server.target, target.rho, concurrency)
        cpu_before, wall_before = time.process_time(), time.perf_counter()
        await run_cell(client, target.url, cell, target.bodies, UNLIMITED_REQUESTS, plan.seconds, {})
        client_cpu = (time.process_time() - cpu_before) / max(time.perf_counter() - wall_before, 1e-9)
        with httpx.Client(timeout=30) as sync:
            after = server_state(sync, target)
    graphs = None
    if target.server.target == OURS:
        batches, memory = our_batches(before[0], after[0], model), our_memory(after[0], model)
        graphs = our_graphs(before[0], after[0], model)
    else:
        batches, memory = peer_batches(before[1], after[1]), peer_memory(after[1])
    print(summary_line(cell), flush=True)
    return {
        **asdict(cell),
        "texts_per_s": cell.throughput_rps * mean_inputs,
        "batches": batches,
        **memory,
        "cuda_graphs": graphs,
        "rss_mib": round(tree_rss(target.server.process.pid) / MIB, 1),
        "client_cpu_share": round(client_cpu, 3),
        "warmup": {"ok": warm.ok, "errors": warm.errors},
    }


def log_tail(path: Path) -> str:
    return path.read_text(errors="replace")[-LOG_TAIL_CHARS:] if path.is_file() else ""


def measure_shape(
    shape_name: str, plan: Plan, texts: list[str], tokenizer: Any, workdir: Path
) -> dict[str, Any]:
    """Build, start both servers, every (clients, server, ρ) cell while the budget lasts."""
    built = build(shape_name, plan.shapes[shape_name], workdir, tokenizer, plan)
    print(f"{shape_name}: built and exported in {built.seconds:.0f} s", flush=True)
    inputs = request_inputs(texts, plan)
    mean_inputs = statistics.fmean(len(chunk) for chunk in inputs)
    result: dict[str, Any] = {
        "status": MEASURED,
        "shape": built.sizes,
        "model": built.name,
        "build_seconds": built.seconds,
        "mean_inputs_per_request": round(mean_inputs, 3),
        "cells": [],
        "skipped_for_time": [],
    }
    commands = server_commands(built, plan)
    result["servers"] = {
        target: {"command": shlex.join(command), "env": env} for target, (command, env) in commands.items()
    }
    logs = workdir / f"logs-{shape_name}"
    logs.mkdir(exist_ok=True)
    servers: dict[str, Server] = {}
    try:
        with contextlib.ExitStack() as stack:
            for target, (command, env) in commands.items():
                begin = time.perf_counter()
                servers[target] = stack.enter_context(started(target, command, env, logs, plan))
                result["servers"][target]["startup_s"] = round(time.perf_counter() - begin, 1)
            with httpx.Client(timeout=30) as client:
                result["servers"][OURS]["models"] = client.get(servers[OURS].url + "/models").json()
                result["servers"][PEER]["stats_at_start"] = client.get(servers[PEER].url + "/stats").json()
            for concurrency in plan.clients:
                for one in targets_for(servers, built, inputs, plan):
                    label = f"{one.server.target} rho {one.rho} × {concurrency} clients"
                    if plan.seconds_left() < plan.cell_s:
                        result["skipped_for_time"].append(label)
                        continue
                    cell = asyncio.run(measure_cell(one, concurrency, plan, built.name, mean_inputs))
                    result["cells"].append(cell)
    except Exception:
        result["status"] = "failed: " + traceback.format_exc(limit=4).strip().splitlines()[-1]
        result["traceback"] = traceback.format_exc()
        result["logs"] = {path.name: log_tail(path) for path in sorted(logs.glob("*.log"))}
    result["ratios"] = ratios(result["cells"])
    return result


def ratios(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """Ours against the peer at each client count: req/s and p99 ratios, and the issue's targets."""
    peer = {c["concurrency"]: c for c in cells if c["target"] == PEER}
    found: dict[str, Any] = {}
    for cell in cells:
        base = peer.get(cell["concurrency"])
        if cell["target"] != OURS or base is None or not base["throughput_rps"]:
            continue
        key = f"{cell['rho']}@{cell['concurrency']}"
        found[key] = {
            "rps_vs_peer": round(cell["throughput_rps"] / base["throughput_rps"], 3),
            "p99_vs_peer": round(cell["p99_ms"] / base["p99_ms"], 3)
            if cell["p99_ms"] and base["p99_ms"]
            else None,
        }
    targets = {}
    for rho, wanted in RPS_TARGETS.items():
        got = found.get(f"{rho}@{TARGET_CLIENTS}", {}).get("rps_vs_peer")
        targets[f"rps rho {rho} @ {TARGET_CLIENTS} clients >= {wanted}x"] = (
            None if got is None else got >= wanted
        )
    p99 = found.get(f"1@{P99_CLIENTS}", {}).get("p99_vs_peer")
    targets[f"p99 rho 1 @ {P99_CLIENTS} clients <= peer"] = None if p99 is None else p99 <= 1.0
    return {"by_cell": found, "targets": targets}


def measure(plan: Plan, texts: list[str], assets: Path | None) -> dict[str, dict[str, Any]]:
    tokenizer = tokenizer_for(assets)
    shapes: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="gpu-service-") as tmp:
        for index, shape_name in enumerate(plan.shapes):
            if index > 0 and plan.seconds_left() < plan.min_shape_s:
                shapes[shape_name] = {"status": OUT_OF_TIME}
                continue
            try:
                shapes[shape_name] = measure_shape(shape_name, plan, texts, tokenizer, Path(tmp))
            except Exception:
                shapes[shape_name] = {
                    "status": "failed: " + traceback.format_exc(limit=4).strip().splitlines()[-1],
                    "traceback": traceback.format_exc(),
                }
    return shapes


# ---------------------------------------------------------------------------------------- markdown
def _mib(value: float | None) -> str:
    return "—" if value is None else f"{value / MIB:.0f}"


def markdown(payload: dict[str, Any]) -> str:
    plan = payload["plan"]
    machine = payload["machine"]
    cpu = f"{machine.get('cpu', '?')} (CPU class {recorded_cpu_class(machine)})"
    where = payload["gpu"] or f"{cpu}, {machine.get('cores', '?')} cores"
    lines = [
        f"# /v1/embeddings end to end: ours vs sentence-transformers ({payload['mode']})",
        "",
        f"Machine: {where}. Ours: `python -m service`, {payload['our_backend']}; peer: sentence-transformers "
        f"encode ({payload['peer_dtype']}) behind FastAPI with a batching queue (≤ {plan['peer_max_batch']} "
        f"texts, {plan['peer_max_wait_ms']:g} ms wait). Same random weights, mean pooling + normalize, "
        f"≤ {plan['max_length']} tokens. {payload['texts']['count']} SQuAD dev paragraphs at their own "
        f"lengths, {plan['min_inputs']}–{plan['max_inputs']} per request, encoding_format "
        f"{plan['encoding_format']}; {plan['warmup_s']:g} s warm-up + {plan['seconds']:g} s per cell; "
        f"rho=auto with min_rho {plan['auto_min_rho']:g}.",
        "",
        "| shape | server | ρ | clients | req/s | vs peer | texts/s | p50 ms | p99 ms | errors | token work "
        "| runs | rows/run | tokens/run | device MiB (peak) | RSS MiB | client CPU |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    notes: list[str] = []
    for shape_name, shape in payload["shapes"].items():
        if shape.get("status") != MEASURED:
            notes.append(f"- {shape_name}: {shape.get('status')}")
        by_cell = shape.get("ratios", {}).get("by_cell", {})
        for c in shape.get("cells", []):
            ratio = by_cell.get(f"{c['rho']}@{c['concurrency']}", {}).get("rps_vs_peer")
            b = c["batches"]
            memory = (
                "—"
                if c["device_memory_bytes"] is None
                else f"{_mib(c['device_memory_bytes'])} ({_mib(c['device_memory_peak_bytes'])})"
            )
            cells = [
                shape_name,
                c["target"],
                c["rho"],
                c["concurrency"],
                fmt(c["throughput_rps"]),
                "—" if ratio is None else f"{ratio:.2f}×",
                fmt(c["texts_per_s"]),
                fmt(c["p50_ms"]),
                fmt(c["p99_ms"]),
                c["errors"],
                fmt(c["mean_work_fraction"], 3),
                b["runs"],
                fmt(b["mean_rows"]),
                fmt(b["mean_padded_tokens"], 0),
                memory,
                fmt(c["rss_mib"], 0),
                f"{c['client_cpu_share']:.2f}",
            ]
            lines.append("| " + " | ".join(map(str, cells)) + " |")
        for skipped in shape.get("skipped_for_time", []):
            notes.append(f"- {shape_name}: not measured, out of the time budget: {skipped}")
        for target, passed in shape.get("ratios", {}).get("targets", {}).items():
            verdict = "not measured" if passed is None else ("met" if passed else "NOT met")
            notes.append(f"- {shape_name}, target {target}: {verdict}")
    lines += ["", *notes, "", f"Command: `{payload['command']}`", ""]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------- CLI
def int_list(text: str) -> tuple[int, ...]:
    return tuple(int(item) for item in text.split(",") if item.strip())


def str_list(text: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in text.split(",") if item.strip())


def env_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.startswith("RETENTION_"):
        raise argparse.ArgumentTypeError(f"expected RETENTION_NAME=VALUE, got {text!r}")
    return key, value


def parse(argv: list[str]) -> argparse.Namespace:
    parser = cli(MODULE, __doc__)
    parser.add_argument("--out", type=Path, help="directory for the JSON and its table")
    parser.add_argument("--dry-run", action="store_true", help="the same code paths on this CPU, tiny")
    parser.add_argument("--cpu", action="store_true", help="the CPU row: onnxruntime vs the peer on the CPU")
    parser.add_argument("--assets", type=Path, help="what --write-assets saved")
    parser.add_argument("--write-assets", type=Path, metavar="DIR", help="save the documents and exit")
    parser.add_argument("--texts-file", type=Path, help="SQuAD-layout JSON Lines (gz) with 'context'")
    parser.add_argument("--max-texts", type=int, default=ASSET_PARAGRAPHS)
    parser.add_argument("--shapes", type=str_list, help="minilm,base (default both; the dry run: tiny)")
    parser.add_argument("--clients", type=int_list, default=CLIENTS, help="concurrent clients, e.g. 8,64")
    parser.add_argument("--rhos", type=str_list, default=RHOS, help="ours, e.g. 1,0.5,0.3,auto")
    parser.add_argument("--seconds", type=float, help=f"per measured cell (default {CELL_SECONDS})")
    parser.add_argument("--warmup-s", type=float, help=f"per cell, unrecorded (default {WARMUP_SECONDS})")
    parser.add_argument("--max-length", type=int, default=MAX_LENGTH, help="tokens per text (both servers)")
    parser.add_argument("--inputs", type=int_list, default=(1, 4), help="texts per request: min,max")
    parser.add_argument("--bodies", type=int, default=256, help="distinct requests, cycled")
    parser.add_argument("--encoding-format", choices=["float", "base64"], default="float")
    parser.add_argument("--auto-min-rho", type=float, default=0.3)
    parser.add_argument("--peer-max-batch", type=int, default=32, help="texts per encode (Infinity's 32)")
    parser.add_argument(
        "--peer-max-wait-ms", type=float, default=2.0, help="as ours: RETENTION_MAX_BATCH_WAIT_MS"
    )
    parser.add_argument(
        "--service-env", type=env_pair, action="append", default=[], help="RETENTION_X=V for our server"
    )
    parser.add_argument("--budget-s", type=float, help="no cell or shape starts past this")
    parser.add_argument("--pid-file", type=Path, help="append each server's pid (process group) here")
    parser.add_argument("--ready-timeout-s", type=float, default=300.0)
    parser.add_argument("--timeout-s", type=float, default=60.0, help="per request")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.out is None and args.write_assets is None:
        parser.error("--out is required")
    if len(args.inputs) != 2 or not 1 <= args.inputs[0] <= args.inputs[1]:
        parser.error("--inputs is min,max with 1 <= min <= max")
    for rho in args.rhos:
        if rho != "auto" and not 0.0 < float(rho) <= 1.0:
            parser.error(f"rho must be in (0, 1] or 'auto', got {rho}")
    return args


def make_plan(args: argparse.Namespace) -> Plan:
    from benchmarks.gpu_forward import DRY_SHAPES, SHAPES

    if not args.cpu and not args.dry_run:
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("no CUDA device here: run it on a GPU machine, --cpu, or --dry-run")
    known = {**SHAPES, **DRY_SHAPES}
    names = args.shapes or (tuple(DRY_SHAPES) if args.dry_run else SHAPE_ORDER)
    unknown = [name for name in names if name not in known]
    if unknown:
        raise SystemExit(f"unknown shapes {unknown}; have {sorted(known)}")
    dry = args.dry_run

    def default(by_run: dict[str, float]) -> float:
        return by_run["dry"] if dry else by_run["cpu" if args.cpu else "gpu"]

    return Plan(
        mode=make_mode(args.cpu, dry),
        dry_run=dry,
        shapes={name: known[name] for name in names},
        clients=args.clients,
        rhos=args.rhos,
        seconds=args.seconds if args.seconds is not None else default(CELL_SECONDS),
        warmup_s=args.warmup_s if args.warmup_s is not None else default(WARMUP_SECONDS),
        max_length=min(args.max_length, 64) if dry else args.max_length,
        min_inputs=args.inputs[0],
        max_inputs=args.inputs[1],
        bodies=min(args.bodies, 32) if dry else args.bodies,
        encoding_format=args.encoding_format,
        auto_min_rho=args.auto_min_rho,
        peer_max_batch=args.peer_max_batch,
        peer_max_wait_ms=args.peer_max_wait_ms,
        ready_timeout_s=args.ready_timeout_s,
        timeout_s=args.timeout_s,
        seed=args.seed,
        service_env=dict(args.service_env),
        deadline=None if args.budget_s is None else time.perf_counter() + args.budget_s,
        min_shape_s=0.0 if dry else MIN_SHAPE_S,
        pid_file=args.pid_file,
    )


def plan_record(plan: Plan) -> dict[str, Any]:
    record = asdict(replace(plan, deadline=None, pid_file=None))
    record.pop("deadline")
    record.pop("pid_file")
    record["mode"] = plan.mode.name
    return record


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    if args.write_assets is not None:
        write_assets(args.write_assets, args.seed)
        return {}
    started_at = time.perf_counter()
    plan = make_plan(args)
    texts, source = read_paragraphs(args)
    if len(texts) < plan.max_inputs:
        raise SystemExit(f"{len(texts)} documents read from {source}: fewer than --inputs' max")
    payload: dict[str, Any] = {
        "what": "POST /v1/embeddings end to end: our server vs sentence-transformers behind FastAPI, "
        "same weights, same documents, same clients",
        "dry_run": plan.dry_run,
        "mode": plan.mode.name,
        "gpu": gpu_name(),
        "our_backend": plan.mode.our_label,
        "peer_dtype": plan.mode.peer_dtype,
        "plan": plan_record(plan),
        "texts": {"source": source, "count": len(texts), "seed": args.seed},
        "shapes": measure(plan, texts, args.assets),
        "versions": {name: installed(name) for name in (*PEER_PACKAGES, *OUR_PACKAGES)},
    }
    out = args.out / (CPU_RESULT if args.cpu else GPU_RESULT)
    publish(payload, markdown, out, MODULE, argv, machine=True, started=started_at)
    if any(str(shape["status"]).startswith("failed") for shape in payload["shapes"].values()):
        raise SystemExit(1)
    return payload


if __name__ == "__main__":
    main()
