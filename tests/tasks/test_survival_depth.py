"""Survival depth (the graph's optional last output): what it counts in torch, and that every exported
task graph reports it exactly as torch does (export validates it like the kept counts)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from retention_core.contract import Manifest
from retention_core.tasks import task_spec
from retention_ort import open_session
from tests.tiny import TINY_LAYERS, build_tiny_model_dir, tiny_model
from training.engine.model import PrunedInputs
from training.engine.selection import RetentionScorer
from training.export.graph import ExportValidationError, example_inputs, graph_for, validate_onnx
from training.export.speed import SPEED_REPEATS, SPEED_RHOS, measure_speed

TASKS = ("classification", "qa", "summarization", "embedding")


def pruned(
    task: str, rho: float, min_kept: int = 0, length: int = 33
) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """Ragged QA-style inputs (protected first third) through ``forward_pruned``: (inputs, counts, depth)."""
    model, _ = tiny_model(task)
    model.config = replace(model.config, min_kept_tokens=min_kept)
    example = example_inputs(3, length, model.backbone.info_vocab_size, (rho,), seed=7)
    protected = example["protected_mask"].bool() if task == "qa" else None
    with torch.no_grad():
        out = model.forward_pruned(
            example["input_ids"],
            example["attention_mask"],
            example["rho"],
            protected,
            example["token_type_ids"],
        )
    return example, out.kept_counts, out.survival_depth


@pytest.mark.parametrize("rho", [0.1, 0.4, 1.0])
def test_depth_agrees_with_the_kept_counts(rho: float) -> None:
    example, counts, depth = pruned("classification", rho)
    real = example["attention_mask"].bool()
    assert depth.dtype == torch.long and depth.shape == real.shape
    assert (depth[~real] == 0).all()  # pads never enter a layer
    assert ((depth >= 0) & (depth <= TINY_LAYERS)).all()
    for layer in range(TINY_LAYERS):  # a dropped token never comes back: depth > p ⇔ it entered layer p
        assert (depth > layer).sum(1).tolist() == counts[:, layer].tolist()
    assert (depth[:, 0] == TINY_LAYERS).all()  # [CLS] is protected
    if rho == 1.0:
        assert (depth[real] == TINY_LAYERS).all()


def test_protected_question_and_the_floor_survive_every_layer() -> None:
    example, _, depth = pruned("qa", 0.1)
    protected = example["protected_mask"].bool()
    assert (depth[protected] == TINY_LAYERS).all()
    assert (depth[example["attention_mask"].bool() & ~protected] < TINY_LAYERS).any()
    # every row at or under the floor runs dense at any rho
    example, _, depth = pruned("classification", 0.1, min_kept=64)
    assert (depth[example["attention_mask"].bool()] == TINY_LAYERS).all()


def test_evaluation_pass_reports_the_same_depth() -> None:
    model, _ = tiny_model("classification")
    example = example_inputs(2, 20, model.backbone.info_vocab_size, (0.3,), seed=3)
    inputs = PrunedInputs(example["input_ids"], example["attention_mask"], example["rho"])
    with torch.no_grad():
        evaluated = model.forward_evaluation(inputs, record_survivors=True)
    survivors = evaluated.survivors
    assert survivors is not None
    assert torch.equal(evaluated.survival_depth, survivors.sum(1))  # (B, P, T) → (B, T)


@pytest.mark.parametrize("task", TASKS)
def test_every_exported_graph_reports_depth_as_torch_does(tmp_path: Path, task: str) -> None:
    manifest = build_tiny_model_dir(tmp_path / task, task)  # export validates it on its grid
    assert manifest.has_survival_depth and Manifest.read(tmp_path / task).has_survival_depth
    assert [spec.name for spec in manifest.outputs][-1] == "survival_depth"
    model, _ = tiny_model(task)
    example = example_inputs(4, 40, model.backbone.info_vocab_size, (0.15, 0.5, 0.8, 1.0), seed=11)
    names = [spec.name for spec in task_spec(task).inputs]
    *_, depth = open_session(tmp_path / task / "model.onnx").run(None, {n: example[n].numpy() for n in names})
    with torch.no_grad():
        expected = graph_for(model)(*(example[name] for name in names))[2]
    assert depth.dtype == np.int64
    np.testing.assert_array_equal(depth, expected.numpy())


def test_export_validation_catches_a_depth_mismatch(tmp_path: Path) -> None:
    build_tiny_model_dir(tmp_path / "m")
    model, _ = tiny_model("classification")
    scorer = model.scorers[0]
    assert isinstance(scorer, RetentionScorer)
    with torch.no_grad():
        scorer.v.weight.neg_()  # the same counts, other tokens: only the depth can tell
        scorer.v.bias.zero_()
    with pytest.raises(ExportValidationError, match="survival depth"):
        validate_onnx(model, tmp_path / "m" / "model.onnx", model.backbone.info_vocab_size)


def test_export_measures_a_speed_curve_the_manifest_keeps(tmp_path: Path) -> None:
    """What the curve holds (not how fast: timings belong to benchmarks): every ρ of the grid, 1 at
    ρ = 1 by definition, the machine, and a manifest that reads back with it."""
    manifest = build_tiny_model_dir(tmp_path / "m", "qa")
    model, _ = tiny_model("qa")
    speed = measure_speed(tmp_path / "m" / "model.onnx", manifest, model.backbone.info_vocab_size)
    assert [point.rho for point in speed.points] == list(SPEED_RHOS)
    assert speed.points[-1].value == 1.0 and all(point.value > 0 for point in speed.points)
    assert speed.machine["cores"] and speed.repeats == SPEED_REPEATS
    manifest.speed = speed
    manifest.write(tmp_path / "m")
    assert Manifest.read(tmp_path / "m").speed == speed
