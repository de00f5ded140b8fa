"""Adaptive Retention's training terms: what only the soft pass and the objective need.

- Hard-Concrete gates (Louizos et al. 2018): sample, expected-L0, deterministic gate.
- The soft pass's budget targets: the schedule's fractions raised to the kept-token floor, per-point
  conditional rates, the droppable tokens' share, ρ sampled per example.
- The per-row score shifts (``quantile``, ``calibrated``) and the salient-token term.
- The Lagrangian budget with projected dual ascent on λ, and the soft attention bias.

The inference path (scorer, schedule, selection, merging) is ``training.engine.selection``. Shapes as there:
B batch, T current sequence length, P pruning points.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from training.engine.selection import floor_tokens

# Numerical guards, named so their role is clear where they are used.
LOGIT_CLAMP = 1e-4  # keep logit() finite when a keep rate is exactly 0 or 1
LOG_GATE_FLOOR = 1e-6  # log(z) floor for a closed gate during soft-masked training


# --------------------------------------------------------------------------------------------
# Hard-Concrete gates
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class HardConcrete:
    """Stretched, clamped concrete distribution. Defaults as in Louizos et al. and the paper."""

    temperature: float = 0.66  # β
    left: float = -0.1  # γ (stretch lower bound)
    right: float = 1.1  # ζ (stretch upper bound)

    @property
    def l0_shift(self) -> float:
        """β·log(-γ/ζ): P(z > 0) = sigmoid(log_alpha - l0_shift)."""
        return self.temperature * math.log(-self.left / self.right)

    def sample(self, log_alpha: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Reparameterised gate z ∈ [0, 1] with exact zeros and ones; same shape as log_alpha."""
        u = torch.rand(log_alpha.shape, generator=generator, dtype=log_alpha.dtype, device=log_alpha.device)
        u = u.clamp(LOGIT_CLAMP, 1.0 - LOGIT_CLAMP)
        s = torch.sigmoid((torch.log(u) - torch.log1p(-u) + log_alpha) / self.temperature)
        return (s * (self.right - self.left) + self.left).clamp(0.0, 1.0)

    def prob_nonzero(self, log_alpha: torch.Tensor) -> torch.Tensor:
        """Expected-L0 term P(z > 0), differentiable in log_alpha."""
        return torch.sigmoid(log_alpha - self.l0_shift)

    def deterministic(self, log_alpha: torch.Tensor) -> torch.Tensor:
        """Eval-time gate: the noise-free stretched sigmoid, clamped to [0, 1]."""
        return (torch.sigmoid(log_alpha) * (self.right - self.left) + self.left).clamp(0.0, 1.0)

    def log_alpha_for_rate(self, keep_rate: torch.Tensor) -> torch.Tensor:
        """log_alpha whose P(z > 0) equals ``keep_rate``: the budget prior added to the learned score."""
        rate = keep_rate.clamp(LOGIT_CLAMP, 1.0 - LOGIT_CLAMP)
        return torch.log(rate) - torch.log1p(-rate) + self.l0_shift


# --------------------------------------------------------------------------------------------
# The soft pass's budget targets
# --------------------------------------------------------------------------------------------
def floored_fractions(fractions: torch.Tensor, num_real: torch.Tensor, min_kept: int) -> torch.Tensor:
    """``keep_fractions`` raised to the kept-token floor: (B, P), (B,) → (B, P).

    max(frac_p, min(min_kept, n_real) / n_real): still non-increasing in p, and bit-identical to
    ``fractions`` when ``min_kept`` is 0 (max with 0 of a non-negative number). The soft pass's budget
    targets use it so that training aims at the counts ``keep_counts`` keeps.
    """
    if min_kept <= 0:
        return fractions
    real = num_real.unsqueeze(-1).to(fractions.dtype)  # (B, 1)
    share = floor_tokens(num_real, min_kept).unsqueeze(-1).to(fractions.dtype) / real.clamp(min=1.0)  # (B, 1)
    return torch.maximum(fractions, share)


def conditional_keep_rates(fractions: torch.Tensor) -> torch.Tensor:
    """Per-point survival rate given survival so far: (B, P) cumulative → (B, P) conditional.
    A point after one that kept nothing gets rate 0 (the clamp only guards 0 / 0)."""
    previous = torch.cat([torch.ones_like(fractions[:, :1]), fractions[:, :-1]], dim=1)  # (B, P)
    return fractions / previous.clamp(min=LOGIT_CLAMP)


