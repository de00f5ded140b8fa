"""The toy parity task, what both sides agree on: three labels (the head width follows them), its own
codec and its own output name (``parity_logits``)."""

from __future__ import annotations

from tokenizers import Tokenizer

from retention_core.codecs.base import Encoded, Row
from retention_core.contract import BASE_INPUTS, KEPT_COUNTS, Manifest, TensorSpec
from retention_core.tasks import CodecOptions, TaskSpec
from retention_tasks.classification.codec import ClassificationCodec

TASK = "toy_parity"
LABELS = ("even", "odd", "empty")


class ParityCodec(ClassificationCodec):
    """Its own rows: one per text, cut to the first ``max_length`` tokens with no [SEP] put back (the
    head is all this task reads). The answer is the classification codec's: the most likely label."""

    task = TASK

    def encode(self, text: str) -> Encoded:
        ids = self.tokenizer.encode(text).ids
        row = Row(tuple(ids[: self.max_length]))
        return Encoded(rows=[row], input_tokens=len(ids), truncated=len(ids) > self.max_length)


def make_codec(manifest: Manifest, tokenizer: Tokenizer, options: CodecOptions) -> ParityCodec:
    return ParityCodec(tokenizer, manifest.max_length, list(manifest.labels))


SPEC = TaskSpec(
    name=TASK,
    head="sequence",
    inputs=BASE_INPUTS,
    outputs=(TensorSpec(name="parity_logits", dtype="float32", axes=("batch", "labels")), KEPT_COUNTS),
    make_codec=make_codec,
)
