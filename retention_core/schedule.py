"""The keep schedule on the host: ρ and a row's token counts → the tokens it keeps entering each layer.

The one statement of the schedule, for every side that needs it:

- ``ScheduleSettings`` and the ``Schedule*`` field types: the five settings a graph bakes into its
  schedule, their defaults, bounds and meaning, declared once. The recipe (``training.recipes.recipe``), the
  trained model's ``RetentionConfig`` and the manifest's ``contract.Schedule`` reuse them.
- ``keep_fractions`` (the share of real tokens kept entering each layer, the kept-token floor included
  when the rows' lengths are given), ``keep_counts`` (the graph's counts), ``mean_kept_fraction`` (the
  cost model's share of a row's token-work), ``token_layers`` (token-work itself: the one definition,
  which a request's usage, training's evaluation and the benchmarks all count with), ``token_work`` (its
  fraction of the dense model's) and ``token_work_curve`` (what ``GET /models/{name}/schedule`` gives the
  explorer page).

The arithmetic is the graph's (``training.engine.selection.keep_counts``, traced into every ``model.onnx``):
float32 fractions ``ρ^(((g+1)/G)^power)`` per group g of G = ⌈P / k⌉ (k the pruning interval), rounded
half up against the real tokens, at least the protected tokens, at least the kept-token floor
min(min_kept_tokens, n_real), at least 1, at most n_real. Numpy only: a backend that needs the counts
before it runs (the torch backend sizes its static shapes with them) reads them here, without a device
round trip; ``tests/service/test_torch_backend.py`` checks them against the ONNX graph's ``kept_counts``
and ``tests/test_schedule_agreement.py`` every reader against one another. The graph's own copy stays
in torch (``training.engine.selection``): it is traced into ``model.onnx``, and torch's float32 ``pow``
differs from numpy's in the last bit, so the soft pass reads it too (training's numbers stay bit-for-bit).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Protocol

import numpy as np
from pydantic import Field


@dataclass(frozen=True)
class ScheduleSettings:
    """The schedule's settings and their defaults (the defaults: what a model exported before each
    setting existed assumed). The field types below carry each one's bounds and meaning."""

    power: float = 1.0
    min_kept_tokens: int = 0
    merge_dropped: bool = False
    leading_share: float = 0.0
    pruning_interval: int = 1


SCHEDULE_DEFAULTS = ScheduleSettings()

SchedulePower = Annotated[
    float,
    Field(
        gt=0.0,
        description="the schedule's shape: frac_p = rho^(((p+1)/P)^power); 1 a geometric descent, < 1 "
        "front-loads the pruning",
    ),
]
MinKeptTokens = Annotated[
    int,
    Field(
        ge=0,
        description="kept-token floor baked into the graph: every pruning point keeps at least "
        "min(this, real tokens), so a row at or under it runs dense at any rho (selection.floor_tokens). "
        "0 = none, what every model exported before the floor existed assumed. Opt-in: on SST-2 a floor of "
        "16 bought less accuracy than the same token-work spent through rho "
        "(docs/experiments/2026-11-25-kept-token-floor.md); export --min-kept-tokens adds it to a trained "
        "run",
    ),
]
MergeDropped = Annotated[
    bool,
    Field(
        description="dropped tokens are merged into their most similar kept token inside the graph "
        "(size-weighted, sizes carried, proportional attention, size-weighted pooling; "
        "selection.merge_dropped) instead of dropped; rho = 1 stays exactly the dense model. False for "
        "directories exported before merging",
    ),
]
LeadingShare = Annotated[
    float,
    Field(
        ge=0.0,
        le=1.0,
        description="share of each pruning point's kept count given to the earliest tokens "
        "(selection.leading_span): 1 = first-k truncation inside the schedule, 0 = the scorers alone",
    ),
]
PruningInterval = Annotated[
    int,
    Field(
        ge=1,
        description="the graph selects at every k-th point only: the layers form ceil(num_points / k) "
        "groups and group g enters with rho^(((g+1)/G)^power); the points between keep every token and "
        "are left out of the graph, dividing the selection's fixed cost by k (the scorers still train at "
        "every point). 1 for directories exported before it",
    ),
]


class ScheduleShape(Protocol):
    """What the functions below read of a schedule (``contract.Schedule`` is one)."""

    @property
    def power(self) -> float: ...
    @property
    def num_points(self) -> int: ...
    @property
    def min_kept_tokens(self) -> int: ...
    @property
    def pruning_interval(self) -> int: ...
    @property
    def last_layer_queries(self) -> int | None: ...


