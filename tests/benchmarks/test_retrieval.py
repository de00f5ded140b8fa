"""benchmarks.retrieval: the ranking metrics on hand-made rankings, the equal-work truncation, and the CLI
end to end on a tiny embedding model and a tiny question → paragraph file."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks import retrieval, retrieval_parts
from retention_core.codecs.base import Row
from tests.tiny import tiny_model, tiny_recipe, write_rows
from training.fitting.fit import save_run


def test_gold_ranks_count_better_documents_and_break_ties_by_index() -> None:
    scores = np.array(
        [
            [0.9, 0.1, 0.5],  # gold 0 is best → 1
            [0.9, 0.1, 0.5],  # gold 1 is worst → 3
            [0.5, 0.2, 0.5],  # gold 2 ties document 0, which comes first → 2
            [0.5, 0.2, 0.5],  # gold 0 ties document 2, comes first → 1
        ]
    )
    assert retrieval_parts.gold_ranks(scores, np.array([0, 1, 2, 0])).tolist() == [1, 3, 2, 1]


def test_ranking_metrics_of_known_ranks() -> None:
    metrics = retrieval.ranking_metrics(np.array([1, 2, 11, 10]))
    assert metrics["ndcg@10"] == pytest.approx(100 * (1 + 1 / math.log2(3) + 0 + 1 / math.log2(11)) / 4)
    assert metrics["mrr@10"] == pytest.approx(100 * (1 + 0.5 + 0 + 0.1) / 4)
    assert metrics["recall@1"] == pytest.approx(25.0)
    assert metrics["recall@10"] == pytest.approx(75.0)
    assert retrieval.ranking_metrics(np.array([1, 1]))["ndcg@10"] == pytest.approx(100.0)


def test_paired_difference_is_the_mean_per_query_gap_with_its_standard_error() -> None:
    first, second = np.array([1, 1, 2, 20]), np.array([2, 1, 2, 1])
    gaps = retrieval_parts.query_ndcg(first) - retrieval_parts.query_ndcg(second)  # (4,)
    paired = retrieval.paired_difference(first, second)
    assert paired["difference"] == pytest.approx(gaps.mean(), abs=0.01)
    assert paired["se"] == pytest.approx(gaps.std(ddof=1) / 2.0, abs=0.01)
    assert retrieval.paired_difference(first, first) == {"difference": 0.0, "se": 0.0}


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
    assert retrieval_parts.truncated_to_work(row, 0.5).input_ids == (100, 101, 102, 103, 109)
    assert retrieval_parts.truncated_to_work(row, 0.01).input_ids == (100, 109)
    assert retrieval_parts.truncated_to_work(row, 1.0).input_ids == row.input_ids


def test_targets_are_met_or_missed_as_the_numbers_say() -> None:
    def learned(ndcg: float, **rivals: tuple[float, float]) -> dict[str, Any]:
        paired = {name: {"difference": d, "se": se} for name, (d, se) in rivals.items()}
        return {"ndcg@10": ndcg, "ndcg_vs_baselines": paired}

    results: dict[str, dict[str, dict[str, Any]]] = {
        "dense": {"1": {"ndcg@10": 80.0}},
        "learned": {
            "0.7": learned(79.9, truncation=(0.1, 1.0)),  # ρ above 0.5: no SE margin
            "0.5": learned(79.0, truncation=(3.0, 1.0), random=(2.5, 1.0)),  # exactly 1 point; > 2 SE
            "0.3": learned(76.9, truncation=(1.9, 1.0), random=(9.0, 1.0)),  # 3.1 points; 1.9 < 2 SE
        },
    }
    checks = retrieval.target_checks(results)
    assert [(check["target"], check["met"]) for check in checks] == [
        ("learned nDCG@10 within 1 points of dense at ρ = 0.5", True),
        ("learned nDCG@10 within 3 points of dense at ρ = 0.3", False),
        ("learned nDCG@10 above every baseline at ρ = 0.7", True),
        ("learned nDCG@10 above every baseline at ρ = 0.5 by > 2 paired SE", True),
        ("learned nDCG@10 above every baseline at ρ = 0.3 by > 2 paired SE", False),
    ]
    assert [check["measured"] for check in checks[1:]] == [
        "-3.10 points (76.90 vs 80.00)",
        "closest: truncation +0.10 ± 1.00",
        "closest: random +2.50 ± 1.00",
        "closest: truncation +1.90 ± 1.00",
    ]
    # Against the user's original model where there is one; a ρ not run is not measured (None).
    results["original"] = {"1": {"ndcg@10": 82.0}}
    del results["learned"]["0.3"]
    gap_checks = retrieval.target_checks(results)[:2]
    assert [(check["met"], check["measured"]) for check in gap_checks] == [
        (False, "-3.00 points (79.00 vs 82.00)"),
        (None, None),
    ]


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


def tiny_embedding_run(tmp_path: Path) -> Path:
    """A tiny random embedding model saved as a run directory under ``tmp_path``."""
    model, tokenizer = tiny_model("embedding")
    run_dir = tmp_path / "run"
    save_run(model, tiny_recipe("embedding"), tokenizer, run_dir)
    return run_dir


def squad_file(tmp_path: Path) -> Path:
    """The tiny question → paragraph set as a SQuAD-style validation file."""
    data = tmp_path / "squad" / "validation.jsonl.gz"
    write_rows(data, [{"question": q, "context": PARAGRAPHS[gold]} for q, gold in QUESTIONS])
    return data


def test_cli_on_a_tiny_model(tmp_path: Path) -> None:
    run_dir, data = tiny_embedding_run(tmp_path), squad_file(tmp_path)
    out, cache = tmp_path / "results" / "tiny-embedding-retrieval", tmp_path / "cache"
    arguments = [str(run_dir), "--out", str(out), "--data", str(data), "--rhos", "1", "0.5", "0.3"]
    retrieval.main([*arguments, "--cache-dir", str(cache), "--layer-exits", "1"])

    payload = json.loads((out / "retrieval.json").read_text())
    assert (payload["queries"], payload["documents"]) == (5, 4)
    assert len(payload["run_weights_sha1"]) == 40 and payload["encoder"].startswith("torch forward_pruned")
    results = payload["results"]
    assert set(results) == {
        "dense",
        "learned",
        "random",
        "attention",
        "leading",
        "truncation",
        "learned+queries",
        "layer-exit",
    }
    assert set(results["learned"]) == {"0.5", "0.3"}
    # Layer exit after 1 of the tiny model's 2 layers does half the dense token-work.
    assert results["layer-exit"]["1"]["document_token_work"] == 0.5
    # Every pruned method is paired with truncation at the same ρ; truncation is not paired with itself.
    assert {"difference", "se"} <= set(results["learned"]["0.3"]["ndcg_vs_truncation"])
    assert "ndcg_vs_truncation" not in results["truncation"]["0.3"]
    assert "minus first-k truncation" in (out / "retrieval.md").read_text()
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
    # Every target's verdict is what the measured numbers say (each ρ the targets name was run): learned
    # within the gap of dense, then learned above every baseline by more than the paired-SE margin.
    gap_checks, baseline_checks = payload["targets"][:2], payload["targets"][2:]
    for check, (rho, gap) in zip(gap_checks, retrieval.NDCG_GAP_TARGETS.items(), strict=True):
        value = results["learned"][f"{rho:g}"]["ndcg@10"]
        assert check["met"] is (dense["ndcg@10"] - value <= gap)
        assert check["measured"].endswith(f"({value:.2f} vs {dense['ndcg@10']:.2f})")
    for check, rho_key in zip(baseline_checks, ("0.5", "0.3"), strict=True):
        assert f"ρ = {rho_key} " in check["target"]
        rivals = results["learned"][rho_key]["ndcg_vs_baselines"].values()
        assert check["met"] is all(p["difference"] > retrieval.SE_MARGIN * p["se"] for p in rivals)
    assert "Targets" in (out / "retrieval.md").read_text()

    assert results["dense"]["1"]["ndcg_vs_dense"] == {"difference": 0.0, "se": 0.0}
    assert "Learned minus dense nDCG@10" in (out / "retrieval.md").read_text()

    # Again from the cache, paired with itself: the same numbers, marked cached, no difference.
    again_arguments = [*arguments, "--out", str(tmp_path / "again"), "--cache-dir", str(cache)]
    retrieval.main([*again_arguments, "--paired-with", str(run_dir)])
    again_payload = json.loads((tmp_path / "again" / "retrieval.json").read_text())
    assert again_payload["paired_with"]["learned_minus_other"] == {
        "1": {"difference": 0.0, "se": 0.0},
        "0.5": {"difference": 0.0, "se": 0.0},
        "0.3": {"difference": 0.0, "se": 0.0},
    }
    again = again_payload["results"]
    assert again["learned"]["0.3"]["ndcg@10"] == results["learned"]["0.3"]["ndcg@10"]
    assert again["random"]["0.3"]["document_cached"] and not results["random"]["0.3"]["document_cached"]


def test_a_document_limit_keeps_the_first_documents_and_only_their_queries(tmp_path: Path) -> None:
    data = retrieval.read_retrieval_set(squad_file(tmp_path), limit_documents=2)
    assert data.paragraphs == PARAGRAPHS[:2]
    assert data.questions == [question for question, gold in QUESTIONS if gold < 2]
    assert data.gold.tolist() == [gold for _, gold in QUESTIONS if gold < 2]


def test_the_exported_graph_and_its_int8_form_search_like_torch(tmp_path: Path) -> None:
    """--graph onnx encodes with the exported graph in onnxruntime: the same vectors as torch (so the same
    nDCG) for dense, learned and truncation; --graph onnx-int8 with its quantized form, close to fp32."""
    run_dir, data = tiny_embedding_run(tmp_path), squad_file(tmp_path)
    common = ["--data", str(data), "--rhos", "1", "0.5", "0.3", "--methods", "learned", "truncation"]
    payloads = {}
    for graph in ("torch", "onnx", "onnx-int8"):
        out = tmp_path / graph
        retrieval.main([str(run_dir), "--out", str(out), *common, "--graph", graph])
        payloads[graph] = json.loads((out / "retrieval.json").read_text())
    torch_results, onnx_results = payloads["torch"]["results"], payloads["onnx"]["results"]
    assert payloads["onnx"]["graph"] == "onnx" and "onnxruntime" in payloads["onnx"]["encoder"]
    for method, rho in (("dense", "1"), ("learned", "0.5"), ("learned", "0.3"), ("truncation", "0.3")):
        assert onnx_results[method][rho]["ndcg@10"] == torch_results[method][rho]["ndcg@10"]
        assert (
            onnx_results[method][rho]["document_token_work"]
            == torch_results[method][rho]["document_token_work"]
        )
    int8 = payloads["onnx-int8"]["results"]
    assert "int8" in payloads["onnx-int8"]["encoder"]
    # every int8 cell is paired with the fp32 model's dense search ("original"), truncation is int8 too
    assert int8["original"]["1"]["ndcg@10"] == torch_results["dense"]["1"]["ndcg@10"]
    assert set(int8["dense"]["1"]["ndcg_vs_dense"]) == {"difference", "se"}
    assert {"difference", "se"} <= set(int8["learned"]["0.3"]["ndcg_vs_truncation"])
    with pytest.raises(SystemExit):  # the graph has no random or attention selector
        retrieval.main([str(run_dir), "--out", str(tmp_path / "x"), "--data", str(data), "--graph", "onnx"])


def test_pairing_with_another_backbone_searches_each_run_with_its_own_queries(tmp_path: Path) -> None:
    """A tuned backbone lives in another space: at ρ = 1 the paired difference is exactly the difference
    of the two runs' own dense nDCG@10 (each searching its documents with its own query vectors)."""
    data = squad_file(tmp_path)
    runs = {}
    for name, seed in (("ours", 0), ("theirs", 1)):
        model, tokenizer = tiny_model("embedding", seed)
        runs[name] = tmp_path / name
        save_run(model, tiny_recipe("embedding"), tokenizer, runs[name])
    dense = {}
    for name, run_dir in runs.items():
        out = tmp_path / f"{name}-retrieval"
        retrieval.main(
            [str(run_dir), "--out", str(out), "--data", str(data), "--rhos", "1", "--methods", "learned"]
        )
        dense[name] = json.loads((out / "retrieval.json").read_text())["results"]["dense"]["1"]["ndcg@10"]
    out = tmp_path / "paired"
    arguments = [str(runs["ours"]), "--out", str(out), "--data", str(data), "--rhos", "1", "0.5"]
    retrieval.main([*arguments, "--methods", "learned", "--paired-with", str(runs["theirs"])])
    paired = json.loads((out / "retrieval.json").read_text())["paired_with"]["learned_minus_other"]
    assert paired["1"]["difference"] == pytest.approx(dense["ours"] - dense["theirs"], abs=0.01)
    assert set(paired) == {"1", "0.5"}


