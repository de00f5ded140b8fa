"""Extractive QA (SQuAD v1.1): task adapter for ``training.fit`` and evaluation.

Pre- and post-processing are the serving codec's (``retention_core.codecs.qa.QACodec``), so training windows,
evaluation windows and served windows are the same.

Training batch: every window of every question is one row (``DOC_STRIDE`` = 128 context tokens of
overlap, question repeated and protected). The start/end targets are the answer's first/last token
when the window holds the whole answer, else position 0 ([CLS]), as in BERT's SQuAD recipe. Loss:
mean of the start and end cross-entropies over the real tokens of each window.

Evaluation (``evaluate``): for each method in ``METHODS`` and each ρ, EM/F1 with the official SQuAD
v1.1 normalisation, max over the gold answers, averaged over questions (in percent).
``learned`` uses the trained scorers, ``random`` random-k and ``attention`` attention-received
selection (both with the same per-layer keep counts and protected question), and ``truncation``
keeps the question, the special tokens and the first round(ρ · n) context tokens of each window (n =
context tokens of the window) and runs the dense model on what is left.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from retention_core.codecs.base import Encoded, Row, pad_rows
from retention_core.codecs.qa import QACodec, QAContext, QAWindow
from retention_core.metrics import squad_scores
from retention_core.text import backend_tokenizer, pad_token_id
from training import retention as R
from training.data import EVAL_SEED
from training.data import Row as DataRow
from training.model import RetentionModel, attention_selector, random_selector
from training.recipes import Recipe
from training.tasks import TRAINING_TASKS, Batch, TrainingTask, softmax_divergence

DOC_STRIDE = 128  # the QACodec default the service uses
MAX_ANSWER_TOKENS = 30
METHODS = ("learned", "random", "attention", "truncation")
QUALITY_METRIC = "f1"  # what ``onnx_quality_curve`` measures (0-1) for the manifest
MASKED_LOGIT = -1e9  # start/end logit of padding positions in the loss


# ---------------------------------------------------------------------- codec cache
_CODECS: dict[tuple[int, int, str], tuple[Any, Any]] = {}


def codec_for(tokenizer: Any, max_length: int) -> QACodec:
    """One QACodec per (tokenizer, max_length); the tokenizer is kept alive alongside its id."""
    key = (id(tokenizer), max_length, "qa")
    if key not in _CODECS:
        _CODECS[key] = (tokenizer, QACodec(backend_tokenizer(tokenizer), max_length, DOC_STRIDE))
    return _CODECS[key][1]


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


def first_answer(row: DataRow) -> tuple[int, str]:
    answers = row["answers"]
    assert isinstance(answers, dict)
    return int(answers["answer_start"][0]), str(answers["text"][0])


def gold_answers(row: DataRow) -> list[str]:
    answers = row["answers"]
    assert isinstance(answers, dict)
    return [str(text) for text in answers["text"]]


def rows_to_tensors(rows: list[Row], pad_id: int) -> dict[str, torch.Tensor]:
    return {name: torch.from_numpy(array) for name, array in pad_rows(rows, pad_id).items()}


def qa_batch(rows: list[DataRow], tokenizer: Any, max_length: int) -> Batch:
    """All windows of all questions; targets (N, 2) start/end token positions."""
    codec = codec_for(tokenizer, max_length)
    windows: list[Row] = []
    targets: list[tuple[int, int]] = []
    for row in rows:
        encoded = codec.encode(str(row["question"]), str(row["context"]))
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


TRAINING_TASKS["qa"] = TrainingTask(qa_batch, qa_loss, qa_distill, salient=answer_span_mask)


# ---------------------------------------------------------------------- shared evaluation plumbing
@dataclass
class RowPrediction:
    logits: np.ndarray  # (T_i, C) unpadded
    kept_fraction: float  # tokens reaching the last layer / real tokens
    token_work: float  # encoder token-work / dense token-work


def make_selector(method: str, seed: int) -> Any:
    if method == "learned":
        return None
    if method == "random":
        return random_selector(torch.Generator().manual_seed(seed))
    if method == "attention":
        return attention_selector()
    raise ValueError(f"unknown selection method {method!r}; known: {METHODS}")


@torch.no_grad()
def predict_rows(
    model: RetentionModel,
    rows: list[Row],
    rho: float,
    pad_id: int,
    selector: Any = None,
    batch_size: int = 16,
) -> list[RowPrediction]:
    """Run ``forward_pruned`` over codec rows in padded batches; unpadded outputs in row order."""
    model.eval()
    device = next(model.parameters()).device
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]))  # length-sorted batches: less padding
    predictions: list[RowPrediction | None] = [None] * len(rows)
    for begin in range(0, len(order), batch_size):
        members = order[begin : begin + batch_size]
        chunk = [rows[i] for i in members]
        feeds = {name: tensor.to(device) for name, tensor in rows_to_tensors(chunk, pad_id).items()}
        rho_tensor = torch.full((len(chunk),), float(rho), device=device)
        out = model.forward_pruned(
            feeds["input_ids"],
            feeds["attention_mask"],
            rho_tensor,
            protected=feeds["protected_mask"].bool() if "protected_mask" in feeds else None,
            token_type_ids=feeds.get("token_type_ids"),
            selector=selector,
        )
        num_real = feeds["attention_mask"].sum(1)  # (B,)
        work = R.encoder_token_work(out.kept_counts, num_real, model.last_layer_queries)  # (B,)
        kept = out.kept_counts[:, -1].to(torch.float32) / num_real.to(torch.float32)  # (B,)
        logits = out.logits.cpu().numpy()
        kept, work = kept.cpu(), work.cpu()
        for i, (member, row) in enumerate(zip(members, chunk, strict=True)):
            predictions[member] = RowPrediction(logits[i, : len(row)], float(kept[i]), float(work[i]))
    return [prediction for prediction in predictions if prediction is not None]


def truncation_keep(row: Row, keep_content: np.ndarray, rho: float) -> list[int]:
    """Positions of a row kept by the truncation baseline.

    ``keep_content`` (T,) marks the content tokens that may be cut (QA: context; summarization: all
    but special tokens); every other token is kept, plus the first round(ρ · n) content tokens.
    """
    content = np.flatnonzero(keep_content)
    budget = int(np.floor(rho * len(content) + 0.5))
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


def truncated_qa(encoded: Encoded, rho: float) -> tuple[Encoded, list[float]]:
    """The QA encoding with each window's context cut to its first round(ρ · n) tokens."""
    state: QAContext = encoded.context
    rows, windows, kept = [], [], []
    for row, window in zip(encoded.rows, state.windows, strict=True):
        positions = truncation_keep(row, np.asarray(window.context_mask), rho)
        rows.append(sub_row(row, positions))
        windows.append(
            QAWindow(
                tuple(window.context_mask[i] for i in positions), tuple(window.offsets[i] for i in positions)
            )
        )
        kept.append(len(positions) / len(row))
    return replace(encoded, rows=rows, context=QAContext(state.context, tuple(windows))), kept


