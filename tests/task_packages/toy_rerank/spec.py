"""The toy reranker, what both sides agree on: one graph row ``[CLS] query [SEP] passage [SEP]`` per
passage (token type ids, the query protected), read by a one-output sequence head."""

from __future__ import annotations

from typing import Any

import numpy as np
from tokenizers import Tokenizer

from retention_core.codecs.base import Encoded, Row, token_spans
from retention_core.contract import BASE_INPUTS, KEPT_COUNTS, Manifest, TensorSpec
from retention_core.tasks import CodecOptions, TaskSpec
from retention_core.text import plain_copy

TASK = "toy_rerank"
SEGMENTS = ("query", "passages[{}]")  # explain: the request fields the offsets index


class RerankCodec:
    """``encode(query, *passages)``: one row per passage, the pair cut to ``max_length`` in the passage
    (never in the query, which stays protected); ``decode``: one score per passage and the passages'
    order by it."""

    task = TASK

    def __init__(self, tokenizer: Tokenizer, max_length: int) -> None:
        self.tokenizer = tokenizer
        self.whole = plain_copy(tokenizer)  # counts a pair's tokens before any cut
        self.pair = plain_copy(tokenizer)
        self.pair.enable_truncation(max_length, strategy="only_second")

    def encode(self, query: str, *passages: str) -> Encoded:
        encodings = [self.pair.encode(query, passage) for passage in passages]
        input_tokens = sum(len(self.whole.encode(query, passage).ids) for passage in passages)
        rows = [
            Row(
                input_ids=tuple(encoding.ids),
                token_type_ids=tuple(encoding.type_ids),
                protected=tuple(int(sequence != 1) for sequence in encoding.sequence_ids),  # 1 = not passage
            )
            for encoding in encodings
        ]
        return Encoded(
            rows=rows,
            input_tokens=input_tokens,
            truncated=input_tokens > sum(len(row) for row in rows),
            spans=lambda: [
                token_spans(encoding, (SEGMENTS[0], SEGMENTS[1].format(i)))
                for i, encoding in enumerate(encodings)
            ],
        )

    def decode(self, encoded: Encoded, outputs: list[np.ndarray]) -> dict[str, Any]:
        """``outputs[i]``: passage i's (1,) relevance."""
        scores = [float(np.asarray(output).reshape(-1)[0]) for output in outputs]
        return {"scores": scores, "ranking": sorted(range(len(scores)), key=lambda i: (-scores[i], i))}


def make_codec(manifest: Manifest, tokenizer: Tokenizer, options: CodecOptions) -> RerankCodec:
    return RerankCodec(tokenizer, manifest.max_length)


def pair_row(ids: tuple[int, ...]) -> Row:
    """A well-formed row of the graph: the first third the protected query."""
    query = max(1, len(ids) // 3)
    return Row(
        ids, tuple(int(i >= query) for i in range(len(ids))), tuple(int(i < query) for i in range(len(ids)))
    )


SPEC = TaskSpec(
    name=TASK,
    head="sequence",
    inputs=(
        *BASE_INPUTS,
        TensorSpec(name="token_type_ids", dtype="int64", axes=("batch", "sequence"), description="0 = query"),
        TensorSpec(name="protected_mask", dtype="int64", axes=("batch", "sequence"), description="1 = kept"),
    ),
    outputs=(TensorSpec(name="relevance", dtype="float32", axes=("batch", "one")), KEPT_COUNTS),
    make_codec=make_codec,
    num_outputs=1,
    example_row=pair_row,
)
