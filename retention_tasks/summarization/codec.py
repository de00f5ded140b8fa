"""Extractive summarization: sentences → token windows → per-sentence salience → top sentences.

Encoding. The document is the sentences joined by a single space. It is tokenized as one sequence
with the tokenizer's template (BERT: ``[CLS] … [SEP]``); a document longer than ``max_length`` tokens
is cut into windows of at most ``max_length`` tokens (``stride`` tokens shared by consecutive
windows, 0 by default), each a complete model input. Every token is mapped to the sentence holding
its first character (special tokens map to none).

Decoding. ``outputs[i]`` is the ``token_logits`` (T_i, 1) of window i. A sentence's score is the mean
logit of all its tokens, over every window that holds them (a token seen by two overlapping windows
counts twice). Sentences without tokens (empty strings, or cut off by ``max_windows``) are never
selected. How many sentences:

- ``max_sentences`` = k → the k best; ``ratio`` = r → the ceil(r · n) best of the n scorable
  sentences (at least 1); both → the smaller of the two; neither → ``DEFAULT_MAX_SENTENCES`` (3).

Selected sentences are returned in document order as ``{"index", "text", "score"}``.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from retention_core.codecs.base import BUILT_TEXT, Encoded, Row, token_spans
from retention_core.text import plain_copy, windowing_tokenizer

DEFAULT_MAX_SENTENCES = 3
NO_SENTENCE = -1


def sentence_starts(sentences: list[str]) -> tuple[str, list[int]]:
    """The document (sentences joined by one space) and the character start of every sentence."""
    starts, position = [], 0
    for sentence in sentences:
        starts.append(position)
        position += len(sentence) + 1
    return " ".join(sentences), starts


@dataclass(frozen=True)
class SummaryContext:
    sentences: tuple[str, ...]
    token_sentences: tuple[tuple[int, ...], ...]  # per window (T_i,): sentence index or NO_SENTENCE


class SummarizationCodec:
    task = "summarization"

    def __init__(
        self, tokenizer: Tokenizer, max_length: int, stride: int = 0, max_windows: int | None = None
    ) -> None:
        if max_length < 4:
            raise ValueError(f"max_length must be at least 4, got {max_length}")
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.max_windows = max_windows
        self._full = plain_copy(tokenizer)  # whole documents, to count their tokens
        processor = self._full.post_processor
        room = max_length - (processor.num_special_tokens_to_add(False) if processor is not None else 0)
        self.stride = max(0, min(stride, room // 2))
        self._windower = windowing_tokenizer(tokenizer, max_length, self.stride, pair=False)

    def encode(self, sentences: list[str]) -> Encoded:
        document, starts = sentence_starts(list(sentences))
        encoding = self._windower.encode(document)
        encodings = [encoding, *encoding.overflowing]
        truncated = False
        if self.max_windows is not None and len(encodings) > self.max_windows:
            encodings, truncated = encodings[: self.max_windows], True
        rows, token_sentences = [], []
        for window in encodings:
            rows.append(Row(input_ids=tuple(window.ids)))
            mapping = []
            for (start, end), sequence in zip(window.offsets, window.sequence_ids, strict=True):
                if sequence is None or end <= start:
                    mapping.append(NO_SENTENCE)
                else:
                    mapping.append(bisect.bisect_right(starts, start) - 1)
            token_sentences.append(tuple(mapping))
        input_tokens = len(encoding.ids) if not encoding.overflowing else len(self._full.encode(document).ids)
        return Encoded(
            rows=rows,
            input_tokens=input_tokens,
            truncated=truncated,
            context=SummaryContext(tuple(sentences), tuple(token_sentences)),
            spans=lambda: [token_spans(window, (BUILT_TEXT,)) for window in encodings],
            extra={BUILT_TEXT: document},
        )

    def sentence_scores(self, encoded: Encoded, outputs: list[np.ndarray]) -> np.ndarray:
        """Mean token logit per sentence (S,); NaN for sentences without tokens."""
        state: SummaryContext = encoded.context
        if len(outputs) != len(state.token_sentences):
            raise ValueError(f"expected {len(state.token_sentences)} outputs, got {len(outputs)}")
        total = np.zeros(len(state.sentences), dtype=np.float64)
        count = np.zeros(len(state.sentences), dtype=np.float64)
        for mapping, logits in zip(state.token_sentences, outputs, strict=True):
            index = np.asarray(mapping, dtype=np.int64)  # (T_i,)
            values = np.asarray(logits, dtype=np.float64).reshape(len(index))  # (T_i,)
            keep = index >= 0
            np.add.at(total, index[keep], values[keep])
            np.add.at(count, index[keep], 1.0)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(count > 0, total / np.maximum(count, 1.0), np.nan)

    def decode(
        self,
        encoded: Encoded,
        outputs: list[np.ndarray],
        max_sentences: int | None = None,
        ratio: float | None = None,
    ) -> dict[str, Any]:
        state: SummaryContext = encoded.context
        scores = self.sentence_scores(encoded, outputs)
        scorable = np.flatnonzero(~np.isnan(scores))
        k = selection_size(len(scorable), max_sentences, ratio)
        # Best first; ties go to the earlier sentence (stable sort on the negated score).
        ranked = scorable[np.argsort(-scores[scorable], kind="stable")][:k]
        return {
            "sentences": [
                {"index": int(i), "text": state.sentences[i], "score": float(scores[i])}
                for i in sorted(ranked.tolist())
            ]
        }


def selection_size(num_sentences: int, max_sentences: int | None, ratio: float | None) -> int:
    """How many sentences to select (see the module docstring)."""
    if max_sentences is not None and max_sentences < 0:
        raise ValueError(f"max_sentences must be >= 0, got {max_sentences}")
    if ratio is not None and not 0.0 < ratio <= 1.0:
        raise ValueError(f"ratio must be in (0, 1], got {ratio}")
    if max_sentences is None and ratio is None:
        max_sentences = DEFAULT_MAX_SENTENCES
    limits = []
    if max_sentences is not None:
        limits.append(max_sentences)
    if ratio is not None:
        limits.append(max(1, math.ceil(ratio * num_sentences - 1e-9)))  # 0.3·10 is 3.0000000000000004
    return min(num_sentences, *limits)
