"""Extractive question answering: (question, context) → sliding windows → best span → characters.

Encoding. The question and the context are encoded as a pair with the tokenizer's own template
(BERT: ``[CLS] question [SEP] context [SEP]``). A context longer than one window is cut into
overlapping windows (``stride`` context tokens shared by consecutive windows), every window repeating
the question. Per row: ``token_type_ids`` are the template's segment ids (BERT: 0 for ``[CLS]``,
the question and the first ``[SEP]``; 1 for the context and the last ``[SEP]``), and ``protected``
is 1 for every token that is not context (``[CLS]``, question, ``[SEP]``): retention never drops them.
A question longer than ``max_length // 2`` tokens is cut to that length (``truncated`` = True).

Decoding. ``outputs[i]`` is the ``span_logits`` (T_i, 2) of window i. A candidate span (s, e) lies in
the context of its window, with s <= e and e - s + 1 <= ``max_answer_tokens``; its score is
start_logit[s] + end_logit[e] (as in BERT's run_squad). The best candidate over all windows wins, so
an answer that two overlapping windows both contain is taken from the window that scores it best.
Token offsets are character offsets into the original ``context`` (Python ``str`` indices: code
points, so accents, CJK and emoji map back exactly), and the answer is ``context[start:end]``
(``end`` exclusive). ``score`` is the probability of the chosen span under a softmax over all
candidate spans of its window.

No valid span (empty context, or every window too short to hold context tokens): the answer is
``{"answer": "", "start": 0, "end": 0, "score": 0.0}``; ``context[start:end] == answer`` still holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from tokenizers import Encoding, Tokenizer

from retention_core.codecs.base import Encoded, Row, token_spans
from retention_core.text import plain_copy, windowing_tokenizer

QA_SEGMENTS = ("question", "context")  # the texts of a pair's sequences 0 and 1 (explain offsets)
NO_ANSWER: dict[str, Any] = {"answer": "", "start": 0, "end": 0, "score": 0.0}
_NEG = -1e30


@dataclass(frozen=True)
class QAWindow:
    """What decoding needs to know about one row."""

    context_mask: tuple[bool, ...]  # (T_i,) token belongs to the context
    offsets: tuple[tuple[int, int], ...]  # (T_i,) character span in ``context`` (context tokens only)


@dataclass(frozen=True)
class QAContext:
    context: str
    windows: tuple[QAWindow, ...]


class QACodec:
    task = "qa"

    def __init__(
        self,
        tokenizer: Tokenizer,
        max_length: int,
        stride: int = 128,
        max_answer_tokens: int = 30,
        max_windows: int | None = None,
    ) -> None:
        if max_length < 8:
            raise ValueError(f"max_length must be at least 8, got {max_length}")
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.stride = stride
        self.max_answer_tokens = max_answer_tokens
        self.max_windows = max_windows
        self.max_question_tokens = max_length // 2
        self._question_tokenizer = plain_copy(tokenizer)  # whole inputs, to count their tokens
        processor = self._question_tokenizer.post_processor
        self._special_pair = processor.num_special_tokens_to_add(True) if processor is not None else 0
        self._windowers: dict[int, Tokenizer] = {}

    def _windower(self, question_tokens: int) -> Tokenizer:
        """Tokenizer cutting the context into windows; the stride must leave room for new tokens."""
        room = self.max_length - question_tokens - self._special_pair
        stride = max(0, min(self.stride, room // 2))
        if stride not in self._windowers:
            self._windowers[stride] = windowing_tokenizer(self.tokenizer, self.max_length, stride, pair=True)
        return self._windowers[stride]

    def windows(self, question: str, context: str) -> tuple[list[Encoding], int, bool]:
        """The window encodings, the untruncated token count and whether anything was cut off."""
        question_ids = self._question_tokenizer.encode(question, add_special_tokens=False)
        truncated = len(question_ids.ids) > self.max_question_tokens
        if truncated:
            cut = question_ids.offsets[self.max_question_tokens - 1][1]
            question = question[:cut]
            question_ids = self._question_tokenizer.encode(question, add_special_tokens=False)
        full = self._question_tokenizer.encode(question, context)
        encoding = self._windower(len(question_ids.ids)).encode(question, context)
        windows = [encoding, *encoding.overflowing]
        if self.max_windows is not None and len(windows) > self.max_windows:
            windows, truncated = windows[: self.max_windows], True
        return windows, len(full.ids), truncated

    def encode(self, question: str, context: str) -> Encoded:
        encodings, input_tokens, truncated = self.windows(question, context)
        rows, windows = [], []
        for encoding in encodings:
            in_context = tuple(sid == 1 for sid in encoding.sequence_ids)
            rows.append(
                Row(
                    input_ids=tuple(encoding.ids),
                    token_type_ids=tuple(encoding.type_ids),
                    protected=tuple(0 if flag else 1 for flag in in_context),
                )
            )
            offsets = tuple(
                (int(s), int(e)) if flag else (0, 0)
                for (s, e), flag in zip(encoding.offsets, in_context, strict=True)
            )
            windows.append(QAWindow(in_context, offsets))
        return Encoded(
            rows=rows,
            input_tokens=input_tokens,
            truncated=truncated,
            context=QAContext(context, tuple(windows)),
            spans=lambda: [token_spans(encoding, QA_SEGMENTS) for encoding in encodings],
        )

    def best_span(self, window: QAWindow, logits: np.ndarray) -> tuple[int, int, float, float] | None:
        """(start token, end token, raw score, probability) of the best valid span of one window."""
        logits = np.asarray(logits, dtype=np.float64).reshape(len(window.context_mask), 2)
        mask = np.asarray(window.context_mask, dtype=bool)  # (T,)
        if not mask.any():
            return None
        start = np.where(mask, logits[:, 0], _NEG)  # (T,)
        end = np.where(mask, logits[:, 1], _NEG)  # (T,)
        scores = start[:, None] + end[None, :]  # (T, T): start s, end e
        length = np.arange(len(mask))[None, :] - np.arange(len(mask))[:, None] + 1  # e - s + 1
        valid = (length >= 1) & (length <= self.max_answer_tokens) & mask[:, None] & mask[None, :]
        scores = np.where(valid, scores, -np.inf)
        flat = int(np.argmax(scores))
        s, e = divmod(flat, len(mask))
        best = float(scores[s, e])
        probability = 1.0 / float(np.exp(scores[valid] - best).sum())
        return s, e, best, probability

    def decode(self, encoded: Encoded, outputs: list[np.ndarray]) -> dict[str, Any]:
        state: QAContext = encoded.context
        if len(outputs) != len(state.windows):
            raise ValueError(f"expected {len(state.windows)} outputs, got {len(outputs)}")
        best: tuple[float, int, int, int, float] | None = None  # (score, window, s, e, probability)
        for index, (window, logits) in enumerate(zip(state.windows, outputs, strict=True)):
            span = self.best_span(window, logits)
            if span is not None and (best is None or span[2] > best[0]):
                best = (span[2], index, span[0], span[1], span[3])
        if best is None:
            return dict(NO_ANSWER)
        _, index, s, e, probability = best
        offsets = state.windows[index].offsets
        start, end = offsets[s][0], offsets[e][1]
        return {"answer": state.context[start:end], "start": start, "end": end, "score": probability}
