"""experiments.retrofit_comparison: the retrofit paired with the user's dense model on the same examples,
the joint model read from its committed evaluation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.report import build_report
from experiments.retrofit_comparison import main as comparison_main
from experiments.retrofit_comparison import unpaired_error
from tests.tiny import tiny_model, tiny_recipe, write_rows
from training.fitting.fit import save_run


def test_unpaired_error_of_two_proportions() -> None:
    assert unpaired_error(50.0, 50.0, 100) == pytest.approx(100 * (0.5 / 100) ** 0.5)
    assert unpaired_error(100.0, 100.0, 10) == 0.0


def test_comparison_pairs_the_retrofit_with_the_dense_model(tmp_path: Path) -> None:
    data_root = tmp_path / "data"
    rows = [{"text": f"{'a fine ' * (i % 9)}film {i}", "label": i % 2} for i in range(12)]
    write_rows(data_root / "sst2" / "validation.jsonl.gz", rows)
    recipe = tiny_recipe()
    recipe = recipe.model_copy(update={"dataset": recipe.dataset.model_copy(update={"root": str(data_root)})})
    for name, seed in (("dense", 0), ("retrofit", 0)):  # the retrofit keeps the dense weights
        model, tokenizer = tiny_model(seed=seed)
        save_run(model, recipe, tokenizer, tmp_path / name)
        log = [{"step": 0, "seconds": 1.0}, {"step": 9, "seconds": 60.0 * (2 if name == "dense" else 1)}]
        (tmp_path / name / "train_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log))
    joint = tmp_path / "joint"
    joint.mkdir()
    results = [{"method": "learned", "rho": rho, "accuracy": 0.5} for rho in (0.3, 1.0)]
    (joint / "eval.json").write_text(json.dumps({"meta": {"split": "sst2/validation"}, "results": results}))
    out = tmp_path / "results" / "tiny-retrofit" / "comparison.json"
    runs = [str(tmp_path / "dense"), str(tmp_path / "retrofit"), "--joint", str(joint)]
    options = ["--split", "validation", "--limit", "12", "--rhos", "1", "0.5", "--out", str(out)]
    comparison_main([*runs, *options])
    payload = json.loads(out.read_text())
    assert payload["num_examples"] == 12
    assert payload["training_seconds"] == {"dense": 120.0, "retrofit": 60.0, "joint": None}
    by_rho = {row["rho"]: row for row in payload["results"]}
    at_one = by_rho[1.0]
    # same weights at ρ = 1: the paired difference is exactly zero, example by example
    assert at_one["retrofit_accuracy"] == payload["dense_accuracy"]
    assert at_one["vs_dense"] == {
        "examples": 12,
        "accuracy_diff": 0.0,
        "standard_error": 0.0,
        "gained": 0,
        "lost": 0,
    }
    assert at_one["vs_joint"]["accuracy_diff"] == pytest.approx(at_one["retrofit_accuracy"] - 50.0)
    assert by_rho[0.5]["joint_accuracy"] is None and by_rho[0.5]["vs_joint"] is None
    assert by_rho[0.5]["token_work"] < at_one["token_work"]
    assert "| 0.5 |" in out.with_suffix(".md").read_text()
    report = build_report(tmp_path / "results", tmp_path / "docs").read_text(encoding="utf-8")
    assert "## Retrofit vs joint training" in report and "| 0.5 |" in report
