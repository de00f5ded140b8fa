"""Per-request accounting: tokens, kept tokens per layer, fraction of encoder token-work, memory."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from retention_core.contract import Manifest
from retention_core.schedule import token_layers

BYTES_PER_FLOAT = 4


@dataclass(frozen=True)
class Work:
    processed_tokens: int  # real tokens that entered the graph (all rows, after truncation / windowing)
    kept_tokens_per_layer: list[int]  # summed over rows: tokens entering each layer
    computed: float  # token-layers computed (last layer counts only its queries when the head reads few)
    dense: float  # token-layers of the dense model on the same rows
    activation_bytes: float  # estimated peak activation memory of the request
    min_kept_tokens: int = 0  # the model's kept-token floor (manifest.schedule.min_kept_tokens)
    rows_at_floor: int = 0  # rows whose last pruning point kept exactly the floor, min(floor, real tokens)

    @property
    def fraction(self) -> float:
        return self.computed / self.dense if self.dense else 1.0


def token_work(manifest: Manifest, row_lengths: list[int], kept_counts: np.ndarray) -> Work:
    """A request's token-work: the token-layers its rows computed (``retention_core.schedule.token_layers``,
    the one definition: the last layer counting ``schedule.last_layer_queries`` queries when set) against
    the dense model's on the same rows (real tokens x layers).

    kept_counts (R, L) int64, one row per graph row.
    """
    counts = kept_counts.astype(np.float64)  # (R, L)
    layers = counts.shape[1]
    processed = int(sum(row_lengths))
    floor = manifest.schedule.min_kept_tokens
    return Work(
        processed_tokens=processed,
        kept_tokens_per_layer=[int(v) for v in kept_counts.sum(axis=0)],
        computed=float(token_layers(kept_counts, manifest.schedule.last_layer_queries).sum()),
        dense=float(processed * layers),
        activation_bytes=activation_bytes(manifest, counts),
        min_kept_tokens=floor,
        rows_at_floor=rows_at_floor(floor, row_lengths, kept_counts),
    )


def rows_at_floor(floor: int, row_lengths: list[int], kept_counts: np.ndarray) -> int:
    """Rows whose last pruning point kept exactly min(floor, real tokens): the floor, not ρ, decided
    how much of them reached the end (a row no longer than the floor runs dense at every ρ).
    The counts come out of the graph, so this reads what ran rather than re-deriving the schedule.
    kept_counts (R, L); 0 when the model has no floor."""
    if floor <= 0 or kept_counts.size == 0:
        return 0
    floors = np.minimum(np.asarray(row_lengths, dtype=np.int64), floor)  # (R,)
    return int(np.count_nonzero(kept_counts[:, -1] == floors))


def activation_bytes(manifest: Manifest, counts: np.ndarray) -> float:
    """Peak over layers of what one layer holds for the request's rows (fp32): hidden states, Q/K/V and
    attention output (4·k·d), the FFN intermediate (k·ffn) and attention scores (heads·k²)."""
    b = manifest.backbone
    per_layer = counts * (4 * b.hidden_size + b.intermediate_size) + b.num_heads * counts**2  # (R, L)
    return float(per_layer.sum(axis=0).max() * BYTES_PER_FLOAT) if per_layer.size else 0.0
