"""The embedding speed harness in quick mode (real ORT sessions, real sentence-transformers), and the
fused dense graph of the classification speed harness."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from benchmarks import embed_speed, encoder_speed
from training.encoders import load_tokenizer
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
    reference = [r for r in payload["results"] if r["variant"] == "peer-fused"]
    assert all(r["speedup_vs_fused_peer"] == 1.0 for r in reference)
    peer_int8 = [r for r in payload["results"] if r["variant"] == "peer-fused-int8"]
    assert all(r["speedup_vs_same_precision_peer"] == 1.0 for r in peer_int8)  # int8 against int8
    assert {r["precision"] for r in payload["results"] if "int8" in r["variant"]} == {"int8"}
    assert all(r["sequences_per_second"] > 0 for r in payload["results"])
    assert payload["targets"] == []  # the targets are at 256 tokens; quick mode runs 32
    assert payload["machine"]["cores"] >= 1 and payload["command"].startswith(
        "python -m benchmarks.embed_speed"
    )
    header = f"Fused attention operators: dense peer 2, ours {fusion['ours_attention_fused']}"
    assert out.with_suffix(".md").read_text().startswith(header)


@pytest.mark.parametrize("seq_len", [8, 512])
def test_documents_tokenize_to_exactly_the_asked_length(seq_len: int) -> None:
    tokenizer = load_tokenizer(TINY_TOKENIZER)
    texts = embed_speed.documents(tokenizer, 3, seq_len, np.random.default_rng(0))
    feeds = embed_speed.token_feeds(tokenizer, texts, seq_len)
    assert {name: array.shape for name, array in feeds.items()} == {
        "input_ids": (3, seq_len),
        "attention_mask": (3, seq_len),
        "token_type_ids": (3, seq_len),
    }


def test_target_checks_compare_fp32_with_fp32_at_256_tokens() -> None:
    def row(variant: str, rho: float | None, speedup: float) -> embed_speed.Measurement:
        precision = "int8" if "int8" in variant else "fp32"
        return embed_speed.Measurement(
            variant, precision, rho, 256, 8, 1.0, 8.0, speedup, speedup, speedup, speedup, None
        )

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
