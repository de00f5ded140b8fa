"""Sequence classification: one row per text, truncated to the model's max length (head kept)."""

from __future__ import annotations

from typing import Any

import numpy as np
from tokenizers import Tokenizer

from retention_core.codecs.base import Encoded, head_row


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


class ClassificationCodec:
    task = "classification"

    def __init__(self, tokenizer: Tokenizer, max_length: int, labels: list[str]) -> None:
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.labels = labels

    def encode(self, text: str) -> Encoded:
        """Tokenize with special tokens; keep the first ``max_length`` tokens ([SEP] re-appended)."""
        return head_row(self.tokenizer, text, self.max_length)

    def decode(self, encoded: Encoded, outputs: list[np.ndarray]) -> dict[str, Any]:
        probs = softmax(outputs[0].astype(np.float64))  # (C,)
        best = int(np.argmax(probs))
        return {
            "label": self.labels[best],
            "scores": {label: float(p) for label, p in zip(self.labels, probs, strict=True)},
        }