def candidate_keep_fractions(
    fractions: torch.Tensor, num_real: torch.Tensor, num_protected: torch.Tensor
) -> torch.Tensor:
    """Share of the droppable (real, unprotected) tokens alive entering each layer when the protected
    tokens count against the budget, as they do in top-M inference (``keep_counts``): (B, P) → (B, P).

    (frac·n_real − n_protected) / (n_real − n_protected), clamped to [0, 1]; 1 for rows with nothing
    to drop. Without it the soft pass keeps frac of the droppable tokens *plus* every protected one —
    at ρ = 0.3 with a 20-token question in a 150-token window, 39 droppable tokens where top-M keeps 25.
    """
    real = num_real.unsqueeze(-1).to(fractions.dtype)  # (B, 1)
    protected = num_protected.unsqueeze(-1).to(fractions.dtype)  # (B, 1)
    droppable = real - protected  # (B, 1)
    share = ((fractions * real - protected) / droppable.clamp(min=1.0)).clamp(0.0, 1.0)  # (B, P)
    return torch.where(droppable > 0, share, torch.ones_like(share))


def sample_rho(batch_size: int, low: float, high: float, generator: torch.Generator) -> torch.Tensor:
    """Budgets for one training batch: one ρ per example, uniform in [low, high]. (B,) on the
    generator's device."""
    return low + (high - low) * torch.rand(batch_size, generator=generator, device=generator.device)


# --------------------------------------------------------------------------------------------
# Score shifts and the salient-token term
# --------------------------------------------------------------------------------------------
def quantile_shift(scores: torch.Tensor, weights: torch.Tensor, rate: torch.Tensor) -> torch.Tensor:
    """Score shift ``quantile``: the per-row score above which a ``rate`` share of the candidate weight
    lies; detached.

    scores (B, T), weights (B, T) ≥ 0 (a token's soft survival so far; 0 for pads and protected
    tokens), rate (B,) → (B, 1). Subtracting it before the budget prior (``retention.score_shift``) makes
    Σ P(z > 0) ≈ rate · Σ weights whatever the scale of the scores, so the budget sets the counts
    instead of a λ whose gradient vanishes once the scorer saturates. A per-row shift leaves the
    top-M ranking of inference unchanged.
    """
    ranked, order = torch.sort(scores.detach(), dim=1, descending=True)  # (B, T)
    cumulative = torch.cumsum(torch.gather(weights.detach(), 1, order), dim=1)  # (B, T)
    wanted = rate.unsqueeze(-1) * cumulative[:, -1:]  # (B, 1)
    position = (cumulative < wanted).sum(1, keepdim=True).clamp(max=scores.shape[1] - 1)  # (B, 1)
    return torch.gather(ranked, 1, position)  # (B, 1)


CALIBRATION_ITERATIONS = 40  # bisection halvings: the bracket below shrinks to ~1e-11 of its width
CALIBRATION_MARGIN = 30.0  # logits past every score, where a sigmoid is 0 or 1 in float32


