"""bf16 autocast training (``fit --precision bf16``) on a tiny random model."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from tests.tiny import tiny_model, tiny_recipe
from training.engine.selection import RetentionScorer
from training.fitting.fit import LOG_FILE, WEIGHTS_FILE, fit

ROWS = [{"text": f"a {'good' if i % 2 else 'bad'} movie number {i}", "label": i % 2} for i in range(16)]


def _fit(run_dir: Path, precision: str):
    model, tokenizer = tiny_model("classification")
    recipe = tiny_recipe("classification").model_copy(
        update={"steps": 3, "batch_size": 4, "log_every": 1, "max_length": 32}
    )
    fit(
        recipe,
        run_dir,
        backbone=model.backbone,
        tokenizer=tokenizer,
        train_rows=ROWS,
        progress=False,
        precision=precision,
    )
    return load_file(str(run_dir / WEIGHTS_FILE)), [json.loads(x) for x in (run_dir / LOG_FILE).open()]


def test_bf16_training_keeps_fp32_weights_logs_its_precision_and_stays_near_fp32(tmp_path: Path) -> None:
    full, full_log = _fit(tmp_path / "fp32", "fp32")
    mixed, mixed_log = _fit(tmp_path / "bf16", "bf16")
    assert {entry["precision"] for entry in full_log} == {"fp32"}
    assert {entry["precision"] for entry in mixed_log} == {"bf16"}
    assert all(tensor.dtype == torch.float32 for tensor in mixed.values())  # master weights stay fp32
    changed = [name for name in full if not torch.equal(full[name], mixed[name])]
    assert changed  # the forward passes really ran in bf16
    for name in changed:  # three small steps from the same start: the same run up to bf16 rounding
        assert torch.allclose(full[name], mixed[name], atol=0.05), name
    for a, b in zip(full_log, mixed_log, strict=True):
        assert abs(a["loss"] - b["loss"]) < 0.1 * abs(a["loss"]) + 0.05


def test_scorer_scores_are_fp32_under_autocast() -> None:
    scorer = RetentionScorer(hidden_size=16, scorer_size=4)
    hidden = torch.randn(2, 5, 16)
    valid = torch.ones(2, 5, dtype=torch.bool)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        scores = scorer(hidden.to(torch.bfloat16), valid)
        projected = scorer.W(hidden)  # what autocast does to any other Linear
    assert projected.dtype == torch.bfloat16
    assert scores.dtype == torch.float32
    torch.testing.assert_close(scores, scorer(hidden.to(torch.bfloat16).float(), valid))
