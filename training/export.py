"""Export a trained run to a model directory the service reads (``retention_core.contract``).

Every export is validated against torch on a grid of batch sizes, ragged lengths and ρ values and
raises ``ExportValidationError`` on any mismatch, before anything is written to the target directory.
The graph of every task is the same wrapper: the task's registered inputs (``retention_core.tasks``)
become ``forward_pruned`` arguments by name.

The directory is written in a hidden sibling (``.<name>.staging-…``, which the service's scan skips),
measured there (quality curves, speed: ``export_model``'s ``measure``), given its one final manifest and
swapped into place in one rename, so the target is always either the old model or the new one, complete.
"""

from __future__ import annotations

import ctypes
import errno
import itertools
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import onnx
import torch
from torch import nn

from retention_core import contract as C
from retention_core.onnx import open_session
from retention_core.tasks import TaskSpec
from retention_torch.forward import Head
from retention_torch.runner import Runner
from retention_torch.two_path import TwoPathRunner, branch_states, prefixed
from retention_torch.weights import from_state
from training import selection as R
from training.encoders import POSITIONS_AFTER_PADDING, SOURCE_MODEL_IDS
from training.fit import manifest_schedule
from training.model import BranchPaths, RetentionModel
from training.recipes import Recipe
from training.token_int8 import per_token_activations

OPSET = 17
LOGIT_ATOL = 1e-4  # ORT matches torch to ~1e-6 in fp32; 1e-4 leaves room for kernel differences
VALIDATION_BATCH_SIZES = (1, 3)
VALIDATION_LENGTHS = (4, 9, 33)
VALIDATION_RHOS = (0.1, 0.3, 0.5, 1.0)
VALIDATION_SEED = 1234


class ExportValidationError(RuntimeError):
    """The exported graph disagrees with torch."""


# Graph inputs that are not positional ``forward_pruned`` arguments → (keyword, conversion).
PRUNED_KEYWORDS = {
    "protected_mask": ("protected", lambda tensor: tensor.bool()),  # int64 over the wire, bool inside
    "token_type_ids": ("token_type_ids", lambda tensor: tensor),
}
PRUNED_POSITIONAL = ("input_ids", "attention_mask", "rho")


class RetentionGraph(nn.Module):
    """The exported graph of any task: its inputs, in the task's order → (main output, kept_counts (B, P),
    survival_depth (B, T)).

    Token heads (QA, summarization) have Drop-and-Restore baked in: every token's last state is
    scattered back before the head.
    """

    def __init__(
        self,
        model: RetentionModel,
        input_names: Sequence[str],
        unpruned: bool = False,
        paths: BranchPaths = "by_batch",
    ) -> None:
        super().__init__()
        unknown = set(input_names) - set(PRUNED_POSITIONAL) - set(PRUNED_KEYWORDS)
        if unknown:
            raise ValueError(
                f"task {model.task!r}: no forward_pruned argument for graph inputs {sorted(unknown)}"
            )
        self.model = model
        self.input_names = tuple(input_names)
        self.unpruned = unpruned  # the all-ρ ≥ 1 branch: forward_unpruned (ρ and protected unused)
        self.paths = paths  # a two-path model's choice of path(s) (``RetentionModel.forward_pruned``)

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        named = dict(zip(self.input_names, inputs, strict=True))
        if self.unpruned:
            out = self.model.forward_unpruned(
                named["input_ids"], named["attention_mask"], named.get("token_type_ids")
            )
            return out.logits, out.kept_counts, out.survival_depth
        keywords = {
            keyword: convert(named[name])
            for name, (keyword, convert) in PRUNED_KEYWORDS.items()
            if name in named
        }
        out = self.model.forward_pruned(
            *(named[name] for name in PRUNED_POSITIONAL), **keywords, paths=self.paths
        )
        return out.logits, out.kept_counts, out.survival_depth


def graph_for(
    model: RetentionModel, unpruned: bool = False, paths: BranchPaths = "by_batch"
) -> RetentionGraph:
    """The graph of the model's task (``model.spec``, the registry entry it was built from)."""
    # eval() on the wrapper: the exporter restores the wrapper's mode on every child afterwards.
    return RetentionGraph(model, [spec.name for spec in model.spec.inputs], unpruned, paths).eval()


def dynamic_axes(task: TaskSpec) -> dict[str, dict[int, str]]:
    """The named (non-numeric) axes of the task's graph inputs and exported outputs, per tensor."""
    specs = (*task.inputs, *task.exported_outputs)
    return {spec.name: {i: axis for i, axis in enumerate(spec.axes) if not axis.isdigit()} for spec in specs}