def calibrated_shift(scores: torch.Tensor, weights: torch.Tensor, rate: torch.Tensor) -> torch.Tensor:
    """Score shift ``calibrated``: the per-row t with Σ w·sigmoid(s − t + logit(rate)) = rate · Σ w; detached.

    scores (B, T), weights (B, T) ≥ 0 (as for ``quantile_shift``), rate (B,) → (B, 1).
    ``quantile_shift`` puts the rate-quantile token at P(z > 0) = rate, which meets the budget only
    when the scores are saturated. For moderate spreads the tokens above it keep more than those below
    give up when rate > 0.5 (+4 to +8 points at 0.818, the per-layer rate of ρ = 0.3 over six layers;
    experiments/score_shift.py)
    and less when rate < 0.5, compounding over layers. The expected count is monotone in t, so a
    bisection finds the shift that keeps the budget in expectation. The ranking is unchanged.
    """
    s = scores.detach()
    w = weights.detach()
    candidate = w > 0
    logit_rate = torch.logit(rate.clamp(LOGIT_CLAMP, 1.0 - LOGIT_CLAMP)).unsqueeze(-1)  # (B, 1)
    wanted = rate.unsqueeze(-1) * w.sum(1, keepdim=True)  # (B, 1)
    any_candidate = candidate.any(1, keepdim=True)  # (B, 1); a row without one keeps a finite bracket
    lowest = torch.where(candidate, s, torch.full_like(s, torch.inf)).amin(1, keepdim=True)  # (B, 1)
    highest = torch.where(candidate, s, torch.full_like(s, -torch.inf)).amax(1, keepdim=True)  # (B, 1)
    low = torch.where(any_candidate, lowest, torch.zeros_like(lowest)) - CALIBRATION_MARGIN
    high = torch.where(any_candidate, highest, torch.zeros_like(highest)) + CALIBRATION_MARGIN
    for _ in range(CALIBRATION_ITERATIONS):
        middle = 0.5 * (low + high)  # (B, 1)
        kept = (w * torch.sigmoid(s - middle + logit_rate)).sum(1, keepdim=True)  # (B, 1)
        too_many = kept > wanted
        low = torch.where(too_many, middle, low)
        high = torch.where(too_many, high, middle)
    return 0.5 * (low + high)  # (B, 1)


def salient_keep_loss(open_prob: torch.Tensor, salient: torch.Tensor) -> torch.Tensor:
    """Mean −log P(z > 0) of the salient tokens' gates over all points: (B, P, T), (B, T) bool → ().

    A supervised nudge for the scorers (e.g. the gold answer span in extractive QA): the budget still
    fixes how many tokens survive (the score shift is per row), so raising the salient tokens' gates
    pushes the others below the cut instead of keeping more. 0 when a batch has no salient token.
    """
    mask = salient.unsqueeze(1).expand_as(open_prob)  # (B, P, T)
    if not bool(mask.any()):
        return open_prob.sum() * 0.0  # keeps the graph (and the device) of a normal loss
    return -torch.log(open_prob[mask].clamp(min=LOGIT_CLAMP)).mean()


# --------------------------------------------------------------------------------------------
# Lagrangian budget
# --------------------------------------------------------------------------------------------
def budget_gap(
    expected_kept: torch.Tensor, target_kept: torch.Tensor, num_real: torch.Tensor
) -> torch.Tensor:
    """Constraint violation per point, as a fraction of real tokens: (B, P) → (P,). > 0 is over budget."""
    return ((expected_kept - target_kept) / num_real.unsqueeze(-1).to(expected_kept.dtype)).mean(0)


def lagrangian_penalty(gap: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
    """λ·(Σ p_t − M), normalised per point: gap (P,), λ (P,) → scalar. λ is a constant here (dual ascent
    moves it)."""
    return (lam.detach() * gap).sum()


def dual_ascent(lam: torch.Tensor, gap: torch.Tensor, lr: float, two_sided: bool = False) -> torch.Tensor:
    """Dual ascent on λ: λ ← λ + η·gap, rising while over budget. (P,) → (P,)

    One-sided (the default, an inequality Σp ≤ M): λ is projected onto λ ≥ 0, so nothing stops the
    gates from closing *more* than the budget asks. Two-sided (an equality Σp = M): λ may go
    negative and then pulls under-budget points back up, so training sees the token counts that
    inference keeps (token-level tasks, whose states are restored and read at every position).
    """
    stepped = lam + lr * gap.detach()
    return stepped if two_sided else torch.clamp(stepped, min=0.0)


def soft_attention_bias(gate_product: torch.Tensor) -> torch.Tensor:
    """Training-time key bias from cumulative gates (B, T) → (B, 1, 1, T): log z, floored."""
    return torch.log(gate_product.clamp(min=LOG_GATE_FLOOR))[:, None, None, :]


__all__ = [
    "CALIBRATION_ITERATIONS",
    "CALIBRATION_MARGIN",
    "LOGIT_CLAMP",
    "LOG_GATE_FLOOR",
    "HardConcrete",
    "budget_gap",
    "calibrated_shift",
    "candidate_keep_fractions",
    "conditional_keep_rates",
    "dual_ascent",
    "floored_fractions",
    "lagrangian_penalty",
    "quantile_shift",
    "salient_keep_loss",
    "sample_rho",
    "soft_attention_bias",
]
