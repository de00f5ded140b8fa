"""The toy reranker's training entry made label-free (the original model's dense pass as the teacher)
with a retrofit recipe builder: ``python -m training retrofit --task`` then offers it."""

from __future__ import annotations

import dataclasses

from tests.task_packages.toy_rerank import training as toy
from tests.task_packages.toy_rerank.spec import SPEC, TASK
from tests.tiny import tiny_recipe
from training.recipes.recipe import Recipe, RetrofitSpec
from training.tasks.teacher import dense_targets

__all__ = ["DATASETS", "SPEC", "TRAINING"]


def toy_retrofit_recipe(model: str, profile: str) -> Recipe:
    """A retrofit builder for the toy (the CLI offers a task that names one)."""
    return tiny_recipe(TASK).model_copy(update={"retrofit": RetrofitSpec(pooling=None, normalize=False)})


TRAINING = dataclasses.replace(toy.TRAINING, teacher=dense_targets, retrofit_recipe=toy_retrofit_recipe)
DATASETS = toy.DATASETS
