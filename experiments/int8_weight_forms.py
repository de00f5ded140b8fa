"""Per-token int8 graphs with other weight forms than the product's 7-bit ones (the weight-bits pilot of
docs/experiments/2026-11-29-batch-invariant-int8.md): does SciTLDR's ρ = 1 miss come from the 7-bit
weights, and can 8-bit weights stay exact on every x86 CPU?

The product (``training.export.int8.quantize_int8``, ``activations="token"``) stores int8 weights with
|w| ≤ 64 (onnxruntime's ``reduce_range``), so the u8 × s8 GEMM never saturates AVX2's ``vpmaddubsw``
(2 × 255 × 64 fits in int16). Built here from the same public pieces, in the same order, with only the
weights changed:

- ``EIGHT_BIT``: int8 weights with |w| ≤ 127. u8 × s8 pairs then reach 2 × 255 × 127 and saturate the
  int16 sums of AVX2 and AVX-512 without VNNI, so a row is exact alone and batched only on VNNI / AMX
  CPUs; run only to isolate the weights' share of the loss;
- ``UNSIGNED``: the same 8-bit weights stored as uint8 w + 128 with zero point 128 (the same integers once
  the zero points are taken off), which sends the GEMM to MLAS's U8U8 kernels: they widen both sides to
  int16 and sum pairs into int32 (``vpmaddwd``; ``vpdpbuud`` on AVX-VNNI-INT8), exact everywhere.

``SEVEN_BIT`` builds the product's own per-token graph (byte for byte; the test checks it). Not adopted:
the uint8 form is exact but ran 0.6× the 7-bit form's speed
(results/experiments/int8-weight-bits/), so the product keeps its 7-bit weights and these forms live
here. ``experiments.int8_per_token --variants int8-per-token-s8 int8-per-token-u8`` builds through
``quantize_per_token``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from training.export.int8 import INT8_OPERATORS, int8_weights, outlying_matmuls, split_attention
from training.export.token_int8 import per_token_activations
from training.export.two_path import CHOICES, all_nodes, joined, unjoined, with_weights_beside_their_pass

SEVEN_BIT, EIGHT_BIT, UNSIGNED = "s7", "s8", "u8"
WEIGHT_FORMS = (SEVEN_BIT, EIGHT_BIT, UNSIGNED)
UNSIGNED_SHIFT = 128  # int8 w → uint8 w + 128, its zero point likewise
MATMUL_INTEGER_WEIGHT_INPUTS = (1, 3)  # MatMulInteger's B and b_zero_point


def quantize_per_token(source: Path, target: Path, weights: str) -> list[str]:
    """The fp32 graph ``source`` (one- or two-path ``model.onnx``) → per-token int8 with ``weights`` (one of
    ``WEIGHT_FORMS``) at ``target``, as ``quantize_int8`` writes it; returns the weight MatMuls kept fp32
    for their outlying inputs, in graph order."""
    if weights not in WEIGHT_FORMS:
        raise ValueError(f"weights {weights!r}: one of {WEIGHT_FORMS}")
    int8, kept = per_token_branches(onnx.load(str(source)), weights)
    onnx.save(with_weights_beside_their_pass(int8), str(target))
    return kept


def per_token_branches(model: Any, weights: str) -> tuple[Any, list[str]]:
    """``per_token_int8`` of each graph our ``If`` choices joined (a two-path model's nest too), joined
    again the same way (``training.export.int8.quantized_branches``)."""
    parts = unjoined(model)
    if parts is None:
        return per_token_int8(model, weights)
    choice = CHOICES[next(node.name for node in model.graph.node if node.op_type == "If")]
    (otherwise, otherwise_kept), (then, then_kept) = (per_token_branches(part, weights) for part in parts)
    return joined(choice, then, otherwise), [*otherwise_kept, *then_kept]


def per_token_int8(model: Any, weights: str) -> tuple[Any, list[str]]:
    """(a standalone graph with per-channel int8 ``weights`` and per-token activations, the weight MatMuls
    kept fp32): ``training.export.int8.quantized_and_kept``'s per-token steps."""
    split = split_attention(model, every=True)
    kept = outlying_matmuls(split)
    int8 = int8_weights(split, INT8_OPERATORS, keep_fp32=kept, seven_bit=weights == SEVEN_BIT)
    if weights == UNSIGNED:
        int8 = unsigned_weights(int8)
    return per_token_activations(int8), kept


def unsigned_weights(model: Any) -> Any:
    """Every ``MatMulInteger``'s int8 weight and weight zero point (initializers (N,) / (K, N) of the top
    graph) shifted by ``UNSIGNED_SHIFT`` into uint8: (w + 128) − (z + 128) = w − z, the same integer
    product, now computed by onnxruntime's U8U8 kernels. Raises if another node reads one of those
    initializers, or a MatMulInteger has int8 weights without an int8 zero point. In place; returned."""
    initializers = {init.name: init for init in model.graph.initializer}
    reads = [(node, position) for node in all_nodes(model.graph) for position in range(len(node.input))]
    shifted: set[str] = set()
    for node, position in reads:
        name = node.input[position]
        if name not in initializers or initializers[name].data_type != onnx.TensorProto.INT8:
            continue
        if node.op_type != "MatMulInteger" or position not in MATMUL_INTEGER_WEIGHT_INPUTS:
            raise ValueError(f"int8 initializer {name!r} is read by {node.op_type} {node.name!r} too")
        shifted.add(name)
    weightless = [
        node.name
        for node in all_nodes(model.graph)
        if node.op_type == "MatMulInteger"
        and node.input[1] in shifted
        and (len(node.input) <= max(MATMUL_INTEGER_WEIGHT_INPUTS) or node.input[3] not in shifted)
    ]
    if weightless:
        raise ValueError(f"MatMulInteger without an int8 weight zero point: {weightless}")
    for name in sorted(shifted):
        values = numpy_helper.to_array(initializers[name]).astype(np.int16) + UNSIGNED_SHIFT  # [1, 255]
        initializers[name].CopyFrom(numpy_helper.from_array(values.astype(np.uint8), name))
    return model
