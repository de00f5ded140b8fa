"""The int8 variant: int8 weights per output channel, activations quantized per call (one scale per token,
``training.export.token_int8``, or per tensor as shipped before), the scorers fp32, and the weight MatMuls
whose inputs carry outliers (found on random-id calibration batches) left fp32."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from retention_ort import open_session
from training.export.token_int8 import per_token_activations
from training.export.two_path import CHOICES, joined, scorer_node, unjoined, with_weights_beside_their_pass

INT8_OPERATORS = ["MatMul", "Attention"]  # weights int8; everything else (softmax, norms, gathers) fp32
ATTENTION_MASK_INPUT = 3  # com.microsoft.Attention's key mask (B, T) int32 (the unpruned pass's)
ATTENTION_BIAS_INPUT = 5  # com.microsoft.Attention's additive attention bias (padding, log-size)
# int8 activation scales: one per token (the product's: batch-invariant) or one per tensor (before).
PER_TOKEN, PER_TENSOR = "token", "tensor"
ACTIVATION_SCALES = (PER_TOKEN, PER_TENSOR)


def stays_fp32(node: str) -> bool:
    """The scorers stay fp32 (their scores decide which tokens survive), wherever the tracer put them: at
    the top (``/scorers.0/…``) or under a branch's prefix (``two_path.scorer_node``)."""
    return scorer_node(node)


def quantize_int8(source: Path, target: Path, activations: str = PER_TOKEN) -> list[str]:
    """int8 weights, one scale per output channel (per-tensor scales cost 0.94 → 0.99 cosine to fp32 on
    MiniLM), activations quantized per call; the scorers stay fp32.

    ``activations``: ``PER_TOKEN`` (the product's): each token's activations get a scale of their own and
    the weights are 7-bit, so a row's output depends on that row alone and the integer GEMM is exact on
    every x86 CPU (``training.export.token_int8``); ``PER_TENSOR``: onnxruntime's dynamic quantization as
    shipped before (one scale per activation tensor, i.e. per batch; 8-bit weights), kept for the
    benchmarks that compare the two.

    ``QAttention`` quantizes its input per tensor and has no attention-bias input, so every ``Attention``
    node is first split into its packed QKV ``MatMul`` (quantized like every weight) and a
    ``MultiHeadAttention`` (``split_attention``; per tensor, only the biased ones: an Attention with a
    plain key mask becomes ``QAttention``). Our graph's two branches are quantized as the standalone
    graphs they were traced as (onnxruntime's quantizer leaves casts it cannot type inside If branches)
    and joined again. Returns the weight MatMuls kept fp32 for their outlying inputs
    (``outlying_matmuls``), in graph order: what makes this int8 differ from one that quantizes every
    weight."""
    if activations not in ACTIVATION_SCALES:
        raise ValueError(f"activations {activations!r}: one of {ACTIVATION_SCALES}")
    int8, kept = quantized_branches(onnx.load(str(source)), activations)
    onnx.save(with_weights_beside_their_pass(int8), str(target))
    return kept


def quantized_branches(model: Any, activations: str = PER_TOKEN) -> tuple[Any, list[str]]:
    """``quantized_and_kept`` of each graph our ``If`` choices joined (a two-path model's nest too),
    joined again the same way."""
    parts = unjoined(model)
    if parts is None:
        return quantized_and_kept(model, activations)
    choice = CHOICES[next(node.name for node in model.graph.node if node.op_type == "If")]
    (otherwise, otherwise_kept), (then, then_kept) = (quantized_branches(part, activations) for part in parts)
    return joined(choice, then, otherwise), [*otherwise_kept, *then_kept]


def quantized(model: Any) -> Any:
    """``model`` with int8 weights (``quantize_int8``'s choices), as a new ModelProto."""
    return quantized_and_kept(model)[0]


def quantized_and_kept(model: Any, activations: str = PER_TOKEN) -> tuple[Any, list[str]]:
    """``quantized`` and the weight MatMuls it left fp32 (``outlying_matmuls``)."""
    per_token = activations == PER_TOKEN
    split = split_attention(model, every=per_token)
    kept = outlying_matmuls(split)
    int8 = int8_weights(split, INT8_OPERATORS, keep_fp32=kept, seven_bit=per_token)
    return (per_token_activations(int8) if per_token else int8), kept


