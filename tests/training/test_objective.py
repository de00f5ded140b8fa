"""The training objective as one object: recipe → Objective, legacy recipes, train_step, the exported pass."""

from __future__ import annotations

import inspect
import json

import pytest
import torch
from pydantic import ValidationError

from tests.tiny import tiny_model, tiny_recipe
from training.engine.gates import SoftGates
from training.engine.model import RetentionModel
from training.fitting.fit import StepSchedule, TrainState, initial_state, train_step
from training.fitting.objective import BudgetRule, Objective
from training.recipes.recipe import Recipe
from training.tasks.batch import Batch

ROWS = [{"text": f"a {'good' if i % 2 else 'bad'} movie number {i}", "label": i % 2} for i in range(8)]


def _legacy_run_recipe(**budget: object) -> dict:
    """A recipe.json as runs wrote it before issue 25: every switch dumped, deleted ones included."""
    dumped = tiny_recipe("qa").model_dump(mode="json")
    dumped["retention"] = {
        key: value for key, value in dumped["retention"].items() if key != "score_shift"
    } | {"normalize_scores": True, "score_shift": "calibrated"}
    dumped["budget"] = dumped["budget"] | {"quadratic_weight": 0.0, "use_gates": True} | budget
    return dumped


def test_a_legacy_run_recipe_loads_as_the_new_one() -> None:
    legacy = Recipe.model_validate_json(json.dumps(_legacy_run_recipe()))
    current = tiny_recipe("qa").model_copy(
        update={"retention": tiny_recipe("qa").retention.model_copy(update={"score_shift": "calibrated"})}
    )
    assert legacy == current
    assert "quadratic_weight" not in legacy.model_dump()["budget"]
    assert "normalize_scores" not in legacy.model_dump()["retention"]


@pytest.mark.parametrize(
    ("normalize", "shift", "expected"),
    [
        (False, "quantile", "none"),
        (False, "calibrated", "none"),
        (True, "quantile", "quantile"),
        (True, None, "quantile"),
    ],
)
def test_normalize_scores_becomes_one_score_shift(normalize: bool, shift: str | None, expected: str) -> None:
    retention: dict[str, object] = {"normalize_scores": normalize}
    if shift is not None:
        retention["score_shift"] = shift
    recipe = Recipe.model_validate({"name": "r", "dataset": {"name": "squad"}, "retention": retention})
    assert recipe.retention.score_shift == expected


@pytest.mark.parametrize("switch", [{"quadratic_weight": 0.5}, {"use_gates": False}])
def test_a_deleted_switch_at_a_value_other_than_off_is_refused(switch: dict[str, object]) -> None:
    with pytest.raises(ValidationError, match="was removed"):
        Recipe.model_validate_json(json.dumps(_legacy_run_recipe(**switch)))


def test_objective_is_built_from_the_recipe() -> None:
    recipe = Recipe.model_validate(
        {
            "name": "r",
            "task": "qa",
            "dataset": {"name": "squad"},
            "retention": {"gates": "sigmoid", "score_shift": "quantile"},
            "rho": {"low": 0.2, "high": 0.9},
            "budget": {"dual_lr": 0.05, "two_sided": True},
            "objective": {"pruned_loss_weight": 1.0, "distill_weight": 0.5, "salient_keep_weight": 2.0},
        }
    )
    objective = Objective.from_recipe(recipe)
    assert objective.gates == SoftGates(kind="sigmoid", score_shift="quantile")
    assert objective.budget == BudgetRule(rho_low=0.2, rho_high=0.9, dual_lr=0.05, two_sided=True)
    assert (objective.weights.pruned, objective.weights.dense, objective.weights.distill) == (1.0, 1.0, 0.5)
    assert objective.weights.salient == 2.0


def test_budget_rule_moves_lambda_by_dual_ascent_unless_frozen() -> None:
    gap = torch.tensor([0.2, -0.1])
    one_sided = BudgetRule(0.1, 1.0, dual_lr=0.5)
    assert one_sided.updated_lambda(torch.zeros(2), gap).tolist() == pytest.approx([0.1, 0.0])
    two_sided = BudgetRule(0.1, 1.0, dual_lr=0.5, two_sided=True)
    assert two_sided.updated_lambda(torch.zeros(2), gap).tolist() == pytest.approx([0.1, -0.05])
    frozen = BudgetRule(0.1, 1.0, dual_lr=0.5, fixed_lambda=0.3)
    lam = frozen.initial_lambda(torch.zeros(2))
    assert frozen.updated_lambda(lam, gap).tolist() == pytest.approx([0.3, 0.3])


