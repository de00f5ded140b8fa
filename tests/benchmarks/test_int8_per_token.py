"""The per-token int8 study (experiments.int8_per_token) on a tiny export: both int8 forms built from
one fp32 graph, the invariance check (per-token exact, as the product needs), speed in the same rounds,
the profile's operator rows and the table."""

from __future__ import annotations

from pathlib import Path

from experiments import int8_per_token as study
from training.tiny import build_tiny_model_dir


def test_the_study_on_a_tiny_export(tmp_path: Path) -> None:
    export = tmp_path / "tiny-embedding"
    build_tiny_model_dir(export, "embedding")
    argv = [str(export), "--out", str(tmp_path / "out" / "study.json"), "--texts", "12", "--documents", "8"]
    payload = study.main([*argv, "--rounds", "1", "--quality-sets", "--profile", "--threads", "1"])
    token = payload["invariance"][study.PER_TOKEN]
    assert set(token) == {f"{rho:g}" for rho in study.RHOS}
    assert all(
        cell["max_abs_difference"] == 0.0 and cell["texts_with_other_kept_counts"] == 0
        for cell in token.values()
    )
    for rho, graphs in payload["speed"].items():
        assert graphs[study.PER_TENSOR]["speed_vs_per_tensor"] == 1.0, rho
        assert graphs[study.PER_TOKEN]["documents_per_second"] > 0
    profiles = payload["profiles"]
    assert set(profiles) == {
        f"{name}@{rho:g}" for name in (study.PER_TOKEN, study.PER_TENSOR) for rho in study.PROFILED_RHOS
    }
    operators = {row["operator"] for row in profiles[f"{study.PER_TOKEN}@1"]["operators"]}
    assert {"MatMulInteger", "QuantizeLinear", "DequantizeLinear"} <= operators
    assert "DynamicQuantizeLinear" not in operators
    table = (tmp_path / "out" / "study.md").read_text(encoding="utf-8")
    assert "| int8-per-token | 1 |" in table and "Where the time goes" in table
