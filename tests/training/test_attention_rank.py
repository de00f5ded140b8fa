"""Scorers that start from what attention already knows (issue 35): the attention-received ranking as a
distillation target for the scorers, and LengthDrop's in-place distillation over the budget sandwich."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from tests.tiny import tiny_model, tiny_recipe
from tests.training.test_qa_stage import TEACHER, qa_batch, runs, stage_recipe, stage_state  # noqa: F401 (fixture)
from training import retention as R
from training.fit import StepSchedule, train_step
from training.model import attention_selector
from training.objective import Objective
from training.recipes import ObjectiveSpec, Recipe

RANK_STEPS = 25


# ---------------------------------------------------------------------- the pure math
def test_rank_loss_is_zero_when_the_scores_are_the_log_of_the_received_attention() -> None:
    received = torch.tensor([[0.5, 2.0, 1.0, 0.25, 9.0]])  # (1, T); the last slot is not a candidate
    candidates = torch.tensor([[True, True, True, True, False]])
    exact = torch.log(received) + 3.0  # any per-row shift ranks the same
    assert R.rank_distill_loss(exact, received, candidates).item() == pytest.approx(0.0, abs=1e-6)
    assert R.rank_distill_loss(-exact, received, candidates).item() > 0.5


def test_rank_loss_leaves_out_rows_with_nothing_to_rank() -> None:
    scores = torch.tensor([[1.0, 0.0, 2.0], [0.3, 0.1, 0.2]], requires_grad=True)
    received = torch.tensor([[1.0, 1.0, 1.0], [1.0, 3.0, 1.0]])
    one_candidate = torch.tensor([[True, False, False], [True, True, True]])
    loss = R.rank_distill_loss(scores, received, one_candidate)
    only_second = R.rank_distill_loss(scores[1:], received[1:], one_candidate[1:])
    assert loss.item() == pytest.approx(only_second.item())
    loss.backward()
    assert scores.grad is not None and torch.all(scores.grad[0] == 0.0)
    none = torch.zeros_like(one_candidate)
    assert R.rank_distill_loss(scores, received, none).item() == 0.0


def test_minimising_the_rank_loss_gives_attention_top_k() -> None:
    generator = torch.Generator().manual_seed(0)
    received = torch.rand(4, 20, generator=generator)  # (B, T)
    candidates = torch.ones(4, 20, dtype=torch.bool)
    scores = torch.zeros(4, 20, requires_grad=True)
    optimizer = torch.optim.SGD([scores], lr=50.0)
    for _ in range(200):
        optimizer.zero_grad()
        R.rank_distill_loss(scores, received, candidates).backward()
        optimizer.step()
    assert torch.equal(scores.topk(6).indices.sort().values, received.topk(6).indices.sort().values)


def test_attention_received_is_what_the_attention_baseline_ranks_by() -> None:
    model, _ = tiny_model("qa")
    model.eval()
    batch = qa_batch(2)
    states, received = model.dense_attention(batch.input_ids, batch.attention_mask, batch.token_type_ids)
    assert states.shape[:3] == (*batch.input_ids.shape[:1], model.num_points, batch.input_ids.shape[1])
    assert received.shape == (batch.input_ids.shape[0], model.num_points, batch.input_ids.shape[1])
    valid = batch.attention_mask.bool()
    select = attention_selector()
    for point, layer in enumerate(model.backbone.views):
        assert torch.allclose(select(point, layer, states[:, point], valid), received[:, point])


# ---------------------------------------------------------------------- a stage that ranks
def warmup_recipe() -> Recipe:
    """Scorer warm-up on the dense teacher: backbone and head frozen, no soft pass, the rank term only."""
    return stage_recipe(True, objective=ObjectiveSpec(soft_loss_weight=0.0, attention_rank_weight=1.0))


def test_a_warmup_stage_moves_only_the_scorers_toward_the_attention_ranking(runs: Path) -> None:  # noqa: F811
    recipe = warmup_recipe()
    state, objective = stage_state(recipe, runs)
    before = {n: v.detach().clone() for n, v in state.model.state_dict().items()}
    batch = qa_batch(4)
    schedule = StepSchedule(RANK_STEPS + 1, 0, 1.0)
    losses = [train_step(state, objective, batch, schedule).log(0.0).rank_loss for _ in range(RANK_STEPS)]
    assert all(loss is not None for loss in losses)
    assert losses[-1] < 0.8 * losses[0]
    after = state.model.state_dict()
    moved = {name for name in before if not torch.equal(before[name], after[name])}
    assert moved and all(name.startswith("scorers.") for name in moved)


def test_a_rank_term_needs_no_other_term_but_nothing_at_all_is_refused() -> None:
    Objective.from_recipe(warmup_recipe())
    nothing = stage_recipe(True, objective=ObjectiveSpec(soft_loss_weight=0.0))
    with pytest.raises(ValueError, match="nothing would train"):
        Objective.from_recipe(nothing)


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


# ---------------------------------------------------------------------- Block-Skim's answer blocks
def test_answer_block_loss_pushes_the_answer_block_open_and_leaves_unscored_blocks_out() -> None:
    length, block = 8, 4  # two blocks: the answer sits in the second
    salient = torch.tensor([[False] * 5 + [True] + [False] * 2])  # (1, T)
    candidates = torch.ones(1, length, dtype=torch.bool)
    logits = torch.zeros(1, 2, length, requires_grad=True)  # (B, P, T)
    loss = R.answer_block_loss(torch.sigmoid(logits), candidates, salient, block, positive_weight=20.0)
    # every block at p = 0.5: the answer block costs 20·log 2, the other log 2, at both points
    assert loss.item() == pytest.approx(21.0 * math.log(2.0) / 2.0, rel=1e-5)
    loss.backward()
    assert logits.grad is not None
    assert torch.all(logits.grad[0, :, 4:] < 0) and torch.all(logits.grad[0, :, :4] > 0)
    first_block_only = torch.tensor([[True] * 4 + [False] * 4])  # the answer block has no droppable token
    alone = R.answer_block_loss(torch.full((1, 2, length), 0.5), first_block_only, salient, block)
    assert alone.item() == pytest.approx(math.log(2.0), rel=1e-5)


def test_answer_block_term_trains_on_the_soft_pass_of_a_qa_stage(runs: Path) -> None:  # noqa: F811
    spec = ObjectiveSpec(pruned_loss_weight=0.0, distill_weight=1.0, answer_block_weight=0.1)
    recipe = stage_recipe(True, objective=spec)
    state, objective = stage_state(recipe, runs)
    log = train_step(state, objective, qa_batch(4), StepSchedule(2, 0, 1.0)).log(0.0)
    assert log.answer_block_loss is not None and log.answer_block_loss > 0.0
    no_soft = stage_recipe(True, objective=spec.model_copy(update={"soft_loss_weight": 0.0}))
    with pytest.raises(ValueError, match="answer_block_weight needs the soft pass"):
        Objective.from_recipe(no_soft)


# ---------------------------------------------------------------------- the study's stages in bf16
def pilot_recipe() -> Recipe:
    """As the lengthdrop-pilot profile: tuned backbone, soft pass + Lagrangian, the rank term and the
    sandwich distilled from the frozen teacher."""
    spec = ObjectiveSpec(
        pruned_loss_weight=1.0, distill_weight=1.0, attention_rank_weight=1.0, sandwich_random_budgets=2
    )
    return stage_recipe(False, objective=spec)


@pytest.mark.parametrize("make_recipe", [warmup_recipe, pilot_recipe], ids=["warmup", "pilot"])
def test_the_study_stages_train_under_bf16_autocast_close_to_fp32(runs: Path, make_recipe) -> None:  # noqa: F811
    logs = {}
    for dtype in (None, torch.bfloat16):
        state, objective = stage_state(make_recipe(), runs)
        state.autocast_dtype = dtype
        logs[dtype] = [
            train_step(state, objective, qa_batch(4), StepSchedule(3, 0, 1.0)).log(0.0) for _ in range(2)
        ]
    for full, mixed in zip(logs[None], logs[torch.bfloat16], strict=True):
        assert math.isfinite(mixed.loss) and mixed.rank_loss is not None
        assert mixed.loss == pytest.approx(full.loss, rel=0.05, abs=0.05)
        assert mixed.rank_loss == pytest.approx(full.rank_loss, rel=0.05, abs=0.01)


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
