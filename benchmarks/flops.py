"""Theoretical encoder cost (multiply-accumulates) of a keep-count schedule vs the dense encoder."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from training import selection as R


@dataclass(frozen=True)
class EncoderShape:
    hidden: int = 384
    ffn: int = 1536
    layers: int = 6
    scorer: int = 32


def layer_macs(keys: int, queries: int, shape: EncoderShape) -> int:
    """One post-LN layer: Q/O projections and FFN on the queries; K/V on every key; QKᵀ and AV."""
    d, f = shape.hidden, shape.ffn
    return queries * (2 * d * d + 2 * d * f) + 2 * keys * d * d + 2 * queries * keys * d


def scorer_macs(tokens: int, shape: EncoderShape) -> int:
    """W and U projections, the decay-matrix summary (T²·r) and v."""
    return tokens * (2 * shape.hidden * shape.scorer + shape.scorer) + tokens * tokens * shape.scorer


def dense_macs(seq_len: int, shape: EncoderShape) -> int:
    return shape.layers * layer_macs(seq_len, seq_len, shape)


def pruned_macs(
    seq_len: int, rho: float, shape: EncoderShape, power: float, last_layer_queries: int | None
) -> int:
    counts = R.keep_counts(
        torch.tensor([rho]), torch.tensor([seq_len]), torch.tensor([1]), shape.layers, power
    )[0].tolist()
    total, alive = 0, seq_len
    for point, kept in enumerate(counts):
        total += scorer_macs(alive, shape)
        is_last = point == shape.layers - 1
        queries = last_layer_queries if (is_last and last_layer_queries is not None) else kept
        total += layer_macs(kept, queries, shape)
        alive = kept
    return total


def flop_ratio(
    seq_len: int, rho: float, shape: EncoderShape, power: float, last_layer_queries: int | None
) -> float:
    """Dense cost / pruned cost: the speed-up a perfectly efficient runtime would show."""
    return dense_macs(seq_len, shape) / pruned_macs(seq_len, rho, shape, power, last_layer_queries)


def model_flop_ratio(model: Any, seq_len: int, rho: float | None) -> float | None:
    """``flop_ratio`` of a ``RetentionModel``'s shape and schedule at ρ (None without a ρ: a dense run)."""
    if not rho:
        return None
    info = model.backbone.info
    shape = EncoderShape(info.hidden_size, info.intermediate_size, info.num_layers, model.config.scorer_size)
    return flop_ratio(seq_len, rho, shape, model.config.schedule_power, model.last_layer_queries)
