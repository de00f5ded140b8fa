"""The task heads on top of the encoder: what each ``TaskSpec.head`` kind reads of the final states.

``sequence``: [CLS] → tanh(dense) → labels (``ClassificationHead``); ``token``: per-token logits
(``TokenHead``, Drop-and-Restore runs before it); ``pooled``: an embedding, the mean of the tokens that
reach the end (``MeanPooling``) or the final [CLS] state (``CLSPooling``).
"""

from __future__ import annotations

import torch
from torch import nn

CLS_POSITION = 0  # [CLS]: protected (default_protected), so it is slot 0 of every layer's kept tokens
CLS_QUERIES = 1  # a head that reads [CLS] only needs the last layer's first query


class ClassificationHead(nn.Module):
    """[CLS] → tanh(dense) → labels, as BERT/RoBERTa classification heads do."""

    def __init__(self, hidden_size: int, num_labels: int, dropout: float) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.out = nn.Linear(hidden_size, num_labels)
        self.dropout = nn.Dropout(dropout)

    def forward(self, cls_state: torch.Tensor) -> torch.Tensor:
        """(B, d) → (B, C)."""
        return self.out(self.dropout(torch.tanh(self.dense(self.dropout(cls_state)))))


class TokenHead(nn.Module):
    """Per-token logits (span start/end, sentence salience): (B, T, d) → (B, T, C)."""

    def __init__(self, hidden_size: int, num_outputs: int, dropout: float) -> None:
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.out = nn.Linear(hidden_size, num_outputs)

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        return self.out(self.dropout(states))


class MeanPooling(nn.Module):
    """Weighted mean of final states (sentence-transformers' mean pooling over the tokens that reach the
    end): no parameters and no normalisation (the codec normalises). (B, T, d), weights (B, T) → (B, d);
    weights: 1 = a surviving real token (inference), a token's soft survival (training)."""

    def forward(self, states: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        expanded = weights.unsqueeze(-1).to(states.dtype)  # (B, T, 1)
        # A batched MatMul, not a sum over T: onnxruntime's ReduceSum orders its additions by the whole
        # tensor's shape (a row's sum moved by ~1e-7 with the batch it came in), a batched MatMul runs the
        # same (1, T) × (T, d) product for every row, whatever the batch.
        total = (expanded.transpose(1, 2) @ states).squeeze(1)  # (B, 1, T) @ (B, T, d) → (B, d)
        return total / expanded.sum(1).clamp(min=1e-9)


class CLSPooling(nn.Module):
    """sentence-transformers' CLS pooling: the final state of [CLS] (the first slot, always kept), no
    parameters and no normalisation (the codec normalises). (B, Tq, d), weights (B, T) → (B, d); the
    weights are ignored (merged tokens already live inside the [CLS] state they were folded into)."""

    def forward(self, states: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        return states[:, CLS_POSITION]
