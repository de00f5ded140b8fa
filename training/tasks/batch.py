"""What a task adapter hands ``training.fitting.fit``: a ``Batch`` of tensors, and the divergence tasks share.

Kept apart from the registry (``training.tasks.registry``) so task modules import it without importing the
registry that imports them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

import torch
import torch.nn.functional as F


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


def softmax_divergence(student: torch.Tensor, teacher: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """KL(teacher ‖ student) of the softmax over ``dim``, averaged over every other position. Scalar."""
    log_student = F.log_softmax(student, dim=dim)
    log_teacher = F.log_softmax(teacher, dim=dim)
    return (log_teacher.exp() * (log_teacher - log_student)).sum(dim).mean()
