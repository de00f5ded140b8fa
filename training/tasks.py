"""Task adapters: rows → model inputs and targets, and the task loss. One per task.

``TRAINING_TASKS[task]`` is what ``training.fit`` uses; QA and summarization register theirs in their own
modules (``training/qa.py``, ``training/summarization.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypedDict

import torch
import torch.nn.functional as F

from training.data import Row


class EncoderInputs(TypedDict):
    """Keyword arguments of ``RetentionModel.forward_soft`` / ``forward_pruned`` that come from data."""

    input_ids: torch.Tensor  # (B, T)
    attention_mask: torch.Tensor  # (B, T)
    protected: torch.Tensor | None  # (B, T) bool
    token_type_ids: torch.Tensor | None  # (B, T)


@dataclass
class Batch:
    input_ids: torch.Tensor  # (B, T)
    attention_mask: torch.Tensor  # (B, T)
    targets: torch.Tensor  # classification: (B,) labels; other tasks: their own layout
    protected: torch.Tensor | None = None  # (B, T) bool; None = [CLS] only
    token_type_ids: torch.Tensor | None = None  # (B, T)
    extra: dict[str, torch.Tensor] | None = None  # task-specific tensors for the loss

    def to(self, device: torch.device | str) -> Batch:
        """The same batch with every tensor on ``device``."""

        def move(value: torch.Tensor | None) -> torch.Tensor | None:
            return None if value is None else value.to(device)

        extra = None if self.extra is None else {key: value.to(device) for key, value in self.extra.items()}
        return Batch(
            input_ids=self.input_ids.to(device),
            attention_mask=self.attention_mask.to(device),
            targets=self.targets.to(device),
            protected=move(self.protected),
            token_type_ids=move(self.token_type_ids),
            extra=extra,
        )

    def encoder_inputs(self) -> EncoderInputs:
        """The keyword arguments every ``RetentionModel`` forward pass takes from a batch."""
        return {
            "input_ids": self.input_ids,
            "attention_mask": self.attention_mask,
            "protected": self.protected,
            "token_type_ids": self.token_type_ids,
        }


@dataclass(frozen=True)
class TrainingTask:
    make_batch: Callable[[list[Row], object, int], Batch]  # (rows, tokenizer, max_length)
    loss: Callable[[torch.Tensor, Batch], torch.Tensor]  # (logits, batch) → scalar
    # (student logits, teacher logits (detached), batch) → scalar divergence, for distillation
    distill: Callable[[torch.Tensor, torch.Tensor, Batch], torch.Tensor] | None = None
    # batch → (B, T) bool tokens the scorers should keep (objective.salient_keep_weight)
    salient: Callable[[Batch], torch.Tensor] | None = None


def classification_batch(rows: list[Row], tokenizer, max_length: int) -> Batch:
    """Dynamic padding to the longest row of the batch, truncation at ``max_length``."""
    encoded = tokenizer(
        [str(row["text"]) for row in rows],
        truncation=True,
        max_length=max_length,
        padding=True,
        return_tensors="pt",
    )
    labels = torch.tensor([int(row["label"]) for row in rows], dtype=torch.long)  # type: ignore[call-overload]
    return Batch(encoded["input_ids"], encoded["attention_mask"], labels)


def classification_loss(logits: torch.Tensor, batch: Batch) -> torch.Tensor:
    """logits (B, C), targets (B,) → scalar cross-entropy."""
    return F.cross_entropy(logits, batch.targets)


def softmax_divergence(student: torch.Tensor, teacher: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """KL(teacher ‖ student) of the softmax over ``dim``, averaged over every other position. Scalar."""
    log_student = F.log_softmax(student, dim=dim)
    log_teacher = F.log_softmax(teacher, dim=dim)
    return (log_teacher.exp() * (log_teacher - log_student)).sum(dim).mean()


def classification_distill(student: torch.Tensor, teacher: torch.Tensor, batch: Batch) -> torch.Tensor:
    """(B, C) student and teacher logits → KL over the labels."""
    return softmax_divergence(student, teacher)


TRAINING_TASKS: dict[str, TrainingTask] = {
    "classification": TrainingTask(classification_batch, classification_loss, classification_distill),
}


def training_task(task: str) -> TrainingTask:
    if task not in TRAINING_TASKS:
        # Task modules register themselves on import.
        import importlib

        importlib.import_module(f"training.{task}")
    return TRAINING_TASKS[task]
