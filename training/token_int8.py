"""Per-token int8 activations: a row's int8 output depends on that row alone.

onnxruntime's dynamic quantization (``DynamicQuantizeLinear``) gives a whole activation tensor ONE scale
and zero point, set by its largest value — one per batch — so a text's vector, and at ρ < 1 which of its
tokens survive, moved with whatever else shared its batch (cosine to itself down to .95 at ρ 0.3). Here
every token gets its own symmetric scale from its own vector:

    scale_t = max(|x_t|) / 127            # (..., T, 1)
    q_t     = round(x_t / scale_t) + 128  # (..., T, K) uint8 in [1, 255], zero point 128

and the weights stay int8 per output channel, but 7-bit (onnxruntime's ``reduce_range``: |w| ≤ 64). That
bound makes the integer product exact on every x86 kernel: AVX2 and AVX-512 without VNNI multiply
u8 × s8 pairs with ``vpmaddubsw``, which saturates each pair's sum at int16 (2 × 255 × 64 = 32,640 fits;
2 × 255 × 127 would not), while VNNI and AMX accumulate in int32. So the int32 GEMM result is the same
integer on any CPU and at any batch composition, and the dequantization after it is elementwise.

The rewrite is a pure function of the graph that onnxruntime's quantizer wrote: each
``DynamicQuantizeLinear(x) → (q, scale, zero_point)`` becomes the nodes below with the same three output
names, so the quantizer's ``MatMulInteger`` reads them unchanged. Its dequantization,
``Cast(int32) × (scale × weight_scale)``, becomes ``(Cast(int32) × weight_scale) × scale``: onnxruntime's
optimizer fuses the first form into ``MatMulIntegerToFloat``, whose activation scale is one per tensor
(or per column), and ran it with the wrong scales (MiniLM's cosine to fp32 fell to 0.88; with the
optimizer off, 0.996); the second form is not fused.
"""

from __future__ import annotations

from typing import Any

import onnx
from onnx import helper

ACTIVATION_LEVELS = 127.0  # symmetric int8: round(x / scale) ∈ [-127, 127]
ACTIVATION_ZERO_POINT = 128  # stored as uint8 (the fast u8 × s8 kernels): [-127, 127] → [1, 255]
# An all-zero token (e.g. a padded one) would give scale 0 and 0 / 0; any positive scale quantizes it to 0.
SMALLEST_SCALE = 1e-30
REDUCE_MAX_AXES_AS_INPUT = 18  # ReduceMax takes its axes as an input from this opset on (attribute before)


def per_token_activations(model: Any) -> Any:
    """``model`` with every ``DynamicQuantizeLinear`` (in its graph and its If branches) replaced by a
    per-token symmetric quantization; in place, returned."""
    opset = next(entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx"))
    _rewrite_graph(model.graph, opset)
    return model


def _rewrite_graph(graph: Any, opset: int) -> None:
    rewritten, token_scales = [], set()
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                _rewrite_graph(attribute.g, opset)
        if node.op_type == "DynamicQuantizeLinear" and node.domain in ("", "ai.onnx"):
            rewritten += per_token_nodes(node.input[0], list(node.output), node.name, opset)
            token_scales.add(node.output[1])
        else:
            rewritten.append(node)
    del graph.node[:]
    graph.node.extend(scaled_after(rewritten, token_scales))


def scaled_after(nodes: list[Any], token_scales: set[str]) -> list[Any]:
    """``nodes`` with every ``Y = Cast(int32) × (token_scale × weight_scale)`` as ``Y = (Cast(int32) ×
    weight_scale) × token_scale`` (the module's docstring says why); the product node goes.
    ``token_scales``: the per-token scales' names ((..., T, 1) each)."""
    products = {  # scale product → (token scale, weight scale)
        node.output[0]: (node.input[0], node.input[1])
        for node in nodes
        if node.op_type == "Mul" and node.input[0] in token_scales
    }
    result = []
    for node in nodes:
        if node.op_type == "Mul" and node.output[0] in products:
            continue  # the product: its consumer takes both scales itself
        product = next((name for name in node.input if name in products), None)
        if node.op_type != "Mul" or product is None:
            result.append(node)
            continue
        token_scale, weight_scale = products[product]
        integer = next(name for name in node.input if name != product)  # Cast(int32) (..., T, N)
        partial = f"{node.name}/by_weight_scale"
        result += [
            helper.make_node("Mul", [integer, weight_scale], [partial], name=partial),  # (..., T, N)
            helper.make_node(
                "Mul", [partial, token_scale], list(node.output), name=f"{node.name}/by_token_scale"
            ),
        ]
    return result


def per_token_nodes(x: str, outputs: list[str], name: str, opset: int) -> list[Any]:
    """Nodes computing ``outputs`` = (q uint8 (..., T, K), scale float (..., T, 1), zero point uint8 ())
    from ``x`` float (..., T, K), one scale per token (the last axis is the one quantized)."""
    quantized, scale, zero_point = outputs
    part = lambda label: f"{name}/per_token/{label}"  # noqa: E731 - names of this node's intermediates
    constants = {
        "levels": helper.make_tensor(part("levels"), onnx.TensorProto.FLOAT, [], [ACTIVATION_LEVELS]),
        "smallest": helper.make_tensor(part("smallest"), onnx.TensorProto.FLOAT, [], [SMALLEST_SCALE]),
        "offset": helper.make_tensor(part("offset"), onnx.TensorProto.FLOAT, [], [ACTIVATION_ZERO_POINT]),
    }
    nodes = [
        helper.make_node("Constant", [], [part(key)], name=part(f"{key}_constant"), value=tensor)
        for key, tensor in constants.items()
    ]
    nodes.append(helper.make_node("Abs", [x], [part("abs")], name=part("Abs")))  # (..., T, K)
    if opset >= REDUCE_MAX_AXES_AS_INPUT:
        axes = helper.make_tensor(part("axes"), onnx.TensorProto.INT64, [1], [-1])
        nodes.append(helper.make_node("Constant", [], [part("axes")], name=part("axes_constant"), value=axes))
        peak = helper.make_node("ReduceMax", [part("abs"), part("axes")], [part("peak")], keepdims=1)
    else:
        peak = helper.make_node("ReduceMax", [part("abs")], [part("peak")], axes=[-1], keepdims=1)
    peak.name = part("ReduceMax")
    zero = helper.make_tensor(part("zero_point"), onnx.TensorProto.UINT8, [], [ACTIVATION_ZERO_POINT])
    nodes += [
        peak,  # (..., T, 1)
        helper.make_node("Div", [part("peak"), part("levels")], [part("raw_scale")], name=part("Div_scale")),
        helper.make_node("Max", [part("raw_scale"), part("smallest")], [scale], name=part("Max")),
        helper.make_node("Div", [x, scale], [part("scaled")], name=part("Div")),  # (..., T, K) in [-127, 127]
        helper.make_node("Round", [part("scaled")], [part("rounded")], name=part("Round")),
        helper.make_node("Add", [part("rounded"), part("offset")], [part("shifted")], name=part("Add")),
        helper.make_node(
            "Cast", [part("shifted")], [quantized], name=part("Cast"), to=onnx.TensorProto.UINT8
        ),
        helper.make_node("Constant", [], [zero_point], name=part("zero_point_constant"), value=zero),
    ]
    return nodes
