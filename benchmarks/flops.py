"""Theoretical encoder cost (multiply-accumulates) of a keep-count schedule vs the dense encoder.

The counts are the graph's (``retention_core.schedule.keep_counts``: the schedule's power, kept-token
floor and pruning interval), and the scorers run where the graph selects (``is_pruning_point``). Merging
what a point drops is not counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from retention_core.schedule import ScheduleShape, is_pruning_point, keep_counts


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


def pruned_macs(seq_len: int, rho: float, shape: EncoderShape, schedule: ScheduleShape) -> int:
    """One row of ``seq_len`` real tokens ([CLS] protected) at ρ under ``schedule`` (its ``num_points`` the
    shape's layers): each pruning point scores the tokens alive and every layer runs on the tokens it
    keeps, the last one on its queries when the head reads a fixed number of positions."""
    rho_row = np.array([rho], np.float32)
    counts = keep_counts(schedule, rho_row, np.array([seq_len]), np.array([1]))[0].tolist()  # (P,)
    queries = schedule.last_layer_queries
    total, alive = 0, seq_len
    for point, kept in enumerate(counts):
        if is_pruning_point(point, schedule.pruning_interval):
            total += scorer_macs(alive, shape)
        is_last = point == shape.layers - 1
        total += layer_macs(kept, queries if (is_last and queries is not None) else kept, shape)
        alive = kept
    return total


def flop_ratio(seq_len: int, rho: float, shape: EncoderShape, schedule: ScheduleShape) -> float:
    """Dense cost / pruned cost: the speed-up a perfectly efficient runtime would show."""
    return dense_macs(seq_len, shape) / pruned_macs(seq_len, rho, shape, schedule)


def model_flop_ratio(model: Any, seq_len: int, rho: float | None) -> float | None:
    """``flop_ratio`` of a ``RetentionModel``'s shape and whole schedule at ρ (None without a ρ: a dense
    run)."""
    from training.engine.model import manifest_schedule

    if not rho:
        return None
    info = model.backbone.info
    shape = EncoderShape(info.hidden_size, info.intermediate_size, info.num_layers, model.config.scorer_size)
    return flop_ratio(seq_len, rho, shape, manifest_schedule(model))
