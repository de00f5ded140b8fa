"""The torch side of classification: its batches, loss, distillation and evaluation
(``learn.py``), its label-free retrofit variant, and its datasets."""

from __future__ import annotations

from retention_tasks.classification import learn as classification
from retention_tasks.classification.retrofit import classification_recipe
from retention_tasks.classification.spec import SPEC
from training.recipes.data import SplitSource, holdout, not_holdout
from training.tasks.registry import TrainingTask
from training.tasks.teacher import dense_targets

__all__ = ["DATASETS", "SPEC", "TRAINING"]

TRAINING = TrainingTask(
    make_batch=classification.classification_batch,
    loss=classification.classification_loss,
    evaluation=classification.EVALUATION,
    distill=classification.classification_distill,
    reference_dataset="sst2",
    retrofit=TrainingTask(
        make_batch=classification.text_batch,
        loss=classification.teacher_divergence,
        evaluation=classification.EVALUATION,
        reference_dataset="imdb",
        teacher=dense_targets,  # the dense pass (ρ = 1): the original model's logits
    ),
    retrofit_recipe=classification_recipe,
    # The pruned branch's copy was measured on embeddings only: classification keeps the frozen retrofit
    # (retrofit_pruned_branch "shared", the default) until a study measures the copy here.
)

DATASETS = {
    # SST-2: GLUE validation (872) is the reported split; GLUE test has no labels.
    "sst2": {
        "train": SplitSource("sst2/train.jsonl.gz", ("glue", "sst2"), "train"),
        "validation": SplitSource("sst2/validation.jsonl.gz", ("glue", "sst2"), "validation"),
        "test": SplitSource("sst2/validation.jsonl.gz", ("glue", "sst2"), "validation"),
    },
    # IMDb: official 25k/25k; validation = 5% of train by sha1(text), removed from train.
    "imdb": {
        "train": SplitSource("imdb/train.jsonl.gz", ("imdb",), "train", not_holdout("text")),
        "validation": SplitSource("imdb/train.jsonl.gz", ("imdb",), "train", holdout("text")),
        "test": SplitSource("imdb/test.jsonl.gz", ("imdb",), "test"),
    },
}
