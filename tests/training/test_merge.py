"""Merging what a pruning point drops (issue 33): the pure functions, the pruned pass with merging and a
leading span, its ONNX export, and the multi-budget (sandwich) top-M term."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from retention_core.contract import MODEL_FILE
from retention_ort import open_session
from training.engine import selection as R
from training.engine.baselines import leading_selector
from training.export.install import export_model
from training.fitting.objective import BudgetRule, Objective
from training.tasks.batch import Batch
from training.tiny import tiny_model, tiny_recipe

ROWS, LENGTH = 3, 12


def ragged_inputs(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Three rows of 12, 8 and 5 real tokens, right-padded: input_ids, attention_mask (B, T)."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(1000, 5000, (ROWS, LENGTH), generator=generator)
    attention_mask = torch.ones(ROWS, LENGTH, dtype=torch.long)
    attention_mask[1, 8:] = 0
    attention_mask[2, 5:] = 0
    return input_ids, attention_mask


def merging(model: torch.nn.Module, leading_share: float = 0.0) -> None:
    model.config = dataclasses.replace(model.config, merge_dropped=True, leading_share=leading_share)


# ---------------------------------------------------------------------- pure functions
def test_merge_keeps_every_token_s_mass_and_sum() -> None:
    """Sizes add up to the real tokens, and Σ size·state over the kept slots equals Σ over all tokens:
    nothing is lost, only folded."""
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(ROWS, LENGTH, 8, generator=generator)
    _, attention_mask = ragged_inputs()
    sizes = attention_mask.to(torch.float32)
    no_protection = torch.zeros(ROWS, LENGTH, dtype=torch.bool)
    scores = R.masked_scores(
        torch.randn(ROWS, LENGTH, generator=generator), attention_mask.bool(), no_protection
    )
    index, kept = R.select_top_tokens(scores, torch.tensor([4, 3, 2]))
    merged, mass = R.merge_dropped(hidden, sizes, index, kept)
    assert torch.equal(mass.sum(1), sizes.sum(1))
    assert torch.equal(mass > 0, kept)  # invalid slots hold nothing; every kept slot at least itself
    torch.testing.assert_close((merged * mass[..., None]).sum(1), (hidden * sizes[..., None]).sum(1))


def test_a_dropped_token_goes_to_its_most_similar_kept_token() -> None:
    """Four tokens on two directions; keeping tokens 0 and 2 sends 1 to 0 and 3 to 2."""
    hidden = torch.tensor([[[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.2, 0.8]]])  # (1, 4, 2)
    index, kept = torch.tensor([[0, 2]]), torch.tensor([[True, True]])
    drop_index, drop_valid = R.dropped_tokens(torch.ones(1, 4), index, kept)
    assert drop_index.tolist() == [[1, 3]] and drop_valid.all()
    assert R.nearest_kept(
        R.gather_tokens(hidden, drop_index), R.gather_tokens(hidden, index), kept
    ).tolist() == [[0, 1]]
    merged, mass = R.merge_dropped(hidden, torch.ones(1, 4), index, kept)
    assert mass.tolist() == [[2.0, 2.0]]
    torch.testing.assert_close(merged, torch.tensor([[[0.95, 0.05], [0.1, 0.9]]]))


def test_nothing_dropped_means_nothing_to_compare() -> None:
    """At ρ = 1 no token is dropped: zero dropped slots, and the kept states come back unchanged."""
    hidden = torch.randn(2, 5, 4)
    sizes = torch.ones(2, 5)
    index, kept = torch.arange(5).expand(2, -1), torch.ones(2, 5, dtype=torch.bool)
    drop_index, _ = R.dropped_tokens(sizes, index, kept)
    assert drop_index.shape == (2, 0)
    merged, mass = R.merge_dropped(hidden, sizes, index, kept)
    assert torch.equal(merged, hidden) and torch.equal(mass, sizes)


def test_proportional_bias_adds_log_size_to_valid_keys_only() -> None:
    valid = torch.tensor([[True, True, False]])
    bias = R.proportional_bias(valid, torch.tensor([[1.0, 4.0, 0.0]]), torch.float32)  # (1, 1, 1, 3)
    assert bias[0, 0, 0, 0] == 0.0
    assert bias[0, 0, 0, 1] == pytest.approx(np.log(4.0))
    assert bias[0, 0, 0, 2] <= R.MASKED_ATTENTION_BIAS / 2


def test_leading_span_is_the_share_of_each_count_given_to_the_first_tokens() -> None:
    positions = torch.arange(6).unsqueeze(0).expand(2, -1)  # (2, 6)
    span = R.leading_span(positions, torch.tensor([4, 5]), 0.5)
    assert span.tolist() == [
        [True, True, False, False, False, False],
        [True, True, False, False, False, False],
    ]


# ---------------------------------------------------------------------- the pruned pass
def test_merging_at_rho_1_is_bit_for_bit_the_dense_pass() -> None:
    model, _ = tiny_model("embedding")
    input_ids, attention_mask = ragged_inputs()
    ones = torch.ones(ROWS)
    dense = model.forward_pruned(input_ids, attention_mask, ones).logits
    merging(model, leading_share=0.5)
    assert torch.equal(model.forward_pruned(input_ids, attention_mask, ones).logits, dense)


def test_merging_changes_a_pruned_vector_but_not_the_counts() -> None:
    model, _ = tiny_model("embedding")
    input_ids, attention_mask = ragged_inputs()
    rho = torch.full((ROWS,), 0.3)
    dropped = model.forward_pruned(input_ids, attention_mask, rho)
    merging(model)
    merged = model.forward_pruned(input_ids, attention_mask, rho)
    assert torch.equal(merged.kept_counts, dropped.kept_counts)
    assert not torch.allclose(merged.logits, dropped.logits)


def test_a_full_leading_share_is_truncation_inside_the_schedule() -> None:
    """leading_share 1 keeps, at every point, the first tokens: the same survivors as the leading
    selector, whatever the scorers say."""
    model, _ = tiny_model("embedding")
    input_ids, attention_mask = ragged_inputs()
    rho = torch.full((ROWS,), 0.4)
    by_position = model.forward_pruned(input_ids, attention_mask, rho, selector=leading_selector())
    model.config = dataclasses.replace(model.config, leading_share=1.0)
    spanned = model.forward_pruned(input_ids, attention_mask, rho)
    assert torch.equal(spanned.survival_depth, by_position.survival_depth)
    torch.testing.assert_close(spanned.logits, by_position.logits)


def test_the_merged_pass_exports_and_matches_onnxruntime(tmp_path: Path) -> None:
    """export_model parity-checks the graph over its grid; here also a mixed-ρ batch by hand."""
    model, tokenizer = tiny_model("embedding")
    merging(model, leading_share=0.25)
    manifest = export_model(model, tiny_recipe("embedding"), tokenizer, tmp_path / "merged")
    assert manifest.schedule.merge_dropped and manifest.schedule.leading_share == 0.25
    input_ids, attention_mask = ragged_inputs(seed=3)
    rho = torch.tensor([0.3, 0.5, 1.0])
    expected = model.forward_pruned(input_ids, attention_mask, rho).logits.detach().numpy()
    session = open_session(tmp_path / "merged" / MODEL_FILE)
    names = {graph_input.name for graph_input in session.get_inputs()}
    feeds = {"input_ids": input_ids.numpy(), "attention_mask": attention_mask.numpy(), "rho": rho.numpy()}
    served = session.run(None, {name: value for name, value in feeds.items() if name in names})[0]
    np.testing.assert_allclose(served, expected, atol=1e-5)


# ---------------------------------------------------------------------- multi-budget training
def test_the_sandwich_is_widest_narrowest_the_batch_and_fresh_draws() -> None:
    rule = BudgetRule(rho_low=0.2, rho_high=1.0, dual_lr=0.0)
    rho = torch.tensor([0.5, 0.7])
    assert rule.sandwich(rho, 0, None) == [rho]
    budgets = rule.sandwich(rho, 3, torch.Generator().manual_seed(0))
    assert len(budgets) == 5
    assert torch.equal(budgets[0], torch.ones(2)) and torch.equal(budgets[1], torch.full((2,), 0.2))
    assert budgets[2] is rho
    assert all(((b >= 0.2) & (b <= 1.0)).all() for b in budgets[3:])


def test_the_sandwich_term_trains_the_backbone_on_every_budget() -> None:
    """With a tuned backbone the multi-budget top-M term differs from the single-budget one and sends
    a gradient into the backbone."""
    model, _ = tiny_model("embedding")
    recipe = tiny_recipe("embedding")
    input_ids, attention_mask = ragged_inputs()
    targets = torch.randn(ROWS, model.backbone.info.hidden_size)
    batch = Batch(input_ids, attention_mask, targets)
    rho = torch.full((ROWS,), 0.3)
    single = Objective.from_recipe(
        recipe.model_copy(
            update={"objective": recipe.objective.model_copy(update={"pruned_loss_weight": 1.0})}
        )
    )
    sandwich_spec = {"pruned_loss_weight": 1.0, "sandwich_random_budgets": 2}
    sandwich = Objective.from_recipe(
        recipe.model_copy(update={"objective": recipe.objective.model_copy(update=sandwich_spec)})
    )
    generator = torch.Generator().manual_seed(0)
    one = single.hard_pass_losses(model.train(), batch, rho, generator).pruned
    several = sandwich.hard_pass_losses(model.train(), batch, rho, generator).pruned
    assert one is not None and several is not None
    assert not torch.isclose(one, several)
    several.backward()
    gradient = model.backbone.layers[0].query.weight.grad
    assert gradient is not None and gradient.abs().sum() > 0
