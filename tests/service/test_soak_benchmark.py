"""experiments/soak.py over the tiny models: a real ``python -m service`` process, mixed-shape requests,
RSS sampled. A smoke run of the benchmark's machinery; it asserts no memory or speed target."""

from __future__ import annotations

import json
from pathlib import Path

from experiments import soak


def test_quick_mixed_shape_soak(models_root: Path, tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    argv = ["--models-dir", str(models_root), "--out", str(out), "--seconds", "3", "--interval", "0.5"]
    soak.main([*argv, "--warm-seconds", "1", "--concurrency", "2", "--max-inputs", "8", "--settle", "0"])
    saved = json.loads(out.read_text())
    assert saved["command"].startswith("python -m experiments.soak ") and saved["machine"]["cores"] >= 1
    assert saved["statuses"].get("200", 0) > 0 and set(saved["statuses"]) <= {"200", "429"}
    assert len(saved["rss_mib"]) >= 4 and saved["rss_peak_mib"] >= saved["rss_after_warm_mib"] > 0
    assert saved["idle_before_p50_ms"] > 0 and saved["idle_after_p50_ms"] > 0
    assert "growth after warm-up" in out.with_suffix(".md").read_text()
    assert out.with_suffix(".png").stat().st_size > 0
    assert not out.with_suffix(".server-logs").exists()  # the server's log is removed after a clean run
