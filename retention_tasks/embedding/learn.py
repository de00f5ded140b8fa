"""Sentence embeddings (label-free): the training math of the ``embedding`` task, its batches and loss, and
its evaluation (the codec loop of ``training.evaluation.codec_loop``).

Batches are unlabeled texts (rows with a ``"text"`` field), one row each, encoded by the serving codec.
The targets are the *teacher's* pooled vectors, computed every step from the model being trained
(``training.tasks.teacher.dense_targets``, the task's ``teacher``): its dense pass (ρ = 1) under
``no_grad``. In a retrofit the backbone is frozen (``RetentionModel.freeze_backbone``), so that pass is
exactly the original model and no copy is needed. Loss: 1 − cosine(student pooled, teacher pooled), mean
over the batch.

Pooling (the "pooled" head, ``training.engine.heads.MeanPooling``): the mean of the final states of the
tokens that reach the end; nothing is restored. A CLS-pooled model (BGE, Arctic-embed;
``training.engine.heads.CLSPooling``) pools the final [CLS] state, which is never dropped; its teacher
and loss are the same. Restoring dropped tokens with their last state (as token
heads do) averages earlier-layer states into the vector and pulls it away from the model's (the
study, docs/experiments/2026-11-25-embedding-pooling.md: −5.9 nDCG@10 at ρ = 0.5 with these scorers,
−7.2 when trained for it; the switch it used was removed afterwards). Both are exactly the dense model at
ρ = 1.

Evaluation: the mean cosine between each method's pruned embedding and the dense embedding of the same
text (``cosine_to_dense``; the manifest curve measures the exported graph against itself at ρ = 1).
Methods: learned, random, attention and truncation.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from retention_core.codecs.base import Encoded
from retention_core.contract import MODEL_FILE
from retention_core.text import pad_token_id
from retention_ort import open_session
from training.evaluation.codec_loop import (
    CodecLoop,
    codec_quality_curve,
    codec_results,
    codec_task_evaluation,
    truncated_text,
)
from training.evaluation.methods import CODEC_METHODS
from training.evaluation.running import RowPrediction, onnx_predict_rows, predict_rows
from training.recipes.data import Example
from training.recipes.recipe import Recipe
from training.tasks.batch import Batch
from training.tasks.codecs import EVERY_WINDOW, evaluation_codec, rows_to_tensors, task_codec
from training.tasks.registry import Curve, EvaluationRun

TASK = "embedding"
METRIC = "cosine_to_dense"
TEXT_FIELD = "text"


def example_text(example: Example) -> str:
    if TEXT_FIELD not in example:
        raise KeyError(f"an embedding example needs a {TEXT_FIELD!r} field; got {sorted(example)}")
    return str(example[TEXT_FIELD])


def embedding_batch(examples: list[Example], tokenizer: Any, max_length: int) -> Batch:
    """One row per text, as the service encodes it. ``targets`` is empty (B, 0) until the teacher
    (``training.tasks.teacher.dense_targets``) fills it in with the dense pooled vectors."""
    codec = task_codec(TASK, tokenizer, max_length, options=EVERY_WINDOW)
    rows = [row for example in examples for row in codec.encode(example_text(example)).rows]
    feeds = rows_to_tensors(rows, pad_token_id(codec.tokenizer))
    return Batch(feeds["input_ids"], feeds["attention_mask"], torch.zeros(len(rows), 0))


def embedding_loss(pooled: torch.Tensor, batch: Batch) -> torch.Tensor:
    """pooled (B, d), targets (B, d) the teacher's → mean of 1 − cosine."""
    return (1.0 - F.cosine_similarity(pooled, batch.targets, dim=-1)).mean()


# ---------------------------------------------------------------------- evaluation
def cosine(first: np.ndarray, second: np.ndarray) -> float:
    first, second = first.astype(np.float64), second.astype(np.float64)
    return float(first @ second / max(float(np.linalg.norm(first) * np.linalg.norm(second)), 1e-12))


def codec_loop(tokenizer: Any, max_length: int, dense: dict[str, np.ndarray]) -> CodecLoop:
    """Embedding's part of the shared loop: the serving codec; the score of an output is its cosine to
    ``dense[text]``, the text's dense vector."""
    codec = evaluation_codec(TASK, tokenizer, max_length)

    def score(example: Example, encoded: Encoded, outputs: list[np.ndarray]) -> dict[str, float]:
        return {METRIC: cosine(outputs[0], dense[example_text(example)])}

    def encode(example: Example) -> Encoded:
        encoded: Encoded = codec.encode(example_text(example))
        return encoded

    return CodecLoop(encode, score, truncated_text, pad_token_id(codec.tokenizer))


def dense_vectors(
    examples: list[Example], outputs: Sequence[np.ndarray | RowPrediction]
) -> dict[str, np.ndarray]:
    """text → its dense vector, from one output (or torch prediction) per example."""
    vectors = [output.logits if isinstance(output, RowPrediction) else output for output in outputs]
    return {example_text(example): vector for example, vector in zip(examples, vectors, strict=True)}


def evaluate(
    run: EvaluationRun, rhos: Sequence[float], methods: Sequence[str] = CODEC_METHODS
) -> dict[str, Any]:
    """``cosine_to_dense`` (percent) per method and ρ against the model's own dense embeddings."""
    EVALUATION.check_methods(methods)
    tokenizer, max_length, examples = run.tokenizer, run.recipe.max_length, run.examples
    loop = codec_loop(tokenizer, max_length, {})
    rows = [loop.encode(example).rows[0] for example in examples]
    predictions = predict_rows(run.model, rows, 1.0, loop.pad_id, None, run.recipe.evaluation.batch_size)
    loop = codec_loop(tokenizer, max_length, dense_vectors(examples, predictions))
    return {
        "task": TASK,
        "num_examples": len(examples),
        "metric": METRIC,
        "results": codec_results(run, loop, rhos, methods),
    }


def onnx_quality_curve(onnx_path: Path, tokenizer: Any, examples: list[Example], recipe: Recipe) -> Curve:
    """``cosine_to_dense`` (0-1) of the exported graph at each evaluation ρ against the fp32 graph's
    ρ = 1 output beside it (``model.onnx``; the graph itself when there is none), through the serving
    codec: the manifest curve. An int8 variant's curve so includes its quantisation error (its value at
    ρ = 1 is its cosine to the fp32 model)."""
    batch_size = recipe.evaluation.batch_size
    loop = codec_loop(tokenizer, recipe.max_length, {})
    rows = [loop.encode(example).rows[0] for example in examples]
    fp32 = onnx_path.with_name(MODEL_FILE)
    reference = fp32 if fp32.is_file() else onnx_path
    outputs = onnx_predict_rows(open_session(reference), rows, 1.0, loop.pad_id, batch_size)
    loop = codec_loop(tokenizer, recipe.max_length, dense_vectors(examples, outputs))
    return codec_quality_curve(onnx_path, loop, examples, METRIC, recipe.evaluation)


EVALUATION = codec_task_evaluation(evaluate, (METRIC,), lambda dataset: METRIC, onnx_quality_curve)
