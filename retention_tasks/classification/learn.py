"""Sequence classification (SST-2, IMDb): task adapter for ``training.fitting.fit`` and evaluation.

Training batch: the texts tokenized with dynamic padding to the longest of the batch, truncated at
``max_length``; loss: cross-entropy over the labels; distillation: KL over the labels.

Retrofit (label-free, ``training.tasks.registry.retrofit_task``): batches of unlabeled texts (``text_batch``);
the targets are the original model's dense logits (the task's teacher) and the loss is
KL(teacher softmax ‖ student softmax) at temperature 1 (``teacher_divergence``): the student learns to
keep the original model's whole predictive distribution, not only its argmax.

Evaluation: quality vs ρ for learned retention and the cheap baselines, at the same kept-token budget.
Methods:
- ``learned``: the trained scorers, top-M per layer (what the ONNX graph does).
- ``random``: same per-layer counts, tokens chosen uniformly at random ([CLS] kept).
- ``attention``: same counts, tokens ranked by the attention they receive in the next layer
  (PoWER-BERT / H2O style).
- ``threshold`` (ablation): the trained scorers, but every token with an open gate is kept instead of
  the scheduled top-M, so the kept count follows the scores and the budget is not enforced.
- ``first_k``: plain truncation to the first round(ρ·n) tokens (same final budget).
- ``first_k_work`` / ``head_tail_work``: truncation to the length that costs the *same encoder
  token-work* as the learned schedule (more tokens than ρ·n, since the learned model reaches ρ only
  at the last layer); head+tail keeps ¼ head and ¾ tail (Sun et al. 2019).
All methods run on the same trained weights; truncation runs the model at ρ=1 on the cut input.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from retention_core.codecs.base import Row
from retention_core.contract import MODEL_FILE
from retention_ort import open_session
from training.engine import selection as S
from training.engine.model import PrunedInputs, RetentionModel, Selector
from training.evaluation.running import length_sorted_chunks, make_selector, onnx_predict_rows
from training.recipes.data import EVAL_SEED, Example
from training.recipes.recipe import TEXT_DATASET_PREFIX, Recipe
from training.tasks.batch import Batch, softmax_divergence
from training.tasks.codecs import rows_to_tensors
from training.tasks.registry import Curve, EvaluationRun, Report, TaskEvaluation

SELECTION_METHODS = ("learned", "random", "attention", "threshold")
TRUNCATION_METHODS = ("first_k", "first_k_work", "head_tail_work")
ALL_METHODS = SELECTION_METHODS + TRUNCATION_METHODS
DEFAULT_METHODS = tuple(m for m in ALL_METHODS if m != "threshold")  # threshold is an ablation
HEAD_SHARE = 0.25  # head+tail truncation: a quarter from the start, the rest from the end
RANDOM_SEED = EVAL_SEED
QUALITY_METRIC = "accuracy"
AGREEMENT_METRIC = "agreement_with_dense"  # the manifest's metric without labels: argmax = dense argmax


# ---------------------------------------------------------------------- training
def encode_texts(rows: list[Example], tokenizer: Any, max_length: int) -> Any:
    """The rows' ``text`` tokenized with dynamic padding to the longest, truncated at ``max_length``."""
    texts = [str(row["text"]) for row in rows]
    return tokenizer(texts, truncation=True, max_length=max_length, padding=True, return_tensors="pt")


def classification_batch(rows: list[Example], tokenizer: Any, max_length: int) -> Batch:
    """Dynamic padding to the longest row of the batch, truncation at ``max_length``."""
    encoded = encode_texts(rows, tokenizer, max_length)
    labels = torch.tensor([int(row["label"]) for row in rows], dtype=torch.long)  # type: ignore[call-overload]
    return Batch(encoded["input_ids"], encoded["attention_mask"], labels)


def text_batch(rows: list[Example], tokenizer: Any, max_length: int) -> Batch:
    """Unlabeled texts, encoded as ``classification_batch`` encodes them; ``targets`` is empty (B, 0)
    until the teacher fills in its logits."""
    encoded = encode_texts(rows, tokenizer, max_length)
    return Batch(encoded["input_ids"], encoded["attention_mask"], torch.zeros(len(rows), 0))


def teacher_divergence(logits: torch.Tensor, batch: Batch) -> torch.Tensor:
    """Student logits (B, C), targets = the teacher's logits (B, C) → KL(teacher ‖ student)."""
    return softmax_divergence(logits, batch.targets)


def classification_loss(logits: torch.Tensor, batch: Batch) -> torch.Tensor:
    """logits (B, C), targets (B,) → scalar cross-entropy."""
    return F.cross_entropy(logits, batch.targets)