def export_onnx(model: RetentionModel, path: Path, vocab_size: int) -> None:
    """The served graph: ``If`` every row asks ρ ≥ 1, the unpruned branch (the dense model's operators
    and nothing else), else the pruned pass; each traced with the TorchScript exporter (it keeps the
    data-dependent TopK k as a tensor) and joined by ``with_unpruned_branch``.

    A model whose pruned branch has weights of its own (``pruned_backbone``) gets one more choice below
    the first: ``If`` some row asks ρ ≥ 1 (a mixed batch), both paths over every row, each row taking
    its own (``with_both_paths_branch``), else the copy's pruned pass alone. So ρ = 1 runs the original's
    weights and operators only, and a batch at ρ < 1 pays for the copy's pruned pass only; the weights
    only that side reads live in its branch (``with_weights_beside_their_pass``)."""
    model = model.eval()
    with tempfile.TemporaryDirectory(prefix="export-") as tmp:
        pruned, unpruned = Path(tmp) / "pruned.onnx", Path(tmp) / "unpruned.onnx"
        trace_onnx(graph_for(model, paths="pruned"), pruned, vocab_size)
        trace_onnx(graph_for(model, unpruned=True), unpruned, vocab_size)
        below = onnx.load(str(pruned))
        if model.pruned_backbone is not None:
            both = Path(tmp) / "both.onnx"
            trace_onnx(graph_for(model, paths="both"), both, vocab_size)
            below = with_both_paths_branch(below, onnx.load(str(both)))
        joined = with_unpruned_branch(below, onnx.load(str(unpruned)))
    onnx.save(with_weights_beside_their_pass(joined), str(path))


def trace_onnx(graph: RetentionGraph, path: Path, vocab_size: int) -> None:
    task = graph.model.spec
    example = example_inputs(batch=2, length=8, vocab_size=vocab_size, rhos=(0.5, 1.0), seed=0)
    with torch.no_grad():
        torch.onnx.export(
            graph,
            tuple(example[spec.name] for spec in task.inputs),
            str(path),
            input_names=[spec.name for spec in task.inputs],
            output_names=[spec.name for spec in task.exported_outputs],
            dynamic_axes=dynamic_axes(task),
            opset_version=OPSET,
            dynamo=False,
        )


UNPRUNED_SCOPE = "unpruned/"  # names inside the unpruned branch (values, nodes, its own weights)
PRUNED_SCOPE = "pruned/"  # the pruned branch's outputs (its inner names are the traced ones)


@dataclass(frozen=True)
class Choice:
    """One ``If`` the export puts over two traced graphs: ``reduce``(rho) ≥ 1 picks ``then``; the names
    of its values and nodes (unique in the whole model: a second choice nests in the first's branch)."""

    reduce: str  # ReduceMin: every row asks ρ ≥ 1; ReduceMax: some row does
    reduced: str
    one: str
    condition: str
    node: str
    then_scope: str  # the then branch's values, nodes, outputs and its own weights
    else_outputs: str  # the else branch's outputs (its inner names are the traced ones)


EVERY_ROW_DENSE = Choice(
    "ReduceMin",
    "rho_min",
    "rho_one",
    "every_rho_is_1",
    "unpruned_if_every_rho_is_1",
    UNPRUNED_SCOPE,
    PRUNED_SCOPE,
)
SOME_ROW_DENSE = Choice(  # below EVERY_ROW_DENSE, in a model whose pruned branch has weights of its own
    "ReduceMax", "rho_max", "rho_one_of_max", "some_rho_is_1", "both_paths_if_some_rho_is_1", "both/", "copy/"
)
CHOICES = {choice.node: choice for choice in (EVERY_ROW_DENSE, SOME_ROW_DENSE)}


def with_unpruned_branch(pruned: Any, unpruned: Any) -> Any:
    """One model: ``If(ReduceMin(rho) ≥ 1, then=unpruned graph, else=pruned graph)``, the two traced
    graphs as its branches. Weights live once, in the outer graph: the unpruned branch reads the pruned
    graph's initializer of identical bytes where there is one (every weight of the dense model), its own
    otherwise. The outer graph keeps the pruned graph's inputs and outputs, names and types."""
    return joined(EVERY_ROW_DENSE, unpruned, pruned)


def with_both_paths_branch(pruned: Any, both: Any) -> Any:
    """A two-path model's ρ < 1 side: ``If(ReduceMax(rho) ≥ 1, then=both paths, else=the copy's pruned
    pass)``; weights once, as in ``with_unpruned_branch`` (the copy's are the outer graph's)."""
    return joined(SOME_ROW_DENSE, both, pruned)


