"""The QA LengthDrop pilot's stop rule (docs/experiments/2026-11-26-qa-lengthdrop.md, plan step 3).

``python -m experiments.qa_pilot_rule <pilot eval dir> --reference results/squad-minilm-calibrated/eval.json
--out <dir>/rule.json``

At each learned cell of the reference chain (its token-work and F1), the pilot's learned F1 at that
token-work: per question, linear in token-work between the pilot's two measured ρ around it (so the
interpolated F1 has a per-question SD too). The pilot passes where it beats the reference by more than
``MARGIN_SE`` unpaired standard errors, √(SE_pilot² + SE_reference²), SE = per-question SD / √n. The
reference's per-question scores are gone with its weights, so its SE is taken equal to the pilot's at
that point (F1's per-question SD is ~40 points for both).

Also reported: the learned scorers minus attention top-k on the same weights, paired, at every ρ the
evaluation measured both (the warm-up's rule).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import publish

MARGIN_SE = 2.0
METHOD = "learned"
ATTENTION = "attention"
DENSE = "1"


def learned_curve(eval_dir: Path) -> list[tuple[float, np.ndarray]]:
    """(token-work, per-question F1) of every pruned learned cell, by token-work."""
    report = json.loads((eval_dir / "eval.json").read_text(encoding="utf-8"))["results"][METHOD]
    scores = json.loads((eval_dir / "per_example.json").read_text(encoding="utf-8"))["scores"][METHOD]
    cells = [(report[rho]["token_work"], np.asarray(scores[rho], dtype=float)) for rho in report]
    return sorted(cells, key=lambda cell: cell[0])


def at_token_work(curve: list[tuple[float, np.ndarray]], work: float) -> np.ndarray:
    """Per-question F1 at ``work``, linear between the two measured cells around it."""
    for (low_work, low), (high_work, high) in itertools.pairwise(curve):
        if low_work <= work <= high_work:
            share = (work - low_work) / (high_work - low_work)
            return (1.0 - share) * low + share * high
    raise ValueError(f"token-work {work:.3f} is outside the pilot's measured range")


def versus_attention(eval_dir: Path) -> list[dict[str, Any]]:
    """Learned minus attention top-k on the same weights, per ρ both measured (the warm-up's rule: the
    learned scorers within 1 paired SE of attention's ranking, or above it)."""
    scores = json.loads((eval_dir / "per_example.json").read_text(encoding="utf-8"))["scores"]
    if ATTENTION not in scores:
        return []
    rows = []
    for rho in sorted(set(scores[METHOD]) & set(scores[ATTENTION]) - {DENSE}, key=float):
        difference = np.asarray(scores[METHOD][rho]) - np.asarray(scores[ATTENTION][rho])  # (N,)
        rows.append(
            {
                "rho": float(rho),
                "difference": round(float(difference.mean()), 2),
                "paired_standard_error": round(float(difference.std(ddof=1) / math.sqrt(len(difference))), 2),
            }
        )
    return rows


def verdict(pilot_dir: Path, reference: Path) -> dict[str, Any]:
    curve = learned_curve(pilot_dir)
    cells = json.loads(reference.read_text(encoding="utf-8"))["results"][METHOD]
    points = []
    for rho, cell in sorted(cells.items()):
        if rho == DENSE:
            continue
        scores = at_token_work(curve, cell["token_work"])
        standard_error = float(scores.std(ddof=1) / math.sqrt(len(scores)))
        combined = math.sqrt(2.0) * standard_error  # the reference's SE taken equal to the pilot's
        difference = float(scores.mean()) - cell["f1"]
        points.append(
            {
                "reference_rho": float(rho),
                "token_work": round(cell["token_work"], 4),
                "reference_f1": round(cell["f1"], 2),
                "pilot_f1": round(float(scores.mean()), 2),
                "difference": round(difference, 2),
                "unpaired_standard_error": round(combined, 2),
                "passes": difference > MARGIN_SE * combined,
            }
        )
    return {
        "pilot": str(pilot_dir),
        "reference": str(reference),
        "margin_se": MARGIN_SE,
        "points": points,
        "passes": all(point["passes"] for point in points),
        "learned_minus_attention": versus_attention(pilot_dir),
    }


def markdown(payload: dict[str, Any]) -> str:
    lines = [
        "| reference ρ | token-work | reference F1 | pilot F1 | difference ± unpaired SE | > 2 SE? |",
        "|---:|---:|---:|---:|---:|---|",
    ]
    for p in payload["points"]:
        difference = f"{p['difference']:+.2f} ± {p['unpaired_standard_error']:.2f}"
        lines.append(
            f"| {p['reference_rho']:g} | {p['token_work']:.2f} | {p['reference_f1']:.1f} "
            f"| {p['pilot_f1']:.1f} | {difference} | {'yes' if p['passes'] else 'no'} |"
        )
    verdict_line = "passes" if payload["passes"] else "does not pass"
    table = "# QA pilot's stop rule\n\n" + "\n".join(lines) + f"\n\nThe pilot {verdict_line} the rule.\n"
    versus = payload["learned_minus_attention"]
    if versus:
        table += "\nLearned minus attention top-k on the same weights (F1 ± paired SE):\n\n"
        table += "\n".join(
            f"- ρ {row['rho']:g}: {row['difference']:+.2f} ± {row['paired_standard_error']:.2f}"
            for row in versus
        )
        table += "\n"
    return table


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m experiments.qa_pilot_rule", description=__doc__)
    parser.add_argument(
        "pilot_eval", type=Path, help="the pilot's evaluation dir (eval.json, per_example.json)"
    )
    parser.add_argument("--reference", type=Path, default=Path("results/squad-minilm-calibrated/eval.json"))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    publish(verdict(args.pilot_eval, args.reference), markdown, args.out, "experiments.qa_pilot_rule", argv)


if __name__ == "__main__":
    main()
