"""The torch side of extractive summarization: its batches, loss, distillation and evaluation
(``learn.py``), and its datasets."""

from __future__ import annotations

from retention_tasks.summarization import learn as summarization
from retention_tasks.summarization.spec import SPEC
from training.recipes.data import SplitSource, bbc_keep
from training.tasks.registry import TrainingTask

__all__ = ["DATASETS", "SPEC", "TRAINING"]

TRAINING = TrainingTask(
    make_batch=summarization.summarization_batch,
    loss=summarization.summarization_loss,
    evaluation=summarization.EVALUATION,
    distill=summarization.summarization_distill,
    reference_dataset="scitldr_a",
)

SCITLDR = ("allenai/scitldr", "Abstract")
DATASETS = {
    "scitldr_a": {
        "train": SplitSource("summarization/scitldr_a/train.jsonl.gz", SCITLDR, "train"),
        "validation": SplitSource("summarization/scitldr_a/validation.jsonl.gz", SCITLDR, "validation"),
        "test": SplitSource("summarization/scitldr_a/test.jsonl.gz", SCITLDR, "test"),
    },
    # BBC News Summary (no official split, local file only): duplicate documents removed (first row of
    # each whitespace-normalised document kept), then sha1(id) % 20: 0 → validation, 1-2 → test, rest
    # → train (``bbc_keep``).
    "bbc_news": {
        split: SplitSource(
            "summarization/bbc_news_summary/all.jsonl.gz",
            ("bbc_news_summary",),
            "train",
            lambda row, split=split: bbc_keep(row, split),  # type: ignore[misc]
        )
        for split in ("train", "validation", "test")
    },
}
