"""Extractive QA (SQuAD v1.1): task adapter for ``training.fitting.fit`` and evaluation.

Pre- and post-processing are the serving codec's (``retention_tasks.qa.codec.QACodec``), so training
windows, evaluation windows and served windows are the same (evaluation also keeps the service's cap on
windows per question; training learns from every window).

Training batch: every window of every question is one row (``DOC_STRIDE`` = 128 context tokens of
overlap, question repeated and protected). The start/end targets are the answer's first/last token
when the window holds the whole answer, else position 0 ([CLS]), as in BERT's SQuAD recipe. Loss:
mean of the start and end cross-entropies over the real tokens of each window.

Evaluation (``evaluate``, the codec loop of ``training.evaluation``): for each method and each ρ,
EM/F1 with the official SQuAD v1.1 normalisation, max over the gold answers, averaged over questions
(in percent).
``learned`` uses the trained scorers, ``random`` random-k and ``attention`` attention-received
selection (both with the same per-layer keep counts and protected question), and ``truncation``
keeps the question, the special tokens and the first round(ρ · n) context tokens of each window (n =
context tokens of the window) and runs the dense model on what is left.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from retention_core.codecs.base import Encoded, Row
from retention_core.metrics import squad_scores
from retention_core.text import pad_token_id
from retention_tasks.qa.codec import QAContext, QAWindow
from training.evaluation.codec_loop import (
    CodecLoop,
    codec_quality_curve,
    codec_results,
    codec_task_evaluation,
    sub_row,
    truncation_keep,
)
from training.evaluation.methods import CODEC_METHODS
from training.recipes.data import Example
from training.recipes.recipe import Recipe
from training.tasks.batch import Batch, softmax_divergence
from training.tasks.codecs import EVERY_WINDOW, evaluation_codec, rows_to_tensors, task_codec
from training.tasks.registry import Curve, EvaluationRun

DOC_STRIDE = 128  # the QACodec default the service uses
METHODS = CODEC_METHODS
METRICS = ("exact_match", "f1")  # per cell of the report, percent
QUALITY_METRIC = "f1"  # what ``onnx_quality_curve`` measures (0-1) for the manifest
MASKED_LOGIT = -1e9  # start/end logit of padding positions in the loss


# ---------------------------------------------------------------------- training
def answer_tokens(window: QAWindow, answer_start: int, answer_text: str) -> tuple[int, int]:
    """(start, end) token of the answer inside the window, or (0, 0) ([CLS]) when not fully inside."""
    end_char = answer_start + len(answer_text)
    context = [i for i, flag in enumerate(window.context_mask) if flag]
    if not context or not answer_text:
        return 0, 0
    offsets = window.offsets
    if offsets[context[0]][0] > answer_start or offsets[context[-1]][1] < end_char:
        return 0, 0
    start = next(i for i in context if offsets[i][1] > answer_start)
    end = next(i for i in reversed(context) if offsets[i][0] < end_char)
    return (start, end) if start <= end else (0, 0)


def first_answer(row: Example) -> tuple[int, str]:
    answers = row["answers"]
    assert isinstance(answers, dict)
    return int(answers["answer_start"][0]), str(answers["text"][0])


def gold_answers(row: Example) -> list[str]:
    answers = row["answers"]
    assert isinstance(answers, dict)
    return [str(text) for text in answers["text"]]


def encode(codec: Any, row: Example) -> Encoded:
    encoded: Encoded = codec.encode(str(row["question"]), str(row["context"]))
    return encoded


def qa_batch(rows: list[Example], tokenizer: Any, max_length: int) -> Batch:
    """All windows of all questions; targets (N, 2) start/end token positions."""
    codec = task_codec("qa", tokenizer, max_length, options=EVERY_WINDOW)
    windows: list[Row] = []
    targets: list[tuple[int, int]] = []
    for row in rows:
        encoded = encode(codec, row)
        start, text = first_answer(row)
        state: QAContext = encoded.context
        for window_row, window in zip(encoded.rows, state.windows, strict=True):
            windows.append(window_row)
            targets.append(answer_tokens(window, start, text))
    feeds = rows_to_tensors(windows, pad_token_id(codec.tokenizer))
    return Batch(
        input_ids=feeds["input_ids"],
        attention_mask=feeds["attention_mask"],
        targets=torch.tensor(targets, dtype=torch.long),  # (N, 2)
        protected=feeds["protected_mask"].bool(),
        token_type_ids=feeds["token_type_ids"],
    )


def qa_loss(logits: torch.Tensor, batch: Batch) -> torch.Tensor:
    """logits (N, T, 2), targets (N, 2) → mean of start and end cross-entropy over real tokens."""
    real = batch.attention_mask.bool().unsqueeze(-1)  # (N, T, 1)
    masked = logits.masked_fill(~real, MASKED_LOGIT)  # (N, T, 2)
    start = F.cross_entropy(masked[..., 0], batch.targets[:, 0])
    end = F.cross_entropy(masked[..., 1], batch.targets[:, 1])
    return (start + end) / 2


def qa_distill(student: torch.Tensor, teacher: torch.Tensor, batch: Batch) -> torch.Tensor:
    """(N, T, 2) student and teacher span logits → mean KL of the start and end distributions
    over the real tokens of each window."""
    real = batch.attention_mask.bool().unsqueeze(-1)  # (N, T, 1)
    return softmax_divergence(
        student.masked_fill(~real, MASKED_LOGIT), teacher.masked_fill(~real, MASKED_LOGIT), dim=1
    )


def answer_span_mask(batch: Batch) -> torch.Tensor:
    """targets (N, 2) → (N, T) bool: the gold answer tokens of each window; none where the window
    lacks the answer (its targets point at [CLS], position 0)."""
    positions = torch.arange(batch.input_ids.shape[1], device=batch.targets.device).unsqueeze(0)  # (1, T)
    start, end = batch.targets[:, :1], batch.targets[:, 1:]  # (N, 1) each
    return (positions >= start) & (positions <= end) & (start > 0)


# ---------------------------------------------------------------------- evaluation
def truncated_qa(encoded: Encoded, rho: float, min_kept: int = 0) -> tuple[Encoded, list[float]]:
    """The QA encoding with each window's context cut to its first round(ρ · n) tokens (at least
    min(min_kept, T) tokens per window, the kept-token floor)."""
    state: QAContext = encoded.context
    rows, windows, kept = [], [], []
    for row, window in zip(encoded.rows, state.windows, strict=True):
        positions = truncation_keep(row, np.asarray(window.context_mask), rho, min_kept)
        rows.append(sub_row(row, positions))
        windows.append(
            QAWindow(
                tuple(window.context_mask[i] for i in positions), tuple(window.offsets[i] for i in positions)
            )
        )
        kept.append(len(positions) / len(row))
    return replace(encoded, rows=rows, context=QAContext(state.context, tuple(windows))), kept


def codec_loop(tokenizer: Any, max_length: int) -> CodecLoop:
    """QA's part of the shared loop: the serving codec, SQuAD EM / F1 (0-1) of the decoded answer."""
    codec = evaluation_codec("qa", tokenizer, max_length)

    def score(row: Example, encoded: Encoded, outputs: list[np.ndarray]) -> dict[str, float]:
        answer = codec.decode(encoded, outputs)
        return squad_scores(str(answer["answer"]), gold_answers(row))

    return CodecLoop(lambda row: encode(codec, row), score, truncated_qa, pad_token_id(codec.tokenizer))


def evaluate(run: EvaluationRun, rhos: Sequence[float], methods: Sequence[str] = METHODS) -> dict[str, Any]:
    """EM / F1 (percent) per method and ρ, plus kept fraction and encoder token-work.

    Returns ``{"task", "num_examples", "metric", "results": {method: {"<rho>": {...}}}}``.
    """
    EVALUATION.check_methods(methods)
    results = codec_results(run, codec_loop(run.tokenizer, run.recipe.max_length), rhos, methods)
    return {"task": "qa", "num_examples": len(run.examples), "metric": QUALITY_METRIC, "results": results}


def onnx_quality_curve(onnx_path: Path, tokenizer: Any, rows: list[Example], recipe: Recipe) -> Curve:
    """F1 (0-1) of the exported graph itself at each of the recipe's evaluation ρ, through the serving
    codec: the manifest curve."""
    loop = codec_loop(tokenizer, recipe.max_length)
    return codec_quality_curve(onnx_path, loop, rows, QUALITY_METRIC, recipe.evaluation)


EVALUATION = codec_task_evaluation(
    evaluate, METRICS, lambda dataset: QUALITY_METRIC, onnx_quality_curve, headline=QUALITY_METRIC
)
