"""What training and serving agree on for classification: a [CLS] head, one logit per label."""

from __future__ import annotations

from tokenizers import Tokenizer

from retention_core.codecs.base import TaskCodec
from retention_core.contract import BASE_INPUTS, KEPT_COUNTS, Manifest, TensorSpec
from retention_core.tasks import CodecOptions, TaskSpec
from retention_tasks.classification.codec import ClassificationCodec


def classification_codec(manifest: Manifest, tokenizer: Tokenizer, options: CodecOptions) -> TaskCodec:
    if not manifest.labels:
        raise ValueError("classification manifest has no labels")
    return ClassificationCodec(tokenizer, manifest.max_length, list(manifest.labels))


SPEC = TaskSpec(
    name="classification",
    head="sequence",
    inputs=BASE_INPUTS,
    outputs=(TensorSpec(name="logits", dtype="float32", axes=("batch", "labels")), KEPT_COUNTS),
    make_codec=classification_codec,
)
