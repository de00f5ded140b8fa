"""Sentence embeddings: one row per text (head kept, like classification); the graph's pooled vector
comes back, L2-normalised unless the request or the model's default says not."""

from __future__ import annotations

from typing import Any

import numpy as np
from tokenizers import Encoding, Tokenizer

from retention_core.codecs.base import Encoded, head_row
from retention_core.text import plain_copy


def l2_normalized(vector: np.ndarray) -> np.ndarray:
    """``vector`` / ‖vector‖ (a zero vector stays zero), as sentence-transformers' Normalize module."""
    norm = float(np.linalg.norm(vector))
    return vector / max(norm, 1e-12)


class EmbeddingCodec:
    task = "embedding"

    def __init__(self, tokenizer: Tokenizer, max_length: int, normalize_default: bool = True) -> None:
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.normalize_default = normalize_default
        self._whole = plain_copy(tokenizer)  # the cut to max_length is head_row's

    def encode(self, text: str) -> Encoded:
        """Tokenize with special tokens; keep the first ``max_length`` tokens ([SEP] re-appended)."""
        return head_row(self._whole, text, self.max_length)

    def tokens(self, text: str, add_special_tokens: bool = True) -> Encoding:
        """The whole text's tokens, not cut to ``max_length`` (what a tokenize endpoint shows)."""
        return self._whole.encode(text, add_special_tokens=add_special_tokens)

    def decode(
        self, encoded: Encoded, outputs: list[np.ndarray], normalize: bool | None = None
    ) -> dict[str, Any]:
        """``outputs[0]`` is the pooled vector (d,); ``normalize`` None = the model's default."""
        vector = outputs[0].astype(np.float32)  # (d,)
        if self.normalize_default if normalize is None else normalize:
            vector = l2_normalized(vector)
        return {"embedding": vector.tolist()}
