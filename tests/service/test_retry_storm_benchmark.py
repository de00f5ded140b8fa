"""benchmarks/retry_storm.py --quick: closed-loop locust clients that retry a refusal after 50 ms against a
real ``python -m service`` holding every tiny model. A run of the benchmark's machinery; it asserts no
speed, only what every run must hold: each attempt answered or refused, a refused one sent again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import retry_storm

pytestmark = pytest.mark.integration  # locust against a subprocess server


def test_quick_retry_storm(models_root: Path, tmp_path: Path) -> None:
    out = tmp_path / "storm.json"
    retry_storm.main(["--models-dir", str(models_root), "--out", str(out), "--quick", "--modes", "auto", "1"])
    saved = json.loads(out.read_text())
    assert saved["command"].startswith("python -m benchmarks.retry_storm ") and saved["machine"]["cpu_class"]
    assert len(saved["models_loaded"]) > 1  # the server holds the other models too
    assert [mode["rho"] for mode in saved["results"]] == ["auto", "1"]
    for mode in saved["results"]:
        assert mode["ok"] > 0 and mode["server_errors"] == 0 and mode["connection_errors"] == 0, mode
        assert mode["ok"] + mode["refused"] == mode["sent"]
        assert mode["p50_ms"] <= mode["p99_ms"]
    assert saved["results"][1]["mean_rho"] == 1.0
    assert "| 0 | auto |" in out.with_suffix(".md").read_text()


def test_a_refused_client_retries_its_text_after_the_delay(tmp_path: Path) -> None:
    """The locustfile's closed loop with a retry delay: summarised per mode from its records."""
    records = [
        {"at_s": 0.0, "latency_s": 0.1, "status": 429},
        {"at_s": 0.15, "latency_s": 0.2, "status": 200, "rho": 0.5},
        {"at_s": 0.2, "latency_s": 0.1, "status": 200, "rho": 1.0},
        {"at_s": 1.9, "latency_s": 0.5, "status": 200, "rho": 1.0},  # answered after the window
        {"at_s": 0.3, "latency_s": 0.1, "status": 503},
    ]
    mode = retry_storm.summarize(retry_storm.Mode("auto", 0, 2.0), records)
    assert (mode.sent, mode.ok, mode.refused, mode.server_errors) == (5, 3, 1, 1)
    assert mode.ok_per_s == 1.0 and mode.refused_per_s == 0.5
    assert mode.mean_rho == pytest.approx(2.5 / 3)