def joined(choice: Choice, then: Any, otherwise: Any) -> Any:
    """``If(choice.reduce(rho) ≥ 1, then, otherwise)`` as one model with ``otherwise``'s inputs, outputs
    and initializers, plus ``then``'s initializers no ``otherwise`` initializer has the bytes of."""
    from onnx import helper

    outer = otherwise.graph
    inputs = {graph_input.name for graph_input in outer.input}
    shared = {_initializer_key(init): init.name for init in outer.initializer}
    renames: dict[str, str] = {init.name: init.name for init in outer.initializer}
    then_renames: dict[str, str] = {}
    lifted = []
    for init in then.graph.initializer:
        target = shared.get(_initializer_key(init))
        if target is None:
            target = choice.then_scope + init.name
            copy = onnx.TensorProto()
            copy.CopyFrom(init)
            copy.name = target
            lifted.append(copy)
        then_renames[init.name] = target
    one = helper.make_tensor("one", onnx.TensorProto.FLOAT, [], [1.0])
    nodes = [
        helper.make_node(choice.reduce, ["rho"], [choice.reduced], name=choice.reduced, keepdims=0),
        helper.make_node("Constant", [], [choice.one], name=choice.one, value=one),
        helper.make_node(
            "GreaterOrEqual", [choice.reduced, choice.one], [choice.condition], name=choice.condition
        ),
        helper.make_node(
            "If",
            [choice.condition],
            [output.name for output in outer.output],
            name=choice.node,
            then_branch=_branch(then.graph, inputs, then_renames, choice.then_scope, choice.then_scope),
            else_branch=_branch(outer, inputs, renames, "", choice.else_outputs),
        ),
    ]
    graph = helper.make_graph(
        nodes, outer.name, list(outer.input), list(outer.output), [*outer.initializer, *lifted]
    )
    model = helper.make_model(graph, opset_imports=list(otherwise.opset_import))
    model.ir_version = otherwise.ir_version
    return model


def with_weights_beside_their_pass(model: Any) -> Any:
    """A two-path graph with the initializers only its ρ < 1 side reads (the copy's weights, the scorers)
    moved from the outer graph into the outer ``If``'s else branch, one level above the copy's pass: left
    two levels up they were not prepacked (the pass took 1.06–1.07× the frozen graph's seconds, as the
    frozen graph does with prepacking off, and ran other kernels: outputs ~3e-7 apart;
    docs/experiments/2026-11-28-pruned-branch.md, "The two-path graph's speed"). A one-path graph is
    returned as it is (its bytes unchanged)."""
    reads = branch_reads(model)
    if reads is None:
        return model
    placed = onnx.ModelProto()
    placed.CopyFrom(model)
    choice = {node.name: node for node in placed.graph.node}[EVERY_ROW_DENSE.node]
    outside = {value for node in placed.graph.node if node is not choice for value in node.input}
    outside |= {value for node in all_nodes(branch_of(choice, "then_branch")) for value in node.input}
    below = branch_of(choice, "else_branch")
    below_reads = {value for node in all_nodes(below) for value in node.input}
    moving = {init.name for init in placed.graph.initializer} & below_reads - outside
    staying = [init for init in placed.graph.initializer if init.name not in moving]
    below.initializer.extend(init for init in placed.graph.initializer if init.name in moving)
    del placed.graph.initializer[:]
    placed.graph.initializer.extend(staying)
    return placed


def _initializer_key(init: Any) -> tuple[int, tuple[int, ...], str]:
    """An initializer's identity by content: dtype, shape and a digest of its values."""
    import hashlib

    from onnx import numpy_helper

    digest = hashlib.sha1(numpy_helper.to_array(init).tobytes()).hexdigest()
    return init.data_type, tuple(init.dims), digest


def _branch(graph: Any, inputs: set[str], weights: dict[str, str], scope: str, output_scope: str) -> Any:
    """``graph``'s nodes as an If branch: outer inputs and weights referenced by their outer names,
    every other value under ``scope``, the outputs under ``output_scope`` (a branch may not reuse the
    outer graph's names)."""
    from onnx import helper

    outputs = {output.name for output in graph.output}

    def name_of(value: str) -> str:
        if not value or value in inputs:
            return value
        if value in weights:
            return weights[value]
        return (output_scope if value in outputs else scope) + value

    nodes = []
    for node in graph.node:
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        copy.name = scope + node.name
        copy.input[:] = [name_of(value) for value in node.input]
        copy.output[:] = [name_of(value) for value in node.output]
        nodes.append(copy)
    branch_outputs = []
    for output in graph.output:
        renamed = onnx.ValueInfoProto()
        renamed.CopyFrom(output)
        renamed.name = name_of(output.name)
        branch_outputs.append(renamed)
    return helper.make_graph(nodes, f"{output_scope.strip('/')}_branch", [], branch_outputs)


