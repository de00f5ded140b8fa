"""How the soft (training) pass opens its gates: ``SoftGates``.

The gate kind (Hard-Concrete, the method; sigmoid, an ablation) and the per-row score shift that lets
the budget set the counts. ``RetentionModel.forward_soft`` asks it at every pruning point and the
objective builds it from the recipe (``training.fitting.objective.soft_gates``), so it sits below both:
the math it calls lives in ``training.engine.terms``. The recipe's ``retention.gates`` and
``retention.score_shift`` take their values from ``GateKind`` and ``ScoreShift`` here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

from training.engine import terms as T

GateKind = Literal["hard_concrete", "sigmoid"]
ScoreShift = Literal["none", "quantile", "calibrated"]
# scores (B, T), candidate weights (B, T), rate (B,) → per-row shift (B, 1)
ShiftFunction = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
SHIFT_FUNCTIONS: dict[str, ShiftFunction] = {"quantile": T.quantile_shift, "calibrated": T.calibrated_shift}


@dataclass(frozen=True)
class SoftGates:
    """The soft pass's gates: what ``RetentionModel.forward_soft`` asks at every pruning point."""

    kind: GateKind = "hard_concrete"
    score_shift: ScoreShift = "none"

    def keep_rates(
        self, fractions: torch.Tensor, num_real: torch.Tensor, protected: torch.Tensor
    ) -> torch.Tensor:
        """(B, P) schedule → (B, P) conditional keep rate of the droppable tokens at every point.

        The calibrated shift counts protected tokens against the budget like top-M inference; the
        other shifts keep the recorded runs' accounting (a share of the droppable tokens equal to the
        schedule)."""
        if self.score_shift == "calibrated":
            fractions = T.candidate_keep_fractions(fractions, num_real, protected.sum(1))
        return T.conditional_keep_rates(fractions)

    def shift(
        self, scores: torch.Tensor, alive: torch.Tensor, protected: torch.Tensor, rate: torch.Tensor
    ) -> torch.Tensor:
        """Scores (B, T) shifted per row so that ``rate`` (B,) of the droppable soft survival ``alive``
        (B, T) stays open; unchanged without a shift. Per row, so the top-M ranking is unchanged."""
        if self.score_shift == "none":
            return scores
        candidates = torch.where(protected, torch.zeros_like(alive), alive)  # (B, T)
        return scores - SHIFT_FUNCTIONS[self.score_shift](scores, candidates, rate)

    def gate(
        self,
        distribution: T.HardConcrete,
        log_alpha: torch.Tensor,
        open_prob: torch.Tensor,
        generator: torch.Generator | None,
        training: bool,
    ) -> torch.Tensor:
        """Gate values (B, T) in [0, 1]: a Hard-Concrete sample in training, its noise-free value in
        eval; the sigmoid ablation uses P(z > 0) itself (no noise, no exact zeros)."""
        if self.kind == "sigmoid":
            return open_prob
        if training:
            return distribution.sample(log_alpha, generator)
        return distribution.deterministic(log_alpha)
