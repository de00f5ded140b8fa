"""The torch side of extractive summarization: its batches, loss, distillation and evaluation
(``learn.py``), and its datasets."""

from __future__ import annotations

import hashlib

from retention_core.text import normalize_whitespace
from retention_tasks.summarization import learn as summarization
from retention_tasks.summarization.spec import SPEC
from training.recipes.data import Example, SplitSource, sha1_bucket
from training.tasks.registry import TrainingTask

__all__ = ["DATASETS", "SPEC", "TRAINING"]

TRAINING = TrainingTask(
    make_batch=summarization.summarization_batch,
    loss=summarization.summarization_loss,
    evaluation=summarization.EVALUATION,
    distill=summarization.summarization_distill,
    reference_dataset="scitldr_a",
)

BBC_BUCKETS = 20  # sha1(id) % 20: 0 → validation (5%), 1-2 → test (10%), else train (85%)
_BBC_CANONICAL: dict[str, str] = {}  # sha1(normalised document) → first id seen with that document


def bbc_split_of(row_id: str) -> str:
    bucket = sha1_bucket(row_id, BBC_BUCKETS)
    return "validation" if bucket == 0 else "test" if bucket in (1, 2) else "train"


def bbc_keep(row: Example, split: str) -> bool:
    """Deduplicate (keep the first row of each whitespace-normalised document, in file order), then
    split by sha1 of the kept row's ``id``. Deterministic across passes over the same file."""
    key = hashlib.sha1(normalize_whitespace(str(row["document"])).encode("utf-8")).hexdigest()
    row_id = str(row["id"])
    if _BBC_CANONICAL.setdefault(key, row_id) != row_id:
        return False
    return bbc_split_of(row_id) == split


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
