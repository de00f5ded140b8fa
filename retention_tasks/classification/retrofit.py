"""The classification task's retrofit recipe (``classification_recipe``, its
``TrainingTask.retrofit_recipe``): a Hugging Face ``*ForSequenceClassification`` checkpoint (BERT or
RoBERTa family, ``training.fitting.hf_checkpoint``); labels from its ``id2label``, length from its
tokenizer / position table.
"""

from __future__ import annotations

from typing import Any

from training.fitting.hf_checkpoint import read_classifier_checkpoint
from training.fitting.retrofit_recipes import profile_sizes
from training.recipes.recipe import DatasetSpec, EvalSpec, OptimizerSpec, Recipe, RetentionSpec, RetrofitSpec

# Classification: `full` is sized as models/recipes/imdb.yaml's full profile (batch 8, 700 steps, ≤ 512
# tokens, its schedule and scorer lr), so a retrofit of a dense IMDb model compares with the joint model
# at the same training budget; `quick` as imdb.yaml's quick length (≤ 256 tokens), fewer steps.
CLASSIFICATION_PROFILES: dict[str, dict[str, Any]] = {
    "full": {
        "batch_size": 8,
        "steps": 700,
        "max_length": 512,
        "rhos": (0.1, 0.2, 0.3, 0.5, 0.7, 1.0),
        "validation_size": 500,
    },
    "quick": {
        "batch_size": 8,
        "steps": 200,
        "max_length": 256,
        "rhos": (0.3, 0.5, 0.7, 1.0),
        "validation_size": 200,
    },
}
CLASSIFICATION_SCHEDULE_POWER = 0.5  # as the classification recipes (imdb.yaml, sst2.yaml): front-loaded


def classification_recipe(model: str, profile: str) -> Recipe:
    """A sequence classifier's retrofit: its labels, its length (capped by the profile), imdb.yaml's
    schedule and optimizer."""
    sizes = profile_sizes(CLASSIFICATION_PROFILES, profile)
    checkpoint = read_classifier_checkpoint(model)
    return Recipe(
        name=model,
        task="classification",
        backbone=model,
        dataset=DatasetSpec(name="texts"),
        labels=checkpoint.labels,
        max_length=min(checkpoint.max_length, sizes["max_length"]),
        batch_size=sizes["batch_size"],
        steps=sizes["steps"],
        retrofit=RetrofitSpec(pooling=None, normalize=False),
        retention=RetentionSpec(schedule_power=CLASSIFICATION_SCHEDULE_POWER),
        optimizer=OptimizerSpec(),  # imdb.yaml's: scorer lr 1e-3, warm-up 6%
        evaluation=EvalSpec(validation_size=sizes["validation_size"], rhos=sizes["rhos"]),
        profile=profile,
    )
