"""The weight forms of ``experiments.int8_weight_forms`` on a tiny export: its 7-bit form is the product's
per-token graph byte for byte (so the other forms differ from it in their weights alone, and the product's
``quantize_int8`` is untouched); 8-bit weights stored as uint8 with zero point 128 (the form that sends
the per-token GEMMs to onnxruntime's U8U8 kernels) are what onnxruntime's optimizer leaves alone, and a
row gets the same bits alone and in any batch. (Their equality with 8-bit int8 weights holds only where
the u8 × s8 kernel does not saturate — not on AVX2 — so it is not asserted here.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from experiments.int8_weight_forms import SEVEN_BIT, UNSIGNED, UNSIGNED_SHIFT, quantize_per_token
from tests.training.test_batch_invariance import OPTIMIZER_BOUND, SIDES, run_rows, session_of, texts
from training.export.int8 import PER_TOKEN, quantize_int8
from training.tiny import build_tiny_model_dir


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    export = tmp_path_factory.mktemp("weight-forms") / "tiny"
    build_tiny_model_dir(export, "embedding")
    return export / "model.onnx"


def weight_initializers(model: onnx.ModelProto) -> list[onnx.TensorProto]:
    """Every MatMulInteger's B and b_zero_point initializer, in the graph and its branches."""
    found, initializers = [], {}

    def walk(graph: onnx.GraphProto) -> None:
        initializers.update({init.name: init for init in graph.initializer})
        for node in graph.node:
            for attribute in node.attribute:
                if attribute.type == onnx.AttributeProto.GRAPH:
                    walk(attribute.g)
            if node.op_type == "MatMulInteger":
                found.append((node.input[1], node.input[3]))

    walk(model.graph)
    return [initializers[name] for pair in found for name in pair]


def test_the_seven_bit_form_is_the_products_per_token_graph(source: Path, tmp_path: Path) -> None:
    product, lab = tmp_path / "product.onnx", tmp_path / "lab.onnx"
    kept = quantize_int8(source, product, activations=PER_TOKEN)
    assert quantize_per_token(source, lab, weights=SEVEN_BIT) == kept
    assert product.read_bytes() == lab.read_bytes()


def test_unsigned_weights_run_unfused_and_batch_invariant(source: Path, tmp_path: Path) -> None:
    path = tmp_path / "u8.onnx"
    quantize_per_token(source, path, weights=UNSIGNED)
    initializers = weight_initializers(onnx.load(str(path)))
    assert initializers and all(init.data_type == onnx.TensorProto.UINT8 for init in initializers)
    zero_points = [numpy_helper.to_array(init) for init in initializers if len(init.dims) == 1]
    assert zero_points and all(np.all(values == UNSIGNED_SHIFT) for values in zero_points)
    plain = ort.SessionOptions()
    plain.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    unoptimized = ort.InferenceSession(str(path), plain, providers=["CPUExecutionProvider"])
    served, rows = session_of(path), texts()
    for side, rhos in SIDES.items():
        batched, reference = run_rows(served, rows, list(rhos)), run_rows(unoptimized, rows, list(rhos))
        for i, (row, rho) in enumerate(zip(rows, rhos, strict=True)):
            np.testing.assert_allclose(
                batched[i][0], reference[i][0], rtol=0, atol=OPTIMIZER_BOUND, err_msg=side
            )
            alone = run_rows(served, [row], [rho])[0]
            assert all(np.array_equal(a, b) for a, b in zip(alone, batched[i], strict=True)), (
                f"{side} row {i}"
            )


def test_an_unknown_weight_form_is_refused(source: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="one of"):
        quantize_per_token(source, tmp_path / "x.onnx", weights="s4")


def test_the_weight_bits_pilot_runs_through_the_study(source: Path, tmp_path: Path) -> None:
    """The pilot's recorded command (results/experiments/int8-weight-bits/profile.json) on the tiny export:
    the variants build here, the ratios are taken against the product's per-token graph."""
    from experiments import int8_per_token as study

    variants = [study.PER_TOKEN, study.PER_TOKEN_S8, study.PER_TOKEN_U8]
    argv = [str(source.parent), "--variants", *variants, "--baseline", study.PER_TOKEN, "--rhos", "1", "0.5"]
    argv += ["--texts", "8", "--documents", "8", "--rounds", "1", "--quality-sets", "--threads", "1"]
    payload = study.main([*argv, "--out", str(tmp_path / "pilot.json")])
    assert set(payload["invariance"]) == {study.FP32, *variants}
    unsigned = payload["invariance"][study.PER_TOKEN_U8]["1"]
    assert unsigned["max_abs_difference"] == 0.0 and unsigned["texts_with_other_kept_counts"] == 0
    for rho, graphs in payload["speed"].items():
        assert graphs[study.PER_TOKEN]["speed_vs_per_token"] == 1.0, rho
