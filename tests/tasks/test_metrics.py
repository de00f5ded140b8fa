from __future__ import annotations

import pytest

from retention_core.metrics import exact_match, f1, normalize_answer, squad_scores
from retention_tasks.summarization.rouge import rouge_scores


def test_official_normalization() -> None:
    assert normalize_answer("The  Eiffel-Tower!") == "eiffeltower"
    assert normalize_answer("an apple, a pear") == "apple pear"


def test_squad_scores_max_over_golds() -> None:
    scores = squad_scores("the Denver Broncos", ["Broncos", "Denver Broncos", "Carolina"])
    assert scores == {"exact_match": 1.0, "f1": 1.0}
    assert exact_match("Broncos", "Denver Broncos") == 0.0
    assert f1("Broncos", "Denver Broncos") == pytest.approx(2 * 1.0 * 0.5 / 1.5)
    assert f1("", "Denver") == 0.0
    assert squad_scores("", ["x"]) == {"exact_match": 0.0, "f1": 0.0}


def test_rouge_max_and_mean() -> None:
    refs = ["the cat sat on the mat", "a completely different sentence"]
    best = rouge_scores("the cat sat on the mat", refs, aggregate="max")
    mean = rouge_scores("the cat sat on the mat", refs, aggregate="mean")
    assert best["rouge1"] == pytest.approx(1.0)
    assert best["rougeL"] == pytest.approx(1.0)
    assert 0.0 < mean["rouge1"] < best["rouge1"]
    with pytest.raises(ValueError):
        rouge_scores("x", [])


def test_serving_modules_do_not_import_torch_or_rouge() -> None:
    import subprocess
    import sys

    code = (
        "import sys; import retention_tasks.qa.codec, retention_tasks.summarization.codec, "
        "retention_core.text, retention_core.metrics, retention_tasks.summarization.rouge, "
        "retention_tasks.summarization.sentences; "
        "bad = [m for m in ('torch', 'rouge_score', 'training.engine.model') "
        "if m in sys.modules]; assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