def test_report_renders_retrieval_and_embedding_evaluations(tmp_path: Path) -> None:
    """docs/benchmarks.md shows every retrieval.json, and an embedding eval.json (its metric is
    cosine_to_dense, per method and ρ) no longer breaks the page."""
    from benchmarks import report
    from retention_tasks.embedding import learn as embedding
    from training.evaluation.reporting import write_report
    from training.tasks.registry import EvaluationRun

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


# ---------------------------------------------------------------------- SciTLDR and long documents
SCITLDR_ROWS = [
    {
        "document": [
            "We propose a way to prune the tokens of a transformer encoder while it runs.",
            "A small scorer per layer decides which tokens the next layer still needs.  ",
            "On retrieval the pruned embeddings stay close to the dense ones at half the compute.",
            "We also study which tokens survive, and find that rare words are kept longest.\n",
        ],
        "all_summaries": [
            "Token pruning keeps embeddings close at half the compute.",
            "Prune tokens per layer.",
        ],
    },
    {"document": ["Graph networks learn on molecules.\n"], "all_summaries": ["Molecule graph networks."]},
    {
        "document": [
            "Sleep consolidates memory in mammals.",
            "We model it with two networks, one fast and one slow, that replay recent examples.",
        ],
        "all_summaries": ["Two networks replay memories as in sleep.", "A dual memory model.", "Replay."],
    },
    {
        "document": [
            "Bandit algorithms trade exploration against exploitation.",
            "Ours has a provably lower regret bound on every benchmark.",
        ],
        "all_summaries": ["A bandit algorithm with lower regret."],
    },
]


