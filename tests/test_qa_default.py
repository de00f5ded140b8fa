"""benchmarks.qa_default on a tiny random QA model: the README's own example and SQuAD-style questions
sent over HTTP to a real service process."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import qa_default
from tests.tasks.rows import SQUAD_ROWS
from tests.tiny import build_tiny_model_dir, write_rows


def test_the_readme_example_is_read_from_the_readme() -> None:
    example = qa_default.readme_example()
    readme = qa_default.README.read_text(encoding="utf-8")
    assert example["question"] and example["context"] and qa_default.EXPECTED_ANSWER in example["context"]
    assert json.dumps(example["question"]) in readme and json.dumps(example["context"]) in readme


def test_a_tiny_model_is_asked_over_http_at_every_rho(tmp_path: Path) -> None:
    models = tmp_path / "models"
    build_tiny_model_dir(models / "tiny-qa", "qa", name="tiny-qa")
    write_rows(tmp_path / "data" / "squad" / "validation.jsonl.gz", SQUAD_ROWS)
    out = tmp_path / "qa_default.json"
    argv = ["--models-dir", str(models), "--model", "tiny-qa", "--questions", "4"]
    qa_default.main([*argv, "--data-root", str(tmp_path / "data"), "--out", str(out)])
    report = json.loads(out.read_text())  # what the committed results are: the file, not the return value

    context = report["readme_example"]["body"]["context"]
    answers = report["readme_example"]["answers"]
    assert [a["rho"] for a in answers] == list(qa_default.RHOS)
    for answer in answers:  # extractive: whatever a random model picks is a span of the context
        assert answer["answer"] in context
        assert answer["correct"] == (answer["answer"].strip() == qa_default.EXPECTED_ANSWER)
    assert report["dev"]["questions"] == 4 and [s["rho"] for s in report["scores"]] == list(qa_default.RHOS)
    for score in report["scores"]:
        assert 0.0 <= score["exact_match"] <= score["f1"] <= 100.0
    table = out.with_suffix(".md").read_text()
    assert "| 0.3 |" in table and "tiny-qa" in table
