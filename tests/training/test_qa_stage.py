"""The QA retention stage on a finished dense run (issue 24): ``retention_stage`` in a recipe, on tiny
random models. The dense run is the teacher: frozen, only the scorers move and ρ = 1 is the teacher; tuned,
backbone and head move against a frozen copy of it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from retention_tasks.qa.learn import qa_distill
from tests.tasks.rows import SQUAD_ROWS
from tests.tiny import tiny_model, tiny_recipe
from training.export.install import export_model
from training.fitting.fit import (
    LOG_FILE,
    WEIGHTS_FILE,
    StepSchedule,
    TrainState,
    final_lambda,
    fit,
    initial_state,
    load_run,
    train_step,
)
from training.fitting.objective import Objective
from training.recipes.recipe import (
    ObjectiveSpec,
    Recipe,
    RetentionSpec,
    RetentionStageSpec,
    RhoSpec,
    load_recipe,
)
from training.tasks.batch import Batch

REPO = Path(__file__).resolve().parents[2]
SQUAD_RECIPE = REPO / "models" / "recipes" / "squad.yaml"
TEACHER_RECIPE = REPO / "experiments" / "recipes" / "squad-teacher.yaml"  # the teacher chain's study
TEACHER = "teacher"  # the dense run's directory name under the test's runs dir
STEPS = 3


def _base(**update) -> Recipe:
    sizes = {"batch_size": 2, "steps": STEPS, "log_every": 1, "checkpoint_every": 2, "max_length": 48}
    return tiny_recipe("qa").model_copy(update=sizes | update)


def dense_recipe() -> Recipe:
    """As squad-teacher.yaml's teacher profile: one dense pass per step, ρ fixed at 1."""
    return _base(
        rho=RhoSpec(low=1.0, high=1.0),
        objective=ObjectiveSpec(soft_loss_weight=0.0, pruned_loss_weight=1.0),
        optimizer=_base().optimizer.model_copy(update={"lr": 1e-3}),
    )


def stage_recipe(frozen: bool, **update) -> Recipe:
    """As squad-teacher.yaml's stage profiles: from the dense run, calibrated shift, later pruning."""
    tuned = {"pruned_loss_weight": 0.0 if frozen else 1.0, "distill_weight": 1.0}
    recipe = _base(
        name="tiny-qa-stage",
        init_from=TEACHER,
        retention_stage=RetentionStageSpec(freeze_backbone=frozen),
        seed=4,
        retention=RetentionSpec(score_shift="calibrated", schedule_power=2.0),
        rho=RhoSpec(low=0.2, high=1.0),
        objective=ObjectiveSpec(**tuned),
        optimizer=_base().optimizer.model_copy(update={"lr": 1e-3, "scorer_lr": 1e-2}),
    )
    return recipe.model_copy(update=update)


