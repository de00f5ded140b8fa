"""The dense peer as ONNX servers ship it: onnxruntime's transformer optimizer, with attention fused.

The dense peer (``export_sentence_embedding``) is the Hugging Face encoder (eager attention) plus
sentence-transformers' mean pooling, exported the way optimum's feature-extraction export does it and
optimised by ``optimize_for_cpu`` (``onnxruntime.transformers.optimizer``, ``model_type="bert"``). This is
the graph a user would serve instead of ours, so every embedding speed-up is measured against its fused
form. Our own graph needs no optimizer pass: it is exported with the same fused operators
(``training.engine.encoders.FusedSelfAttention``, ``FusedSkipLayerNorm``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from training.export.graph import OPSET

FUSED_ATTENTION_OPS = ("Attention", "MultiHeadAttention")
PEER_INPUTS = ("input_ids", "attention_mask", "token_type_ids")  # optimum's BERT feature-extraction inputs
PEER_OUTPUT = "sentence_embedding"

# Families whose attention ORT's BERT optimizer cannot fuse: MPNet adds its relative-position bias between
# QKᵀ and the softmax, a pattern the fusion does not match. Their peer is the optimizer's best graph
# (SkipLayerNorm, BiasGelu; attention unfused), what a user of that optimizer serves; torch SDPA beside it.
UNFUSABLE_ATTENTION = frozenset({"mpnet"})

FusionCounts = dict[str, int]  # fused operator → how many the optimizer made (non-zero ones only)


class AttentionFusionError(RuntimeError):
    """The optimizer did not fuse attention in every layer."""


def optimize_for_cpu(onnx_in: Path, onnx_out: Path, num_heads: int, hidden: int) -> FusionCounts:
    """Run onnxruntime's BERT optimizer on ``onnx_in``, save to ``onnx_out``; return the fused counts."""
    from onnxruntime.transformers.optimizer import optimize_model

    optimized = optimize_model(str(onnx_in), model_type="bert", num_heads=num_heads, hidden_size=hidden)
    optimized.save_model_to_file(str(onnx_out))
    statistics = optimized.get_fused_operator_statistics()
    return {operator: int(count) for operator, count in statistics.items() if count}


def fused_attention_count(counts: FusionCounts) -> int:
    return sum(counts.get(operator, 0) for operator in FUSED_ATTENTION_OPS)


def require_fused_attention(counts: FusionCounts, num_layers: int, graph: str) -> None:
    """Raise unless every one of ``num_layers`` layers got a fused attention operator."""
    fused = fused_attention_count(counts)
    if fused != num_layers:
        raise AttentionFusionError(f"{graph}: {fused} fused attention operators for {num_layers} layers")


# ---------------------------------------------------------------------- the dense peer
class SentenceEmbeddingGraph(nn.Module):
    """A Hugging Face encoder + sentence-transformers' mean pooling: (ids, mask, types) → (B, d)."""

    def __init__(self, encoder: Any) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
    ) -> torch.Tensor:
        states = self.encoder(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
        ).last_hidden_state  # (B, T, d)
        weights = attention_mask.unsqueeze(-1).to(states.dtype)  # (B, T, 1)
        return (states * weights).sum(1) / weights.sum(1).clamp(min=1e-9)  # (B, d)


def load_eager_encoder(checkpoint: str | Path, num_layers: int | None = None) -> Any:
    """The checkpoint's encoder with eager attention: the exported form ORT's optimizer fuses (the SDPA
    export is a different pattern that the optimizer leaves unfused). ``num_layers``: only its first
    ``num_layers`` layers (the layer-exit baseline); None: all of them."""
    from transformers import AutoModel
    from transformers.utils import logging as hf_logging

    if num_layers is None:
        encoder = AutoModel.from_pretrained(
            str(checkpoint), attn_implementation="eager", local_files_only=True
        )
        return encoder.float().eval()
    # transformers reads keyword arguments it knows as config overrides: a shorter config loads the first
    # layers' weights. Its load report would list every later layer's weights as unused, which is the point.
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        encoder = AutoModel.from_pretrained(
            str(checkpoint), attn_implementation="eager", local_files_only=True, num_hidden_layers=num_layers
        )
    finally:
        hf_logging.set_verbosity(verbosity)
    return encoder.float().eval()


def export_sentence_embedding(encoder: Any, path: Path) -> None:
    """The dense peer's graph, dynamic batch and sequence axes, optimum's input names."""
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(1000, 2000, (2, 16), generator=generator)  # (B, T)
    example = (input_ids, torch.ones_like(input_ids), torch.zeros_like(input_ids))
    axes = {"batch": 0, "sequence": 1}
    dynamic = {name: {axes["batch"]: "batch", axes["sequence"]: "sequence"} for name in PEER_INPUTS}
    with torch.no_grad():
        torch.onnx.export(
            SentenceEmbeddingGraph(encoder).eval(),
            example,
            str(path),
            input_names=list(PEER_INPUTS),
            output_names=[PEER_OUTPUT],
            dynamic_axes={**dynamic, PEER_OUTPUT: {axes["batch"]: "batch"}},
            opset_version=OPSET,
            dynamo=False,
        )


@dataclass(frozen=True)
class PeerGraphs:
    unfused: Path  # the plain export
    fused: Path  # after onnxruntime's optimizer
    counts: FusionCounts


def build_dense_peer(checkpoint: str | Path, workdir: Path, num_layers: int | None = None) -> PeerGraphs:
    """Export and optimise the dense peer of ``checkpoint`` (only its first ``num_layers`` layers, when
    given: the layer-exit baseline) into ``workdir``; raise unless attention fused in every layer (for
    the families ORT's optimizer can fuse)."""
    encoder = load_eager_encoder(checkpoint, num_layers)
    config = encoder.config
    unfused, fused = workdir / "peer.onnx", workdir / "peer.fused.onnx"
    export_sentence_embedding(encoder, unfused)
    counts = optimize_for_cpu(unfused, fused, config.num_attention_heads, config.hidden_size)
    if config.model_type not in UNFUSABLE_ATTENTION:
        require_fused_attention(counts, config.num_hidden_layers, "dense peer")
    return PeerGraphs(unfused=unfused, fused=fused, counts=counts)