def int8_weights(
    model: Any, operators: list[str], keep_fp32: Sequence[str] = (), seven_bit: bool = False
) -> Any:
    """Dynamic per-channel int8 weights of ``operators`` (the scorers and the nodes named in ``keep_fp32``
    excepted), as a new ModelProto; ``seven_bit``: |w| ≤ 64 (onnxruntime's ``reduce_range``, see
    ``training.export.token_int8``)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory(prefix="quantize-") as tmp:
        staged, out = Path(tmp) / "split.onnx", Path(tmp) / "int8.onnx"
        onnx.save(model, str(staged))
        quantize_dynamic(
            str(staged),
            str(out),
            weight_type=QuantType.QInt8,
            per_channel=True,
            reduce_range=seven_bit,
            op_types_to_quantize=operators,
            nodes_to_exclude=[
                *(node.name for node in model.graph.node if stays_fp32(node.name)),
                *keep_fp32,
            ],
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
        )
        return onnx.load(str(out))


# A weight MatMul whose input has values this many times its 99.9th percentile stays fp32: a token's int8
# scale is set by its largest value (one per tensor before per-token scales), so such outliers leave the
# bulk of the values a few of the 255 steps. all-mpnet-base-v2's FFN output projections in layers 7-11
# reach 25-48× (int8 cosine to fp32 0.89 with them, 0.99 without); every GEMM of MiniLM stays under 15×
# (docs/experiments/2026-11-27-mpnet-int8.md).
OUTLIER_RATIO = 20.0
OUTLIER_PERCENTILE = 99.9
# Calibration inputs: random token ids. The outlying GEMMs are a property of the weights, not of the text:
# random ids flag the same ones as real paragraphs (the study above), so export needs no data.
CALIBRATION_BATCH, CALIBRATION_TOKENS, CALIBRATION_CALLS, CALIBRATION_SEED = 8, 128, 2, 0


def outlying_matmuls(model: Any) -> list[str]:
    """The weight MatMuls of a standalone graph whose input carries outliers (max |x| over its
    ``OUTLIER_PERCENTILE``th percentile above ``OUTLIER_RATIO``), at ρ = 1 on random token ids."""
    ratios = input_outlier_ratios(model, calibration_batches(model))
    return [name for name, ratio in ratios.items() if ratio > OUTLIER_RATIO]


def input_outlier_ratios(model: Any, batches: Sequence[dict[str, np.ndarray]]) -> dict[str, float]:
    """Every weight MatMul (the scorers excepted) → max |x| of its input over ``batches`` divided by the
    mean over batches of |x|'s ``OUTLIER_PERCENTILE``th percentile, at ρ = 1. Real tokens only where a
    batch has an ``attention_mask``; feeds the graph does not take are left out."""
    weights = {init.name for init in model.graph.initializer}
    taps: dict[str, list[str]] = {}  # input tensor → the weight MatMuls that read it
    for node in model.graph.node:
        if node.op_type == "MatMul" and node.input[1] in weights and not stays_fp32(node.name):
            taps.setdefault(node.input[0], []).append(node.name)
    if not taps:
        return {}
    tapped = onnx.ModelProto()
    tapped.CopyFrom(model)
    tapped.graph.output.extend(
        onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None) for name in taps
    )
    peaks: dict[str, float] = {}
    bulk: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="calibrate-") as tmp:
        onnx.save(tapped, str(Path(tmp) / "tapped.onnx"))
        session = open_session(Path(tmp) / "tapped.onnx", intra_op_threads=0)
        names = [output.name for output in session.get_outputs()]
        wanted = {graph_input.name for graph_input in session.get_inputs()}
        for batch in batches:
            feeds = {**batch, "rho": np.ones(len(batch["input_ids"]), np.float32)}  # every row dense
            outputs = dict(
                zip(names, session.run(None, {k: v for k, v in feeds.items() if k in wanted}), strict=True)
            )
            real = batch.get("attention_mask")  # (B, T)
            for name in taps:
                values = np.abs(outputs[name])  # (B, T, width)
                if real is not None and values.shape[:2] == real.shape:
                    values = values[real.astype(bool)]  # (tokens, width)
                peaks[name] = max(peaks.get(name, 0.0), float(values.max()))
                bulk.setdefault(name, []).append(float(np.percentile(values, OUTLIER_PERCENTILE)))
    return {node: peaks[name] / float(np.mean(bulk[name])) for name, nodes in taps.items() for node in nodes}


def calibration_batches(model: Any) -> list[dict[str, np.ndarray]]:
    """``CALIBRATION_CALLS`` batches of random token ids for ``model``'s inputs: ids uniform over the
    vocabulary (the rows of the word-embedding table ``input_ids`` indexes), every token real, token
    types and protected masks zero."""
    shape = (CALIBRATION_BATCH, CALIBRATION_TOKENS)
    weights = {init.name for init in model.graph.initializer}
    inputs = [graph_input.name for graph_input in model.graph.input if graph_input.name not in weights]
    rng = np.random.default_rng(CALIBRATION_SEED)
    batches = []
    for _ in range(CALIBRATION_CALLS):
        batch = {name: np.zeros(shape, np.int64) for name in inputs if name != "rho"}
        batch["input_ids"] = rng.integers(0, vocabulary_size(model), shape).astype(np.int64)
        batch["attention_mask"] = np.ones(shape, np.int64)
        batches.append(batch)
    return batches


def vocabulary_size(model: Any) -> int:
    """Rows of the table a Gather or EmbedLayerNormalization reads with ``input_ids`` (the word
    embeddings), also through the Cast to int32 onnxruntime's optimizer puts before the latter."""
    tables = {init.name: init.dims[0] for init in model.graph.initializer if len(init.dims) == 2}
    ids = {"input_ids"}
    for node in model.graph.node:
        if node.op_type == "Cast" and node.input[0] in ids:
            ids.update(node.output)
        elif node.op_type == "Gather" and node.input[1] in ids and node.input[0] in tables:
            return int(tables[node.input[0]])
        elif node.op_type == "EmbedLayerNormalization" and node.input[0] in ids and node.input[2] in tables:
            return int(tables[node.input[2]])
    raise ValueError("no word-embedding table is read with input_ids")


