"""benchmarks.retrieval: the ranking metrics on hand-made rankings, the equal-work truncation, and the CLI
end to end on a tiny embedding model and a tiny question → paragraph file."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from benchmarks import retrieval
from retention_core.codecs.base import Row
from tests.tiny import tiny_model, tiny_recipe, write_rows
from training.fit import save_run


def test_gold_ranks_count_better_documents_and_break_ties_by_index() -> None:
    scores = np.array(
        [
            [0.9, 0.1, 0.5],  # gold 0 is best → 1
            [0.9, 0.1, 0.5],  # gold 1 is worst → 3
            [0.5, 0.2, 0.5],  # gold 2 ties document 0, which comes first → 2
            [0.5, 0.2, 0.5],  # gold 0 ties document 2, comes first → 1
        ]
    )
    assert retrieval.gold_ranks(scores, np.array([0, 1, 2, 0])).tolist() == [1, 3, 2, 1]


def test_ranking_metrics_of_known_ranks() -> None:
    metrics = retrieval.ranking_metrics(np.array([1, 2, 11, 10]))
    assert metrics["ndcg@10"] == pytest.approx(100 * (1 + 1 / math.log2(3) + 0 + 1 / math.log2(11)) / 4)
    assert metrics["mrr@10"] == pytest.approx(100 * (1 + 0.5 + 0 + 0.1) / 4)
    assert metrics["recall@1"] == pytest.approx(25.0)
    assert metrics["recall@10"] == pytest.approx(75.0)
    assert retrieval.ranking_metrics(np.array([1, 1]))["ndcg@10"] == pytest.approx(100.0)


def test_search_is_cosine_not_dot_product() -> None:
    documents = np.array([[10.0, 0.0], [0.6, 0.8]])  # the long vector would win a dot product
    queries = np.array([[0.5, 0.9]])
    assert retrieval.search(queries, documents, np.array([1])).tolist() == [1]
    assert retrieval.search(queries, documents, np.array([0])).tolist() == [2]


def test_cosine_distribution_reports_the_spread() -> None:
    dense = np.eye(4)
    pruned = np.array([[1.0, 0, 0, 0], [0, 2.0, 0, 0], [0, 1.0, 1.0, 0], [0, 0, 0, -1.0]])
    summary = retrieval.cosine_distribution(pruned, dense)
    assert summary["min"] == pytest.approx(-1.0)
    assert summary["mean"] == pytest.approx((1 + 1 + 1 / math.sqrt(2) - 1) / 4, abs=1e-4)
    assert summary["p50"] == pytest.approx(np.median([1, 1, 1 / math.sqrt(2), -1]), abs=1e-4)


def test_truncation_keeps_the_head_and_sep_at_the_asked_work() -> None:
    row = Row(tuple(range(100, 110)))  # [CLS]=100 … [SEP]=109
    assert retrieval.truncated_to_work(row, 0.5).input_ids == (100, 101, 102, 103, 109)
    assert retrieval.truncated_to_work(row, 0.01).input_ids == (100, 109)
    assert retrieval.truncated_to_work(row, 1.0).input_ids == row.input_ids


PARAGRAPHS = [
    "The Normans were the people who in the 10th and 11th centuries gave their name to Normandy.",
    "The Amazon rainforest covers much of the Amazon basin of South America.",
    "Photosynthesis converts light energy into chemical energy stored in sugars.",
    "The Super Bowl is the annual championship game of the National Football League.",
]
QUESTIONS = [
    ("Who gave their name to Normandy?", 0),
    ("In what centuries did the Normans name Normandy?", 0),
    ("What basin does the Amazon rainforest cover?", 1),
    ("What does photosynthesis store energy in?", 2),
    ("What league plays the Super Bowl?", 3),
]


def test_cli_on_a_tiny_model(tmp_path: Path) -> None:
    model, tokenizer = tiny_model("embedding")
    run_dir = tmp_path / "run"
    save_run(model, tiny_recipe("embedding"), tokenizer, run_dir)
    data = tmp_path / "squad" / "validation.jsonl.gz"
    write_rows(data, [{"question": q, "context": PARAGRAPHS[gold]} for q, gold in QUESTIONS])
    out, cache = tmp_path / "results" / "tiny-embedding-retrieval", tmp_path / "cache"
    arguments = [str(run_dir), "--out", str(out), "--data", str(data), "--rhos", "1", "0.5", "0.3"]
    retrieval.main([*arguments, "--cache-dir", str(cache)])

    payload = json.loads((out / "retrieval.json").read_text())
    assert (payload["queries"], payload["documents"]) == (5, 4)
    assert len(payload["run_weights_sha1"]) == 40 and payload["encoder"].startswith("torch forward_pruned")
    results = payload["results"]
    assert set(results) == {"dense", "learned", "random", "attention", "truncation", "learned+queries"}
    assert set(results["learned"]) == {"0.5", "0.3"}
    dense = results["dense"]["1"]
    assert dense["document_cosine_to_dense"]["min"] == pytest.approx(1.0, abs=1e-4)
    for method in ("learned", "random", "attention", "truncation"):
        cell = results[method]["0.3"]
        assert 0.0 <= cell["ndcg@10"] <= 100.0 and cell["recall@10"] == 100.0  # 4 documents < 10
        assert cell["document_cosine_to_dense"]["min"] <= cell["document_cosine_to_dense"]["mean"] <= 1.0001
        assert 0.0 < cell["document_token_work"] < 1.0
    # Truncation does the pruned schedule's token-work (up to rounding to whole tokens).
    assert results["truncation"]["0.5"]["document_token_work"] == pytest.approx(
        results["learned"]["0.5"]["document_token_work"], abs=0.08
    )
    assert [check["met"] is not None for check in payload["targets"]] == [True, True, True, True]
    assert "Targets" in (out / "retrieval.md").read_text()

    # Again from the cache: the same numbers, marked cached.
    retrieval.main([*arguments, "--out", str(tmp_path / "again"), "--cache-dir", str(cache)])
    again = json.loads((tmp_path / "again" / "retrieval.json").read_text())["results"]
    assert again["learned"]["0.3"]["ndcg@10"] == results["learned"]["0.3"]["ndcg@10"]
    assert again["random"]["0.3"]["document_cached"] and not results["random"]["0.3"]["document_cached"]


def test_report_renders_retrieval_and_embedding_evaluations(tmp_path: Path) -> None:
    """docs/benchmarks.md shows every retrieval.json, and an embedding eval.json (its metric is
    cosine_to_dense, per method and ρ) no longer breaks the page."""
    from benchmarks import report
    from training import embedding
    from training.evaluation import EvaluationRun, write_report

    model, tokenizer = tiny_model("embedding")
    recipe = tiny_recipe("embedding")
    run_dir = tmp_path / "run"
    save_run(model, recipe, tokenizer, run_dir)
    data = tmp_path / "validation.jsonl.gz"
    write_rows(data, [{"question": q, "context": PARAGRAPHS[gold]} for q, gold in QUESTIONS])
    results = tmp_path / "results"
    arguments = ["--data", str(data), "--rhos", "0.5", "--methods", "learned", "truncation"]
    retrieval.main([str(run_dir), "--out", str(results / "tiny-retrieval"), *arguments])
    examples: list[dict[str, object]] = [{"text": text} for text in PARAGRAPHS]
    evaluated = embedding.evaluate(EvaluationRun(model, tokenizer, recipe, examples), [0.5, 1.0])
    meta = {"model": "tiny-embedding", "profile": "full", "split": "texts/test", "num_examples": 4}
    write_report(evaluated, results / "tiny-embedding-full", meta, embedding.EVALUATION.table(evaluated))

    text = report.build_report(results, tmp_path / "docs").read_text(encoding="utf-8")
    assert "## Retrieval with learned retention (embeddings)" in text
    assert "### Retrieval: tiny-embedding (full)" in text and "(tiny-retrieval)" in text
    assert "| learned | 0.5 |" in text and "| truncation | 0.5 |" in text
    assert (
        "cosine_to_dense" in text
        and (tmp_path / "docs" / "plots" / "quality_tiny-embedding-full.png").is_file()
    )
