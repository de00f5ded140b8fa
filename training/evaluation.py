"""Evaluation every task shares: quality vs ρ for the learned retention and its baselines.

A task plugs into this module with a ``TaskEvaluation`` (its methods, its report, its manifest quality
curve); tasks whose inputs are codec rows (QA, summarization, a new task) also reuse the loop below:
encode every example with the *serving* codec (``evaluation_codec``: the task's registered codec with
the service's default limits, so long inputs are scored on the rows the service would run), run
``forward_pruned`` (torch) or the exported graph (onnxruntime) over the rows, decode with the codec
and score each example.

Methods of the codec loop: ``learned`` (the trained scorers), ``random`` / ``attention`` (the same
per-layer keep counts, other token choices) and ``truncation`` (the task cuts each row to its first
round(ρ · n) content tokens and the dense model runs on what is left).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from retention_core.codecs.base import Encoded, Row, TaskCodec, pad_rows
from retention_core.contract import Manifest
from retention_core.onnx import open_session
from retention_core.schedule import keep_exponents
from retention_core.tasks import CodecOptions, TaskSpec, task_spec
from retention_core.text import backend_tokenizer
from training import selection as S
from training.data import EVAL_SEED, Example
from training.model import (
    RetentionModel,
    Selector,
    attention_selector,
    layer_exit,
    leading_selector,
    random_selector,
)
from training.recipes import EvalSpec, Recipe

LEARNED = "learned"
TRUNCATION = "truncation"
LAYER_EXIT = "layer_exit"
CODEC_METHODS = (LEARNED, "random", "attention", TRUNCATION)
# Accepted by --methods, not run by default: the dense model stopped after the layer count whose
# token-work is nearest the learned schedule's at each ρ, its head reading those states.
CODEC_EXTRA_METHODS = (LAYER_EXIT,)
# Training learns from every window of a long document; serving (and so evaluation) caps the windows.
EVERY_WINDOW = CodecOptions(max_windows=sys.maxsize)
SERVING = CodecOptions()

Report = dict[str, Any]  # an eval.json payload without its "meta"
Curve = list[tuple[float, float]]  # (ρ, quality in 0-1)
# A codec-loop cell's per-example scores ({metric: [value per example]}) while in memory; written
# beside eval.json (PER_EXAMPLE_FILE, the report's metric only), so that any two cells over the same
# examples — of this run or another run's — can be compared pairwise.
PER_EXAMPLE = "per_example"
PER_EXAMPLE_FILE = "per_example.json"
PAIRED = "paired_vs_dense"  # a cell's paired difference to the dense reference, in eval.json
DENSE_RHO = "1"


# ---------------------------------------------------------------------- what a task registers
@dataclass(frozen=True)
class EvaluationRun:
    """What a task's report measures: a trained model, the tokenizer and recipe it was trained with, and
    the examples to score (``python -m training evaluate`` builds it once; every task's report takes it)."""

    model: RetentionModel
    tokenizer: Any
    recipe: Recipe
    examples: list[Example]


@dataclass(frozen=True)
class TaskEvaluation:
    """How ``python -m training evaluate`` and the manifest's quality curve measure one task."""

    methods: tuple[str, ...]  # every method ``--methods`` accepts, ``learned`` first
    default_methods: tuple[str, ...]
    # (run, ρs, methods) → report (``{"results": …}`` at least)
    report: Callable[[EvaluationRun, Sequence[float], Sequence[str]], Report]
    merge: Callable[[Report, Report], Report]  # (earlier eval.json, new report) → both, new wins
    table: Callable[[Report], str]  # markdown of a report (rows: methods, columns: ρ)
    metrics: tuple[str, ...]  # the report's per-cell metrics, in table order
    quality_metric: Callable[[str], str]  # dataset name → metric of the manifest curve
    # (onnx path, tokenizer, examples, recipe) → the exported graph's quality at recipe.evaluation.rhos
    quality_curve: Callable[[Path, Any, list[Example], Recipe], Curve]
    # The one of ``metrics`` a results page plots against ρ (benchmarks.report), whatever the dataset.
    headline: str

    def __post_init__(self) -> None:
        if self.headline not in self.metrics:
            raise ValueError(f"headline {self.headline!r} is not one of the metrics {list(self.metrics)}")

    def check_methods(self, methods: Sequence[str]) -> None:
        """A misspelt method must not run as another one and be recorded under the typo."""
        unknown = [method for method in methods if method not in self.methods]
        if unknown:
            raise ValueError(f"unknown evaluation method(s) {unknown}; known: {list(self.methods)}")


def codec_task_evaluation(
    report: Callable[[EvaluationRun, Sequence[float], Sequence[str]], Report],
    metrics: tuple[str, ...],
    quality_metric: Callable[[str], str],
    quality_curve: Callable[[Path, Any, list[Example], Recipe], Curve],
    headline: str | None = None,
) -> TaskEvaluation:
    """The evaluation of a task measured by the codec loop below: its methods, merging and table;
    ``headline`` (default: the first of ``metrics``) is what a results page plots."""
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


# ---------------------------------------------------------------------- codecs
def codec_manifest(max_length: int, labels: Sequence[str] = ()) -> Manifest:
    """The manifest fields a codec reads (max_length, labels); the rest describe an exported graph."""
    return Manifest.model_construct(max_length=max_length, labels=list(labels))


# (task spec, id(tokenizer), max_length, labels, options) → (tokenizer, codec); the tokenizer is kept
# alive beside its id so the id is never reused by another tokenizer while the entry exists, and a task
# registered again (tests) gets a codec of its new spec.
_CODECS: dict[tuple[TaskSpec, int, int, tuple[str, ...], CodecOptions], tuple[Any, TaskCodec]] = {}


def task_codec(
    task: str, tokenizer: Any, max_length: int, labels: Sequence[str] = (), options: CodecOptions = SERVING
) -> Any:
    """The task's registered codec, one per (tokenizer, max_length, labels, options). ``SERVING`` is what
    a served model of this task applies (evaluation); ``EVERY_WINDOW`` keeps every window (training)."""
    spec = task_spec(task)
    key = (spec, id(tokenizer), max_length, tuple(labels), options)
    if key not in _CODECS:
        manifest = codec_manifest(max_length, labels)
        _CODECS[key] = (tokenizer, spec.make_codec(manifest, backend_tokenizer(tokenizer), options))
    return _CODECS[key][1]


def evaluation_codec(task: str, tokenizer: Any, max_length: int, labels: Sequence[str] = ()) -> Any:
    """The codec with the service's defaults: evaluation rows are the rows the service would run."""
    return task_codec(task, tokenizer, max_length, labels, SERVING)


def rows_to_tensors(rows: list[Row], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded int64 feeds keyed by graph input name (no ρ), as torch tensors (B, T)."""
    return {name: torch.from_numpy(array) for name, array in pad_rows(rows, pad_id).items()}


# ---------------------------------------------------------------------- torch predictions
@dataclass
class RowPrediction:
    logits: np.ndarray  # token heads (T_i, C) unpadded; sequence heads (C,)
    kept_fraction: float  # tokens reaching the last layer / real tokens
    token_work: float  # encoder token-work / dense token-work


def make_selector(method: str, seed: int = EVAL_SEED) -> Selector | None:
    """The token choice of a selection method: None = the trained scorers."""
    if method == LEARNED:
        return None
    if method == "random":
        return random_selector(torch.Generator().manual_seed(seed))
    if method == "attention":
        return attention_selector()
    if method == "leading":
        return leading_selector()
    raise ValueError(f"unknown selection method {method!r}; known: {CODEC_METHODS}")


def length_sorted_chunks(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Indices in batches of similar length (less padding), shortest first."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    return [order[begin : begin + batch_size] for begin in range(0, len(order), batch_size)]


def unpad(first: np.ndarray, index: int, length: int) -> np.ndarray:
    """Row ``index`` of a graph's first output: token outputs (B, T, k) lose their padding, (B, C) not."""
    return first[index, :length] if first.ndim == 3 else first[index]


# A batch's forward: padded feeds (B, T) → head outputs, kept fraction (B,), token-work fraction (B,).
BatchForward = Callable[[dict[str, torch.Tensor]], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


@torch.no_grad()
def batched_predictions(
    model: RetentionModel, rows: list[Row], pad_id: int, batch_size: int, forward: BatchForward
) -> list[RowPrediction]:
    """``forward`` over codec rows in padded batches of similar length; unpadded outputs in row order."""
    model.eval()
    device = next(model.parameters()).device
    predictions: list[RowPrediction | None] = [None] * len(rows)
    for members in length_sorted_chunks([len(row) for row in rows], batch_size):
        chunk = [rows[i] for i in members]
        feeds = {name: tensor.to(device) for name, tensor in rows_to_tensors(chunk, pad_id).items()}
        logits, kept, work = (value.cpu() for value in forward(feeds))
        outputs = logits.numpy()
        for i, (member, row) in enumerate(zip(members, chunk, strict=True)):
            predictions[member] = RowPrediction(unpad(outputs, i, len(row)), float(kept[i]), float(work[i]))
    return [prediction for prediction in predictions if prediction is not None]


def predict_rows(
    model: RetentionModel,
    rows: list[Row],
    rho: float,
    pad_id: int,
    selector: Selector | None = None,
    batch_size: int = 16,
) -> list[RowPrediction]:
    """Run ``forward_pruned`` over codec rows in padded batches; unpadded outputs in row order."""

    def forward(feeds: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        batch = len(feeds["input_ids"])
        out = model.forward_pruned(
            feeds["input_ids"],
            feeds["attention_mask"],
            torch.full((batch,), float(rho), device=feeds["input_ids"].device),
            protected=feeds["protected_mask"].bool() if "protected_mask" in feeds else None,
            token_type_ids=feeds.get("token_type_ids"),
            selector=selector,
        )
        num_real = feeds["attention_mask"].sum(1)  # (B,)
        work = S.encoder_token_work(out.kept_counts, num_real, model.last_layer_queries)  # (B,)
        kept = out.kept_counts[:, -1].to(torch.float32) / num_real.to(torch.float32)  # (B,)
        return out.logits, kept, work

    return batched_predictions(model, rows, pad_id, batch_size, forward)


def exit_layers(model: RetentionModel, rho: float) -> int:
    """The layer count whose token-work (k / L) is nearest the learned schedule's at ``rho`` (its mean
    keep fraction over the pruning points, the pruning interval's groups included, floors aside), at
    least one layer."""
    config = model.config
    exponents = keep_exponents(model.num_points, config.schedule_power, config.pruning_interval)  # (P,)
    fractions = np.float32(rho) ** exponents  # (P,) float32, the graph's arithmetic
    return max(1, round(float(fractions.mean()) * model.num_points))


def layer_exit_rows(
    model: RetentionModel, rows: list[Row], num_layers: int, pad_id: int, batch_size: int = 16
) -> list[RowPrediction]:
    """``layer_exit`` over codec rows in padded batches; every token kept, token-work k / L."""

    def forward(feeds: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        ids = feeds["input_ids"]
        out = layer_exit(model, ids, feeds["attention_mask"], num_layers, feeds.get("token_type_ids"))
        every_token_kept = torch.ones(len(ids))  # (B,)
        return out, every_token_kept, every_token_kept * (num_layers / model.num_points)

    return batched_predictions(model, rows, pad_id, batch_size, forward)


# ---------------------------------------------------------------------- onnxruntime predictions
def onnx_predict_rows(
    session: Any, rows: list[Row], rho: float, pad_id: int, batch_size: int
) -> list[np.ndarray]:
    """What the service does: pad codec rows, add ρ, run the graph, unpad the first output."""
    names = {graph_input.name for graph_input in session.get_inputs()}
    outputs: list[np.ndarray] = [np.empty(0)] * len(rows)
    for members in length_sorted_chunks([len(row) for row in rows], batch_size):
        chunk = [rows[i] for i in members]
        feeds: dict[str, np.ndarray] = dict(pad_rows(chunk, pad_id))
        feeds["rho"] = np.full(len(chunk), rho, dtype=np.float32)
        first = session.run(None, {name: value for name, value in feeds.items() if name in names})[0]
        for i, (member, row) in enumerate(zip(members, chunk, strict=True)):
            outputs[member] = unpad(first, i, len(row))
    return outputs


# ---------------------------------------------------------------------- the codec loop
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


def _method_predictions(
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
            inputs, predictions = _method_predictions(model, loop, encodings, method, rho, batch_size)
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


# ---------------------------------------------------------------------- reports
def markdown_table(report: Report, metrics: Sequence[str]) -> str:
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


def paired_difference(
    values: Sequence[float] | np.ndarray, reference: Sequence[float] | np.ndarray
) -> dict[str, float | int]:
    """Mean of values − reference over the same examples and its standard error (the spread of the
    per-example differences, not of two independent means)."""
    if len(values) != len(reference):
        raise ValueError(f"paired scores need the same examples: {len(values)} vs {len(reference)}")
    diff = np.asarray(values, dtype=np.float64) - np.asarray(reference, dtype=np.float64)  # (N,)
    n = len(diff)
    error = float(diff.std(ddof=1) / np.sqrt(n)) if n > 1 else float("nan")
    return {"examples": n, "difference": float(diff.mean()) if n else float("nan"), "standard_error": error}


def split_per_example(report: Report) -> dict[str, dict[str, list[float]]]:
    """Takes the per-example scores out of a codec-loop report's cells: ``{method: {ρ: [the report's
    metric per example]}}`` (empty for reports without them, e.g. classification's)."""
    results, metric = report.get("results"), report.get("metric")
    if not isinstance(results, dict):
        return {}
    scores: dict[str, dict[str, list[float]]] = {}
    for method, by_rho in results.items():
        for rho, cell in by_rho.items():
            per_example = cell.pop(PER_EXAMPLE, None)
            if per_example and metric in per_example:
                scores.setdefault(method, {})[rho] = per_example[metric]
    return scores


def attach_per_example(report: Report, scores: dict[str, dict[str, list[float]]]) -> Report:
    """The inverse of ``split_per_example`` (an earlier run read back for ``--merge``)."""
    for method, by_rho in scores.items():
        for rho, values in by_rho.items():
            cell = report["results"].get(method, {}).get(rho)
            if cell is not None:
                cell[PER_EXAMPLE] = {report["metric"]: values}
    return report


def read_per_example(out_dir: Path) -> dict[str, Any] | None:
    path = out_dir / PER_EXAMPLE_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def dense_reference(out_dir: Path) -> list[float] | None:
    """Another evaluation's dense scores per example (learned at ρ = 1), e.g. the teacher a stage was
    distilled from."""
    saved = read_per_example(out_dir)
    return None if saved is None else saved["scores"].get(LEARNED, {}).get(DENSE_RHO)


def add_paired(
    report: Report, scores: dict[str, dict[str, list[float]]], reference: list[float] | None
) -> None:
    """Each cell's paired difference to ``reference`` (default: this report's own dense cell)."""
    reference = reference if reference is not None else scores.get(LEARNED, {}).get(DENSE_RHO)
    if reference is None:
        return
    for method, by_rho in scores.items():
        for rho, values in by_rho.items():
            report["results"][method][rho][PAIRED] = paired_difference(values, reference)


def paired_table(report: Report) -> str:
    """Markdown: each cell's difference to the dense reference ± its paired standard error."""
    results = report.get("results")
    if not isinstance(results, dict) or not any(PAIRED in c for by in results.values() for c in by.values()):
        return ""
    rhos = sorted({rho for by_rho in results.values() for rho in by_rho}, key=float)
    lines = ["| method | " + " | ".join(f"ρ={rho}" for rho in rhos) + " |", "|" + "---|" * (len(rhos) + 1)]
    for method, by_rho in results.items():
        cells = []
        for rho in rhos:
            paired = by_rho.get(rho, {}).get(PAIRED)
            cells.append(f"{paired['difference']:+.2f} ± {paired['standard_error']:.2f}" if paired else "—")
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    n = next(c[PAIRED]["examples"] for by in results.values() for c in by.values() if PAIRED in c)
    return (
        f"\n{report['metric']} minus the dense reference on the same {n} examples"
        " ± paired standard error:\n\n" + "\n".join(lines) + "\n"
    )


def merge_method_results(previous: Report, report: Report) -> Report:
    """An earlier report's ``results`` plus the new ones; a new (method, ρ) replaces the old."""
    merged: dict[str, dict[str, Any]] = previous["results"]
    for method, by_rho in report["results"].items():
        merged.setdefault(method, {}).update(by_rho)
    return {**report, "results": merged}


def write_report(
    report: Report,
    out_dir: Path,
    meta: dict[str, object],
    table: str,
    dense_scores: list[float] | None = None,
) -> None:
    """``eval.json`` (the report, each cell's paired difference to the dense reference, and the run's
    metadata), ``eval.md`` (a title and the tables) and, for codec-loop reports, ``per_example.json``.

    ``dense_scores``: the reference per example (another run's, e.g. the teacher); default the
    report's own learned ρ = 1."""
    out_dir.mkdir(parents=True, exist_ok=True)
    scores = split_per_example(report)
    add_paired(report, scores, dense_scores)
    if scores:
        saved = {"metric": report["metric"], "num_examples": report.get("num_examples"), "scores": scores}
        (out_dir / PER_EXAMPLE_FILE).write_text(json.dumps(saved) + "\n", encoding="utf-8")
    payload = {**report, "meta": meta}
    (out_dir / "eval.json").write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    title = f"# {meta.get('model')} — {meta.get('split')} ({meta.get('num_examples')} examples)\n\n"
    (out_dir / "eval.md").write_text(title + table + paired_table(report), encoding="utf-8")