def split_attention(model: Any, every: bool = True) -> Any:
    """``com.microsoft.Attention`` nodes, in the graph and in its If branches → MatMul(x, W_qkv)
    (B, T, 3d), Split into Q, K, V, and ``MultiHeadAttention``(Q, K, V, b_qkv, key mask or
    attention_bias=…): the same arithmetic, with the projection as a plain MatMul the quantizer can make
    int8 (per token). ``every``: each Attention node; else only those with an attention bias (an
    Attention with a plain key mask then becomes onnxruntime's per-tensor ``QAttention``). In place;
    returned."""
    _split_in_graph(model.graph, {init.name: init.dims for init in model.graph.initializer}, every)
    return model


def _split_in_graph(graph: Any, shapes: dict[str, Any], every: bool) -> None:
    from onnx import helper

    shapes = {**shapes, **{init.name: init.dims for init in graph.initializer}}
    rewritten = []
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                _split_in_graph(attribute.g, shapes, every)
        if node.op_type == "Identity" and node.input[0] in shapes:  # a weight the exporter stored once
            shapes[node.output[0]] = shapes[node.input[0]]
        inputs = list(node.input)
        biased = len(inputs) > ATTENTION_BIAS_INPUT and inputs[ATTENTION_BIAS_INPUT]
        if node.domain != "com.microsoft" or node.op_type != "Attention" or not (biased or every):
            rewritten.append(node)
            continue
        hidden, weight, bias = inputs[:3]
        width = shapes[weight][1] // 3
        heads = next(attr.i for attr in node.attribute if attr.name == "num_heads")
        packed, sizes = f"{node.name}/qkv", f"{node.name}/qkv_sizes"
        parts = [f"{node.name}/{part}" for part in ("query", "key", "value")]
        split_sizes = helper.make_tensor(sizes, onnx.TensorProto.INT64, [3], [width] * 3)
        key_mask = inputs[ATTENTION_MASK_INPUT] if len(inputs) > ATTENTION_MASK_INPUT else ""
        # MultiHeadAttention's inputs: query, key, value, bias, key_padding_mask, attention_bias
        masks = [key_mask, inputs[ATTENTION_BIAS_INPUT] if biased else ""]
        while masks and not masks[-1]:
            masks.pop()
        rewritten += [
            helper.make_node("Constant", [], [sizes], name=f"{node.name}/Sizes", value=split_sizes),
            helper.make_node("MatMul", [hidden, weight], [packed], name=f"{node.name}/MatMul"),
            helper.make_node("Split", [packed, sizes], parts, name=f"{node.name}/Split", axis=2),
            helper.make_node(
                "MultiHeadAttention",
                [*parts, bias, *masks],
                [node.output[0]],
                name=f"{node.name}/MultiHeadAttention",
                domain="com.microsoft",
                num_heads=heads,
            ),
        ]
    del graph.node[:]
    graph.node.extend(rewritten)
