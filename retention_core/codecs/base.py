"""The codec protocol between HTTP handlers, the micro-batcher and the ONNX session.

A request item is encoded into one or more *rows* (windows of at most ``max_length`` tokens). The
batcher pads rows from many requests into one batch, runs the graph, and hands every request the
graph outputs of its own rows, unpadded; the codec turns those into the response.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from tokenizers import Encoding, Tokenizer


@dataclass(frozen=True)
class Row:
    """One graph row: real tokens only (padding is added by ``pad_rows``)."""

    input_ids: tuple[int, ...]
    token_type_ids: tuple[int, ...] | None = None
    protected: tuple[int, ...] | None = None  # 1 = never dropped (QA question, [CLS], [SEP])

    def __len__(self) -> int:
        return len(self.input_ids)


SPECIAL_SEGMENT = ""  # the segment of a token with no text of its own ([CLS], [SEP])
# The ``Encoded.extra`` key of a text a codec built itself rather than read from one request field (a
# summary's sentences joined): its tokens' segment is named so, and an explanation carries the text
# (``Explanation.document``) for the offsets to index.
BUILT_TEXT = "document"


@dataclass(frozen=True)
class TokenSpan:
    """Where one row token comes from: the input text it is part of (``segment``, named as the request
    field the text arrives in: "text", "question", "context", ``name[i]`` for item i of a list field
    such as a reranker's "passages[2]"; "document" for a summary's joined sentences; ``SPECIAL_SEGMENT``
    for special tokens) and its character offsets ``[start, end)`` into that text (Python ``str``
    indices). Each codec names its own segments: nothing else lists them."""

    segment: str
    start: int
    end: int


SpanSource = Callable[[], list[tuple[TokenSpan, ...]]]


@dataclass
class Encoded:
    rows: list[Row]
    input_tokens: int  # real tokens of the whole input, before truncation / windowing
    truncated: bool  # some of the input was cut off (policy: keep the head)
    context: Any = None  # codec-specific, read back by ``decode``
    extra: dict[str, Any] = field(default_factory=dict)
    # Per row (T_i,): where each token comes from, for ``explain`` (retention_core.explain); None for a
    # codec that does not map tokens back to text. Built only when asked: it costs about a quarter of
    # the tokenization, which a request without explain should not pay.
    spans: SpanSource | None = None


def token_spans(encoding: Encoding, segments: tuple[str, ...]) -> tuple[TokenSpan, ...]:
    """The spans of one tokenizer encoding: sequence i's tokens are in ``segments[i]``; special tokens
    (no sequence) get ``SPECIAL_SEGMENT`` and (0, 0)."""
    return tuple(
        TokenSpan(SPECIAL_SEGMENT, 0, 0)
        if sequence is None
        else TokenSpan(segments[sequence], int(s), int(e))
        for (s, e), sequence in zip(encoding.offsets, encoding.sequence_ids, strict=True)
    )


class TaskCodec(Protocol):
    task: str

    def decode(self, encoded: Encoded, outputs: list[np.ndarray]) -> dict[str, Any]:
        """``outputs[i]`` is the first graph output of ``encoded.rows[i]``, unpadded
        (classification: (C,); qa: (T_i, 2); summarization: (T_i, 1))."""
        ...


def head_row(tokenizer: Tokenizer, text: str, max_length: int) -> Encoded:
    """One row: the tokenizer's template ([CLS] … [SEP]), cut to the first ``max_length`` tokens with
    the last special token re-appended (single-row tasks: classification, embedding)."""
    encoding = tokenizer.encode(text)
    ids = encoding.ids
    input_tokens = len(ids)
    truncated = input_tokens > max_length
    if truncated:
        ids = [*ids[: max_length - 1], ids[-1]]
    return Encoded(
        rows=[Row(tuple(ids))],
        input_tokens=input_tokens,
        truncated=truncated,
        spans=lambda: [head_spans(encoding, max_length)],
    )


def head_spans(encoding: Encoding, max_length: int) -> tuple[TokenSpan, ...]:
    """The spans of ``head_row``'s row: the first ``max_length`` - 1 tokens and the last one."""
    spans = token_spans(encoding, ("text",))
    return spans if len(spans) <= max_length else (*spans[: max_length - 1], spans[-1])


# How each per-token graph input is read off a row: a task's graph inputs (``TaskSpec.inputs``) name
# which of them its feeds hold. A field the row does not carry is fed as zeros.
TOKEN_FEEDS: dict[str, Callable[[Row], Sequence[int] | None]] = {
    "input_ids": lambda row: row.input_ids,
    "attention_mask": lambda row: (1,) * len(row),  # 1 = real token
    "token_type_ids": lambda row: row.token_type_ids,
    "protected_mask": lambda row: row.protected,  # 1 = never dropped
}


def carried_inputs(row: Row) -> tuple[str, ...]:
    """The per-token inputs a row implies when no task names them (training feeds torch models by
    keyword): the base two, and the pair's segment ids with their protected mask when it has them."""
    if row.token_type_ids is None:
        return ("input_ids", "attention_mask")
    return ("input_ids", "attention_mask", "token_type_ids", "protected_mask")


def pad_rows(
    rows: list[Row], pad_id: int, length: int | None = None, names: Sequence[str] | None = None
) -> dict[str, np.ndarray]:
    """Right-pad rows to the longest one (or to ``length``, when longer: the service pads to a few
    shapes so ORT's arena sees few sizes). Returns int64 feeds keyed by ONNX input name (no rho): the
    per-token inputs ``names`` (a task's, ``TaskSpec.feeds``), else those the first row implies."""
    length = max([len(row) for row in rows] + [length or 0])
    feeds = {}
    for name in names if names is not None else carried_inputs(rows[0]):
        values = TOKEN_FEEDS[name]
        feed = np.full((len(rows), length), pad_id if name == "input_ids" else 0, dtype=np.int64)  # (B, T)
        for i, row in enumerate(rows):
            feed[i, : len(row)] = values(row) or 0
        feeds[name] = feed
    return feeds
