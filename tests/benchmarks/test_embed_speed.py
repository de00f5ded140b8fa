"""The embedding speed harness in quick mode (real ORT sessions, real sentence-transformers), and the
fused dense graph of the classification speed harness."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks import embed_speed, embedding_graphs, encoder_speed
from training.engine.encoders import load_tokenizer
from training.tiny import TINY_LAYERS, TINY_TOKENIZER


def test_quick_embed_speed_measures_every_variant_against_the_fused_peer(tmp_path: Path) -> None:
    out = tmp_path / "embed_speed.json"
    embed_speed.main(["--quick", "--int8", "--out", str(out), "--rhos", "0.5", "0.3"])
    payload = json.loads(out.read_text())
    fusion = payload["fusion"]
    assert fusion["num_layers"] == TINY_LAYERS
    assert fusion["peer_attention_fused"] == TINY_LAYERS
    # Our graph is fused at export: one Attention node per layer in each of its two branches (unpruned,
    # pruned; merged tokens' log-size in the pruned one's bias).
    assert fusion["ours_attention_fused"] == 2 * TINY_LAYERS
    assert fusion["ours_fused_operators"]["SkipLayerNormalization"] == 4 * TINY_LAYERS
    variants = {r["variant"] for r in payload["results"]}
    ours = ("ours-onnx", "ours-onnx-int8")
    expected = {"peer-fused", "peer-onnx", "peer-fused-int8", "sentence-transformers"} | {
        f"{graph}@{rho}" for graph in ours for rho in ("1", "0.5", "0.3")
    }
    assert variants == expected
    assert {r["precision"] for r in payload["results"] if "int8" in r["variant"]} == {"int8"}
    assert all(r["sequences_per_second"] > 0 for r in payload["results"])
    cells = {(r["seq_len"], r["batch"]) for r in payload["results"]}
    assert cells == {(32, 1), (32, 2)}
    for seq_len, batch in cells:
        rows = {r["variant"]: r for r in payload["results"] if (r["seq_len"], r["batch"]) == (seq_len, batch)}
        assert_speedups_are_the_measured_times(rows, batch)
        # The schedule's FLOP ratio (dense / pruned) for our graphs only, from the whole schedule: the
        # product's kept-token floor (32) keeps these 32-token rows dense at every ρ, so every ρ costs the
        # dense pass plus the scorers (its growth as ρ falls: tests/training/test_pipeline_parts.py).
        theory = [rows[f"ours-onnx@{rho}"]["theoretical_flop_ratio"] for rho in ("1", "0.5", "0.3")]
        assert theory[0] == theory[1] == theory[2] < 1.0
        assert all(rows[name]["theoretical_flop_ratio"] is None for name in ("peer-fused", "peer-onnx"))
    assert payload["targets"] == []  # the targets are at 256 tokens; quick mode runs 32
    assert payload["machine"]["cores"] >= 1 and payload["command"].startswith(
        "python -m benchmarks.embed_speed"
    )
    header = f"Fused attention operators: dense peer 2, ours {fusion['ours_attention_fused']}"
    assert out.with_suffix(".md").read_text().startswith(header)


def assert_speedups_are_the_measured_times(rows: dict[str, Any], batch: int) -> None:
    """One (seq_len, batch) cell: each rate is the variant's own median time; each speed-up over the fused
    peer (the median of per-round ratios) lies in its per-round range, which also holds the ratio of the
    two median times, so a speed-up taken against another variant, or inverted, falls outside it. fp32
    variants' same-precision peer is the fused peer itself; int8 variants' is the int8 peer's rounds."""
    reference = rows[embed_speed.REFERENCE]
    for name, row in rows.items():
        assert row["sequences_per_second"] == pytest.approx(batch / row["seconds_per_batch"])
        low, high = row["speedup_min"] * (1 - 1e-9), row["speedup_max"] * (1 + 1e-9)
        assert low <= row["speedup_vs_fused_peer"] <= high, name
        assert low <= reference["seconds_per_batch"] / row["seconds_per_batch"] <= high, name
        same_precision = row["speedup_vs_same_precision_peer"]
        if row["precision"] == "fp32":
            assert same_precision == row["speedup_vs_fused_peer"], name
        else:  # other rounds than the fp32 peer's: not the same number (equal floats only by accident)
            assert same_precision != row["speedup_vs_fused_peer"], name


@pytest.mark.parametrize("seq_len", [8, 512])
def test_documents_tokenize_to_exactly_the_asked_length(seq_len: int) -> None:
    tokenizer = load_tokenizer(TINY_TOKENIZER)
    texts = embedding_graphs.documents(tokenizer, 3, seq_len, np.random.default_rng(0))
    feeds = embedding_graphs.token_feeds(tokenizer, texts, seq_len)
    assert {name: array.shape for name, array in feeds.items()} == {
        "input_ids": (3, seq_len),
        "attention_mask": (3, seq_len),
        "token_type_ids": (3, seq_len),
    }


def test_target_checks_compare_fp32_with_fp32_at_256_tokens() -> None:
    def row(variant: str, rho: float | None, speedup: float) -> dict[str, Any]:
        precision = "int8" if "int8" in variant else "fp32"
        fields = ("variant", "precision", "rho", "seq_len", "batch", "speedup_vs_fused_peer")
        return dict(zip(fields, (variant, precision, rho, 256, 8, speedup), strict=True))

    results = [
        row("peer-fused", None, 1.0),
        row("ours-onnx@0.5", 0.5, 1.9),
        row("ours-onnx-int8@0.5", 0.5, 2.6),  # int8 is not compared with the fp32 peer's target
    ]
    (check,) = embed_speed.target_checks(results)
    assert check == {
        "rho": 0.5,
        "batch": 8,
        "target": 1.8,
        "variant": "ours-onnx@0.5",
        "speedup_vs_fused_peer": 1.9,
        "met": True,
    }


def test_encoder_speed_times_the_fused_dense_graph_too(tmp_path: Path) -> None:
    out = tmp_path / "speed.json"
    encoder_speed.main(["--quick", "--out", str(out), "--rhos", "0.3", "--no-int8", "--no-torch-baseline"])
    rows = {r["variant"]: r for r in json.loads(out.read_text())["results"]}
    assert set(rows) == {encoder_speed.DENSE, encoder_speed.FUSED_DENSE, "pruned-onnx-fp32@0.3"}
    assert all(r["speedup_vs_fused_dense"] > 0 for r in rows.values())
    assert "vs fused dense ONNX" in out.with_suffix(".md").read_text()
