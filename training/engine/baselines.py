"""The evaluation baselines on the engine: other token choices at the learned schedule's counts
(``Selector``s for ``forward_pruned``: random, leading, attention received) and the layer-exit model.
"""

from __future__ import annotations

import torch

from training.engine import selection as S
from training.engine.encoders import LayerView
from training.engine.model import RetentionModel, Selector, original_positions


def random_selector(generator: torch.Generator) -> Selector:
    """Random-k: every token equally likely to be kept (protected tokens still kept)."""

    def select(
        point: int, layer: LayerView, hidden: torch.Tensor, valid: torch.Tensor, bias: torch.Tensor
    ) -> torch.Tensor:
        return S.random_scores(valid, generator)

    return select


def leading_selector() -> Selector:
    """Truncation inside the pass: the earliest tokens rank first (slots stay in original order), so
    each point keeps the leading ones; with merging, the tail is folded into them instead of lost."""

    def select(
        point: int, layer: LayerView, hidden: torch.Tensor, valid: torch.Tensor, bias: torch.Tensor
    ) -> torch.Tensor:
        slots = torch.arange(valid.shape[1], device=valid.device, dtype=hidden.dtype)  # (T,)
        return (-slots).unsqueeze(0).expand(valid.shape[0], -1)  # (B, T)

    return select


def attention_selector() -> Selector:
    """PoWER-BERT / H2O style: the attention each token receives in the next layer, summed over
    heads and (valid) queries. Needs the attention probabilities, so it cannot use fused attention."""

    def select(
        point: int, layer: LayerView, hidden: torch.Tensor, valid: torch.Tensor, bias: torch.Tensor
    ) -> torch.Tensor:
        probs = layer.attention_probs(hidden, bias)  # (B, H, T, T)
        return S.attention_received(probs, valid)  # (B, T)

    return select


@torch.no_grad()
def layer_exit(
    model: RetentionModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    num_layers: int,
    token_type_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Layer-exit baseline: the dense model stopped after its first ``num_layers`` layers, every token
    kept, then the model's own head on those states (token-work num_layers / L). (B, T) → the head's
    output: pooled (B, d), sequence (B, C), token (B, T, C)."""
    valid = attention_mask.bool()  # (B, T)
    hidden = model.backbone.embed(input_ids, token_type_ids)  # (B, T, d)
    # every token kept: one bias for every layer
    bias = model.backbone.layer_bias(S.attention_bias(valid, hidden.dtype), original_positions(valid))
    for layer in model.backbone.views[:num_layers]:
        hidden = layer(hidden, bias)
    return model.head_output(hidden, valid)
