"""The exported graph: ``If`` every row asks ρ ≥ 1, the unpruned branch (the dense model's operators
only), else the pruned pass; both branches built from onnxruntime's fused operators (one ``Attention``
and two ``SkipLayerNormalization`` per layer, as ORT's optimizer gives the dense peer), the weights
stored once, and either branch equal to torch on a ragged batch. Its int8 form keeps the attention bias
(padding, merged tokens' log-size), quantizes the weights per channel and leaves the scorers fp32."""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch

from retention_ort import open_session
from tests.tiny import TINY_LAYERS, tiny_model
from training.export.graph import example_inputs, export_onnx, graph_for, validate_onnx
from training.export.int8 import quantize_int8

INT8_COSINE_FLOOR = 0.98  # tiny random weights; MiniLM's int8 graph keeps 0.994 (docs/benchmarks.md)


def exported(tmp_path: Path, task: str = "embedding", merge: bool = True) -> tuple[Any, Path]:
    model, _ = tiny_model(task)
    model.config = dataclasses.replace(model.config, merge_dropped=merge, leading_share=0.5 if merge else 0.0)
    path = tmp_path / "model.onnx"
    export_onnx(model.eval(), path, model.backbone.info_vocab_size)
    return model, path


def branches(path: Path) -> dict[str, onnx.GraphProto]:
    """The exported model's two If branches: "unpruned" (every ρ ≥ 1) and "pruned"."""
    (choice,) = [node for node in onnx.load(str(path)).graph.node if node.op_type == "If"]
    graphs = {attribute.name: attribute.g for attribute in choice.attribute}
    return {"unpruned": graphs["then_branch"], "pruned": graphs["else_branch"]}


def operator_counts(graph: onnx.GraphProto) -> Counter[str]:
    return Counter(node.op_type for node in graph.node)


@pytest.mark.parametrize(("task", "merge"), [("embedding", True), ("embedding", False), ("qa", False)])
def test_every_layer_is_one_attention_node_and_two_skip_layer_norms(
    tmp_path: Path, task: str, merge: bool
) -> None:
    model, path = exported(tmp_path, task, merge)
    for branch in branches(path).values():
        counts = operator_counts(branch)
        assert counts["Attention"] == TINY_LAYERS
        assert counts["SkipLayerNormalization"] == 2 * TINY_LAYERS
        assert counts["Softmax"] == 0  # no unfused attention core left
    # the unpruned branch is the dense model: no scorer, no selection, no merge, a 2-D key mask
    unpruned_graph = branches(path)["unpruned"]
    unpruned = operator_counts(unpruned_graph)
    assert unpruned["TopK"] == 0 and unpruned["ScatterElements"] == 0 and unpruned["Tanh"] == 0
    attention = [node for node in unpruned_graph.node if node.op_type == "Attention"]
    assert all(len(node.input) == 4 and node.input[3] for node in attention)  # mask_index, no bias
    report = validate_onnx(model, path, model.backbone.info_vocab_size)  # raises on any mismatch
    assert report.cases > 0 and report.max_abs_diff <= 1e-4


def test_the_weights_are_stored_once(tmp_path: Path) -> None:
    """The unpruned branch reads the pruned graph's weights: the file is not twice the model."""
    model, path = exported(tmp_path)
    weights = sum(parameter.numel() * 4 for parameter in model.parameters())
    assert path.stat().st_size < 1.3 * weights


def test_classification_keeps_one_query_in_its_last_layer(tmp_path: Path) -> None:
    """A [CLS] head computes one query in the last layer: that layer's core stays unfused (one Softmax)."""
    _, path = exported(tmp_path, "classification", merge=False)
    for branch in branches(path).values():
        counts = operator_counts(branch)
        assert counts["Attention"] == TINY_LAYERS - 1 and counts["Softmax"] == 1


@pytest.mark.parametrize("rhos", [(1.0, 0.3, 0.5, 0.7), (1.0,), (1.0, 1.0, 1.0, 0.9)])
def test_a_ragged_batch_matches_torch_in_either_branch(tmp_path: Path, rhos: tuple[float, ...]) -> None:
    model, path = exported(tmp_path)
    vocab = model.backbone.info_vocab_size
    example = example_inputs(batch=4, length=23, vocab_size=vocab, rhos=rhos, seed=3)
    graph = graph_for(model)
    with torch.no_grad():
        expected = graph(*(example[name] for name in graph.input_names))
    feeds = {name: example[name].numpy() for name in graph.input_names}
    logits, counts, depth = open_session(path).run(None, feeds)
    assert np.array_equal(counts, expected[1].numpy()) and np.array_equal(depth, expected[2].numpy())
    assert float(np.max(np.abs(logits - expected[0].numpy()))) <= 1e-5


def test_int8_keeps_the_attention_bias_and_the_scorers_fp32(tmp_path: Path) -> None:
    model, path = exported(tmp_path)
    quantize_int8(path, tmp_path / "model.int8.onnx")
    int8 = branches(tmp_path / "model.int8.onnx")
    # QAttention quantizes its input with one scale per tensor (and has no attention-bias input): every
    # Attention became MatMul + MultiHeadAttention, the pruned branch's with its bias, the unpruned
    # branch's with its key mask; no activation is quantized per tensor
    pruned, unpruned = operator_counts(int8["pruned"]), operator_counts(int8["unpruned"])
    assert pruned["QAttention"] == 0 and pruned["MultiHeadAttention"] == TINY_LAYERS
    assert unpruned["QAttention"] == 0 and unpruned["MultiHeadAttention"] == TINY_LAYERS
    assert all(node.input[5] for node in int8["pruned"].node if node.op_type == "MultiHeadAttention")
    assert all(node.input[4] for node in int8["unpruned"].node if node.op_type == "MultiHeadAttention")
    for name, graph in int8.items():
        assert not [node for node in graph.node if node.op_type == "DynamicQuantizeLinear"]
        quantized = {node.name for node in graph.node if node.op_type == "MatMulInteger"}
        assert len(quantized) >= 4 * TINY_LAYERS  # QKV, attention output, FFN in and out
        assert not [name for name in quantized if "/scorers." in name]
    vocab = model.backbone.info_vocab_size
    for rhos in ((1.0,), (1.0, 0.5, 0.3)):  # either branch
        example = example_inputs(batch=3, length=33, vocab_size=vocab, rhos=rhos, seed=5)
        feeds = {name: example[name].numpy() for name in ("input_ids", "attention_mask", "rho")}
        fp32 = open_session(path).run(None, feeds)[0]
        int8 = open_session(tmp_path / "model.int8.onnx").run(None, feeds)[0]
        cosine = (fp32 * int8).sum(1) / (np.linalg.norm(fp32, axis=1) * np.linalg.norm(int8, axis=1))
        assert float(cosine.min()) >= INT8_COSINE_FLOOR
