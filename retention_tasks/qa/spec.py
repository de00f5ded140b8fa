"""What training and serving agree on for extractive QA: a token head (start, end) over windows of a
long context, the question and [CLS] protected."""

from __future__ import annotations

from retention_core.codecs.base import Row
from retention_core.contract import BASE_INPUTS, KEPT_COUNTS, TensorSpec
from retention_core.tasks import CodecFactory, TaskSpec
from retention_tasks.qa.codec import QACodec


def windowed(codec: type[QACodec]) -> CodecFactory:
    """A long-document codec: its windows capped at ``options.max_windows`` (serving and evaluation)."""
    return lambda manifest, tokenizer, options: codec(
        tokenizer, manifest.max_length, max_windows=options.max_windows
    )


def qa_row(ids: tuple[int, ...]) -> Row:
    """Everything context except [CLS], which stays protected."""
    return Row(
        ids, token_type_ids=tuple(0 for _ in ids), protected=tuple(int(i == 0) for i in range(len(ids)))
    )


SPEC = TaskSpec(
    name="qa",
    head="token",
    inputs=(
        *BASE_INPUTS,
        TensorSpec(
            name="token_type_ids", dtype="int64", axes=("batch", "sequence"), description="0 = question"
        ),
        TensorSpec(
            name="protected_mask", dtype="int64", axes=("batch", "sequence"), description="1 = never drop"
        ),
    ),
    outputs=(
        TensorSpec(name="span_logits", dtype="float32", axes=("batch", "sequence", "start_end")),
        KEPT_COUNTS,
    ),
    make_codec=windowed(QACodec),
    num_outputs=2,
    example_row=qa_row,
)
