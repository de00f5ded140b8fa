"""The two-path speed study on tiny exports (real onnxruntime sessions): every variant timed at each ρ,
and the graphs it builds by surgery (the copy's weights moved, each pruned pass alone) compute what the
exported graphs compute."""

from __future__ import annotations

import json
from pathlib import Path

import onnx

from experiments import two_path_speed
from retention_core.contract import MODEL_FILE
from tests.training.test_two_path_export import exported
from training.export.two_path import with_weights_beside_their_pass

SAME_WEIGHTS_ATOL = 1e-5  # other kernels (prepacked or not) move fp32 outputs by ~1e-7


def test_every_variant_is_timed_and_the_surgery_keeps_the_outputs(tmp_path: Path) -> None:
    _, two_path, original = exported(tmp_path, "embedding")
    out = tmp_path / "speed.json"
    two_path_speed.main([str(original), str(two_path), "--out", str(out), "--rounds", "1", "--threads", "1"])
    payload = json.loads(out.read_text())
    variants = {"frozen", "two-path", "frozen-no-prepacking", "two-path-weights-one-level"}
    variants |= {"frozen-pass", "copy-pass"}
    assert set(payload["results"]) == {f"{rho:g}" for rho in two_path_speed.RHOS}
    for rows in payload["results"].values():
        assert set(rows) == variants
        assert all(row["seconds_per_batch"] > 0 for row in rows.values())
        assert all(row["max_abs_vs_same_weights"] <= SAME_WEIGHTS_ATOL for row in rows.values()), rows
        assert rows["frozen"]["speedup_vs_frozen"] == 1.0
    assert out.with_suffix(".md").read_text().startswith("# Two-path graph speed")
    # the export already placed the copy's weights: placing them again changes nothing
    model = onnx.load(str(two_path / MODEL_FILE))
    assert with_weights_beside_their_pass(model).SerializeToString() == model.SerializeToString()
