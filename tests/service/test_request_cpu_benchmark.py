"""experiments/request_cpu.py over the tiny models: a real ``python -m service`` process, per-thread CPU
read from /proc while a sequential client sends served and invalid requests. A smoke run of the
benchmark's machinery; it asserts no CPU target. /proc charges CPU in 10 ms ticks, so the served cells
send long texts, enough requests that the inference thread's share spans many ticks (20 short ones
once read 0). (Its early-refusal kind needs a model slow enough to
stay busy through the window: the tiny ones are not; early refusal itself: test_storm.py.)"""

from __future__ import annotations

import json
from pathlib import Path

from experiments import request_cpu


def test_request_cpu_counts_each_kind_over_both_connection_modes(models_root: Path, tmp_path: Path) -> None:
    out = tmp_path / "cpu.json"
    request_cpu.main(
        [
            "--models-dir",
            str(models_root),
            "--out",
            str(out),
            "--requests",
            "300",
            "--min-words",
            "150",
            "--kinds",
            "served",
            "invalid",
        ]
    )
    saved = json.loads(out.read_text())
    assert saved["cpu_clock_tick_ms"] > 0
    assert saved["command"].startswith("python -m experiments.request_cpu ")
    cells = {(cell["kind"], cell["connection"]): cell for cell in saved["results"]}
    assert set(cells) == {(k, c) for k in ("served", "invalid") for c in request_cpu.CONNECTIONS}
    for connection in request_cpu.CONNECTIONS:
        served, invalid = cells["served", connection], cells["invalid", connection]
        assert served["unexpected_status"] == 0 and invalid["unexpected_status"] == 0
        assert served["cpu_ms_per_request"]["event_loop"] > 0
        assert served["cpu_ms_per_request"]["other_threads"] > 0  # the inference thread ran the model
        assert invalid["cpu_ms_per_request"]["other_threads"] < served["cpu_ms_per_request"]["other_threads"]
    assert "| invalid | new_connection |" in out.with_suffix(".md").read_text()
    assert not out.with_suffix(".server-logs").exists()
