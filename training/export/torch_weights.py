"""The torch backend's weights: ``weights.safetensors`` under ``retention_torch``'s tensor names, and its
forward checked against the staged ``model.onnx`` on the export's validation grid."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from retention_core import contract as C
from retention_ort import open_session
from retention_torch.forward import Head
from retention_torch.runner import Runner
from retention_torch.two_path import TwoPathRunner, branch_states, prefixed
from retention_torch.weights import from_state
from training.engine import selection as R
from training.engine.encoders import POSITIONS_AFTER_PADDING
from training.engine.model import RetentionModel, manifest_schedule
from training.export.graph import (
    LOGIT_ATOL,
    VALIDATION_BATCH_SIZES,
    VALIDATION_LENGTHS,
    VALIDATION_RHOS,
    VALIDATION_SEED,
    ExportValidationError,
    check_exact,
    example_inputs,
)

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
        check_exact("kept counts", counts, torch.from_numpy(ours.kept_counts), where)
        check_exact("survival depth", depth, torch.from_numpy(ours.survival_depth), where)
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