def example_inputs(
    batch: int, length: int, vocab_size: int, rhos: Sequence[float], seed: int
) -> dict[str, torch.Tensor]:
    """Ragged right-padded inputs: row i has length - i·stride real tokens (at least 2). Every graph
    input any task declares, by name; a task's graph takes the ones its ``TaskSpec.inputs`` names. The
    trace, the validation grid, the speed rows (``training.speed``) and the dense baseline
    (``training.dense_graph``) all start from these."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(5, vocab_size, (batch, length), generator=generator)  # (B, T)
    attention_mask = torch.ones(batch, length, dtype=torch.long)  # (B, T)
    for row in range(batch):
        real = max(2, length - row * max(1, length // (batch + 1)))
        attention_mask[row, real:] = 0
        input_ids[row, real:] = 0
    rho = torch.tensor([rhos[i % len(rhos)] for i in range(batch)], dtype=torch.float32)  # (B,)
    # QA-style pair: the first third of each row (at least [CLS]) is the protected question segment.
    positions = torch.arange(length).unsqueeze(0)  # (1, T)
    question = positions < max(1, length // 3)  # (1, T)
    token_type_ids = (~question).to(torch.long).expand(batch, -1) * attention_mask  # (B, T)
    protected_mask = question.to(torch.long).expand(batch, -1) * attention_mask  # (B, T)
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "rho": rho,
        "token_type_ids": token_type_ids.contiguous(),
        "protected_mask": protected_mask.contiguous(),
    }


@dataclass(frozen=True)
class ParityReport:
    cases: int
    max_abs_diff: float


def validate_onnx(model: RetentionModel, onnx_path: Path, vocab_size: int) -> ParityReport:
    """Compare ORT with torch on the grid; raise on mismatch of logits, kept counts or survival depth."""
    graph = graph_for(model)
    session = open_session(onnx_path)
    worst, cases = 0.0, 0
    rho_sets = [(rho,) for rho in VALIDATION_RHOS] + [VALIDATION_RHOS]  # uniform and mixed budgets
    for batch, length, rhos in itertools.product(VALIDATION_BATCH_SIZES, VALIDATION_LENGTHS, rho_sets):
        example = example_inputs(batch, length, vocab_size, rhos, seed=VALIDATION_SEED + cases)
        with torch.no_grad():
            expected = graph(*(example[name] for name in graph.input_names))
        feeds = {name: example[name].numpy() for name in graph.input_names}
        logits, counts, depth = session.run(None, feeds)
        where = f"batch={batch} length={length} rho={rhos}"
        _check_exact("kept counts", counts, expected[1], where)
        _check_exact("survival depth", depth, expected[2], where)
        diff = float(np.max(np.abs(logits - expected[0].numpy())))
        if diff > LOGIT_ATOL:
            raise ExportValidationError(f"logits differ by {diff:.2e} > {LOGIT_ATOL:.0e} at {where}")
        worst, cases = max(worst, diff), cases + 1
    return ParityReport(cases=cases, max_abs_diff=worst)


def _check_exact(what: str, onnx_value: np.ndarray, torch_value: torch.Tensor, where: str) -> None:
    """Integer outputs must match torch exactly."""
    if not np.array_equal(onnx_value, torch_value.numpy()):
        raise ExportValidationError(
            f"{what} differ at {where}: onnx={onnx_value.tolist()} torch={torch_value.tolist()}"
        )


# ---------------------------------------------------------------------- the torch backend's weights
ACTIVATIONS: dict[str, C.Activation] = {
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "relu": "relu",
}


def torch_architecture(model: RetentionModel) -> C.Architecture:
    """What ``retention_torch`` needs beside the tensors to run ``model``."""
    backbone = model.backbone
    info, config = backbone.info, backbone.config
    act = getattr(config, "hidden_act", getattr(config, "activation", None))
    if act not in ACTIVATIONS:
        raise ExportValidationError(
            f"the torch backend has no {act!r} activation; have {sorted(ACTIVATIONS)}"
        )
    embeddings = backbone.embeddings
    relative = backbone.relative_attention_bias
    return C.Architecture(
        family=info.family,
        hidden_size=info.hidden_size,
        num_layers=info.num_layers,
        num_heads=info.num_heads,
        intermediate_size=info.intermediate_size,
        activation=ACTIVATIONS[act],
        layer_norm_eps=float(backbone.views[0].attn_norm.eps),
        positions="after_padding" if info.family in POSITIONS_AFTER_PADDING else "absolute",
        padding_idx=int(getattr(embeddings, "padding_idx", None) or getattr(config, "pad_token_id", 0) or 0),
        relative_attention_buckets=None if relative is None else int(relative.num_embeddings),
        scorer_size=model.config.scorer_size,
        ema_decay=model.config.ema_decay,
    )


def torch_state(model: RetentionModel) -> dict[str, torch.Tensor]:
    """Every tensor ``retention_torch.weights`` reads, under its names: QKV packed, the HF family's own
    names gone; a two-path model's copy of the encoder again under ``retention_torch.two_path``'s prefix
    (the scorers and the head are one set)."""
    state = encoder_state(model.backbone)
    for i, scorer in enumerate(cast(list[R.RetentionScorer], list(model.scorers))):
        state[f"scorers.{i}.W.weight"], state[f"scorers.{i}.W.bias"] = scorer.W.weight, scorer.W.bias
        state[f"scorers.{i}.U.weight"] = scorer.U.weight
        state[f"scorers.{i}.v.weight"], state[f"scorers.{i}.v.bias"] = scorer.v.weight, scorer.v.bias
    for name, parameter in model.head.named_parameters():  # sequence: dense, out; token: out; pooled: none
        state[f"head.{name}"] = parameter
    if model.pruned_backbone is not None:  # the copy's tensors, but those it shares with the original
        state |= prefixed(copy_only(encoder_state(model.pruned_backbone), encoder_state(model.backbone)))
    return {name: tensor.detach().float().contiguous().cpu() for name, tensor in state.items()}


def copy_only(copy: dict[str, torch.Tensor], original: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The copy's tensors that differ from the original's (a table it keeps as the original's,
    ``copy_embeddings: original``, is stored once: ``retention_torch.two_path.branch_states`` reads the
    original's in its place)."""
    return {name: tensor for name, tensor in copy.items() if not torch.equal(tensor, original[name])}


