"""Per-token int8 activations: a row's int8 output depends on that row alone.

onnxruntime's dynamic quantization (``DynamicQuantizeLinear``) gives a whole activation tensor ONE scale
and zero point, set by its largest value — one per batch — so a text's vector, and at ρ < 1 which of its
tokens survive, moved with whatever else shared its batch (cosine to itself down to .89 at ρ 0.3). Here
every token (a row of the activation flattened to (R, K)) gets its own symmetric scale from its own
vector:

    scale_r = max(|x_r|) / 127                       # (R,)
    q_r     = QuantizeLinear(x_r, scale_r, 128)      # (R, K) uint8 in [1, 255]
    y_r     = DequantizeLinear(int32 x_r·W, scale_r) × weight_scale

and the weights stay int8 per output channel, but 7-bit (onnxruntime's ``reduce_range``: |w| ≤ 64). That
bound makes the integer product exact on every x86 kernel: AVX2 and AVX-512 without VNNI multiply
u8 × s8 pairs with ``vpmaddubsw``, which saturates each pair's sum at int16 (2 × 255 × 64 = 32,640 fits;
2 × 255 × 127 would not), while VNNI and AMX accumulate in int32. So the int32 GEMM result is the same
integer at any batch composition, and everything around it is elementwise per row.

The rewrite is a pure function of the graph that onnxruntime's quantizer wrote. Each
``DynamicQuantizeLinear(x) → (q, scale, zero_point)`` becomes ``per_token_nodes`` with the same three
output names (q keeps x's shape, so the quantizer's ``MatMulInteger`` reads it unchanged; scale is one per
row). Its dequantization ``Cast(int32 y) × (scale × weight_scale)`` becomes ``dequantized_per_row``:
onnxruntime's optimizer would fuse the product form into ``MatMulIntegerToFloat``, whose activation scale
is one per tensor or per column, and ran it with the wrong scales (MiniLM's int8 lost 3–6 nDCG@10; fine
with the optimizer off). ``QuantizeLinear`` / ``DequantizeLinear`` along axis 0 of the flattened rows
do in one pass each what Div, Round, Add, Cast and two Muls did.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import onnx
from onnx import helper

ACTIVATION_LEVELS = 127.0  # symmetric int8: round(x / scale) ∈ [-127, 127]
ACTIVATION_ZERO_POINT = 128  # stored as uint8 (the fast u8 × s8 kernels): [-127, 127] → [1, 255]
# An all-zero token (e.g. a padded one) would give scale 0 and 0 / 0; any positive scale quantizes it to 0.
SMALLEST_SCALE = 1e-30
ROWS_AXIS = 0  # of the (R, K) flattened activation: QuantizeLinear's / DequantizeLinear's per-axis scale
REDUCE_AXES_AS_INPUT = 18  # ReduceMax takes its axes as an input from this opset on (an attribute before)


def per_token_activations(model: Any) -> Any:
    """``model`` with every ``DynamicQuantizeLinear`` (in its graph and its If branches) replaced by a
    per-token symmetric quantization and its dequantization per row; in place, returned."""
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
    graph.node.extend(dequantized_per_row(rewritten, token_scales))


def namer(prefix: str) -> Callable[[str], str]:
    """Names of one rewrite's intermediates, under the node it replaces."""
    return lambda label: f"{prefix}/{label}"


def constant(name: str, kind: int, values: list[Any], dims: tuple[int, ...] = ()) -> Any:
    value = helper.make_tensor(name, kind, list(dims), values)
    return helper.make_node("Constant", [], [name], name=f"{name}_constant", value=value)


def row_peaks(values: str, peaks: str, name: str, opset: int) -> list[Any]:
    """max over the last axis of (R, K) ``values`` → (R,) ``peaks``, in ``opset``'s form of ReduceMax."""
    if opset < REDUCE_AXES_AS_INPUT:
        return [helper.make_node("ReduceMax", [values], [peaks], name=name, axes=[-1], keepdims=0)]
    axes = f"{name}/axes"
    return [
        constant(axes, onnx.TensorProto.INT64, [-1], dims=(1,)),
        helper.make_node("ReduceMax", [values, axes], [peaks], name=name, keepdims=0),
    ]


