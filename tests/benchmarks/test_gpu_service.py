"""benchmarks/gpu_service.py: its CPU dry run end to end (a tiny random model through the real exporter,
the real ``python -m service`` on the torch backend and the real sentence-transformers peer server as
subprocesses, real HTTP on loopback), the CPU row's onnxruntime variant, the peer's batching queue, and
the arithmetic the report is made of (histogram deltas of /metrics, ratios against the peer)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import psutil
import pytest

from benchmarks import gpu_service, st_peer
from tests.benchmarks.cells import assert_answered_or_shed
from tests.tiny import write_rows

TOPICS = ["river", "railway", "harbour", "market", "school", "bridge", "mill", "fair", "castle", "forest"]


def squad_like(path: Path) -> Path:
    """SQuAD-layout rows (questions share a context); paragraphs of 40–90 words, past the selection's
    32-token floor, so that ρ < 1 prunes."""
    rows = []
    for index, topic in enumerate(TOPICS):
        words = " ".join(
            f"the {topic} changed the town in year {year} and people remembered it"
            for year in range(index + 4)
        )
        rows += [
            {"question": f"what about {q}?", "context": f"Paragraph {index}: {words}."} for q in range(2)
        ]
    write_rows(path, rows)
    return path


def server_children() -> list[psutil.Process]:
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            command = " ".join(child.cmdline())
            alive = child.is_running() and child.status() != psutil.STATUS_ZOMBIE
            if alive and ("-m service" in command or "benchmarks.st_peer" in command):
                found.append(child)
        except psutil.NoSuchProcess:
            continue
    return found


@pytest.mark.integration  # two servers on sockets
def test_the_dry_run_drives_both_servers_over_http(tmp_path: Path) -> None:
    texts = squad_like(tmp_path / "squad" / "validation.jsonl.gz")
    out = tmp_path / "bench"
    argv = ["--dry-run", "--out", str(out), "--texts-file", str(texts)]
    gpu_service.main(argv)

    saved = json.loads((out / gpu_service.GPU_RESULT).read_text())  # the file is what gets committed
    assert saved["command"] == "python -m benchmarks.gpu_service " + " ".join(argv)
    assert saved["dry_run"] is True and saved["mode"] == "gpu dry run (cpu)" and saved["gpu"] is None
    assert saved["machine"]["cores"] >= 1 and saved["texts"]["count"] == len(TOPICS)
    assert saved["versions"]["sentence-transformers"] and saved["versions"]["fastapi"]
    (shape,) = saved["shapes"].values()
    assert shape["status"] == gpu_service.MEASURED and shape["skipped_for_time"] == []
    assert shape["servers"]["service"]["env"]["RETENTION_BACKEND"] == "torch"
    (model,) = shape["servers"]["service"]["models"]["models"]
    assert model["backend"] == "torch" and model["device"] == "cpu" and model["task"] == "embedding"
    assert model["pruned_branch_bytes"] > 0  # the product's shape: ρ < 1 runs a copy of its own
    grid = {(c["target"], c["rho"], c["concurrency"]) for c in shape["cells"]}
    ours = {("service", rho, clients) for rho in gpu_service.RHOS for clients in gpu_service.CLIENTS}
    assert grid == ours | {("sentence-transformers", "-", clients) for clients in gpu_service.CLIENTS}
    for cell in shape["cells"]:
        assert_answered_or_shed(cell)
        assert cell["p50_ms"] <= cell["p99_ms"] and cell["texts_per_s"] > cell["throughput_rps"]
        assert cell["batches"]["runs"] > 0 and cell["batches"]["mean_rows"] >= 1
        assert cell["rss_mib"] > 0 and cell["client_cpu_share"] > 0
        assert cell["device_memory_bytes"] is None  # no accelerator here
        if cell["target"] == "service":  # the scheduler's runs, read from /metrics
            assert cell["batches"]["mean_padded_tokens"] >= cell["batches"]["mean_rows"]
            assert sum(cell["batches"]["rows_buckets"].values()) == cell["batches"]["runs"]
    work = {(c["rho"], c["concurrency"]): c["mean_work_fraction"] for c in shape["cells"] if c["rho"] != "-"}
    for clients in gpu_service.CLIENTS:
        assert work[("1", clients)] == pytest.approx(1.0) and work[("0.3", clients)] < 0.9
    by_cell = shape["ratios"]["by_cell"]
    assert set(by_cell) == {f"{rho}@{clients}" for rho in gpu_service.RHOS for clients in gpu_service.CLIENTS}
    assert all(ratio["rps_vs_peer"] > 0 for ratio in by_cell.values())
    assert len(shape["ratios"]["targets"]) == 4 and all(
        isinstance(met, bool) for met in shape["ratios"]["targets"].values()
    )
    table = (out / gpu_service.GPU_RESULT).with_suffix(".md").read_text()
    assert "| tiny | service | 0.3 | 64 |" in table and "| tiny | sentence-transformers | - | 8 |" in table
    assert server_children() == []  # both servers were stopped


@pytest.mark.integration
def test_the_cpu_row_runs_onnxruntime_against_the_peer(tmp_path: Path) -> None:
    texts = squad_like(tmp_path / "squad" / "validation.jsonl.gz")
    argv = ["--cpu", "--dry-run", "--out", str(tmp_path), "--texts-file", str(texts)]
    gpu_service.main([*argv, "--clients", "8", "--rhos", "1,0.3", "--seconds", "0.5"])
    saved = json.loads((tmp_path / gpu_service.CPU_RESULT).read_text())
    (shape,) = saved["shapes"].values()
    assert saved["mode"] == "cpu dry run" and shape["status"] == gpu_service.MEASURED
    (model,) = shape["servers"]["service"]["models"]["models"]
    assert model["backend"] == "onnxruntime" and model["pruned_branch_bytes"] > 0
    assert [(c["target"], c["rho"]) for c in shape["cells"]] == [
        ("sentence-transformers", "-"),
        ("service", "1"),
        ("service", "0.3"),
    ]
    for cell in shape["cells"]:
        assert_answered_or_shed(cell)  # fixed ρ only: every request answered


@pytest.mark.integration
def test_a_shape_past_the_budget_is_recorded_not_measured(tmp_path: Path) -> None:
    texts = squad_like(tmp_path / "squad" / "validation.jsonl.gz")
    args = gpu_service.parse(
        ["--dry-run", "--out", str(tmp_path), "--texts-file", str(texts), "--budget-s", "0"]
    )
    plan = gpu_service.make_plan(args)
    plan = replace(plan, shapes={"tiny": plan.shapes["tiny"], "again": plan.shapes["tiny"]})
    plan = replace(plan, min_shape_s=60.0)
    shapes = gpu_service.measure(plan, gpu_service.read_paragraphs(args)[0], None)
    assert shapes["again"] == {"status": gpu_service.OUT_OF_TIME}
    first = shapes["tiny"]  # built and started, but no cell fits in no time
    assert first["status"] == gpu_service.MEASURED and first["cells"] == []
    assert len(first["skipped_for_time"]) == len(gpu_service.CLIENTS) * (len(gpu_service.RHOS) + 1)


def test_histogram_deltas_are_the_observations_between_two_scrapes() -> None:
    def samples(counts: dict[str, float], total: float) -> gpu_service.Samples:
        found: gpu_service.Samples = {}
        model = (("model", "m"),)
        for le, value in counts.items():
            found[("retention_batch_size_bucket", tuple(sorted({"model": "m", "le": le}.items())))] = value
        found[("retention_batch_size_count", model)] = counts["+Inf"]
        found[("retention_batch_size_sum", model)] = total
        return found

    before = samples({"1.0": 2, "8.0": 3, "32.0": 3, "+Inf": 3}, 10.0)
    after = samples({"1.0": 2, "8.0": 6, "32.0": 9, "+Inf": 9}, 10.0 + 3 * 6 + 6 * 20)
    delta = gpu_service.histogram_delta(before, after, "retention_batch_size", "m")
    assert delta == {"count": 6, "mean": (18 + 120) / 6, "buckets": {"8.0": 3, "32.0": 3}}
    assert gpu_service.histogram_delta(after, after, "retention_batch_size", "m")["mean"] is None


def test_ratios_and_targets_read_ours_against_the_peer_at_the_same_clients() -> None:
    def cell(target: str, rho: str, clients: int, rps: float, p99: float) -> dict:
        return {"target": target, "rho": rho, "concurrency": clients, "throughput_rps": rps, "p99_ms": p99}

    cells = [
        cell("sentence-transformers", "-", 64, 100.0, 50.0),
        cell("service", "1", 64, 110.0, 40.0),
        cell("service", "0.5", 64, 120.0, 40.0),
        cell("sentence-transformers", "-", 8, 50.0, 10.0),
        cell("service", "1", 8, 60.0, 9.0),
    ]
    found = gpu_service.ratios(cells)
    assert found["by_cell"]["1@64"] == {"rps_vs_peer": 1.1, "p99_vs_peer": 0.8}
    assert found["targets"] == {
        "rps rho 1 @ 64 clients >= 1.0x": True,
        "rps rho 0.5 @ 64 clients >= 1.3x": False,
        "rps rho 0.3 @ 64 clients >= 1.6x": None,  # not measured
        "p99 rho 1 @ 8 clients <= peer": True,
    }


def test_the_peer_batches_what_waited_and_keeps_a_large_request_whole() -> None:
    seen: list[int] = []

    def encode(texts: list[str]) -> np.ndarray:
        seen.append(len(texts))
        return np.asarray([[float(len(text))] for text in texts], dtype=np.float32)  # (N, 1)

    async def scenario() -> list[np.ndarray]:
        batcher = st_peer.Batcher(encode, max_batch=4, max_wait_s=0.05)
        worker = asyncio.create_task(batcher.run())
        requests = [["a", "bb"], ["ccc"], ["dddd", "e"], ["f" * 6] * 5]
        answers = await asyncio.gather(*(batcher.submit(texts) for texts in requests))
        worker.cancel()
        batcher.executor.shutdown()
        return answers

    answers = asyncio.run(scenario())
    assert [a[:, 0].tolist() for a in answers] == [[1, 2], [3], [4, 1], [6] * 5]  # each its own rows
    assert seen == [3, 2, 5]  # in arrival order, at most 4 texts unless one request is larger
