"""benchmarks/overload.py --quick: locust (open loop) against real ``python -m service`` processes over the
tiny models, two policies. A smoke run of the benchmark's machinery; it asserts no speed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import overload

pytestmark = pytest.mark.integration  # locust against subprocess servers


def test_quick_overload_benchmark(models_root: Path, tmp_path: Path) -> None:
    out = tmp_path / "overload.json"
    argv = ["--models-dir", str(models_root), "--out", str(out), "--quick", "--policies", "auto", "tei_cap"]
    overload.main(argv)
    saved = json.loads(out.read_text())  # what the committed results are: the file, not the return value
    assert saved["command"].startswith("python -m benchmarks.overload ") and saved["machine"]["cores"] >= 1
    assert saved["capacity_rho1_rps"] > 0
    cells = saved["results"]
    assert {(c["policy"], c["multiple"]) for c in cells} == {
        (p, m) for p in ("auto", "tei_cap") for m in (0.5, 2.0)
    }
    for cell in cells:
        assert cell["sent"] > 0 and cell["ok"] > 0, cell
        assert cell["server_errors"] == 0 and cell["other"] == 0, cell  # only 200s and 429s
        assert cell["ok"] + cell["shed"] == cell["sent"]
        assert cell["p50_ms"] <= cell["p99_ms"] and cell["rss_peak_mib"] >= cell["rss_start_mib"] > 0
        assert cell["idle_after_p50_ms"] is not None
        assert cell["batcher_p50_ms"] <= cell["batcher_p99_ms"]
    auto = [c for c in cells if c["policy"] == "auto"]
    assert all(set(c["reasons"]) <= {"auto:idle", "auto:backlog", "auto:floor"} for c in auto)
    assert all(c["mean_rho"] == 1.0 for c in cells if c["policy"] == "tei_cap")
    table = out.with_suffix(".md").read_text()
    assert "| auto | 2 |" in table and "| tei_cap | 0.5 |" in table
    assert out.with_suffix(".png").stat().st_size > 0


def test_rounds_are_summarised_per_policy_and_rate() -> None:
    def cell(policy: str, multiple: float, round_index: int, goodput: float, p99: float | None) -> dict:
        fields = overload.Cell(policy, multiple, 10.0 * multiple, 10.0, round_index, goodput_rps=goodput)
        fields.p99_ms = p99
        return overload.asdict(fields)

    results = [
        cell("auto", 10.0, 0, 100.0, 400.0),
        cell("rho_min", 10.0, 0, 120.0, 2000.0),
        cell("auto", 10.0, 1, 110.0, 600.0),
        cell("rho_min", 10.0, 1, 116.0, None),  # a cell without any 200 has no p99
    ]
    auto, rho_min = overload.across_rounds(results)
    assert (auto["policy"], auto["rounds"], auto["goodput_mean"]) == ("auto", 2, 105.0)
    assert auto["goodput_sd"] == pytest.approx(7.0710678) and auto["goodput_range"] == (100.0, 110.0)
    assert auto["p99_mean_ms"] == 500.0 and auto["p99_range_ms"] == (400.0, 600.0)
    assert rho_min["goodput_mean"] == 118.0 and rho_min["p99_mean_ms"] == 2000.0
    table = "\n".join(overload.rounds_table(results))
    assert "| auto | 10 | 2 | 105.0 ± 7.1 [100.0, 110.0] | 500 [400, 600] | 0 |" in table
