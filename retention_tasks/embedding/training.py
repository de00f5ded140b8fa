"""The torch side of embeddings: its batches and loss (to the original model's dense vectors) and its
evaluation (``learn.py``), its retrofit recipe, and its dataset."""

from __future__ import annotations

from retention_tasks.embedding.learn import EVALUATION, embedding_batch, embedding_loss
from retention_tasks.embedding.retrofit import embedding_recipe
from retention_tasks.embedding.spec import SPEC
from training.recipes.data import SplitSource, holdout, not_holdout, unique_texts
from training.tasks.registry import TrainingTask
from training.tasks.teacher import dense_targets

__all__ = ["DATASETS", "SPEC", "TRAINING"]

TRAINING = TrainingTask(
    make_batch=embedding_batch,
    loss=embedding_loss,
    evaluation=EVALUATION,
    reference_dataset="squad_contexts",
    teacher=dense_targets,
    retrofit_recipe=embedding_recipe,
    # The two-path model: measured above the frozen retrofit on every retrieval set tried, ρ = 1 still the
    # original bit for bit (docs/experiments/2026-11-28-pruned-branch.md); ~7x a frozen step's cost.
    retrofit_pruned_branch="copy",
)

CONTEXTS = unique_texts("context")
DATASETS = {
    # SQuAD contexts as unlabeled texts (embedding retrofit): the distinct paragraphs of the SQuAD splits
    # (train / validation carved by sha1(title) as for qa's "squad"; test = the official dev set's).
    "squad_contexts": {
        "train": SplitSource(
            "squad/train_subset.jsonl.gz", ("squad",), "train", not_holdout("title"), CONTEXTS
        ),
        "validation": SplitSource(
            "squad/train_subset.jsonl.gz", ("squad",), "train", holdout("title"), CONTEXTS
        ),
        "test": SplitSource("squad/validation.jsonl.gz", ("squad",), "validation", None, CONTEXTS),
    },
}