def encoder_state(backbone: Any) -> dict[str, torch.Tensor]:
    """An encoder's tensors (embeddings, layers, the relative-position table) under the torch backend's
    names."""
    embeddings = backbone.embeddings
    state = {
        "embeddings.word": embeddings.word_embeddings.weight,
        "embeddings.position": embeddings.position_embeddings.weight,
        "embeddings.norm.weight": embeddings.LayerNorm.weight,
        "embeddings.norm.bias": embeddings.LayerNorm.bias,
    }
    if hasattr(embeddings, "token_type_embeddings"):
        state["embeddings.token_type"] = embeddings.token_type_embeddings.weight
    for i, view in enumerate(backbone.views):
        state[f"layers.{i}.qkv.weight"] = torch.cat([view.query.weight, view.key.weight, view.value.weight])
        state[f"layers.{i}.qkv.bias"] = torch.cat([view.query.bias, view.key.bias, view.value.bias])
        for name, module in (
            ("out", view.attn_out),
            ("attn_norm", view.attn_norm),
            ("ffn_in", view.ffn_in),
            ("ffn_out", view.ffn_out),
            ("ffn_norm", view.ffn_norm),
        ):
            state[f"layers.{i}.{name}.weight"] = module.weight
            state[f"layers.{i}.{name}.bias"] = module.bias
    if backbone.relative_attention_bias is not None:
        state["relative_attention_bias"] = backbone.relative_attention_bias.weight
    return state


def torch_head(model: RetentionModel) -> Head:
    return Head(model.spec.head, model.config.pooling, model.last_layer_queries)


def export_torch_weights(model: RetentionModel, staging: Path, vocab_size: int) -> C.TorchWeights:
    """Write ``weights.safetensors`` and check the torch backend's forward on it against the staged
    ``model.onnx`` on the export's validation grid: main output within ``LOGIT_ATOL``, kept counts and
    every token's survival depth (which tokens entered which layer) equal. Raises
    ``ExportValidationError`` otherwise."""
    from safetensors.torch import load_file, save_file

    path = staging / C.WEIGHTS_FILE
    save_file(torch_state(model), str(path))
    architecture = torch_architecture(model)
    runner = torch_runner(model, load_file(str(path)), architecture)  # what the service reads
    session = open_session(staging / C.MODEL_FILE)
    names = [spec.name for spec in model.spec.inputs]
    worst, cases = 0.0, 0
    rho_sets = [(rho,) for rho in VALIDATION_RHOS] + [VALIDATION_RHOS]
    for batch, length, rhos in itertools.product(VALIDATION_BATCH_SIZES, VALIDATION_LENGTHS, rho_sets):
        example = example_inputs(batch, length, vocab_size, rhos, seed=VALIDATION_SEED + cases)
        feeds = {name: example[name].numpy() for name in names}
        main, counts, depth = session.run(None, feeds)
        ours = runner.run(feeds)
        where = f"torch weights, batch={batch} length={length} rho={rhos}"
        _check_exact("kept counts", counts, torch.from_numpy(ours.kept_counts), where)
        _check_exact("survival depth", depth, torch.from_numpy(ours.survival_depth), where)
        diff = float(np.max(np.abs(main - ours.main)))
        if diff > LOGIT_ATOL:
            raise ExportValidationError(f"outputs differ by {diff:.2e} > {LOGIT_ATOL:.0e} at {where}")
        worst, cases = max(worst, diff), cases + 1
    parity = C.TorchParity(cases=cases, max_abs_diff=worst, kept_tokens_equal=True)
    return C.TorchWeights(architecture=architecture, bytes=path.stat().st_size, parity=parity)


