"""int8 keeps fp32 the weight MatMuls whose inputs carry outliers (``training.export.int8.outlying_matmuls``),
found at ρ = 1 on random token ids: a graph with one planted outlier, quantized for real."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from retention_ort import open_session
from training.export.int8 import OUTLIER_RATIO, int8_weights, outlying_matmuls

VOCAB, WIDTH = 100, 64
OUTLYING_TOKEN, OUTLYING_COLUMN = 7, 5


def two_table_graph() -> onnx.ModelProto:
    """input_ids → two embedding tables → one weight MatMul each → summed. The first table holds one
    value 1,000× the rest (one token, one column): about 1 in 6,400 of the first MatMul's input values,
    well inside its 99.9th percentile's tail, the kind of value that sets a per-tensor int8 scale."""
    rng = np.random.default_rng(0)
    table = rng.normal(size=(VOCAB, WIDTH)).astype(np.float32)
    table[OUTLYING_TOKEN, OUTLYING_COLUMN] = 1000.0 * float(np.abs(table).max())
    plain = rng.normal(size=(VOCAB, WIDTH)).astype(np.float32)
    weights = [rng.normal(size=(WIDTH, WIDTH)).astype(np.float32) for _ in range(2)]
    initializers = [
        numpy_helper.from_array(table, "outlying_table"),
        numpy_helper.from_array(plain, "plain_table"),
        numpy_helper.from_array(weights[0], "w_outlying"),
        numpy_helper.from_array(weights[1], "w_plain"),
    ]
    nodes = [
        helper.make_node("Gather", ["outlying_table", "input_ids"], ["a"], name="embed_a"),
        helper.make_node("Gather", ["plain_table", "input_ids"], ["b"], name="embed_b"),
        helper.make_node("MatMul", ["a", "w_outlying"], ["a_out"], name="outlying"),
        helper.make_node("MatMul", ["b", "w_plain"], ["b_out"], name="plain"),
        helper.make_node("Add", ["a_out", "b_out"], ["out"], name="sum"),
    ]
    graph = helper.make_graph(
        nodes,
        "two_tables",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", "sequence", WIDTH])],
        initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_the_matmul_reading_outliers_is_found_and_stays_fp32(tmp_path: Path) -> None:
    model = two_table_graph()
    assert OUTLIER_RATIO > 1
    found = outlying_matmuls(model)
    assert found == ["outlying"]
    quantized = int8_weights(model, ["MatMul"], keep_fp32=found)
    kinds = {node.name: node.op_type for node in quantized.graph.node}
    assert kinds["outlying"] == "MatMul"  # left fp32
    assert "plain" not in kinds and any(kind != "MatMul" and "plain" in name for name, kind in kinds.items())
    onnx.save(quantized, str(tmp_path / "int8.onnx"))
    ids = np.array([[OUTLYING_TOKEN, 1, 2, 3]], dtype=np.int64)
    out = open_session(tmp_path / "int8.onnx").run(None, {"input_ids": ids})[0]  # (1, 4, W)
    assert out.shape == (1, 4, WIDTH) and np.isfinite(out).all()


def test_a_graph_without_outliers_keeps_every_matmul_int8() -> None:
    model = two_table_graph()
    table = next(init for init in model.graph.initializer if init.name == "outlying_table")
    values = numpy_helper.to_array(table).copy()
    values[OUTLYING_TOKEN, OUTLYING_COLUMN] = 0.0
    table.CopyFrom(numpy_helper.from_array(values, "outlying_table"))
    assert outlying_matmuls(model) == []
