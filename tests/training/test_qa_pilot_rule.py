"""The QA pilot's stop rule (experiments.qa_pilot_rule) on written evaluation files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from experiments.qa_pilot_rule import main, versus_attention

REFERENCE = {
    "0.3": {"f1": 59.5, "token_work": 0.525},
    "0.5": {"f1": 65.1, "token_work": 0.68},
    "1": {"f1": 68.9, "token_work": 1.0},
}


def write_pilot(root: Path, f1_by_rho: dict[str, float], work_by_rho: dict[str, float]) -> Path:
    rng = np.random.default_rng(0)
    scores = {}
    for rho, f1 in f1_by_rho.items():  # 2,000 questions scoring 0 or 100, mean f1
        scores[rho] = (100.0 * (rng.random(2000) < f1 / 100.0)).tolist()
    results = {rho: {"f1": float(np.mean(s)), "token_work": work_by_rho[rho]} for rho, s in scores.items()}
    root.mkdir(parents=True)
    (root / "eval.json").write_text(json.dumps({"results": {"learned": results}}))
    (root / "per_example.json").write_text(json.dumps({"scores": {"learned": scores}}))
    return root


@pytest.mark.parametrize(("better", "passes"), [(8.0, True), (1.0, False)])
def test_pilot_passes_only_more_than_two_unpaired_se_above_the_reference(
    tmp_path: Path, better: float, passes: bool
) -> None:
    reference = tmp_path / "reference.json"
    reference.write_text(json.dumps({"results": {"learned": REFERENCE}}))
    works = {"0.2": 0.45, "0.5": 0.68, "0.7": 0.80, "1": 1.0}  # 0.525 lies between 0.2 and 0.5
    f1s = {"0.2": 59.5 - 3.0 + better, "0.5": 65.1 + better, "0.7": 67.0, "1": 68.9}
    pilot = write_pilot(tmp_path / "pilot", f1s, works)
    main([str(pilot), "--reference", str(reference), "--out", str(tmp_path / "rule.json")])
    verdict = json.loads((tmp_path / "rule.json").read_text())
    assert [p["token_work"] for p in verdict["points"]] == [0.525, 0.68]
    at_half = verdict["points"][1]
    measured = json.loads((pilot / "eval.json").read_text())["results"]["learned"]["0.5"]["f1"]
    assert at_half["pilot_f1"] == pytest.approx(measured, abs=0.01)  # an exact token-work: that cell
    assert 1.0 < at_half["unpaired_standard_error"] < 2.0  # √2 · 49 / √2000 for 0/100 scores near 65
    assert verdict["passes"] is passes and all(p["passes"] is passes for p in verdict["points"])
    assert verdict["learned_minus_attention"] == []  # no attention cells written here


def test_learned_minus_attention_is_paired_per_rho(tmp_path: Path) -> None:
    root = write_pilot(tmp_path / "run", {"0.5": 60.0, "1": 68.9}, {"0.5": 0.68, "1": 1.0})
    scores = json.loads((root / "per_example.json").read_text())["scores"]
    learned = np.asarray(scores["learned"]["0.5"])
    scores["attention"] = {"0.5": (learned - 2.0).tolist(), "1": scores["learned"]["1"]}  # 2 points lower
    (root / "per_example.json").write_text(json.dumps({"scores": scores}))
    assert versus_attention(root) == [{"rho": 0.5, "difference": 2.0, "paired_standard_error": 0.0}]