def scitldr_file(tmp_path: Path) -> Path:
    path = tmp_path / "summarization" / "scitldr_a" / "test.jsonl.gz"
    write_rows(path, SCITLDR_ROWS)
    return path


def test_scitldr_reads_one_query_per_tldr_against_its_joined_abstract(tmp_path: Path) -> None:
    data = retrieval.read_retrieval_set(scitldr_file(tmp_path), None, retrieval.DATASETS["scitldr"])
    assert len(data.paragraphs) == 4 and len(data.questions) == 7  # 2 + 1 + 3 + 1 TLDRs
    assert data.gold.tolist() == [0, 0, 1, 2, 2, 2, 3]
    assert data.questions[3] == "Two networks replay memories as in sleep."
    assert data.paragraphs[1] == "Graph networks learn on molecules."  # the trailing newline is gone
    assert data.paragraphs[0].startswith("We propose a way") and "needs. On retrieval" in data.paragraphs[0]
    limited = retrieval.read_retrieval_set(scitldr_file(tmp_path), 3, retrieval.DATASETS["scitldr"])
    assert len(limited.questions) == 3 and len(limited.paragraphs) == 4  # every abstract is still searched


def test_cli_on_scitldr_keeps_its_own_cache(tmp_path: Path) -> None:
    run_dir = tiny_embedding_run(tmp_path)
    out, cache = tmp_path / "out", tmp_path / "cache"
    arguments = ["--dataset", "scitldr", "--data", str(scitldr_file(tmp_path)), "--rhos", "0.5"]
    retrieval.main([str(run_dir), "--out", str(out), *arguments, "--cache-dir", str(cache)])

    payload = json.loads((out / "retrieval.json").read_text())
    assert (payload["dataset"], payload["queries"], payload["documents"]) == ("scitldr", 7, 4)
    assert set(payload["results"]["learned"]) == {"0.5"}
    assert payload["search"].endswith("ties to the lower abstract index")
    text = (out / "retrieval.md").read_text()
    assert "SciTLDR-A test TLDR → abstract" in text and "7 TLDRs (all) search 4 abstracts" in text
    assert [path.name for path in cache.iterdir()] == ["scitldr"] and any((cache / "scitldr").glob("*.npy"))