def torch_runner(model: RetentionModel, state: dict[str, torch.Tensor], architecture: C.Architecture) -> Any:
    """The torch backend's forward over ``state`` (both paths' runners for a two-path model), eager."""
    original, copy = branch_states(state)

    def runner(path_state: dict[str, torch.Tensor]) -> Runner:
        weights = from_state(path_state, architecture, model.spec.head)
        schedule = manifest_schedule(model)
        return Runner(weights, schedule, torch_head(model), model_max_length(model), graphs=False)

    return runner(original) if copy is None else TwoPathRunner(runner(original), runner(copy))


def model_max_length(model: RetentionModel) -> int:
    return int(model.backbone.info.max_positions)


INT8_OPERATORS = ["MatMul", "Attention"]  # weights int8; everything else (softmax, norms, gathers) fp32
FP32_NODE_SCOPES = ("/scorers.",)  # the scorers stay fp32: their scores decide which tokens survive
ATTENTION_MASK_INPUT = 3  # com.microsoft.Attention's key mask (B, T) int32 (the unpruned pass's)
ATTENTION_BIAS_INPUT = 5  # com.microsoft.Attention's additive attention bias (padding, log-size)
# int8 activation scales: one per token (the product's: batch-invariant) or one per tensor (before).
PER_TOKEN, PER_TENSOR = "token", "tensor"
ACTIVATION_SCALES = (PER_TOKEN, PER_TENSOR)


def stays_fp32(node: str) -> bool:
    """A node of ``FP32_NODE_SCOPES`` wherever the tracer put it: at the top (``/scorers.0/…``) or under a
    branch's prefix (the two-path graph's mixed-batch pass: ``both//scorers.0/…``)."""
    return any(scope in node for scope in FP32_NODE_SCOPES)


def quantize_int8(source: Path, target: Path, activations: str = PER_TOKEN) -> list[str]:
    """int8 weights, one scale per output channel (per-tensor scales cost 0.94 → 0.99 cosine to fp32 on
    MiniLM), activations quantized per call; the scorers stay fp32.

    ``activations``: ``PER_TOKEN`` (the product's): each token's activations get a scale of their own and
    the weights are 7-bit, so a row's output depends on that row alone and the integer GEMM is exact on
    every x86 CPU (``training.token_int8``); ``PER_TENSOR``: onnxruntime's dynamic quantization as
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
    ``training.token_int8``)."""
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


def unjoined(model: Any) -> tuple[Any, Any] | None:
    """The two standalone graphs ``joined`` joined (else, then: pruned and unpruned for
    ``with_unpruned_branch``), each with the outer inputs, the outer outputs' names and the weights its
    nodes (and their branches) read; None for a graph without one of our ``If`` choices."""
    from onnx import helper

    outer = model.graph
    choices = [node for node in outer.node if node.op_type == "If"]
    if len(choices) != 1 or choices[0].name not in CHOICES:
        return None
    branches = {attribute.name: attribute.g for attribute in choices[0].attribute}
    weights = {init.name: init for init in outer.initializer}
    standalone = []
    for key in ("else_branch", "then_branch"):
        branch = branches[key]
        names = {output.name: final.name for output, final in zip(branch.output, outer.output, strict=True)}
        nodes = []
        for node in branch.node:
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            copy.input[:] = [names.get(value, value) for value in node.input]
            copy.output[:] = [names.get(value, value) for value in node.output]
            nodes.append(copy)
        read = {value for node in nodes for inner in all_nodes_of(node) for value in inner.input}
        graph = helper.make_graph(
            nodes,
            branch.name,
            list(outer.input),
            list(outer.output),
            # the branch's own weights (with_weights_beside_their_pass), then the outer ones it reads
            [*branch.initializer, *(weights[name] for name in weights if name in read)],
        )
        part = helper.make_model(graph, opset_imports=list(model.opset_import))
        part.ir_version = model.ir_version
        standalone.append(part)
    return standalone[0], standalone[1]


def all_nodes(graph: Any) -> Iterator[Any]:
    """Every node of ``graph`` and of the graphs its nodes hold (If branches), depth first."""
    for node in graph.node:
        yield from all_nodes_of(node)


def all_nodes_of(node: Any) -> Iterator[Any]:
    """``node`` and every node of the graphs it holds (an If's branches), depth first."""
    yield node
    for attribute in node.attribute:
        if attribute.type == onnx.AttributeProto.GRAPH:
            yield from all_nodes(attribute.g)


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