def onnx_session(onnx_path: Path) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])


def onnx_predict_rows(
    session: Any, rows: list[Row], rho: float, pad_id: int, batch_size: int
) -> list[np.ndarray]:
    """What the service does: pad codec rows, add ρ, run the graph, unpad the first output."""
    names = {graph_input.name for graph_input in session.get_inputs()}
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]))  # length-sorted batches: less padding
    outputs: list[np.ndarray] = [np.empty(0)] * len(rows)
    for begin in range(0, len(order), batch_size):
        members = order[begin : begin + batch_size]
        chunk = [rows[i] for i in members]
        feeds: dict[str, np.ndarray] = dict(pad_rows(chunk, pad_id))
        feeds["rho"] = np.full(len(chunk), rho, dtype=np.float32)
        first = session.run(None, {name: value for name, value in feeds.items() if name in names})[0]
        for i, (member, row) in enumerate(zip(members, chunk, strict=True)):
            outputs[member] = first[i, : len(row)]
    return outputs


def markdown_table(report: dict[str, Any], metrics: Sequence[str]) -> str:
    """Rows: methods; columns: ρ; cells: the metrics (percent) and the token-work fraction."""
    results = report["results"]
    rhos = sorted({rho for by_rho in results.values() for rho in by_rho}, key=float)
    lines = ["| method | " + " | ".join(f"ρ={rho}" for rho in rhos) + " |", "|" + "---|" * (len(rhos) + 1)]
    for method, by_rho in results.items():
        cells = []
        for rho in rhos:
            values = by_rho.get(rho)
            cells.append(
                " / ".join(f"{values[m]:.1f}" for m in metrics) + f" ({values['token_work']:.2f})"
                if values
                else "—"
            )
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    for name, values in report.get("baselines", {}).items():
        lines.append(
            f"| {name} | " + " | ".join(" / ".join(f"{values[m]:.1f}" for m in metrics) for _ in rhos) + " |"
        )
    return "\n".join(lines) + f"\n\nCells: {' / '.join(metrics)} (fraction of dense encoder token-work).\n"