def test_one_rho_per_text_matches_one_call_per_rho() -> None:
    """Texts grouped by their own ρ give the vectors each ρ gives for all texts at once."""
    model, tokenizer = tiny_model("embedding")
    encoder = retrieval.Encoder(model, tokenizer, 64, batch_size=2)
    texts = [" ".join(row["document"]) for row in SCITLDR_ROWS]
    at_half, _ = encoder.encode(texts, "learned", 0.5)
    at_third, _ = encoder.encode(texts, "learned", 0.3)
    mixed, work = encoder.encode(texts, "learned", (0.5, 0.3, 0.3, 0.5))
    np.testing.assert_allclose(mixed, np.stack([at_half[0], at_third[1], at_third[2], at_half[3]]), atol=1e-5)
    lengths = [len(row) for row in encoder.rows(texts)]
    expected = np.mean(
        [
            *encoder.schedule_work(lengths[:1], 0.5),
            *encoder.schedule_work(lengths[1:3], 0.3),
            *encoder.schedule_work(lengths[3:], 0.5),
        ]
    )
    assert work == pytest.approx(float(expected), abs=1e-6)
    with pytest.raises(ValueError):
        encoder.encode(texts, "learned", (0.5, 0.3))


def test_equal_work_rho_is_the_largest_that_fits() -> None:
    from experiments import retrieval_long

    model, tokenizer = tiny_model("embedding")
    encoder = retrieval.Encoder(model, tokenizer, 512)
    lengths = np.array([20, 57, 300, 512])
    targets = 256 / np.maximum(lengths, 256)  # a cut at 256: the short rows lose nothing
    rhos, work = retrieval_long.equal_work_rhos(encoder, lengths, targets)
    assert rhos[0] == rhos[1] == 1.0 and np.all(rhos[2:] < 1.0)
    for length, rho, done, target in zip(lengths, rhos, work, targets, strict=True):
        assert done == pytest.approx(encoder.schedule_work([int(length)], float(rho))[0])
        assert done <= target + 1e-9
        if rho < 1.0:
            assert encoder.schedule_work([int(length)], float(rho) + retrieval_long.RHO_STEP)[0] > target


