"""What ``RetentionModel.forward_evaluation`` adds to the pruned pass: the open-gate ablation and the
survivors of every layer (never exported)."""

from __future__ import annotations

import torch

from training.engine import terms as T

OPEN_GATE_PROBABILITY = 0.5  # open-gate ablation: a gate counts as open when P(z > 0) exceeds this


class EvaluationProbe:
    """What ``forward_evaluation`` adds to the pruned pass (never exported: ``forward_pruned`` runs
    without a probe).

    Open-gate ablation (``open_gate_prior`` (B, P), the budget prior per point): instead of the
    scheduled top-M, keep every token whose gate would be open, P(z > 0) > ½; counts then vary per
    example and miss the budget. The prior is one number per row, so those tokens are exactly the
    top-count ones by score and top-M can still select them.
    Survivors (``length`` T): record which original positions entered each layer, (B, P, T) bool.
    """

    def __init__(
        self, gates: T.HardConcrete, open_gate_prior: torch.Tensor | None, length: int | None
    ) -> None:
        self.gates = gates
        self.open_gate_prior = open_gate_prior
        self.length = length
        self.per_point: list[torch.Tensor] = []  # per point (B, T) bool

    def before_selection(
        self,
        point: int,
        raw: torch.Tensor,
        valid: torch.Tensor,
        protected: torch.Tensor,
        counts: torch.Tensor,
    ) -> None:
        """May rewrite ``counts[:, point]`` (B, P) before the top-M selection of this point."""
        if self.open_gate_prior is None:
            return
        log_alpha = raw + self.open_gate_prior[:, point].unsqueeze(-1)  # (B, T)
        open_gate = self.gates.prob_nonzero(log_alpha) > OPEN_GATE_PROBABILITY
        counts[:, point] = (valid & (open_gate | protected)).sum(1)

    def after_selection(self, positions: torch.Tensor, valid: torch.Tensor) -> None:
        """Sees the original positions (B, K) of the kept slots and which are valid (B, K)."""
        if self.length is not None:
            self.per_point.append(alive_positions(positions, valid, self.length))

    def survivors(self) -> torch.Tensor | None:
        return torch.stack(self.per_point, dim=1) if self.length is not None else None  # (B, P, T)


def alive_positions(positions: torch.Tensor, valid: torch.Tensor, length: int) -> torch.Tensor:
    """Kept slots (B, K) → (B, T) bool over the original positions. Counts, not a bool scatter: a
    padding slot may carry the same position as a kept one."""
    hits = torch.zeros(positions.shape[0], length, dtype=torch.long, device=positions.device)  # (B, T)
    return hits.scatter_add(1, positions, valid.long()) > 0