def tiny_fit(recipe: Recipe, run_dir: Path, **kwargs):
    model, tokenizer = tiny_model("qa")
    return fit(
        recipe,
        run_dir,
        backbone=model.backbone,
        tokenizer=tokenizer,
        train_rows=SQUAD_ROWS,
        progress=False,
        **kwargs,
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A runs dir holding a finished tiny dense QA run, the teacher."""
    root = tmp_path_factory.mktemp("runs")
    tiny_fit(dense_recipe(), root / TEACHER)
    return root


def stage_state(recipe: Recipe, runs: Path) -> tuple[TrainState, Objective]:
    """Model, optimizer and teacher at step 0, as ``fit`` builds them, and the objective."""
    objective = Objective.from_recipe(recipe)
    torch.manual_seed(recipe.seed)
    model, _ = tiny_model("qa")
    state = initial_state(recipe, objective, model.backbone, "cpu", runs / TEACHER)
    state.model.train()
    return state, objective


def qa_batch(count: int = 3) -> Batch:
    _, tokenizer = tiny_model("qa")
    return Objective.from_recipe(stage_recipe(True)).task.make_batch(SQUAD_ROWS[:count], tokenizer, 48)


def run_steps(state: TrainState, objective: Objective, count: int = STEPS) -> None:
    batch = qa_batch(4)
    for _ in range(count):
        train_step(state, objective, batch, StepSchedule(count + 1, 0, 1.0))


def backbone_and_head(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: v.detach().clone() for n, v in model.state_dict().items() if not n.startswith("scorers.")}


def scorers(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: v.detach().clone() for n, v in model.state_dict().items() if n.startswith("scorers.")}


def dense_logits(model, batch: Batch) -> torch.Tensor:
    """The span logits (N, T, 2) at ρ = 1, without gradient."""
    with torch.no_grad():
        return model.forward_pruned(**batch.encoder_inputs(), rho=torch.ones(batch.input_ids.shape[0])).logits


# ---------------------------------------------------------------------- the recipe
def test_squad_stage_profiles_start_from_the_teacher() -> None:
    frozen, tuned = (load_recipe(TEACHER_RECIPE, name) for name in ("stage-frozen", "stage-tuned"))
    for recipe in (frozen, tuned):
        assert recipe.init_from == "squad-minilm-teacher" and recipe.retention_stage is not None
        assert recipe.retention.score_shift == "calibrated" and recipe.retention.schedule_power > 1.0
        assert (recipe.rho.low, recipe.rho.high) == (0.2, 1.0) and recipe.objective.distill_weight > 0.0
        assert Objective.from_recipe(recipe).distill_target == "teacher"
    assert frozen.frozen_backbone and not tuned.frozen_backbone
    assert tuned.optimizer.lr == 2.0e-5 and tuned.objective.pruned_loss_weight > 0.0


def test_teacher_profile_resumes_its_checkpoint_from_before_the_opt_in_floor() -> None:
    """The dense teacher's checkpoint (RETENTION_RUNS_DIR/squad-minilm-teacher) was written while the
    kept-token floor defaulted to 16; ``fit --resume`` refuses a checkpoint of another recipe, so the
    profile pins that floor (it changes nothing at ρ = 1)."""
    teacher = load_recipe(TEACHER_RECIPE, "teacher")
    assert teacher.retention.min_kept_tokens == 16 and teacher.rho.low == teacher.rho.high == 1.0


def test_a_stage_needs_a_run_to_start_from_and_refuses_a_pass_that_trains_nothing() -> None:
    with pytest.raises(ValueError, match="set init_from"):
        stage_recipe(True).model_validate(stage_recipe(True).model_dump() | {"init_from": None})
    untrainable = stage_recipe(True, objective=ObjectiveSpec(pruned_loss_weight=1.0, distill_weight=1.0))
    with pytest.raises(ValueError, match="top-M pass trains nothing"):
        Objective.from_recipe(untrainable)
    no_soft = stage_recipe(False, objective=ObjectiveSpec(soft_loss_weight=0.0, pruned_loss_weight=1.0))
    with pytest.raises(ValueError, match="soft_loss_weight > 0"):
        Objective.from_recipe(no_soft)
    # The recorded recipes keep in-place distillation.
    assert Objective.from_recipe(load_recipe(SQUAD_RECIPE, "calibrated")).distill_target == "dense_pass"


def test_a_stage_starts_from_the_dense_run(runs: Path) -> None:
    teacher, _, _ = load_run(runs / TEACHER)
    for frozen in (True, False):
        state, _ = stage_state(stage_recipe(frozen), runs)
        start, parent = backbone_and_head(state.model), backbone_and_head(teacher)
        assert start.keys() == parent.keys() and all(torch.equal(start[k], parent[k]) for k in parent)
        assert state.lam.tolist() == final_lambda(runs / TEACHER)  # the dense run never moved λ: zeros
        assert (state.teacher is None) == frozen


# ---------------------------------------------------------------------- frozen
def test_frozen_stage_moves_only_the_scorers(runs: Path) -> None:
    state, objective = stage_state(stage_recipe(True), runs)
    before, scorers_before = backbone_and_head(state.model), scorers(state.model)
    run_steps(state, objective)
    after = backbone_and_head(state.model)
    assert all(torch.equal(after[k], before[k]) for k in before)  # backbone and head: bit-identical
    assert any(not torch.equal(v, scorers_before[k]) for k, v in scorers(state.model).items())


def test_frozen_stage_distils_the_soft_pass_from_the_dense_run(runs: Path) -> None:
    """The term is KL(teacher ‖ soft pass) against the dense run's own outputs (computed here from its run
    directory), it trains the scorers, and the frozen model's dense pass is that teacher even in training
    mode (no dropout)."""
    teacher, _, _ = load_run(runs / TEACHER)
    state, objective = stage_state(stage_recipe(True), runs)
    batch = qa_batch()
    expected_teacher = dense_logits(teacher, batch)
    assert torch.equal(dense_logits(state.model, batch), expected_teacher)  # state.model is in train mode
    rho = torch.full((batch.input_ids.shape[0],), 0.3)
    terms = objective.terms(state.model, batch, rho, state.lam, state.generator, state.teacher)
    assert terms.soft is not None and terms.extra.soft_distill is not None
    assert terms.extra.pruned is None and terms.extra.dense is None  # nothing in them would train
    torch.testing.assert_close(
        terms.extra.soft_distill, qa_distill(terms.soft.logits, expected_teacher, batch), rtol=0, atol=0
    )
    assert terms.extra.soft_distill.item() > 0.0
    terms.extra.soft_distill.backward()
    assert all(p.grad is not None for p in state.model.scorers.parameters())


def test_frozen_stage_run_at_rho_1_is_the_teacher_exactly(runs: Path, tmp_path: Path) -> None:
    tiny_fit(stage_recipe(True), tmp_path / "stage", init_run=runs / TEACHER)
    stage, recipe, tokenizer = load_run(tmp_path / "stage")
    teacher, _, _ = load_run(runs / TEACHER)
    assert recipe.retention_stage is not None and recipe.retention_stage.freeze_backbone  # recorded
    batch = qa_batch(len(SQUAD_ROWS))
    assert torch.equal(dense_logits(stage, batch), dense_logits(teacher, batch))
    trained = load_file(str(tmp_path / "stage" / WEIGHTS_FILE))
    assert any(
        not torch.equal(v, scorers(teacher)[k]) for k, v in trained.items() if k.startswith("scorers.")
    )
    log = (tmp_path / "stage" / LOG_FILE).read_text().splitlines()
    assert len(log) == STEPS and '"soft_distill_loss": null' not in log[-1]
    manifest = export_model(stage, recipe, tokenizer, tmp_path / "model")  # parity-checked against torch
    assert manifest.task == "qa"


# ---------------------------------------------------------------------- tuned
def test_tuned_stage_moves_the_backbone_against_a_fixed_teacher(runs: Path) -> None:
    teacher_run, _, _ = load_run(runs / TEACHER)
    state, objective = stage_state(stage_recipe(False), runs)
    before = backbone_and_head(state.model)
    run_steps(state, objective)
    after = backbone_and_head(state.model)
    assert any(not torch.equal(after[k], before[k]) for k in before if k.startswith("backbone."))
    assert not torch.equal(after["head.out.weight"], before["head.out.weight"])
    assert state.teacher is not None and not state.teacher.training
    assert not any(p.requires_grad for p in state.teacher.parameters())
    fixed = backbone_and_head(state.teacher)
    assert all(torch.equal(fixed[k], before[k]) for k in before)  # untouched by the steps

    # The top-M pass's divergence is taken from the teacher, not from the student's own dense pass: at
    # ρ = 1 without dropout the top-M pass IS the student's dense pass (in-place distillation would give
    # exactly 0), while the student has drifted from the teacher.
    batch = qa_batch()
    state.model.eval()
    ones = torch.ones(batch.input_ids.shape[0])
    terms = objective.terms(state.model, batch, ones, state.lam, state.generator, state.teacher)
    assert terms.extra.distill is not None and terms.extra.pruned is not None
    expected = qa_distill(dense_logits(state.model, batch), dense_logits(teacher_run, batch), batch)
    torch.testing.assert_close(terms.extra.distill, expected, rtol=1e-5, atol=1e-7)
    assert terms.extra.distill.item() > 1e-6


def test_tuned_stage_resumes_as_if_never_stopped(runs: Path, tmp_path: Path) -> None:
    """The teacher copy is not checkpointed: a resumed run rebuilds it from the init_from run."""
    recipe = stage_recipe(False)
    tiny_fit(recipe, tmp_path / "whole", init_run=runs / TEACHER)
    tiny_fit(recipe, tmp_path / "split", init_run=runs / TEACHER, stop_at=1)
    tiny_fit(recipe, tmp_path / "split", init_run=runs / TEACHER, resume=True)
    whole = load_file(str(tmp_path / "whole" / WEIGHTS_FILE))
    split = load_file(str(tmp_path / "split" / WEIGHTS_FILE))
    assert all(torch.equal(tensor, split[name]) for name, tensor in whole.items())