def test_long_context_mode_on_a_tiny_model(tmp_path: Path) -> None:
    from experiments import retrieval_long

    model, tokenizer = tiny_model("embedding")
    run_dir = tmp_path / "run"
    save_run(model, tiny_recipe("embedding"), tokenizer, run_dir)
    data, out, cache = scitldr_file(tmp_path), tmp_path / "out", tmp_path / "cache"
    arguments = ["--dataset", "scitldr", "--data", str(data), "--cache-dir", str(cache)]
    retrieval_long.main(
        [str(run_dir), "--out", str(out), *arguments, "--short-length", "16", "--long-length", "48"]
    )

    payload = json.loads((out / retrieval_long.RESULT_FILE).read_text())
    encoder = retrieval.Encoder(model, tokenizer, 48)
    texts = retrieval.read_retrieval_set(data, None, retrieval.DATASETS["scitldr"]).paragraphs
    tokens = retrieval_long.input_tokens(encoder, texts)
    assert (
        tokens[1] <= 16 < min(tokens[0], tokens[2], tokens[3]) and tokens[0] > 48
    )  # the data covers each case
    assert (payload["long_documents"], payload["documents_over_long_length"]) == (3, 1)
    assert (payload["long_queries"], payload["queries"], payload["trained_max_length"]) == (6, 7, 64)
    results = payload["results"]
    names = [
        "dense@16",
        "learned@48, equal work",
        "attention@48, equal work",
        "learned@48, ρ=0.5",
        "dense@48",
    ]
    assert list(results) == names
    truncated, learned, ceiling = results["dense@16"], results["learned@48, equal work"], results["dense@48"]
    assert truncated["document_tokens_per_layer"] == 16.0 and ceiling["document_token_work"] == 1.0
    assert ceiling["document_tokens_per_layer"] == pytest.approx(np.mean([48, tokens[2], tokens[3]]), abs=0.1)
    # Equal work: never more than the cut, and within a few tokens of it.
    assert (
        truncated["document_token_work"] - 0.1
        <= learned["document_token_work"]
        <= truncated["document_token_work"]
    )
    assert results["attention@48, equal work"]["document_token_work"] == learned["document_token_work"]
    assert ceiling["document_cosine_to_dense_48"]["min"] == pytest.approx(1.0, abs=1e-4)
    assert truncated["document_cosine_to_dense_16"]["min"] == pytest.approx(1.0, abs=1e-4)
    assert truncated["document_cosine_to_dense_48"]["min"] < 0.9999  # the cut changed the vectors
    for cell in results.values():
        assert 0.0 <= cell["ndcg@10"] <= 100.0 and cell["recall@10"] == 100.0  # 4 documents < 10
    assert set(payload["answer"]["points_over_baseline"]) == set(names[1:])
    assert "dense@48" in (out / "long_context.md").read_text()
    assert sorted(path.name for path in cache.iterdir()) == ["scitldr"]


