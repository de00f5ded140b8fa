"""experiments.op_profile in quick mode: onnxruntime's own profiler over the dense peer and our graph
(tiny model, real sessions), kernel time by operator type."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments import op_profile
from training.tiny import TINY_LAYERS


def test_quick_profile_names_the_fused_operators_of_both_graphs(tmp_path: Path) -> None:
    out = tmp_path / "op_profile.json"
    op_profile.main(["--quick", "--out", str(out), "--rhos", "1", "0.5"])
    payload = json.loads(out.read_text())
    profiles = {row["variant"]: row for row in payload["profiles"]}
    assert set(profiles) == {"peer-fused", "ours@1", "ours@0.5"}
    for row in profiles.values():
        operators = {op["operator"]: op for op in row["operators"]}
        # both graphs run one fused Attention node per layer
        assert operators["Attention"]["nodes"] == TINY_LAYERS
        assert sum(op["share_of_kernels"] for op in row["operators"]) == pytest.approx(1.0)
        assert row["kernel_milliseconds_per_call"] > 0.0 and row["wall_milliseconds_per_call"] > 0.0
        assert row["wall_milliseconds_per_call"] == pytest.approx(
            row["kernel_milliseconds_per_call"] + row["outside_kernels_milliseconds_per_call"]
        )

    def operator_names(variant: str) -> set[str]:
        return {op["operator"] for op in profiles[variant]["operators"]}

    # ρ < 1 runs the selection; ρ = 1 takes the unpruned branch, which has none (as the peer)
    assert "TopK" in operator_names("ours@0.5")
    assert "TopK" not in operator_names("ours@1") and "TopK" not in operator_names("peer-fused")
    assert "ours@0.5" in out.with_suffix(".md").read_text()