def aggregate(values: list[dict[str, float]]) -> dict[str, float]:
    return {key: float(np.mean([value[key] for value in values])) for key in values[0]} if values else {}


# ---------------------------------------------------------------------- evaluation
def evaluate(
    model: RetentionModel,
    tokenizer: Any,
    recipe: Recipe,
    rows: list[DataRow],
    rhos: Sequence[float],
    methods: Sequence[str] = METHODS,
) -> dict[str, Any]:
    """EM / F1 (percent) per method and ρ, plus kept fraction and encoder token-work.

    Returns ``{"task", "num_examples", "metric", "results": {method: {"<rho>": {...}}}}``.
    """
    codec = codec_for(tokenizer, recipe.max_length)
    pad_id = pad_token_id(codec.tokenizer)
    encodings = [codec.encode(str(row["question"]), str(row["context"])) for row in rows]
    results: dict[str, dict[str, dict[str, float]]] = {}
    for method in methods:
        results[method] = {}
        for rho in rhos:
            per_question: list[dict[str, float]] = []
            if method == "truncation":
                cut = [truncated_qa(encoded, rho) for encoded in encodings]
                inputs = [encoded for encoded, _ in cut]
                flat = [row for encoded in inputs for row in encoded.rows]
                predictions = predict_rows(model, flat, 1.0, pad_id, None, recipe.evaluation.batch_size)
                fractions = [fraction for _, kept in cut for fraction in kept]
                for prediction, fraction in zip(predictions, fractions, strict=True):
                    prediction.kept_fraction = prediction.token_work = fraction
            else:
                inputs = encodings
                flat = [row for encoded in inputs for row in encoded.rows]
                selector = make_selector(method, EVAL_SEED)
                predictions = predict_rows(model, flat, rho, pad_id, selector, recipe.evaluation.batch_size)
            cursor = 0
            for row, encoded in zip(rows, inputs, strict=True):
                mine = predictions[cursor : cursor + len(encoded.rows)]
                cursor += len(encoded.rows)
                answer = codec.decode(encoded, [p.logits for p in mine])
                scores = squad_scores(str(answer["answer"]), gold_answers(row))
                per_question.append(
                    {
                        "exact_match": 100.0 * scores["exact_match"],
                        "f1": 100.0 * scores["f1"],
                        "kept_fraction": float(np.mean([p.kept_fraction for p in mine])),
                        "token_work": float(np.mean([p.token_work for p in mine])),
                    }
                )
            results[method][f"{rho:g}"] = aggregate(per_question)
    return {"task": "qa", "num_examples": len(rows), "metric": QUALITY_METRIC, "results": results}


def onnx_quality_curve(
    onnx_path: Path,
    tokenizer: Any,
    rows: list[DataRow],
    rhos: Sequence[float],
    max_length: int,
    batch_size: int,
) -> list[tuple[float, float]]:
    """F1 (0-1) of the exported graph itself at each ρ, through the serving codec: the manifest curve."""
    codec = QACodec(backend_tokenizer(tokenizer), max_length, DOC_STRIDE)
    pad_id = pad_token_id(codec.tokenizer)
    session = onnx_session(onnx_path)
    encodings = [codec.encode(str(row["question"]), str(row["context"])) for row in rows]
    flat = [window for encoded in encodings for window in encoded.rows]
    curve = []
    for rho in rhos:
        outputs = onnx_predict_rows(session, flat, rho, pad_id, batch_size)
        cursor, total = 0, 0.0
        for row, encoded in zip(rows, encodings, strict=True):
            answer = codec.decode(encoded, outputs[cursor : cursor + len(encoded.rows)])
            cursor += len(encoded.rows)
            total += squad_scores(str(answer["answer"]), gold_answers(row))["f1"]
        curve.append((float(rho), total / max(len(rows), 1)))
    return curve
