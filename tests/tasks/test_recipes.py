"""The QA and summarization recipes parse, in both profiles, and their adapters accept them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.tasks.rows import SCITLDR_ROWS, SQUAD_ROWS
from training.recipes import load_recipe
from training.tasks import training_task

RECIPES = Path(__file__).resolve().parents[2] / "models" / "recipes"


@pytest.mark.parametrize(
    ("file", "task", "rows"),
    [("squad.yaml", "qa", SQUAD_ROWS), ("scitldr.yaml", "summarization", SCITLDR_ROWS)],
)
@pytest.mark.parametrize("profile", ["full", "quick"])
def test_recipe(hf_tokenizer: Any, file: str, task: str, rows: list[dict[str, Any]], profile: str) -> None:
    recipe = load_recipe(RECIPES / file, profile)
    assert recipe.task == task and recipe.profile == profile
    assert max(recipe.evaluation.rhos) == 1.0
    batch = training_task(task).make_batch(rows[: recipe.batch_size], hf_tokenizer, recipe.max_length)
    assert batch.input_ids.shape[1] <= recipe.max_length