def keep_exponents(
    num_points: int, power: float, interval: int = 1, dtype: type[np.floating] = np.float32
) -> np.ndarray:
    """((g+1)/G)^power for the group g = p // k of every point p: (P,), in float32 as the graph computes
    it (the cost model asks for float64)."""
    groups = -(-num_points // interval)  # ⌈P / k⌉
    steps = np.arange(1, groups + 1, dtype=dtype) / dtype(groups)  # (G,)
    return np.repeat(steps ** dtype(power), interval)[:num_points]  # (P,)


def keep_fractions(
    schedule: ScheduleShape, rho: np.ndarray, num_real: np.ndarray | None = None
) -> np.ndarray:
    """Share of real tokens alive entering each layer: rho (B,) → (B, P) float32, non-increasing in p;
    the last group reaches exactly ρ. With the rows' real tokens (B,), raised to the kept-token floor's
    share min(min_kept_tokens, n_real) / n_real (what the soft pass aims at: the counts top-M keeps)."""
    exponents = keep_exponents(schedule.num_points, schedule.power, schedule.pruning_interval)  # (P,)
    fractions = np.asarray(rho, dtype=np.float32)[:, None] ** exponents  # (B, P)
    if num_real is None or schedule.min_kept_tokens <= 0:
        return fractions
    real = np.asarray(num_real, dtype=np.int64)  # (B,)
    share = np.minimum(real, schedule.min_kept_tokens).astype(np.float32) / np.maximum(real, 1).astype(
        np.float32
    )  # (B,)
    return np.maximum(fractions, share[:, None])


def keep_counts(
    schedule: ScheduleShape, rho: np.ndarray, num_real: np.ndarray, num_protected: np.ndarray
) -> np.ndarray:
    """Tokens kept entering each layer: rho (B,) float32, real and protected tokens (B,) → (B, P) int64."""
    fractions = keep_fractions(schedule, rho)  # (B, P)
    real = num_real.astype(np.int64)
    counts = np.floor(fractions * real[:, None].astype(np.float32) + np.float32(0.5)).astype(np.int64)
    lower = np.maximum(num_protected.astype(np.int64), 1)  # (B,)
    if schedule.min_kept_tokens > 0:
        lower = np.maximum(lower, np.minimum(real, schedule.min_kept_tokens))
    return np.minimum(np.maximum(counts, lower[:, None]), real[:, None])  # (B, P)


def is_pruning_point(point: int, interval: int) -> bool:
    """Whether ``point`` selects under a pruning interval: the first point of each group."""
    return point % interval == 0


def mean_kept_fraction(schedule: ScheduleShape, rho: float, length: int = 0) -> float:
    """The share of a row's token-work its pruned layers do at ``rho``: the mean kept fraction over the
    schedule's points, in float64, before rounding (the cost model's). A row of ``length`` real tokens
    keeps at least min(min_kept_tokens, length) of them at every point (the kept-token floor), so a short
    row costs the same at every rho; ``length`` 0: long enough that the floor never applies."""
    points = schedule.num_points
    least = min(schedule.min_kept_tokens, length) / length if length > 0 else 0.0
    exponents = keep_exponents(points, schedule.power, schedule.pruning_interval, np.float64).tolist()
    return sum(max(rho**exponent, least) for exponent in exponents) / points


def token_layers(counts: np.ndarray, last_layer_queries: int | None) -> np.ndarray:
    """Encoder token-work, the one definition: the token-layers each row computes, Σ over layers of the
    tokens entering the layer, the last layer counting only its queries when the head reads a fixed number
    of positions (``last_layer_queries``: 1 for [CLS]). counts (B, P) → (B,) float64 (exact: integers).

    The dense model's is n_real · P (``token_work``). A request's usage (``retention_core.usage``), the
    explorer's curve, training's evaluation (``training.engine.selection.encoder_token_work``: this on
    tensors) and the benchmarks all count with it."""
    work = counts.astype(np.float64)  # (B, P)
    if last_layer_queries is not None:
        work[:, -1] = float(last_layer_queries)
    return work.sum(1)


def token_work(counts: np.ndarray, num_real: np.ndarray, last_layer_queries: int | None) -> np.ndarray:
    """Fraction of dense encoder token-work each row does: ``token_layers`` / (n_real · P). counts (B, P),
    real tokens (B,) → (B,) float64."""
    dense = np.asarray(num_real, dtype=np.float64) * counts.shape[1]  # (B,)
    return token_layers(counts, last_layer_queries) / dense


def token_work_curve(schedule: ScheduleShape, length: int, rhos: Sequence[float]) -> list[float]:
    """The token-work fraction of one row of ``length`` real tokens ([CLS] protected) at each of ``rhos``,
    with the graph's counts: what the explorer page draws."""
    rho = np.asarray(rhos, dtype=np.float32)  # (R,)
    real = np.full(len(rho), length, dtype=np.int64)  # (R,)
    counts = keep_counts(schedule, rho, real, np.ones_like(real))  # (R, P)
    return [float(value) for value in token_work(counts, real, schedule.last_layer_queries)]
