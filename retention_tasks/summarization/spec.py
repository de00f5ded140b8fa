"""What training and serving agree on for extractive summarization: one logit per token, a sentence's
score read off its tokens, over windows of a long document."""

from __future__ import annotations

from retention_core.contract import BASE_INPUTS, KEPT_COUNTS, TensorSpec
from retention_core.tasks import TaskSpec
from retention_tasks.summarization.codec import SummarizationCodec

SPEC = TaskSpec(
    name="summarization",
    head="token",
    inputs=BASE_INPUTS,
    outputs=(
        TensorSpec(name="token_logits", dtype="float32", axes=("batch", "sequence", "one")),
        KEPT_COUNTS,
    ),
    # windows capped at options.max_windows (serving and evaluation)
    make_codec=lambda manifest, tokenizer, options: SummarizationCodec(
        tokenizer, manifest.max_length, max_windows=options.max_windows
    ),
    num_outputs=1,
)
