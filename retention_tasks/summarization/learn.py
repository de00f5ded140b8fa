"""Extractive summarization (SciTLDR-A, BBC News): task adapter for ``training.fitting.fit`` and evaluation.

Pre- and post-processing are the serving codec's (``retention_tasks.summarization.codec``); evaluation
also keeps the service's cap on windows per document, training learns from every window. The BBC split
rule lives with the other split rules in ``training.recipes.data``.

Labels. SciTLDR-A rows carry ``extractive_labels`` (the oracle sentence). BBC News rows carry the
article as one string and the summary as the extracted sentences, often joined *without* a space;
the article is split with ``split_sentences`` and a sentence is labelled 1 when its
whitespace-normalised text occurs in the whitespace-normalised summary (≥ 97% of every summary's
characters are covered this way on the first 400 articles).

Loss (pooled): every window's token logits are averaged per sentence (the same mean the codec
decodes with) and each (window, sentence) pair gets a binary cross-entropy against the sentence
label.

Evaluation (``evaluate``, the codec loop of ``training.evaluation``): ROUGE-1/2/L/Lsum F1 (percent,
``rouge-score`` with stemming) of the selected sentences against the references, **max over
``all_summaries``** (the SciTLDR convention; BBC has a single reference). ROUGE-Lsum (summary-level LCS,
one sentence per line) is the one to read for BBC: its summaries list the extracted sentences in a
different order than the article, so plain ROUGE-L penalises even the oracle. k sentences are selected:
SciTLDR 1 (a TLDR is one sentence), BBC ratio 0.4 of the sentences (the summaries hold 43% of the
sentences on average). Baselines: ``lead`` (first k sentences) and ``oracle`` (the labelled sentences),
independent of ρ.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from retention_core.codecs.base import Encoded
from retention_core.text import pad_token_id
from retention_tasks.summarization.codec import SummaryContext, selection_size
from retention_tasks.summarization.rouge import rouge_scores
from retention_tasks.summarization.sentences import split_sentences
from training.evaluation.codec_loop import (
    CodecLoop,
    aggregate,
    codec_quality_curve,
    codec_results,
    codec_task_evaluation,
    percent,
    sub_row,
    truncation_keep,
)
from training.evaluation.methods import CODEC_METHODS
from training.recipes.data import Example
from training.recipes.recipe import Recipe
from training.tasks.batch import Batch
from training.tasks.codecs import EVERY_WINDOW, evaluation_codec, rows_to_tensors, task_codec
from training.tasks.registry import Curve, EvaluationRun

IGNORE_LABEL = -1.0
METHODS = CODEC_METHODS
METRICS = ("rouge1", "rouge2", "rougeL")  # per cell of the report, percent
HEADLINE_METRIC = "rougeL"  # what a results page plots, on every dataset (the manifest's: quality_metric)
# How many sentences evaluation selects, per dataset (kwargs of SummarizationCodec.decode).
SELECTION: dict[str, dict[str, Any]] = {
    "scitldr_a": {"max_sentences": 1},
    "bbc_news": {"ratio": 0.4},
}
DEFAULT_SELECTION: dict[str, Any] = {"max_sentences": 3}


def quality_metric(dataset: str) -> str:
    """The headline ROUGE variant: Lsum for multi-sentence references in their own order (BBC)."""
    return "rougeLsum" if dataset == "bbc_news" else "rougeL"


# ---------------------------------------------------------------------- rows
def row_sentences(row: Example) -> list[str]:
    document = row["document"]
    if isinstance(document, str):
        return split_sentences(document)
    assert isinstance(document, list)
    return [str(sentence) for sentence in document]


def summary_labels(sentences: list[str], summary: str) -> list[int]:
    """1 for every sentence whose text occurs in the summary (whitespace-insensitive)."""
    target = "".join(summary.split())
    return [int(bool(key) and key in target) for key in ("".join(s.split()) for s in sentences)]


def row_labels(row: Example, sentences: list[str]) -> list[int]:
    labels = row.get("extractive_labels")
    if isinstance(labels, list) and len(labels) == len(sentences):
        return [int(label) for label in labels]
    return summary_labels(sentences, str(row["summary"]))


# A terminator directly followed by a sentence start; not after a one-letter word ("U.S.", "J.").
_GLUED_SENTENCES = re.compile(r"""(?<!\b[A-Z])([.!?]["'”’)]*)(?=[A-Z"“‘(])""")


def summary_sentences(summary: str) -> list[str]:
    """Sentences of a reference summary, also where they were joined without a space (BBC)."""
    return [
        sentence
        for line in _GLUED_SENTENCES.sub(r"\1\n", summary).splitlines()
        for sentence in split_sentences(line)
    ]


def references(row: Example) -> list[str]:
    """Reference summaries, one sentence per line (for rougeLsum)."""
    many = row.get("all_summaries")
    texts = [str(text) for text in many] if isinstance(many, list) and many else [str(row["summary"])]
    return ["\n".join(summary_sentences(text)) for text in texts]


# ---------------------------------------------------------------------- training
def summarization_batch(rows: list[Example], tokenizer: Any, max_length: int) -> Batch:
    """All windows of all documents. targets (N, S) sentence labels (IGNORE_LABEL = no such
    sentence); extra["segments"] (N, T) the window-local sentence of every token (-1 = none)."""
    codec = task_codec("summarization", tokenizer, max_length, options=EVERY_WINDOW)
    windows, segments, labels = [], [], []
    for row in rows:
        sentences = row_sentences(row)
        row_label = row_labels(row, sentences)
        encoded = codec.encode(sentences)
        state: SummaryContext = encoded.context
        for window_row, mapping in zip(encoded.rows, state.token_sentences, strict=True):
            present = sorted({index for index in mapping if index >= 0})
            local = {index: slot for slot, index in enumerate(present)}
            windows.append(window_row)
            segments.append([local.get(index, -1) for index in mapping])
            labels.append([float(row_label[index]) for index in present])
    feeds = rows_to_tensors(windows, pad_token_id(codec.tokenizer))
    length = feeds["input_ids"].shape[1]
    width = max(1, max(len(label) for label in labels))
    segment_tensor = torch.full((len(windows), length), -1, dtype=torch.long)  # (N, T)
    target = torch.full((len(windows), width), IGNORE_LABEL)  # (N, S)
    for i, (segment, label) in enumerate(zip(segments, labels, strict=True)):
        segment_tensor[i, : len(segment)] = torch.tensor(segment, dtype=torch.long)
        target[i, : len(label)] = torch.tensor(label)
    return Batch(
        input_ids=feeds["input_ids"],
        attention_mask=feeds["attention_mask"],
        targets=target,
        extra={"segments": segment_tensor},
    )


def sentence_logits(token_logits: torch.Tensor, segments: torch.Tensor, width: int) -> torch.Tensor:
    """Mean token logit per window-local sentence: (N, T, 1), (N, T) → (N, S)."""
    slots = torch.arange(width, device=segments.device)  # (S,)
    member = (segments.unsqueeze(-1) == slots).to(token_logits.dtype)  # (N, T, S)
    total = torch.einsum("nt,nts->ns", token_logits[..., 0], member)  # (N, S)
    return total / member.sum(1).clamp(min=1.0)


def summarization_loss(logits: torch.Tensor, batch: Batch) -> torch.Tensor:
    """Pooled BCE: one term per (window, sentence) pair."""
    assert batch.extra is not None
    pooled = sentence_logits(logits, batch.extra["segments"], batch.targets.shape[1])  # (N, S)
    valid = batch.targets != IGNORE_LABEL
    return F.binary_cross_entropy_with_logits(pooled[valid], batch.targets[valid])


def summarization_distill(student: torch.Tensor, teacher: torch.Tensor, batch: Batch) -> torch.Tensor:
    """(N, T, 1) student and teacher token logits → BCE of the student's pooled sentence logits
    against the teacher's sentence probabilities."""
    assert batch.extra is not None
    width = batch.targets.shape[1]
    valid = batch.targets != IGNORE_LABEL  # (N, S)
    pooled = sentence_logits(student, batch.extra["segments"], width)  # (N, S)
    soft_targets = torch.sigmoid(sentence_logits(teacher, batch.extra["segments"], width))  # (N, S)
    return F.binary_cross_entropy_with_logits(pooled[valid], soft_targets[valid])


# ---------------------------------------------------------------------- evaluation
def selected_text(sentences: list[str], indices: Sequence[int]) -> str:
    """The selected sentences in document order, one per line (for rougeLsum)."""
    return "\n".join(sentences[i] for i in sorted(indices))


def truncated_summary(encoded: Encoded, rho: float, min_kept: int = 0) -> tuple[Encoded, list[float]]:
    """Each window keeps its special tokens and its first round(ρ · n) document tokens (at least
    min(min_kept, T) tokens in all, the kept-token floor)."""
    state: SummaryContext = encoded.context
    rows, mappings, kept = [], [], []
    for row, mapping in zip(encoded.rows, state.token_sentences, strict=True):
        content = np.asarray([index >= 0 for index in mapping])
        positions = truncation_keep(row, content, rho, min_kept)
        rows.append(sub_row(row, positions))
        mappings.append(tuple(mapping[i] for i in positions))
        kept.append(len(positions) / len(row))
    return replace(encoded, rows=rows, context=SummaryContext(state.sentences, tuple(mappings))), kept


def selection_for(dataset: str) -> dict[str, Any]:
    return SELECTION.get(dataset, DEFAULT_SELECTION)


def codec_loop(tokenizer: Any, max_length: int, selection: dict[str, Any]) -> CodecLoop:
    """Summarization's part of the shared loop: the serving codec, ROUGE F1 (0-1, max over the
    references) of the sentences the codec selects."""
    codec = evaluation_codec("summarization", tokenizer, max_length)

    def score(row: Example, encoded: Encoded, outputs: list[np.ndarray]) -> dict[str, float]:
        summary = codec.decode(encoded, outputs, **selection)
        picked = [int(item["index"]) for item in summary["sentences"]]
        return rouge_scores(selected_text(row_sentences(row), picked), references(row))

    def encode(row: Example) -> Encoded:
        encoded: Encoded = codec.encode(row_sentences(row))
        return encoded

    return CodecLoop(encode, score, truncated_summary, pad_token_id(codec.tokenizer))


def baselines(rows: list[Example], selection: dict[str, Any]) -> dict[str, dict[str, float]]:
    """ROUGE (percent) of ``lead`` (the first k sentences) and ``oracle`` (the labelled sentences)."""
    lead, oracle = [], []
    for row in rows:
        sentences = row_sentences(row)
        k = selection_size(len(sentences), selection.get("max_sentences"), selection.get("ratio"))
        lead.append(percent(rouge_scores(selected_text(sentences, range(k)), references(row))))
        labels = row_labels(row, sentences)
        chosen = [i for i, label in enumerate(labels) if label] or [0]
        oracle.append(percent(rouge_scores(selected_text(sentences, chosen), references(row))))
    return {"lead": aggregate(lead), "oracle": aggregate(oracle)}


def evaluate(
    run: EvaluationRun,
    rhos: Sequence[float],
    methods: Sequence[str] = METHODS,
    selection: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """ROUGE (percent) per method and ρ, plus lead-k and oracle baselines. ``selection`` defaults to the
    dataset's.

    Returns ``{"task", "num_examples", "metric", "selection", "results": {method: {"<rho>": {...}}},
    "baselines": {"lead": {...}, "oracle": {...}}}``.
    """
    EVALUATION.check_methods(methods)
    dataset = run.recipe.dataset.name
    selection = selection or selection_for(dataset)
    loop = codec_loop(run.tokenizer, run.recipe.max_length, selection)
    return {
        "task": "summarization",
        "num_examples": len(run.examples),
        "metric": quality_metric(dataset),
        "selection": selection,
        "reference_aggregate": "max",
        "results": codec_results(run, loop, rhos, methods),
        "baselines": baselines(run.examples, selection),
    }


def onnx_quality_curve(
    onnx_path: Path,
    tokenizer: Any,
    rows: list[Example],
    recipe: Recipe,
    selection: dict[str, Any] | None = None,
) -> Curve:
    """``quality_metric(dataset)`` F1 (0-1, max over references) of the exported graph at each of the
    recipe's evaluation ρ, through the serving codec: the manifest curve. ``selection`` defaults to the
    dataset's."""
    dataset = recipe.dataset.name
    loop = codec_loop(tokenizer, recipe.max_length, selection or selection_for(dataset))
    return codec_quality_curve(onnx_path, loop, rows, quality_metric(dataset), recipe.evaluation)


EVALUATION = codec_task_evaluation(evaluate, METRICS, quality_metric, onnx_quality_curve, HEADLINE_METRIC)
