"""Every profile of every committed recipe (ablations included) is one `fit` could run: it validates,
its task and dataset are registered, and a training stage starts from a run its own recipe produces.
The QA and summarization recipes also make batches their training task accepts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.tasks.rows import SCITLDR_ROWS, SQUAD_ROWS
from training.__main__ import run_dir_for
from training.data import REGISTRY
from training.recipes import Recipe, load_recipe, recipe_profiles
from training.tasks import training_task

RECIPES = Path(__file__).resolve().parents[2] / "models" / "recipes"
RECIPE_FILES = sorted(RECIPES.rglob("*.yaml"))
PROFILES = [(path, profile) for path in RECIPE_FILES for profile in recipe_profiles(path)]
RUNS = Path("runs")


def _runs_produced(path: Path) -> set[str]:
    """The run directory names that the profiles of one recipe file write (``fit`` names them)."""
    return {run_dir_for(load_recipe(path, profile), RUNS).name for profile in recipe_profiles(path)}


@pytest.mark.parametrize(
    ("path", "profile"),
    PROFILES,
    ids=[f"{path.relative_to(RECIPES).with_suffix('')}:{profile}" for path, profile in PROFILES],
)
def test_every_profile_of_every_recipe_is_runnable(path: Path, profile: str) -> None:
    recipe = load_recipe(path, profile)
    assert recipe.profile == profile
    assert training_task(recipe.task) is not None
    assert recipe.dataset.name in REGISTRY
    assert max(recipe.evaluation.rhos) == 1.0
    if recipe.init_from is not None:
        assert recipe.init_from in _runs_produced(path) - {run_dir_for(recipe, RUNS).name}


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
