"""The task registry: everything about a task that training and serving must agree on, as data.

A ``TaskSpec`` names the graph's inputs and outputs (the ONNX contract), the kind of head the encoder
ends in and the codec that turns requests into graph rows and graph outputs into answers. Training
adds the torch side of a task (batches, loss, evaluation) in ``training.tasks``; the service reads
only this registry. Adding a task = one ``register`` call plus its codec, no switch elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from tokenizers import Tokenizer

from retention_core.codecs.base import TOKEN_FEEDS, Row, TaskCodec, pad_rows
from retention_core.codecs.classification import ClassificationCodec
from retention_core.codecs.embedding import EmbeddingCodec
from retention_core.codecs.qa import QACodec
from retention_core.codecs.summarization import SummarizationCodec
from retention_core.contract import (
    BASE_INPUTS,
    DEFAULT_MAX_WINDOWS,
    KEPT_COUNTS,
    OPTIONAL_OUTPUTS,
    Manifest,
    TensorSpec,
)

# "sequence": the head reads [CLS] only → (B, C); the last layer then computes one query.
# "token": the head reads every position → (B, T, C); dropped tokens are restored with their last state.
# "pooled": the mean of the final states of the tokens that reach the end → (B, d), no parameters; at
# ρ = 1 every real token does, so it is exactly the dense model's mean pooling. Nothing is restored:
# dropped tokens' earlier-layer states would pull the mean away from the model's (training/embedding.py).
# A CLS-pooled model (manifest.embedding.pooling == "cls") pools the final [CLS] state instead; the graph
# outputs the pooled vector either way, so serving does not depend on the pooling.
HeadKind = Literal["sequence", "token", "pooled"]
RHO_INPUT = "rho"  # the graph input that is per row, not per token: the kept fraction (B,)


@dataclass(frozen=True)
class CodecOptions:
    """Serving-time limits a codec applies; evaluation uses the same defaults."""

    max_windows: int = DEFAULT_MAX_WINDOWS


CodecFactory = Callable[[Manifest, Tokenizer, CodecOptions], TaskCodec]


def plain_row(ids: tuple[int, ...]) -> Row:
    return Row(ids)


@dataclass(frozen=True)
class TaskSpec:
    name: str
    head: HeadKind
    inputs: tuple[TensorSpec, ...]  # graph inputs, in order
    outputs: tuple[TensorSpec, ...]  # (main output, kept_counts): what every model directory has
    make_codec: CodecFactory
    num_outputs: int | None = None  # width of the head; None = one per label
    # A well-formed row of this task's graph from token ids (warm-up, export examples).
    example_row: Callable[[tuple[int, ...]], Row] = plain_row

    def __post_init__(self) -> None:
        unknown = [spec.name for spec in self.inputs if spec.name not in (*TOKEN_FEEDS, RHO_INPUT)]
        if unknown:
            raise ValueError(f"task {self.name!r}: no row field feeds the graph inputs {unknown}")

    @property
    def token_inputs(self) -> tuple[str, ...]:
        """The graph inputs read off the rows (every input but rho), in order."""
        return tuple(spec.name for spec in self.inputs if spec.name != RHO_INPUT)

    def feeds(
        self, rows: list[Row], rhos: Sequence[float], pad_id: int, length: int | None = None
    ) -> dict[str, np.ndarray]:
        """One padded batch of this task's graph: exactly its ``inputs``, the per-token ones from the rows'
        fields (``codecs.base.TOKEN_FEEDS``), rho one per row (B,)."""
        feeds = pad_rows(rows, pad_id, length, self.token_inputs)
        feeds[RHO_INPUT] = np.asarray(rhos, dtype=np.float32)  # (B,)
        return feeds

    @property
    def exported_outputs(self) -> tuple[TensorSpec, ...]:
        """What export writes today: the task's outputs, then the optional ones (survival depth)."""
        return (*self.outputs, *OPTIONAL_OUTPUTS)

    def output_contract(self, declared: int) -> tuple[TensorSpec, ...]:
        """The outputs a model directory declaring ``declared`` of them must have: the task's own, then
        as many of the optional ones (older exports stop after kept_counts). Any other count gets the
        full list, which then fails to match."""
        if len(self.outputs) <= declared <= len(self.exported_outputs):
            return self.exported_outputs[:declared]
        return self.exported_outputs

    @property
    def last_layer_queries(self) -> int | None:
        """A head that reads only [CLS] lets the last layer compute one query. A pooled head's depends on
        the model's pooling (CLS pooling: 1, training.model.RetentionModel.last_layer_queries); the
        manifest's ``schedule.last_layer_queries`` records what each graph does."""
        return 1 if self.head == "sequence" else None

    @property
    def restores_tokens(self) -> bool:
        """Token heads need every position: dropped tokens come back with their last state."""
        return self.head == "token"

    def head_width(self, labels: list[str] | tuple[str, ...]) -> int:
        if self.num_outputs is not None:
            return self.num_outputs
        if not labels:
            raise ValueError(f"a {self.name} model needs labels")
        return len(labels)


