"""experiments/schedule_compare.py: two schedules compared at equal token-work and at equal quality,
on hand-made retrieval and frontier payloads whose answers are known."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from experiments import schedule_compare as sc


def retrieval(dense: float, learned: dict[str, tuple[float, float]]) -> dict[str, Any]:
    """A benchmarks.retrieval payload: ρ → (token-work, nDCG@10) for learned."""
    cells = {rho: {"document_token_work": work, "ndcg@10": ndcg} for rho, (work, ndcg) in learned.items()}
    return {"results": {"dense": {"1": {"ndcg@10": dense}}, "learned": cells}}


def frontier(points: list[tuple[str, float, float, float]]) -> dict[str, Any]:
    """A benchmarks.frontier payload: (family, ρ, nDCG@10, speed-up) per point."""
    return {
        "results": [
            {"family": family, "rho": rho, "quality": {"ndcg_at_10": ndcg}, "speedup_vs_reference": speed}
            for family, rho, ndcg, speed in points
        ]
    }


def test_quality_rows_compare_b_with_a_at_b_work() -> None:
    a = retrieval(80.0, {"0.5": (0.6, 76.0)})  # A's curve: (0.6, 76) → (1.0, 80)
    b = retrieval(80.0, {"0.5": (0.5, 75.0), "0.7": (0.8, 79.0)})
    rows = sc.quality_rows(a, b)
    assert [row[0] for row in rows] == [0.7, 0.5]
    assert rows[0][3] == pytest.approx(79.0 - 78.0)  # A at 0.8 of the work: 78
    assert rows[1][3] is None  # 0.5 of the work lies below A's measured range


def test_int8_cost_per_rho() -> None:
    fp32 = retrieval(80.0, {"0.5": (0.6, 76.0)})
    int8 = retrieval(79.5, {"0.5": (0.6, 75.0)})
    assert sc.int8_costs(fp32, int8) == pytest.approx({1.0: -0.5, 0.5: -1.0})


def test_clock_rows_divide_speed_ups_at_equal_quality() -> None:
    a = frontier([("learned", 1.0, 80.0, 1.0), ("learned", 0.5, 76.0, 1.4), ("int8-learned", 0.5, 75.0, 2.0)])
    b = frontier(
        [("learned", 0.5, 78.0, 1.5), ("truncation", 0.5, 70.0, 9.0), ("int8-learned", 0.5, 70.0, 3.0)]
    )
    unmeasured = {
        "family": "learned",
        "rho": 0.4,
        "quality": {"ndcg_at_10": None},
        "speedup_vs_reference": 9.0,
    }
    a["results"].append(unmeasured)
    b["results"].append(unmeasured)
    rows = sc.clock_rows(a, b)  # a ρ without quality is a point of neither curve
    assert len(rows) == 2
    assert rows[0][:4] == ("fp32", 0.5, 78.0, 1.5)
    assert rows[0][4] == pytest.approx(1.5 / 1.2)  # A reaches 78 at 1.2×
    assert rows[1][0] == "int8" and rows[1][4] is None  # one int8 point of A: no curve to read


def test_cli_prints_both_tables(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    paths = {}
    for name, payload in {
        "a.json": retrieval(80.0, {"0.5": (0.6, 76.0)}),
        "b.json": retrieval(80.0, {"0.5": (0.7, 77.0)}),
        "fa.json": frontier([("learned", 1.0, 80.0, 1.0), ("learned", 0.5, 76.0, 1.4)]),
        "fb.json": frontier([("learned", 0.5, 77.0, 1.5)]),
    }.items():
        paths[name] = tmp_path / name
        paths[name].write_text(json.dumps(payload))
    sc.main(
        [
            "quality",
            str(paths["a.json"]),
            str(paths["b.json"]),
            "--int8",
            str(paths["a.json"]),
            str(paths["b.json"]),
        ]
    )
    sc.main(["clock", str(paths["fa.json"]), str(paths["fb.json"])])
    out = capsys.readouterr().out
    assert "| 0.5 | 0.700 | 77.00 | +0.00 | +0.00 / +0.00 |" in out  # A at 0.7 of the work: 77
    assert "| fp32 | 0.5 | 77.00 | 1.50× | 1.15× |" in out  # A reaches 77 at 1.3×
