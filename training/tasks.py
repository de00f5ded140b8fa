"""Task adapters: rows → model inputs and targets, and the task loss. One per task."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from training.data import Row


@dataclass
class Batch:
    input_ids: torch.Tensor  # (B, T)
    attention_mask: torch.Tensor  # (B, T)
    targets: torch.Tensor  # (B,) labels for classification
    protected: torch.Tensor | None = None  # (B, T) bool
    token_type_ids: torch.Tensor | None = None  # (B, T)


def classification_batch(rows: list[Row], tokenizer, max_length: int) -> Batch:  # type: ignore[no-untyped-def]
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


def classification_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """logits (B, C), targets (B,) → scalar cross-entropy."""
    return F.cross_entropy(logits, targets)