def classification_distill(student: torch.Tensor, teacher: torch.Tensor, batch: Batch) -> torch.Tensor:
    """(B, C) student and teacher logits → KL over the labels."""
    return softmax_divergence(student, teacher)


# ---------------------------------------------------------------------- evaluation


@dataclass
class MethodResult:
    method: str
    rho: float
    accuracy: float
    token_work: float  # mean fraction of dense encoder token-work
    num_examples: int
    seconds: float


def tokenize_rows(rows: list[Example], tokenizer: Any, max_length: int) -> list[list[int]]:
    encoded = tokenizer([str(row["text"]) for row in rows], truncation=True, max_length=max_length)
    return [list(ids) for ids in encoded["input_ids"]]


def as_rows(sequences: Sequence[Sequence[int]]) -> list[Row]:
    return [Row(tuple(seq)) for seq in sequences]


def truncated_lengths(
    num_real: torch.Tensor, rho: float, model: RetentionModel, equal_work: bool
) -> torch.Tensor:
    """Kept length per example for truncation baselines. (B,) → (B,) int64."""
    rhos = torch.full(num_real.shape, rho)
    counts = model.keep_counts(rhos, num_real, torch.ones_like(num_real))  # (B, P), the model's floor too
    if not equal_work:
        return counts[:, -1]
    # Learned work = Σ_{p<P-1} counts_p + last layer; truncation at k costs (P-1)·k + the same last layer.
    return torch.clamp(torch.round(counts[:, :-1].float().mean(1)).long(), min=2)


def truncate(ids: Sequence[int], keep: int, head_share: float | None) -> list[int]:
    """Cut [CLS] … [SEP] to ``keep`` tokens, special tokens kept. head_share=None keeps the head only."""
    if keep >= len(ids):
        return list(ids)
    body, budget = list(ids[1:-1]), max(keep - 2, 0)
    if head_share is None:
        kept = body[:budget]
    else:
        head = int(budget * head_share)
        kept = body[:head] + (body[len(body) - (budget - head) :] if budget > head else [])
    return [ids[0], *kept, ids[-1]]


def _selector(method: str) -> Selector | None:
    return None if method == "threshold" else make_selector(method, RANDOM_SEED)


@dataclass(frozen=True)
class BatchPredictions:
    """One evaluation batch: which examples (indices into the sequences), their predicted labels and
    the fraction of dense encoder token-work each row did, (B,)."""

    indices: list[int]
    predictions: list[int]
    token_work: torch.Tensor


@torch.inference_mode()
def method_predictions(
    model: RetentionModel,
    sequences: list[list[int]],
    method: str,
    rho: float,
    batch_size: int,
    pad_id: int,
) -> Iterator[BatchPredictions]:
    """Every example's prediction under ``method`` at ``rho``, in length-sorted batches (per-example
    outcomes for paired comparisons; ``evaluate_method`` aggregates them)."""
    device = next(model.parameters()).device
    selector = _selector(method) if method in SELECTION_METHODS else None
    for chunk in length_sorted_chunks([len(seq) for seq in sequences], batch_size):
        batch = [sequences[i] for i in chunk]
        num_real = torch.tensor([len(seq) for seq in batch])
        if method in TRUNCATION_METHODS:
            keep = truncated_lengths(num_real, rho, model, equal_work=method != "first_k")
            share = HEAD_SHARE if method == "head_tail_work" else None
            batch = [truncate(seq, int(k), share) for seq, k in zip(batch, keep.tolist(), strict=True)]
            batch_rho = torch.ones(len(batch))
        else:
            batch_rho = torch.full((len(batch),), rho)
        feeds = rows_to_tensors(as_rows(batch), pad_id)  # input_ids, attention_mask (B, T)
        inputs = PrunedInputs(
            feeds["input_ids"].to(device), feeds["attention_mask"].to(device), batch_rho.to(device)
        )
        out = model.forward_evaluation(inputs, selector=selector, open_gates=method == "threshold")
        work = S.encoder_token_work(out.kept_counts.cpu(), num_real, model.last_layer_queries)  # (B,)
        yield BatchPredictions(list(chunk), out.logits.argmax(-1).tolist(), work)


def evaluate_method(
    model: RetentionModel,
    sequences: list[list[int]],
    labels: list[int],
    method: str,
    rho: float,
    batch_size: int,
    pad_id: int,
) -> MethodResult:
    correct, work, started = 0, 0.0, time.perf_counter()
    for batch in method_predictions(model, sequences, method, rho, batch_size, pad_id):
        correct += sum(int(p == labels[i]) for p, i in zip(batch.predictions, batch.indices, strict=True))
        work += batch.token_work.sum().item()
    count = len(sequences)
    return MethodResult(method, rho, correct / count, work / count, count, time.perf_counter() - started)


