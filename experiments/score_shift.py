"""Does a score shift meet the budget? Expected kept share of the quantile and calibrated shifts.

``python -m experiments.score_shift --out results/experiments/score-shift/score_shift.json``

Draws Gaussian scores at several spreads (logits) and, for per-layer keep rates, shifts them with
``retention.quantile_shift`` (the rate-quantile token at P(z > 0) = rate) and with
``retention.calibrated_shift`` (expected kept count = budget), then reports the expected kept
share Σ P(z > 0) / n. ρ = 0.3 over six pruning points asks 0.3^(1/6) ≈ 0.82 at every point, so the
table also shows that share compounded over six points, against ρ = 0.3.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benchmarks.harness import publish

SPREADS = (0.5, 1.0, 2.0, 4.0, 8.0)
NUM_POINTS = 6  # MiniLM-L6: one pruning point per layer
SERVING_RHO = 0.3
SCHEDULE_RATE = SERVING_RHO ** (1 / NUM_POINTS)  # ≈ 0.818: the geometric schedule's per-layer rate
RATES = (0.3, 0.5, SCHEDULE_RATE)
DEFAULT_TOKENS = 100_000
SEED = 0
DECIMALS = 4


def score_shift(num_tokens: int = DEFAULT_TOKENS) -> dict[str, object]:
    """{"cells": [{"rate", "spread", "quantile", "calibrated"}], ...}: expected kept shares."""
    import torch

    from benchmarks.harness import describe
    from training.engine import terms as R

    generator = torch.Generator().manual_seed(SEED)
    cells = []
    for rate in RATES:
        rates = torch.tensor([rate])  # (B=1,)
        logit_rate = torch.logit(rates).unsqueeze(-1)  # (1, 1)
        for spread in SPREADS:
            scores = torch.randn(1, num_tokens, generator=generator) * spread  # (1, T)
            weights = torch.ones_like(scores)  # every token a candidate, fully alive
            shares = {}
            for name, shift in (("quantile", R.quantile_shift), ("calibrated", R.calibrated_shift)):
                kept = torch.sigmoid(scores - shift(scores, weights, rates) + logit_rate)  # (1, T)
                shares[name] = round(kept.mean().item(), DECIMALS)
            cells.append({"rate": rate, "spread": spread, **shares})
    return {
        "num_tokens": num_tokens,
        "seed": SEED,
        "num_points": NUM_POINTS,
        "cells": cells,
        "machine": describe(),
    }


def markdown(payload: dict[str, object]) -> str:
    num_points = payload["num_points"]
    lines = [
        "| per-layer rate | score spread | quantile shift | calibrated shift | quantile, compounded |",
        "|---|---|---|---|---|",
    ]
    for cell in payload["cells"]:  # type: ignore[attr-defined]
        schedule = cell["rate"] == SCHEDULE_RATE
        compounded = f"{cell['quantile'] ** num_points:.3f} vs {SERVING_RHO}" if schedule else "—"
        lines.append(
            f"| {cell['rate']:.3f} | {cell['spread']} | {cell['quantile']:.3f} "
            f"| {cell['calibrated']:.3f} | {compounded} |"
        )
    lines += [
        "",
        "Cells: expected kept share Σ P(z > 0) / n; compounded (the schedule's rate only) = "
        f"share^{num_points} vs ρ.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m experiments.score_shift", description=__doc__)
    parser.add_argument("--tokens", type=int, default=DEFAULT_TOKENS)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    publish(score_shift(args.tokens), markdown, args.out, "experiments.score_shift", argv)


if __name__ == "__main__":
    main()