def _state_and_batch(recipe: Recipe) -> tuple[TrainState, Objective, Batch]:
    model, tokenizer = tiny_model("classification")
    objective = Objective.from_recipe(recipe)
    torch.manual_seed(recipe.seed)
    state = initial_state(recipe, objective, model.backbone, "cpu", None)
    state.model.train()
    return state, objective, objective.task.make_batch(ROWS[:4], tokenizer, recipe.max_length)


def test_train_step_is_a_function_of_the_state_and_the_batch() -> None:
    recipe = tiny_recipe("classification").model_copy(update={"steps": 4, "batch_size": 4})
    schedule = StepSchedule.from_recipe(recipe)
    logs = []
    for _ in range(2):
        state, objective, batch = _state_and_batch(recipe)
        first = train_step(state, objective, batch, schedule)
        second = train_step(state, objective, batch, schedule)
        assert state.step == 2 and (first.step, second.step) == (0, 1)
        logs.append([first.log(seconds=0.0), second.log(seconds=0.0)])
    assert logs[0] == logs[1]  # same state, same batch: the same step, bit for bit
    entry = logs[0][1]
    assert entry.lam == [round(x, 5) for x in state.lam.tolist()] and any(x != 0.0 for x in entry.lam)
    assert entry.pruned_loss is None and entry.dense_loss is None and entry.salient_loss is None
    assert 0.0 < entry.kept_fraction <= 1.0 and entry.lr > 0.0


def test_the_exported_pass_takes_only_model_inputs_and_a_baseline_selector() -> None:
    """export traces forward_pruned: evaluation options (open gates, survivors) live elsewhere; ``paths``
    is the export's choice of a two-path model's branch (each traced as a graph of its own)."""
    parameters = list(inspect.signature(RetentionModel.forward_pruned).parameters)
    assert parameters == [
        "self",
        "input_ids",
        "attention_mask",
        "rho",
        "protected",
        "token_type_ids",
        "selector",
        "paths",
    ]


def _dense_teacher_recipe() -> Recipe:
    recipe = tiny_recipe("classification").model_copy(update={"steps": 4, "batch_size": 4})
    dense_only = recipe.objective.model_copy(update={"soft_loss_weight": 0.0, "pruned_loss_weight": 1.0})
    return recipe.model_copy(
        update={"objective": dense_only, "rho": recipe.rho.model_copy(update={"low": 1.0})}
    )


def test_a_step_without_the_soft_pass_is_plain_dense_fine_tuning() -> None:
    """soft_loss_weight 0 + ρ fixed at 1 (the dense QA teacher): one dense pass, its task loss is the
    whole loss, the scorers and λ do not move."""
    recipe = _dense_teacher_recipe()
    state, objective, batch = _state_and_batch(recipe)
    scorers = {name: p.detach().clone() for name, p in state.model.named_parameters() if "scorer" in name}
    assert scorers  # the tiny model has scorers to watch
    lam = state.lam.clone()
    state.model.eval()  # no dropout (train_step keeps the mode it finds): the same pass, deterministic
    with torch.no_grad():
        ones = torch.ones(batch.input_ids.shape[0])
        dense_logits = state.model.forward_pruned(**batch.encoder_inputs(), rho=ones).logits
        dense_loss = objective.task.loss(dense_logits, batch)
    result = train_step(state, objective, batch, StepSchedule.from_recipe(recipe))
    log = result.log(seconds=0.0)
    assert result.terms.soft is None and log.task_loss == 0.0 and log.kept_fraction == 1.0
    assert result.loss.item() == pytest.approx(dense_loss.item(), rel=1e-6)
    assert torch.equal(state.lam, lam)
    for name, before in scorers.items():
        assert torch.equal(dict(state.model.named_parameters())[name], before), name


def test_an_objective_with_nothing_to_train_is_refused() -> None:
    recipe = _dense_teacher_recipe()
    nothing = recipe.objective.model_copy(update={"pruned_loss_weight": 0.0})
    with pytest.raises(ValueError, match="nothing would train"):
        Objective.from_recipe(recipe.model_copy(update={"objective": nothing}))
