"""Two selection schedules of one embedding run, compared where a user feels them: quality at equal
token-work (two ``benchmarks.retrieval`` files) and speed at equal quality (two ``benchmarks.frontier``
files, each against the fastest dense graph of its own timing run, so runs made minutes apart compare).

    python -m experiments.schedule_compare quality <A retrieval.json> <B retrieval.json> \
        [--int8 <A int8 retrieval.json> <B int8 retrieval.json>]
    python -m experiments.schedule_compare clock <A frontier.json> <B frontier.json>

``quality``: B's learned nDCG@10 at each ρ minus A's learned curve linearly interpolated at B's
token-work (A's curve is concave in work, so interpolation slightly overstates B's gain); with ``--int8``
each schedule's int8 cost (int8 − fp32 at the same ρ). ``clock``: at each of B's learned points (fp32
and int8), B's speed-up over its dense reference divided by A's interpolated at B's nDCG@10 (above 1:
B reaches that quality faster). Prints a markdown table; nothing is written.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from benchmarks.frontier import interpolated_speed
from experiments.kept_token_floor import at_equal_work

LEARNED = "learned"
FAMILIES = {"fp32": "learned", "int8": "int8-learned"}  # benchmarks.frontier's family names


def _load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def learned_curve(retrieval: dict[str, Any]) -> dict[float, tuple[float, float]]:
    """ρ → (document token-work, nDCG@10) of the learned method, ρ = 1 (dense) included."""
    curve = {
        float(rho): (cell["document_token_work"], cell["ndcg@10"])
        for rho, cell in retrieval["results"][LEARNED].items()
    }
    curve.setdefault(1.0, (1.0, retrieval["results"]["dense"]["1"]["ndcg@10"]))
    return curve


def quality_rows(a: dict[str, Any], b: dict[str, Any]) -> list[tuple[float, float, float, float | None]]:
    """Per ρ < 1 of B: (ρ, B's work, B's nDCG, B − A at B's work)."""
    curve_a, curve_b = list(learned_curve(a).values()), learned_curve(b)  # (work, nDCG) points
    rows = []
    for rho, (work, score) in sorted(curve_b.items(), reverse=True):
        if rho < 1:
            at = at_equal_work(curve_a, work)
            rows.append((rho, work, score, None if at is None else score - at))
    return rows


def int8_costs(fp32: dict[str, Any], int8: dict[str, Any]) -> dict[float, float]:
    """ρ → int8 nDCG@10 − fp32 nDCG@10 of the learned method."""
    a, b = learned_curve(fp32), learned_curve(int8)
    return {rho: b[rho][1] - a[rho][1] for rho in sorted(set(a) & set(b), reverse=True)}


def measured(point: dict[str, Any]) -> bool:
    """A frontier point with a quality (a ρ the retrieval files did not measure has none)."""
    return point["quality"]["ndcg_at_10"] is not None


def clock_rows(a: dict[str, Any], b: dict[str, Any]) -> list[tuple[str, float, float, float, float | None]]:
    """Per learned point of B: (precision, ρ, nDCG, B's speed-up, B's ÷ A's speed-up at that nDCG)."""
    rows = []
    for precision, family in FAMILIES.items():
        curve_a = [  # (nDCG, speed-up) points
            (r["quality"]["ndcg_at_10"], r["speedup_vs_reference"])
            for r in a["results"]
            if r["family"] == family and measured(r)
        ]
        for r in (r for r in b["results"] if r["family"] == family and r["rho"] < 1 and measured(r)):
            at = interpolated_speed(curve_a, r["quality"]["ndcg_at_10"])
            speed = r["speedup_vs_reference"]
            rows.append(
                (precision, r["rho"], r["quality"]["ndcg_at_10"], speed, None if at is None else speed / at)
            )
    return rows


def _cost(value: float | None) -> str:
    return "–" if value is None else f"{value:+.2f}"  # "–": int8 not measured at that ρ


def _num(value: float | None, fmt: str) -> str:
    return "outside A's range" if value is None else format(value, fmt)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.schedule_compare", description=__doc__.splitlines()[0]
    )
    sub = parser.add_subparsers(dest="kind", required=True)
    quality = sub.add_parser("quality")
    quality.add_argument("a", type=Path)
    quality.add_argument("b", type=Path)
    quality.add_argument("--int8", type=Path, nargs=2, metavar=("A_INT8", "B_INT8"))
    clock = sub.add_parser("clock")
    clock.add_argument("a", type=Path)
    clock.add_argument("b", type=Path)
    args = parser.parse_args(argv)
    a, b = _load(args.a), _load(args.b)
    if args.kind == "quality":
        costs = (
            (int8_costs(a, _load(args.int8[0])), int8_costs(b, _load(args.int8[1]))) if args.int8 else None
        )
        print("| ρ | B token-work | B nDCG@10 | B − A at B's work | int8 cost A / B |")
        print("|---|---|---|---|---|")
        for rho, work, score, diff in quality_rows(a, b):
            cost = "–" if costs is None else " / ".join(_cost(side.get(rho)) for side in costs)
            print(f"| {rho:g} | {work:.3f} | {score:.2f} | {_num(diff, '+.2f')} | {cost} |")
    else:
        print("| precision | ρ | B nDCG@10 | B speed-up | B ÷ A at equal nDCG |")
        print("|---|---|---|---|---|")
        for precision, rho, score, speed, ratio in clock_rows(a, b):
            print(f"| {precision} | {rho:g} | {score:.2f} | {speed:.2f}× | {_num(ratio, '.2f')}× |")


if __name__ == "__main__":
    main()