def evaluate_classification(
    run: EvaluationRun, rhos: Sequence[float], methods: Sequence[str], progress: bool = True
) -> list[MethodResult]:
    """One result per (method, ρ) over the run's examples (batches of the recipe's evaluation size)."""
    EVALUATION.check_methods(methods)
    model, tokenizer, batch_size = run.model.eval(), run.tokenizer, run.recipe.evaluation.batch_size
    sequences = tokenize_rows(run.examples, tokenizer, run.recipe.max_length)
    labels = [int(row["label"]) for row in run.examples]  # type: ignore[call-overload]
    results = []
    grid = [(m, r) for m in methods for r in rhos]
    for method, rho in tqdm(grid, desc="evaluate", disable=not progress):
        if method in TRUNCATION_METHODS and rho >= 1.0:
            continue  # identical to learned at ρ=1 (the dense model)
        results.append(
            evaluate_method(model, sequences, labels, method, rho, batch_size, tokenizer.pad_token_id)
        )
    return results


def markdown_table(results: list[MethodResult], metric: str = "accuracy") -> str:
    rhos = sorted({r.rho for r in results})
    methods = list(dict.fromkeys(r.method for r in results))
    lookup = {(r.method, r.rho): r for r in results}
    header = "| method | " + " | ".join(f"ρ={rho:g}" for rho in rhos) + " |"
    lines = [header, "|" + "---|" * (len(rhos) + 1)]
    for method in methods:
        cells = []
        for rho in rhos:
            result = lookup.get((method, rho))
            cells.append(f"{100 * result.accuracy:.2f} ({result.token_work:.2f})" if result else "—")
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + f"\n\nCells: {metric} % (fraction of dense encoder token-work done).\n"


def merge_results(previous: Report, report: Report) -> Report:
    """An earlier report's results plus the new ones; a new (method, ρ) replaces the old."""
    merged = {(r["method"], r["rho"]): r for r in previous["results"]}
    merged.update({(r["method"], r["rho"]): r for r in report["results"]})
    return {**report, "results": list(merged.values())}


def report_of(results: list[MethodResult]) -> Report:
    return {"results": [asdict(r) for r in results]}


def results_of(report: Report) -> list[MethodResult]:
    return [MethodResult(**r) for r in report["results"]]


def evaluate(run: EvaluationRun, rhos: Sequence[float], methods: Sequence[str] = DEFAULT_METHODS) -> Report:
    """The CLI's report: ``{"results": [MethodResult as a dict, …]}``."""
    return report_of(evaluate_classification(run, rhos, methods))


def onnx_accuracy_curve(onnx_path: Path, tokenizer: Any, rows: list[Example], recipe: Recipe) -> Curve:
    """Accuracy of the exported graph itself (onnxruntime) at each of the recipe's evaluation ρ: what
    the manifest reports. Unlabeled rows (a retrofit on texts, no labelled dataset): agreement with the
    fp32 graph's own predictions at ρ = 1 (``model.onnx`` beside it, or the graph itself)."""
    session = open_session(onnx_path)
    sequences = as_rows(tokenize_rows(rows, tokenizer, recipe.max_length))
    batch_size, pad_id = recipe.evaluation.batch_size, tokenizer.pad_token_id

    def predictions_at(graph: Any, rho: float) -> np.ndarray:
        logits = onnx_predict_rows(graph, sequences, rho, pad_id, batch_size)
        return np.array([int(np.argmax(row_logits)) for row_logits in logits])  # logits (C,) per row

    if all("label" in row for row in rows):
        labels = np.array([int(row["label"]) for row in rows])  # type: ignore[call-overload]
    else:
        fp32 = onnx_path.with_name(MODEL_FILE)
        labels = predictions_at(open_session(fp32) if fp32.is_file() else session, 1.0)
    return [(rho, float((predictions_at(session, rho) == labels).mean())) for rho in recipe.evaluation.rhos]


def quality_metric(dataset: str) -> str:
    """Accuracy on a labelled dataset; agreement with the dense model on unlabeled texts."""
    return AGREEMENT_METRIC if dataset.startswith(TEXT_DATASET_PREFIX) else QUALITY_METRIC


EVALUATION = TaskEvaluation(
    methods=ALL_METHODS,
    default_methods=DEFAULT_METHODS,
    report=evaluate,
    merge=merge_results,
    table=lambda report: markdown_table(results_of(report)),
    metrics=(QUALITY_METRIC,),
    quality_metric=quality_metric,
    quality_curve=onnx_accuracy_curve,
    headline=QUALITY_METRIC,
)
