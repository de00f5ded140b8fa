"""The embedding task's evaluation (the codec loop of ``training.evaluation.codec_loop``): the mean cosine
between each method's pruned embedding and the dense embedding of the same text (``cosine_to_dense``; the
manifest curve measures the exported graph against itself at ρ = 1). Methods: learned, random, attention
and truncation. Its training side (batches, the teacher, the loss): ``training.tasks.embedding``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

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
from training.tasks.codecs import evaluation_codec
from training.tasks.embedding import METRIC, TASK, example_text
from training.tasks.registry import Curve, EvaluationRun


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