TASKS: dict[str, TaskSpec] = {}


def register(spec: TaskSpec) -> TaskSpec:
    """Add (or replace) a task. Returns it, so a module can keep a reference."""
    TASKS[spec.name] = spec
    return spec


def task_spec(name: str) -> TaskSpec:
    if name not in TASKS:
        raise KeyError(f"unknown task {name!r}; known: {sorted(TASKS)}")
    return TASKS[name]


def _classification_codec(manifest: Manifest, tokenizer: Tokenizer, options: CodecOptions) -> TaskCodec:
    if not manifest.labels:
        raise ValueError("classification manifest has no labels")
    return ClassificationCodec(tokenizer, manifest.max_length, list(manifest.labels))


def _windowed(codec: type[QACodec] | type[SummarizationCodec]) -> CodecFactory:
    """A long-document codec: its windows capped at ``options.max_windows`` (serving and evaluation)."""
    return lambda manifest, tokenizer, options: codec(
        tokenizer, manifest.max_length, max_windows=options.max_windows
    )


def _qa_row(ids: tuple[int, ...]) -> Row:
    """Everything context except [CLS], which stays protected."""
    return Row(
        ids, token_type_ids=tuple(0 for _ in ids), protected=tuple(int(i == 0) for i in range(len(ids)))
    )


register(
    TaskSpec(
        name="classification",
        head="sequence",
        inputs=BASE_INPUTS,
        outputs=(TensorSpec(name="logits", dtype="float32", axes=("batch", "labels")), KEPT_COUNTS),
        make_codec=_classification_codec,
    )
)
register(
    TaskSpec(
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
        make_codec=_windowed(QACodec),
        num_outputs=2,
        example_row=_qa_row,
    )
)
register(
    TaskSpec(
        name="summarization",
        head="token",
        inputs=BASE_INPUTS,
        outputs=(
            TensorSpec(name="token_logits", dtype="float32", axes=("batch", "sequence", "one")),
            KEPT_COUNTS,
        ),
        make_codec=_windowed(SummarizationCodec),
        num_outputs=1,
    )
)


def _embedding_codec(manifest: Manifest, tokenizer: Tokenizer, options: CodecOptions) -> TaskCodec:
    normalize = manifest.embedding.normalize if manifest.embedding is not None else True
    return EmbeddingCodec(tokenizer, manifest.max_length, normalize_default=normalize)


register(
    TaskSpec(
        name="embedding",
        head="pooled",
        inputs=BASE_INPUTS,
        outputs=(TensorSpec(name="embedding", dtype="float32", axes=("batch", "hidden")), KEPT_COUNTS),
        make_codec=_embedding_codec,
        num_outputs=0,  # a pooled head has no width of its own: its vector is the hidden state (d)
    )
)
