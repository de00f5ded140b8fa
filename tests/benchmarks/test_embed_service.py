"""experiments/embed_service.py: the --quick smoke (a real ``python -m service`` subprocess over a tiny
exported embedding model, real HTTP on loopback), a server that dies at start, and the pooling and
agreement arithmetic the report is made of."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import psutil
import pytest

from experiments import embed_service
from tests.tiny import write_rows

pytestmark = pytest.mark.integration  # servers on sockets

PARAGRAPHS = [
    f"Paragraph {index} tells how the {topic} changed the town over {index + 2} long years, "
    "and who remembered it afterwards."
    for index, topic in enumerate(
        ["river", "railway", "harbour", "market", "school", "bridge", "mill", "fair"]
    )
]


def squad_like(path: Path) -> Path:
    """Rows shaped like SQuAD dev (several questions share one context)."""
    rows = [{"question": f"what about {i}?", "context": text} for text in PARAGRAPHS for i in range(2)]
    write_rows(path, rows)
    return path


def running_service_children() -> list[psutil.Process]:
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if "service" in child.cmdline() and child.is_running() and child.status() != psutil.STATUS_ZOMBIE:
                found.append(child)
        except psutil.NoSuchProcess:
            continue
    return found


def test_quick_smoke_drives_our_server_over_http(tmp_path: Path) -> None:
    out = tmp_path / "bench" / "embed_service.json"
    texts = squad_like(tmp_path / "squad" / "validation.jsonl.gz")
    argv = ["--quick", "--out", str(out), "--texts-file", str(texts), "--inputs-per-request", "2"]
    embed_service.main(argv)

    saved = json.loads(out.read_text())  # what the committed results are: the file, not the return value
    assert saved["machine"]["cores"] >= 1 and saved[
        "command"
    ] == "python -m experiments.embed_service " + " ".join(argv)
    assert set(saved["servers"]) == {"service"} and saved["agreement"] is None  # no Infinity in this venv
    assert saved["texts"]["count"] == len(PARAGRAPHS)  # distinct contexts only
    summary = {(row["rho"], row["concurrency"]): row for row in saved["summary"]}
    assert set(summary) == {(rho, c) for rho in embed_service.DEFAULT_RHOS for c in (1, 4)}
    for cell in saved["results"]:
        assert cell["ok"] == cell["sent"] > 0 and cell["errors"] == 0, json.dumps(cell)
        assert cell["p50_ms"] <= cell["p99_ms"]
        assert cell["texts_per_s"] == pytest.approx(2 * cell["throughput_rps"])
        assert 0 < cell["rss_idle_mib"] <= cell["rss_peak_mib"]
    for concurrency in (1, 4):
        work = [summary[(rho, concurrency)]["mean_work_fraction"] for rho in ("1", "0.5", "0.3")]
        assert work[0] == pytest.approx(1.0) and work[0] > work[1] > work[2]
    table = out.with_suffix(".md").read_text()
    assert "| service | 0.3 | 4 |" in table and "Agreement: not measured" in table
    assert running_service_children() == []  # the server was stopped


def test_a_server_that_dies_at_start_is_reported_with_its_log(tmp_path: Path) -> None:
    code = "import sys; print('no model here'); sys.exit(3)"
    spec = embed_service.ServerSpec("service", [sys.executable, "-c", code], None, ("1",))
    with (
        pytest.raises(RuntimeError, match=r"exited \(3\)[\s\S]*no model here"),
        embed_service.started(spec, tmp_path, timeout_s=30),
    ):
        pass


def unit_rows(matrix: np.ndarray) -> np.ndarray:
    return matrix / np.linalg.norm(matrix, axis=1, keepdims=True)


def test_agreement_compares_each_rho_with_the_peer() -> None:
    rng = np.random.default_rng(0)
    peer = unit_rows(rng.normal(size=(6, 8)))  # (N, d)
    pruned = unit_rows(peer + 0.5 * rng.normal(size=peer.shape))
    found = embed_service.agreement({"infinity": {"-": peer}, "service": {"1": peer.copy(), "0.3": pruned}})
    assert found is not None and found["texts"] == 6
    assert found["cosine_vs_infinity"]["1"] == {"mean": 1.0, "min": 1.0, "p5": 1.0}
    lower = found["cosine_vs_infinity"]["0.3"]
    assert lower["min"] <= lower["p5"] <= lower["mean"] < 1.0
    assert embed_service.agreement({"service": {"1": peer}}) is None  # no peer
    tiny = unit_rows(rng.normal(size=(6, 4)))
    assert embed_service.agreement({"infinity": {"-": peer}, "service": {"1": tiny}}) is None  # other model


def test_summary_pools_rounds() -> None:
    def cell(round_index: int, ok: int, seconds: float, p50: float) -> dict:
        return {
            "target": "infinity",
            "rho": "-",
            "concurrency": 8,
            "round": round_index,
            "ok": ok,
            "errors": 0,
            "seconds": seconds,
            "throughput_rps": ok / seconds,
            "texts_per_s": 4 * ok / seconds,
            "p50_ms": p50,
            "p99_ms": 2 * p50,
            "mean_work_fraction": None,
            "rss_idle_mib": 100.0 + round_index,
            "rss_peak_mib": 120.0 + round_index,
        }

    (row,) = embed_service.summarise([cell(0, 100, 10.0, 30.0), cell(1, 300, 20.0, 50.0)])
    assert row["rounds"] == 2 and row["ok"] == 400
    assert row["requests_per_s"] == pytest.approx(400 / 30) and row["texts_per_s"] == pytest.approx(1600 / 30)
    assert row["requests_per_s_by_round"] == [10.0, 15.0]
    assert row["p50_ms"] == 40.0 and row["p99_ms"] == 80.0
    assert row["rss_idle_mib"] == 101.0 and row["rss_peak_mib"] == 121.0