def per_token_nodes(x: str, outputs: list[str], name: str, opset: int) -> list[Any]:
    """Nodes computing ``outputs`` = (q uint8 shaped as x, scale float (R,) one per row of x flattened to
    (R, K), zero point uint8 ()) from ``x`` float (..., T, K)."""
    quantized, scale, zero_point = outputs
    part = namer(f"{name}/per_token")
    zero_points = helper.make_tensor("value", onnx.TensorProto.UINT8, [1], [ACTIVATION_ZERO_POINT])
    return [
        constant(part("levels"), onnx.TensorProto.FLOAT, [ACTIVATION_LEVELS]),
        constant(part("smallest"), onnx.TensorProto.FLOAT, [SMALLEST_SCALE]),
        helper.make_node("Flatten", [x], [part("rows")], name=part("Flatten"), axis=-1),  # (R, K)
        helper.make_node("Abs", [part("rows")], [part("abs")], name=part("Abs")),
        *row_peaks(part("abs"), part("peak"), part("ReduceMax"), opset),  # (R,)
        helper.make_node("Div", [part("peak"), part("levels")], [part("raw_scale")], name=part("Div")),
        helper.make_node("Max", [part("raw_scale"), part("smallest")], [scale], name=part("Max")),  # (R,)
        helper.make_node("Shape", [scale], [part("rows_shape")], name=part("Shape_rows")),
        helper.make_node(
            "ConstantOfShape",
            [part("rows_shape")],
            [part("zero_points")],
            name=part("ZeroPoints"),
            value=zero_points,
        ),  # (R,) uint8
        helper.make_node(
            "QuantizeLinear",
            [part("rows"), scale, part("zero_points")],
            [part("quantized_rows")],
            name=part("QuantizeLinear"),
            axis=ROWS_AXIS,
        ),  # (R, K) uint8
        helper.make_node("Shape", [x], [part("shape")], name=part("Shape")),
        helper.make_node(
            "Reshape", [part("quantized_rows"), part("shape")], [quantized], name=part("Reshape")
        ),
        constant(zero_point, onnx.TensorProto.UINT8, [ACTIVATION_ZERO_POINT]),
    ]


def dequantized_per_row(nodes: list[Any], token_scales: set[str]) -> list[Any]:
    """``nodes`` with every ``Y = Cast(int32 y) × (token_scale × weight_scale)`` (the quantizer's
    dequantization) as ``Y = DequantizeLinear(y as (R, N), token_scale, axis 0) × weight_scale`` shaped as
    y; the scale product and the Cast go. ``token_scales``: the per-token scales' names."""
    products = {  # scale product → (token scale, weight scale)
        node.output[0]: (node.input[0], node.input[1])
        for node in nodes
        if node.op_type == "Mul" and node.input[0] in token_scales
    }
    casts = {node.output[0]: node.input[0] for node in nodes if node.op_type == "Cast"}
    result, replaced = [], set()
    for node in nodes:
        product = next((name for name in node.input if name in products), None)
        if node.op_type != "Mul" or product is None:
            result.append(node)
            continue
        token_scale, weight_scale = products[product]
        cast = next(name for name in node.input if name != product)
        integer = casts[cast]  # (..., T, N) int32
        replaced.update({product, cast})
        part = namer(f"{node.name}/per_row")
        result += [
            helper.make_node("Flatten", [integer], [part("rows")], name=part("Flatten"), axis=-1),
            helper.make_node(
                "DequantizeLinear",
                [part("rows"), token_scale],
                [part("dequantized")],
                name=part("DequantizeLinear"),
                axis=ROWS_AXIS,
            ),  # (R, N) float
            helper.make_node("Mul", [part("dequantized"), weight_scale], [part("scaled")], name=part("Mul")),
            helper.make_node("Shape", [integer], [part("shape")], name=part("Shape")),
            helper.make_node(
                "Reshape", [part("scaled"), part("shape")], list(node.output), name=part("Reshape")
            ),
        ]
    return [node for node in result if not set(node.output) & replaced]