def save_serving_tokenizer(tokenizer: Any, path: Path) -> None:
    """tokenizer.json without padding/truncation: the service pads per batch and truncates by policy."""
    from tokenizers import Tokenizer

    backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    backend.no_padding()
    backend.no_truncation()
    backend.save(str(path))


def versions() -> dict[str, str]:
    import onnx
    import onnxruntime
    import transformers

    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "onnx": onnx.__version__,
        "onnxruntime": onnxruntime.__version__,
        "opset": str(OPSET),
    }


def embedding_info(model: RetentionModel, recipe: Recipe) -> C.EmbeddingInfo | None:
    """A pooled head's vector: the model's pooling (mean, or [CLS]) of the final states, normalised by
    default unless the retrofitted model's sentence-transformers config has no Normalize module."""
    if model.spec.head != "pooled":
        return None
    normalize = recipe.retrofit.normalize if recipe.retrofit is not None else True
    return C.EmbeddingInfo(
        pooling=model.config.pooling, normalize=normalize, dimensions=model.backbone.info.hidden_size
    )


def source_model_names(backbone: str) -> list[str]:
    """The names users know an embedding retrofit's source model by: its hub id and short name."""
    hub_id = SOURCE_MODEL_IDS.get(backbone)
    return [] if hub_id is None else [hub_id, hub_id.split("/")[-1]]


def build_manifest(
    model: RetentionModel,
    recipe: Recipe,
    name: str,
    variants: dict[str, C.Variant],
    quality: C.QualityCurve | None,
) -> C.Manifest:
    info = model.backbone.info
    task = model.spec
    default_rho, default_rho_rule = C.choose_default_rho(quality)  # recipe.rho.default no longer decides
    return C.Manifest(
        name=name,
        task=task.name,
        labels=list(recipe.labels),
        backbone=C.Backbone(
            name_or_path=recipe.backbone,
            family=info.family,
            num_layers=info.num_layers,
            hidden_size=info.hidden_size,
            num_heads=info.num_heads,
            intermediate_size=info.intermediate_size,
        ),
        max_length=min(recipe.max_length, info.max_positions),
        default_rho=default_rho,
        default_rho_rule=default_rho_rule,
        schedule=manifest_schedule(model),
        variants=variants,
        inputs=list(task.inputs),
        outputs=list(task.exported_outputs),
        training={"recipe": json.loads(recipe.model_dump_json()), "dataset": recipe.dataset.name},
        quality=quality,
        embedding=embedding_info(model, recipe),
        aliases=source_model_names(recipe.backbone) if task.head == "pooled" else [],
        versions=versions(),
    )


# (staging directory, its manifest so far) → the manifest with what was measured on the staged graphs
Measure = Callable[[Path, C.Manifest], C.Manifest]


def export_model(
    model: RetentionModel,
    recipe: Recipe,
    tokenizer: Any,
    out_dir: Path,
    name: str | None = None,
    int8: bool = False,
    quality: C.QualityCurve | None = None,
    measure: Measure | None = None,
) -> C.Manifest:
    """Export and validate into a hidden sibling of ``out_dir``, measure it there, write its manifest
    once, then swap it into place.

    ``measure`` runs on the staging directory before the swap, not on ``out_dir`` after it: a service
    hot-reloading ``out_dir`` must never load a model twice or read a manifest rewritten in place, and a
    crash while measuring must leave the previous model (or nothing), never a model without its curve.

    The task is the model's (``model.spec``, resolved from the registry once, when the model was built):
    graph, validation and manifest all read that one ``TaskSpec``, and the recipe must name the same task.
    """
    if recipe.task != model.spec.name:
        raise ValueError(
            f"recipe {recipe.name!r} is for task {recipe.task!r}, the model for {model.spec.name!r}"
        )
    model = model.eval()
    vocab_size = model.backbone.info_vocab_size
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.staging-", dir=out_dir.parent))
    try:
        export_onnx(model, staging / C.MODEL_FILE, vocab_size)
        validate_onnx(model, staging / C.MODEL_FILE, vocab_size)
        # The torch backend's forward runs one set of encoder weights: a two-path model is served by
        torch_weights = export_torch_weights(model, staging, vocab_size)
        variants = {"fp32": C.Variant(file=C.MODEL_FILE, precision="fp32")}
        if int8:
            quantize_int8(staging / C.MODEL_FILE, staging / C.INT8_MODEL_FILE)
            variants["int8"] = C.Variant(file=C.INT8_MODEL_FILE, precision="int8")
        save_serving_tokenizer(tokenizer, staging / C.TOKENIZER_FILE)
        manifest = build_manifest(model, recipe, name or recipe.name, variants, quality)
        manifest = manifest.model_copy(
            update={
                "torch_weights": torch_weights,
                "pruned_branch": (
                    None if model.pruned_backbone is None else pruned_branch_info(model, staging, variants)
                ),
            }
        )
        if measure is not None:
            manifest = with_default_rho(measure(staging, manifest))  # the measured curve decides it
        manifest.write(staging)
        C.Manifest.read(staging)  # the service's reader accepts what we wrote, before anyone can see it
        os.chmod(staging, 0o777 & ~current_umask())  # mkdtemp's 0700 would hide the model from other users
        install_directory(staging, out_dir)
    finally:
        if staging.exists():  # failed before the swap, or holds the replaced model after it
            shutil.rmtree(staging)
    return manifest


