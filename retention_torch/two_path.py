"""The two-path model on the torch backend: rows at ρ ≥ 1 run the original's weights, rows at ρ < 1 the
copy the retrofit trained for them (``training.engine.model.RetentionModel.add_pruned_branch``), as the ONNX
graph's ``If`` choices do.

``weights.safetensors`` holds the original's tensors under their usual names and the copy's encoder
(embeddings, layers, MPNet's relative table) again under ``PRUNED_BRANCH_PREFIX``; the scorers and the
head are one set, read by both paths. A run is one side of ρ = 1 (the service's planner never joins the
two: ``service.scheduling.planner.plan_path_runs``); a mixed run given directly is split by row and put
back in order, each row as it would be in a run of its own side.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

PRUNED_BRANCH_PREFIX = "pruned_branch."
DENSE_RHO = 1.0  # a row at ρ ≥ this runs the original's weights (the graph's unpruned choice)


class RowRunner(Protocol):
    """What runs a run of rows: ``retention_torch.runner.Runner`` and this module's ``TwoPathRunner``."""

    def run(self, feeds: dict[str, np.ndarray]) -> RunOutputs: ...


class RunOutputs(Protocol):
    """A run's outputs: ``retention_torch.runner.RunResult`` and ``MixedOutputs``."""

    @property
    def main(self) -> np.ndarray: ...

    @property
    def kept_counts(self) -> np.ndarray: ...

    @property
    def survival_depth(self) -> np.ndarray: ...


def prefixed(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The copy's encoder tensors under the names ``weights.safetensors`` stores them."""
    return {f"{PRUNED_BRANCH_PREFIX}{name}": tensor for name, tensor in state.items()}


def branch_states(
    state: dict[str, torch.Tensor],
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor] | None]:
    """(the ρ ≥ 1 path's state, the ρ < 1 path's state; None for a one-path model): the copy's path is
    the original's state with the copy's own tensors in place of the original encoder's."""
    own = {
        name[len(PRUNED_BRANCH_PREFIX) :]: t
        for name, t in state.items()
        if name.startswith(PRUNED_BRANCH_PREFIX)
    }
    original = {name: t for name, t in state.items() if not name.startswith(PRUNED_BRANCH_PREFIX)}
    return original, ({**original, **own} if own else None)


def rows_of(feeds: dict[str, np.ndarray], rows: np.ndarray) -> dict[str, np.ndarray]:
    """The feeds of ``rows`` (indices) alone, every per-row input cut the same way."""
    return {name: value[rows] for name, value in feeds.items()}


@dataclass(frozen=True)
class MixedOutputs:
    main: np.ndarray
    kept_counts: np.ndarray
    survival_depth: np.ndarray


@dataclass
class TwoPathRunner:
    """``dense`` (the original's weights) for rows at ρ ≥ 1, ``pruned`` (the copy's) for the rest."""

    dense: RowRunner
    pruned: RowRunner

    def run(self, feeds: dict[str, np.ndarray]) -> RunOutputs:
        dense_rows = feeds["rho"] >= DENSE_RHO  # (B,)
        if dense_rows.all():
            return self.dense.run(feeds)
        if not dense_rows.any():
            return self.pruned.run(feeds)
        sides = [(np.flatnonzero(dense_rows), self.dense), (np.flatnonzero(~dense_rows), self.pruned)]
        parts = [(rows, runner.run(rows_of(feeds, rows))) for rows, runner in sides]
        return MixedOutputs(
            *(in_order(parts, field, len(dense_rows)) for field in MixedOutputs.__dataclass_fields__)
        )


def in_order(parts: list[tuple[np.ndarray, RunOutputs]], field: str, count: int) -> np.ndarray:
    """One output of every row, rows back in the feeds' order (each side's outputs have the feeds' T)."""
    first = getattr(parts[0][1], field)
    joined = np.empty((count, *first.shape[1:]), dtype=first.dtype)
    for rows, outputs in parts:
        joined[rows] = getattr(outputs, field)
    return joined
