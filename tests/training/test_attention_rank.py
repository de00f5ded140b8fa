"""LengthDrop's in-place distillation over the budget sandwich (the Length-Adaptive Transformer), and the
retention stages of the QA study (issue 35) under bf16 autocast. The study's attention-ranking and
answer-block terms were removed from the product (training.recipes.recipe.DELETED_OBJECTIVE_TERMS)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from tests.tiny import tiny_model, tiny_recipe
from tests.training.test_qa_stage import TEACHER, qa_batch, runs, stage_recipe, stage_state  # noqa: F401 (fixture)
from training.engine import selection as R
from training.fitting.fit import StepSchedule, train_step
from training.fitting.objective import Objective
from training.recipes.recipe import ObjectiveSpec, Recipe


# ---------------------------------------------------------------------- LengthDrop's sandwich
def lengthdrop_recipe() -> Recipe:
    """In-place distillation over the sandwich (the Length-Adaptive Transformer): ρ = 1, ρ.low and two
    random budgets a step; the narrower passes learn from the widest."""
    spec = ObjectiveSpec(pruned_loss_weight=0.0, distill_weight=1.0, sandwich_random_budgets=2)
    return tiny_recipe("qa").model_copy(update={"objective": spec, "batch_size": 3, "max_length": 48})


def test_every_narrower_sandwich_pass_learns_from_the_widest() -> None:
    recipe = lengthdrop_recipe()
    objective = Objective.from_recipe(recipe)
    model, _ = tiny_model("qa")
    model.eval()  # no dropout: the passes below repeat exactly
    batch = qa_batch(3)
    rho = torch.linspace(0.4, 0.8, batch.input_ids.shape[0])  # (N,) one budget per window
    extra = objective.hard_pass_losses(model, batch, rho, torch.Generator().manual_seed(1))
    budgets = objective.budget.sandwich(rho, 2, torch.Generator().manual_seed(1))
    inputs = batch.encoder_inputs()
    with torch.no_grad():
        widest = model.forward_pruned(**inputs, rho=budgets[0]).logits
        students = [model.forward_pruned(**inputs, rho=budget).logits for budget in budgets[1:]]
    assert torch.equal(budgets[0], torch.ones_like(rho)) and len(students) == 3
    assert objective.task.distill is not None and extra.dense is not None and extra.distill is not None
    assert extra.pruned is None  # pruned_loss_weight 0: the narrower passes learn from the widest only
    assert extra.dense.item() == pytest.approx(objective.task.loss(widest, batch).item(), rel=1e-5)
    expected = torch.stack([objective.task.distill(s, widest, batch) for s in students]).mean()
    assert extra.distill.item() == pytest.approx(expected.item(), rel=1e-5)


# ---------------------------------------------------------------------- the study's stages in bf16
def pilot_recipe() -> Recipe:
    """As the lengthdrop-pilot profile without its (removed) ranking term: tuned backbone, soft pass +
    Lagrangian, and the sandwich distilled from the frozen teacher."""
    spec = ObjectiveSpec(pruned_loss_weight=1.0, distill_weight=1.0, sandwich_random_budgets=2)
    return stage_recipe(False, objective=spec)


def frozen_stage_recipe() -> Recipe:
    """As the stage-frozen profile: scorers only, the soft pass distilled from the teacher."""
    return stage_recipe(True)


@pytest.mark.parametrize("make_recipe", [frozen_stage_recipe, pilot_recipe], ids=["frozen", "pilot"])
def test_the_study_stages_train_under_bf16_autocast_close_to_fp32(runs: Path, make_recipe) -> None:  # noqa: F811
    logs = {}
    for dtype in (None, torch.bfloat16):
        state, objective = stage_state(make_recipe(), runs)
        state.autocast_dtype = dtype
        logs[dtype] = [
            train_step(state, objective, qa_batch(4), StepSchedule(3, 0, 1.0)).log(0.0) for _ in range(2)
        ]
    for full, mixed in zip(logs[None], logs[torch.bfloat16], strict=True):
        assert math.isfinite(mixed.loss) and mixed.soft_distill_loss is not None
        assert full.soft_distill_loss is not None
        assert mixed.loss == pytest.approx(full.loss, rel=0.05, abs=0.05)
        assert mixed.soft_distill_loss == pytest.approx(full.soft_distill_loss, rel=0.05, abs=0.01)


def test_attention_received_and_distillation_are_fp32_under_autocast() -> None:
    probs = torch.softmax(torch.randn(2, 3, 6, 6), dim=-1)  # (B, H, T, T)
    valid = torch.ones(2, 6, dtype=torch.bool)
    received = R.attention_received(probs.to(torch.bfloat16), valid)
    assert received.dtype == torch.float32
    torch.testing.assert_close(received, R.attention_received(probs.to(torch.bfloat16).float(), valid))
    objective = Objective.from_recipe(pilot_recipe())
    batch = qa_batch(2)
    student = torch.randn(*batch.input_ids.shape, 2)  # (N, T, 2) span logits
    teacher = torch.randn_like(student)
    divergence = objective.divergence(student.to(torch.bfloat16), teacher.to(torch.bfloat16), batch)
    assert divergence is not None and divergence.dtype == torch.float32
