"""What training and serving agree on for embeddings: a pooled head, the vector is the hidden state."""

from __future__ import annotations

from tokenizers import Tokenizer

from retention_core.codecs.base import TaskCodec
from retention_core.contract import BASE_INPUTS, KEPT_COUNTS, Manifest, TensorSpec
from retention_core.tasks import CodecOptions, TaskSpec
from retention_tasks.embedding.codec import EmbeddingCodec


def embedding_codec(manifest: Manifest, tokenizer: Tokenizer, options: CodecOptions) -> TaskCodec:
    normalize = manifest.embedding.normalize if manifest.embedding is not None else True
    return EmbeddingCodec(tokenizer, manifest.max_length, normalize_default=normalize)


SPEC = TaskSpec(
    name="embedding",
    head="pooled",
    inputs=BASE_INPUTS,
    outputs=(TensorSpec(name="embedding", dtype="float32", axes=("batch", "hidden")), KEPT_COUNTS),
    make_codec=embedding_codec,
    num_outputs=0,  # a pooled head has no width of its own: its vector is the hidden state (d)
)