def pruned_branch_info(
    model: RetentionModel, staging: Path, variants: dict[str, C.Variant]
) -> C.PrunedBranch:
    """What a two-path model costs beyond its original: the copy's parameters, and per variant the bytes
    of the weights only the copy's pass reads (``copy_only_bytes``)."""
    assert model.pruned_backbone is not None
    originals = dict(model.backbone.named_parameters())
    return C.PrunedBranch(
        parameters=sum(  # a tensor the copy keeps as the original's is stored once: not the copy's
            param.numel()
            for name, param in model.pruned_backbone.named_parameters()
            if not torch.equal(param, originals[name])
        ),
        bytes={
            name: copy_only_bytes(onnx.load(str(staging / variant.file)))
            for name, variant in variants.items()
        },
    )


def branch_reads(model: Any) -> tuple[set[str], set[str]] | None:
    """(the initializers the copy's pruned pass reads, the scorers' excepted; those the ρ = 1 branch
    reads) of a two-path graph, fp32 or int8; None for a one-path graph. Traced node names do not tell
    the copy's operators from the original's (both are ``/layers.N/…``): the branches do."""
    outer = {node.name: node for node in model.graph.node}.get(EVERY_ROW_DENSE.node)
    if outer is None:
        return None
    unpruned, below = (branch_of(outer, key) for key in ("then_branch", "else_branch"))
    inner = {node.name: node for node in below.node}.get(SOME_ROW_DENSE.node)
    if inner is None:
        return None
    copy_pass = branch_of(inner, "else_branch")
    copy_reads = {value for node in all_nodes(copy_pass) if not stays_fp32(node.name) for value in node.input}
    return copy_reads, {value for node in all_nodes(unpruned) for value in node.input}


def branch_of(node: Any, key: str) -> Any:
    return next(attribute.g for attribute in node.attribute if attribute.name == key)


def copy_only_bytes(model: Any) -> int:
    """Bytes of the initializers the copy's pruned pass reads and the ρ = 1 branch does not: the copy's
    weights (an initializer it shares by content with the original, a table training left as it was, is
    stored once and not counted); 0 for a one-path graph."""
    from onnx import numpy_helper

    reads = branch_reads(model)
    if reads is None:
        return 0
    copy_reads, original_reads = reads
    outer = {node.name: node for node in model.graph.node}[EVERY_ROW_DENSE.node]
    below = branch_of(outer, "else_branch").initializer  # with_weights_beside_their_pass put them there
    weights = {init.name: init for init in [*model.graph.initializer, *below]}
    return sum(
        numpy_helper.to_array(weights[name]).nbytes for name in copy_reads - original_reads if name in weights
    )


def with_default_rho(manifest: C.Manifest) -> C.Manifest:
    """``manifest`` with default_rho (and the rule's text) chosen from its fp32 quality curve."""
    default_rho, rule = C.choose_default_rho(manifest.quality)
    return manifest.model_copy(update={"default_rho": default_rho, "default_rho_rule": rule})


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


AT_FDCWD = -100
RENAME_EXCHANGE = 2  # linux/fs.h: swap two existing paths atomically


def exchange_paths(first: Path, second: Path) -> bool:
    """Swap two existing paths in one step (Linux ``renameat2``); False where the system cannot."""
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if renameat2 is None:  # not glibc ≥ 2.28 (or not Linux)
        return False
    encoded = (os.fsencode(first), os.fsencode(second))
    if renameat2(AT_FDCWD, encoded[0], AT_FDCWD, encoded[1], RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):  # kernel or file system without it
        return False
    raise OSError(code, os.strerror(code), str(second))


def install_directory(staging: Path, target: Path) -> None:
    """Put the finished ``staging`` directory at ``target``; afterwards ``staging`` holds the old one (if
    any). Readers of ``target`` see the old model or the new one, never a mix or nothing (except in the
    fallback, where ``target`` is missing between two renames)."""
    if not target.exists():
        os.rename(staging, target)
    elif not exchange_paths(staging, target):
        aside = target.parent / f".{target.name}.replaced-{uuid.uuid4().hex[:8]}"
        os.rename(target, aside)
        try:
            os.rename(staging, target)
        except OSError:
            os.rename(aside, target)  # the old model goes back where it was
            raise
        os.rename(aside, staging)
