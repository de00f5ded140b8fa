"""Reports of an evaluation: the markdown tables, each cell's paired difference to the dense reference,
and the files a report is written to (``eval.json``, ``eval.md``, ``per_example.json``). Torch-free: the
results page (``benchmarks.report``) and the studies read it."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from training.evaluation.methods import LEARNED

Report = dict[str, Any]  # an eval.json payload without its "meta" (``training.tasks.registry.Report``)

# A codec-loop cell's per-example scores ({metric: [value per example]}) while in memory; written
# beside eval.json (PER_EXAMPLE_FILE, the report's metric only), so that any two cells over the same
# examples — of this run or another run's — can be compared pairwise.
PER_EXAMPLE = "per_example"
PER_EXAMPLE_FILE = "per_example.json"
PAIRED = "paired_vs_dense"  # a cell's paired difference to the dense reference, in eval.json
DENSE_RHO = "1"


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
