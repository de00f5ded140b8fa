"""Command-line entry points on tiny models: export a run, evaluate it, the benchmark harness."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from retention_core.contract import Manifest
from retention_tasks.classification.learn import evaluate_classification, markdown_table
from tests.tiny import tiny_model, tiny_recipe, write_rows
from training.__main__ import main as training_main
from training.fitting.fit import save_run
from training.tasks.registry import EvaluationRun

ROWS = [{"text": f"{'great fun' if i % 2 else 'dull and slow'} film {i}", "label": i % 2} for i in range(12)]


def tiny_evaluation_run() -> EvaluationRun:
    """A tiny classifier on ROWS, evaluated in batches of 4."""
    recipe = tiny_recipe()
    recipe = recipe.model_copy(update={"evaluation": recipe.evaluation.model_copy(update={"batch_size": 4})})
    return EvaluationRun(*tiny_model(), recipe, ROWS)


def _tiny_run(tmp_path: Path, data_root: Path | None = None) -> Path:
    model, tokenizer = tiny_model()
    recipe = tiny_recipe()
    if data_root is not None:
        dataset = recipe.dataset.model_copy(update={"root": str(data_root)})
        recipe = recipe.model_copy(update={"dataset": dataset})
    run_dir = tmp_path / "run"
    save_run(model, recipe, tokenizer, run_dir)
    return run_dir


def test_export_command_writes_a_model_directory(tmp_path: Path) -> None:
    run_dir = _tiny_run(tmp_path)
    training_main(["export", str(run_dir), "--out", str(tmp_path / "model"), "--no-quality", "--int8"])
    manifest = Manifest.read(tmp_path / "model")
    assert manifest.name == "tiny-classification" and set(manifest.variants) == {"fp32", "int8"}
    assert (tmp_path / "model" / "tokenizer.json").is_file()


def test_evaluation_covers_every_method_and_budget(tmp_path: Path) -> None:
    methods = ["learned", "random", "attention", "first_k", "first_k_work", "head_tail_work"]
    results = evaluate_classification(tiny_evaluation_run(), [0.3, 1.0], methods, progress=False)
    seen = {(r.method, r.rho) for r in results}
    assert ("learned", 1.0) in seen and ("attention", 0.3) in seen and ("first_k", 1.0) not in seen
    learned_dense = next(r for r in results if r.method == "learned" and r.rho == 1.0)
    learned_pruned = next(r for r in results if r.method == "learned" and r.rho == 0.3)
    assert learned_pruned.token_work < learned_dense.token_work <= 1.0
    assert all(0.0 <= r.accuracy <= 1.0 and r.num_examples == len(ROWS) for r in results)
    assert "| learned |" in markdown_table(results)


def test_encoder_speed_harness_quick_mode(tmp_path: Path) -> None:
    from benchmarks.encoder_speed import main as bench_main

    out = tmp_path / "speed.json"
    bench_main(["--quick", "--out", str(out), "--rhos", "1.0", "0.3", "--no-torch-baseline"])
    payload = json.loads(out.read_text())
    variants = {r["variant"] for r in payload["results"]}
    assert {"dense-onnx-fp32", "pruned-onnx-fp32@0.3", "pruned-onnx-int8@0.3"} <= variants
    assert payload["machine"]["cores"] >= 1
    assert out.with_suffix(".md").read_text().startswith("| seq |")


def test_memory_harness_and_report_quick_mode(tmp_path: Path) -> None:
    from benchmarks import memory, report

    results_dir, docs_dir = tmp_path / "results", tmp_path / "docs"
    memory.main(
        ["--quick", "--rhos", "0.3", "--no-arena", "--out", str(results_dir / "bench" / "memory.json")]
    )
    payload = json.loads((results_dir / "bench" / "memory.json").read_text())
    assert [r["variant"] for r in payload["results"]] == ["dense-onnx-fp32", "pruned-onnx-fp32"]
    assert all(r["peak_bytes"] > 0 for r in payload["results"])
    out = report.build_report(results_dir, docs_dir)
    assert "## Peak memory" in out.read_text()


def test_quick_benchmarks_need_no_tests_package(tmp_path: Path) -> None:
    """``python -m benchmarks … --quick`` from an install: ``tests`` (not packaged) cannot be imported."""
    repo = Path(__file__).resolve().parents[2]
    script = (
        "import sys; sys.modules['tests'] = None  # as in an installed copy: no tests package\n"
        "from benchmarks.__main__ import main\n"
        "main(['memory', '--quick', '--results-dir', sys.argv[1]])"
    )
    env = {**os.environ, "PYTHONPATH": str(repo), "HF_HUB_OFFLINE": "1"}
    results = tmp_path / "results"
    done = subprocess.run(
        [sys.executable, "-c", script, str(results)], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads((results / "bench" / "memory.json").read_text())["results"]


def test_every_task_refuses_a_misspelt_method_at_the_cli(tmp_path: Path) -> None:
    run_dir = _tiny_run(tmp_path)
    with pytest.raises(SystemExit, match="unknown evaluation method"):
        training_main(["evaluate", str(run_dir), "--out", str(tmp_path / "out"), "--methods", "learnd"])
    assert not (tmp_path / "out").exists()  # refused before anything ran or was written
    with pytest.raises(ValueError, match="learnd"):
        evaluate_classification(tiny_evaluation_run(), [0.5], ["learnd"], progress=False)


def test_merged_evaluation_and_its_report(tmp_path: Path) -> None:
    from benchmarks import report
    from retention_tasks.classification.learn import EVALUATION, report_of
    from training.evaluation.reporting import write_report

    run = tiny_evaluation_run()
    run_dir = tmp_path / "results" / "sst2-minilm-quick"
    meta = {"model": "tiny", "profile": "quick", "split": "validation", "num_examples": len(ROWS)}
    first = evaluate_classification(run, [0.5], ["learned", "threshold"], progress=False)
    write_report(report_of(first), run_dir, meta, EVALUATION.table(report_of(first)))
    second = evaluate_classification(run, [0.3, 0.5], ["learned"], progress=False)
    merged = EVALUATION.merge(json.loads((run_dir / "eval.json").read_text()), report_of(second))
    assert sorted((r["method"], r["rho"]) for r in merged["results"]) == [
        ("learned", 0.3),
        ("learned", 0.5),
        ("threshold", 0.5),
    ]
    write_report(merged, run_dir, meta, EVALUATION.table(merged))
    log = {"step": 0, "kept_fraction": 0.5, "target_fraction": 0.5, "lam": [0.0, 0.01]}
    (run_dir / "train_log.jsonl").write_text(json.dumps(log) + "\n")
    text = report.build_report(tmp_path / "results", tmp_path / "docs").read_text()
    assert "## Quality vs ρ — sst2-minilm-quick (tiny, quick recipe)" in text and "| threshold |" in text
    assert (tmp_path / "docs" / "plots" / "budget_sst2-minilm-quick.png").is_file()


def test_soft_budget_reports_expected_and_target_kept_per_point(tmp_path: Path) -> None:
    from experiments.soft_budget import main as soft_budget_main

    data_root = tmp_path / "data"
    rows = [{"text": f"a {'fine ' * (i % 5)}film number {i}", "label": i % 2} for i in range(8)]
    write_rows(data_root / "sst2" / "validation.jsonl.gz", rows)
    run_dir = _tiny_run(tmp_path, data_root)
    out = tmp_path / "soft_budget.json"
    soft_budget_main([str(run_dir), "--rhos", "0.3", "1.0", "--examples", "8", "--out", str(out)])
    payload = json.loads(out.read_text())
    low, dense = payload["rhos"]["0.3"], payload["rhos"]["1"]
    assert len(low["expected"]) == len(low["target"]) == 2  # one pruning point per tiny layer
    assert low["target"][-1] == 0.3 and dense["target"] == [1.0, 1.0]
    assert all(0.0 < e <= 1.0 for e in low["expected"])
    assert "| 0.3 |" in out.with_suffix(".md").read_text()


def _tiny_qa_run(tmp_path: Path) -> Path:
    """A tiny QA run whose dataset root holds four SQuAD-style validation questions."""
    data_root = tmp_path / "data"
    context = "The game was played at Levi's Stadium in Santa Clara, California, in February."
    rows = [
        {
            "id": str(i),
            "title": "Super Bowl",
            "question": f"Where was game {i} played?",
            "context": context,
            "answers": {"text": ["Santa Clara, California"], "answer_start": [context.index("Santa")]},
        }
        for i in range(4)
    ]
    write_rows(data_root / "squad" / "validation.jsonl.gz", rows)
    model, tokenizer = tiny_model("qa")
    recipe = tiny_recipe("qa")
    recipe = recipe.model_copy(update={"dataset": recipe.dataset.model_copy(update={"root": str(data_root)})})
    run_dir = tmp_path / "run"
    save_run(model, recipe, tokenizer, run_dir)
    return run_dir


def test_answer_survival_reports_answer_and_droppable_survival_per_method(tmp_path: Path) -> None:
    from experiments.answer_survival import main as answer_survival_main

    run_dir = _tiny_qa_run(tmp_path)
    out = tmp_path / "answer_survival.json"
    answer_survival_main([str(run_dir), "--rhos", "0.3", "--questions", "4", "--out", str(out)])
    payload = json.loads(out.read_text())
    assert payload["windows_with_answer"] == 4 and 0.0 <= payload["dense_span_hit"] <= 1.0
    assert set(payload["methods"]) == {"learned", "attention", "random", "answer-protected"}
    for per_rho in payload["methods"].values():
        row = per_rho["0.3"]
        assert row["windows"] == 4 and len(row["answer_alive"]) == len(row["droppable_alive"]) == 2
        assert all(0.0 <= x <= 1.0 for x in row["answer_alive"] + row["droppable_alive"])
        assert row["droppable_alive"][-1] < 1.0  # ρ = 0.3 dropped tokens
    oracle = payload["methods"]["answer-protected"]["0.3"]
    assert oracle["answer_alive"] == [1.0, 1.0] and oracle["all_answer_kept"] == 1.0  # the oracle's premise
    assert "| random | 0.3 |" in out.with_suffix(".md").read_text()


def test_task_evaluation_merge_keeps_earlier_cells_and_refuses_other_examples(tmp_path: Path) -> None:
    run_dir = _tiny_qa_run(tmp_path)
    out = tmp_path / "results"
    common = ["evaluate", str(run_dir), "--split", "test", "--out", str(out)]  # test = validation.jsonl.gz
    training_main([*common, "--limit", "4", "--rhos", "0.3", "--methods", "learned"])
    training_main([*common, "--limit", "4", "--rhos", "0.3", "0.5", "--methods", "random", "--merge"])
    payload = json.loads((out / "eval.json").read_text())
    assert set(payload["results"]["learned"]) == {"0.3"}  # the first run's cells survive
    assert set(payload["results"]["random"]) == {"0.3", "0.5"}
    assert payload["meta"]["command"].count("python -m training evaluate") == 2
    assert "| learned |" in (out / "eval.md").read_text() and "| random |" in (out / "eval.md").read_text()
    with pytest.raises(SystemExit, match="num_examples"):  # other questions: merging would mix subsets
        training_main([*common, "--limit", "2", "--rhos", "0.3", "--methods", "learned", "--merge"])
    assert set(json.loads((out / "eval.json").read_text())["results"]) == {"learned", "random"}