def test_a_floor_above_every_text_makes_every_method_dense(tmp_path: Path) -> None:
    """--min-kept-tokens: the floor reaches every method's counts (and the cache key): texts at or under
    it run dense at any ρ, so each pruned cell equals dense."""
    run_dir, data = tiny_embedding_run(tmp_path), squad_file(tmp_path)
    cache = tmp_path / "cache"
    base = [str(run_dir), "--data", str(data), "--rhos", "1", "0.3", "--cache-dir", str(cache)]
    retrieval.main([*base, "--out", str(tmp_path / "plain")])
    retrieval.main([*base, "--out", str(tmp_path / "floor"), "--min-kept-tokens", "512"])
    plain = json.loads((tmp_path / "plain" / "retrieval.json").read_text())
    floored = json.loads((tmp_path / "floor" / "retrieval.json").read_text())
    assert floored["min_kept_tokens"] == 512 and plain["min_kept_tokens"] == 0
    for method in ("learned", "random", "attention", "truncation", "learned+queries"):
        cell = floored["results"][method]["0.3"]
        # A floor is its own cache entry (learned+queries reuses this invocation's learned documents).
        assert cell["document_cached"] == (method == "learned+queries")
        assert cell["document_token_work"] == 1.0
        assert cell["document_cosine_to_dense"]["min"] == pytest.approx(1.0, abs=1e-5)
    assert plain["results"]["learned"]["0.3"]["document_token_work"] < 1.0


def test_an_int8_graph_that_keeps_gemms_fp32_has_its_own_cache_keys() -> None:
    """The embedding cache tells int8 graphs apart by the weight GEMMs they leave fp32: vectors of an int8
    that quantized every weight are never served for one that kept its outlying GEMMs fp32, and a graph
    that keeps none reads the keys written before the rule existed."""
    model, tokenizer = tiny_model("embedding")
    texts = ["one text", "another text"]

    def key(kept: tuple[str, ...], method: str) -> str:
        encoder = retrieval_parts.OnnxEncoder(model, tokenizer, 64, graph="onnx-int8", fp32_matmuls=kept)
        return retrieval_parts.EmbeddingStore(encoder, None).key(texts, method, 0.5)

    for method in ("dense", "learned", "truncation"):
        plain, outlying = key((), method), key(("/layers.6/MatMul_1",), method)
        assert plain != outlying and outlying != key(("/layers.7/MatMul_1",), method)
        before = retrieval_parts.OnnxEncoder(model, tokenizer, 64, graph="onnx-int8")
        assert plain == retrieval_parts.EmbeddingStore(before, None).key(texts, method, 0.5)
