"""The evaluation loop of tasks whose inputs are codec rows (QA, summarization, embedding, a new task).

Encode every example with the *serving* codec (``training.tasks.codecs.evaluation_codec``: the task's
registered codec with the service's default limits, so long inputs are scored on the rows the service
would run), run ``forward_pruned`` (torch) or the exported graph (onnxruntime) over the rows
(``training.evaluation.running``), decode with the codec and score each example. Methods:
``training.evaluation.methods``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from retention_core.codecs.base import Encoded, Row
from retention_ort import open_session
from training.engine.model import RetentionModel
from training.evaluation.methods import CODEC_EXTRA_METHODS, CODEC_METHODS, LAYER_EXIT, TRUNCATION
from training.evaluation.reporting import PER_EXAMPLE, markdown_table, merge_method_results
from training.evaluation.running import (
    RowPrediction,
    exit_layers,
    layer_exit_rows,
    make_selector,
    onnx_predict_rows,
    predict_rows,
)
from training.recipes.data import Example
from training.recipes.recipe import EvalSpec, Recipe
from training.tasks.registry import Curve, EvaluationRun, Report, TaskEvaluation

# (example, its encoding, the first graph output of each of its rows) → metrics in 0-1
Scorer = Callable[[Example, Encoded, list[np.ndarray]], dict[str, float]]
# (encoding, ρ, kept-token floor) → the encoding cut for the truncation baseline and the kept fraction
# of each row
Truncator = Callable[[Encoded, float, int], tuple[Encoded, list[float]]]


@dataclass(frozen=True)
class CodecLoop:
    """One task's part of the codec loop: how an example is encoded, scored and truncated."""

    encode: Callable[[Example], Encoded]
    score: Scorer
    truncate: Truncator
    pad_id: int


def truncation_keep(row: Row, keep_content: np.ndarray, rho: float, min_kept: int = 0) -> list[int]:
    """Positions of a row kept by the truncation baseline.

    ``keep_content`` (T,) marks the content tokens that may be cut (QA: context; summarization: all
    but special tokens); every other token is kept, plus the first round(ρ · n) content tokens, and
    more if needed to keep min(min_kept, T) in all: the kept-token floor the pruned methods run with.
    """
    content = np.flatnonzero(keep_content)
    fixed = len(row) - len(content)  # tokens the baseline never cuts
    floor = min(min_kept, len(row)) - fixed
    budget = min(max(int(np.floor(rho * len(content) + 0.5)), floor), len(content))
    cut = set(content[budget:].tolist())
    return [i for i in range(len(row)) if i not in cut]


def sub_row(row: Row, positions: Sequence[int]) -> Row:
    def pick(values: tuple[int, ...] | None) -> tuple[int, ...] | None:
        return None if values is None else tuple(values[i] for i in positions)

    return Row(
        input_ids=tuple(row.input_ids[i] for i in positions),
        token_type_ids=pick(row.token_type_ids),
        protected=pick(row.protected),
    )


def truncated_text(encoded: Encoded, rho: float, min_kept: int = 0) -> tuple[Encoded, list[float]]:
    """The truncation baseline of a one-row text encoding ([CLS] … [SEP]): keep [CLS], [SEP] and the
    first round(ρ · n) word pieces (at least min(min_kept, T) tokens in all)."""
    row = encoded.rows[0]
    content = np.array([0 < i < len(row) - 1 for i in range(len(row))])
    positions = truncation_keep(row, content, rho, min_kept)
    return Encoded([sub_row(row, positions)], encoded.input_tokens, encoded.truncated), [
        len(positions) / len(row)
    ]


def aggregate(values: list[dict[str, float]]) -> dict[str, float]:
    return {key: float(np.mean([value[key] for value in values])) for key in values[0]} if values else {}


def percent(scores: dict[str, float]) -> dict[str, float]:
    return {key: 100.0 * value for key, value in scores.items()}


