"""The keep schedule on the host: ρ and a row's token counts → the tokens it keeps entering each layer.

The same arithmetic as the graph's (``training.retention.keep_counts``, traced into every ``model.onnx``):
float32 fractions ``ρ^(((g+1)/G)^power)`` per group g of G = ⌈P / k⌉ (k the pruning interval), rounded
half up against the real tokens, at least the protected tokens, at least the kept-token floor
min(min_kept_tokens, n_real), at least 1, at most n_real. Numpy only: a backend that needs the counts
before it runs (the torch backend sizes its static shapes with them) reads them here, without a device
round trip; ``tests/service/test_torch_backend.py`` checks them against the ONNX graph's ``kept_counts``.
"""

from __future__ import annotations

import numpy as np

from retention_core.contract import Schedule


def keep_exponents(
    num_points: int, power: float, interval: int = 1, dtype: type[np.floating] = np.float32
) -> np.ndarray:
    """((g+1)/G)^power for the group g = p // k of every point p: (P,), in float32 as the graph computes
    it (the cost model asks for float64)."""
    groups = -(-num_points // interval)  # ⌈P / k⌉
    steps = np.arange(1, groups + 1, dtype=dtype) / dtype(groups)  # (G,)
    return np.repeat(steps ** dtype(power), interval)[:num_points]  # (P,)


def keep_counts(
    schedule: Schedule, rho: np.ndarray, num_real: np.ndarray, num_protected: np.ndarray
) -> np.ndarray:
    """Tokens kept entering each layer: rho (B,) float32, real and protected tokens (B,) → (B, P) int64."""
    exponents = keep_exponents(schedule.num_points, schedule.power, schedule.pruning_interval)  # (P,)
    fractions = rho.astype(np.float32)[:, None] ** exponents  # (B, P)
    real = num_real.astype(np.int64)
    counts = np.floor(fractions * real[:, None].astype(np.float32) + np.float32(0.5)).astype(np.int64)
    lower = np.maximum(num_protected.astype(np.int64), 1)  # (B,)
    if schedule.min_kept_tokens > 0:
        lower = np.maximum(lower, np.minimum(real, schedule.min_kept_tokens))
    return np.minimum(np.maximum(counts, lower[:, None]), real[:, None])  # (B, P)


def is_pruning_point(point: int, interval: int) -> bool:
    """Whether ``point`` selects under a pruning interval: the first point of each group."""
    return point % interval == 0
