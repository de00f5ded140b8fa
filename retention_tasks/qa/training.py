"""The torch side of extractive QA: its batches, loss, distillation, salient answer span and evaluation
(``learn.py``), and its dataset."""

from __future__ import annotations

from retention_tasks.qa import learn as qa
from retention_tasks.qa.spec import SPEC
from training.recipes.data import SplitSource, holdout, not_holdout
from training.tasks.registry import TrainingTask

__all__ = ["DATASETS", "SPEC", "TRAINING"]

TRAINING = TrainingTask(
    make_batch=qa.qa_batch,
    loss=qa.qa_loss,
    evaluation=qa.EVALUATION,
    distill=qa.qa_distill,
    salient=qa.answer_span_mask,
    reference_dataset="squad",
)

DATASETS = {
    # SQuAD v1.1: 11,877-question train subset; validation = 5% of its questions by sha1(title) so
    # articles do not leak; test = the full official dev set.
    "squad": {
        "train": SplitSource("squad/train_subset.jsonl.gz", ("squad",), "train", not_holdout("title")),
        "validation": SplitSource("squad/train_subset.jsonl.gz", ("squad",), "train", holdout("title")),
        "test": SplitSource("squad/validation.jsonl.gz", ("squad",), "validation"),
    },
}