def method_predictions(
    model: RetentionModel,
    loop: CodecLoop,
    encodings: list[Encoded],
    method: str,
    rho: float,
    batch_size: int,
) -> tuple[list[Encoded], list[RowPrediction]]:
    """The encodings the method runs on and one prediction per row of them."""
    if method != TRUNCATION:
        flat = [row for encoded in encodings for row in encoded.rows]
        if method == LAYER_EXIT:
            return encodings, layer_exit_rows(model, flat, exit_layers(model, rho), loop.pad_id, batch_size)
        return encodings, predict_rows(model, flat, rho, loop.pad_id, make_selector(method), batch_size)
    cut = [loop.truncate(encoded, rho, model.config.min_kept_tokens) for encoded in encodings]
    inputs = [encoded for encoded, _ in cut]
    flat = [row for encoded in inputs for row in encoded.rows]
    predictions = predict_rows(model, flat, 1.0, loop.pad_id, None, batch_size)  # dense on the cut rows
    fractions = [fraction for _, kept in cut for fraction in kept]
    for prediction, fraction in zip(predictions, fractions, strict=True):
        prediction.kept_fraction = prediction.token_work = fraction
    return inputs, predictions


def codec_results(
    run: EvaluationRun, loop: CodecLoop, rhos: Sequence[float], methods: Sequence[str]
) -> dict[str, dict[str, dict[str, float]]]:
    """``{method: {"<ρ>": mean metrics (percent), kept_fraction, token_work}}`` over the run's examples
    (batches of the recipe's evaluation batch size)."""
    model, examples, batch_size = run.model, run.examples, run.recipe.evaluation.batch_size
    encodings = [loop.encode(example) for example in examples]
    results: dict[str, dict[str, dict[str, float]]] = {}
    for method in methods:
        results[method] = {}
        for rho in rhos:
            inputs, predictions = method_predictions(model, loop, encodings, method, rho, batch_size)
            per_example: list[dict[str, float]] = []
            cursor = 0
            for example, encoded in zip(examples, inputs, strict=True):
                mine = predictions[cursor : cursor + len(encoded.rows)]
                cursor += len(encoded.rows)
                scores = percent(loop.score(example, encoded, [p.logits for p in mine]))
                scores["kept_fraction"] = float(np.mean([p.kept_fraction for p in mine]))
                scores["token_work"] = float(np.mean([p.token_work for p in mine]))
                per_example.append(scores)
            cell: dict[str, Any] = aggregate(per_example)
            if per_example:
                scored = [key for key in per_example[0] if key not in ("kept_fraction", "token_work")]
                cell[PER_EXAMPLE] = {key: [scores[key] for scores in per_example] for key in scored}
            results[method][f"{rho:g}"] = cell
    return results


def codec_quality_curve(
    onnx_path: Path,
    loop: CodecLoop,
    examples: list[Example],
    metric: str,
    evaluation: EvalSpec,
) -> Curve:
    """``metric`` (0-1) of the exported graph at each of the recipe's evaluation ρ (``evaluation.rhos``),
    through the serving codec: the manifest curve."""
    rhos, batch_size = evaluation.rhos, evaluation.batch_size
    session = open_session(onnx_path)
    encodings = [loop.encode(example) for example in examples]
    flat = [row for encoded in encodings for row in encoded.rows]
    curve = []
    for rho in rhos:
        outputs = onnx_predict_rows(session, flat, rho, loop.pad_id, batch_size)
        cursor, total = 0, 0.0
        for example, encoded in zip(examples, encodings, strict=True):
            total += loop.score(example, encoded, outputs[cursor : cursor + len(encoded.rows)])[metric]
            cursor += len(encoded.rows)
        curve.append((float(rho), total / max(len(examples), 1)))
    return curve


def codec_task_evaluation(
    report: Callable[[EvaluationRun, Sequence[float], Sequence[str]], Report],
    metrics: tuple[str, ...],
    quality_metric: Callable[[str], str],
    quality_curve: Callable[[Path, Any, list[Example], Recipe], Curve],
    headline: str | None = None,
) -> TaskEvaluation:
    """The evaluation of a task measured by the codec loop (``codec_results``, ``codec_quality_curve``): its
    methods, merging and table; ``headline`` (default: the first of ``metrics``) is what a results page
    plots."""
    return TaskEvaluation(
        methods=CODEC_METHODS + CODEC_EXTRA_METHODS,
        default_methods=CODEC_METHODS,
        report=report,
        merge=merge_method_results,
        table=lambda report: markdown_table(report, metrics),
        metrics=metrics,
        quality_metric=quality_metric,
        quality_curve=quality_curve,
        headline=metrics[0] if headline is None else headline,
    )
