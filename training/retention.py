"""Adaptive Retention: the method in one module.

Everything that decides *which tokens survive* lives here, shared by training, export and evaluation:

- ``RetentionScorer``: s_t = vᵀ tanh(W h_t + U m_{t-1}) + b with the summary m_t = γ m_{t-1} + (1-γ) h_t.
- Hard-Concrete gates (Louizos et al. 2018): sample, expected-L0, deterministic gate.
- The budget schedule: how a per-example ρ becomes a keep count at every pruning point.
- The Lagrangian budget with projected dual ascent on λ.
- Deterministic top-M selection that physically gathers the kept tokens in their original order.

Shapes: B batch, T current sequence length, d hidden size, r scorer size, P pruning points (one
before every encoder layer, the first one scoring the embeddings). Nothing here imports the plumbing
(data, recipes, HF wrappers), and everything is traceable by the TorchScript ONNX exporter: keep
counts stay tensors end to end (``int()``/``.item()`` would freeze them into constants).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

# Numerical guards, named so their role is clear where they are used.
LOGIT_CLAMP = 1e-4  # keep logit() finite when a keep rate is exactly 0 or 1
PROTECTED_SCORE_BONUS = 1e4  # lifts [CLS] / question tokens above every learned score
EXCLUDED_SCORE = -1e9  # pads and already-dropped slots: never selected
MASKED_ATTENTION_BIAS = -1e9  # additive attention bias for keys that must not be attended
LOG_GATE_FLOOR = 1e-6  # log(z) floor for a closed gate during soft-masked training


# --------------------------------------------------------------------------------------------
# Scorer
# --------------------------------------------------------------------------------------------
class RetentionScorer(nn.Module):
    """Per-token retention score from the hidden state and an EMA summary of the tokens before it.

    s_t = vᵀ tanh(W h_t + U m_{t-1}) + b,   m_t = γ m_{t-1} + (1-γ) h_t,   m_0 = 0.

    U is linear, so U m_{t-1} is the same EMA taken over the projected states u_k = U h_k. That EMA is
    computed in closed form as a lower-triangular decay matrix applied to u (no per-token loop):
    Σ_{k<t} (1-γ) γ^{t-1-k} u_k. The matrix product costs O(T²·r) with r ≪ d (r=32 vs d=384:
    well under 1% of an encoder layer at T=512) and exports to plain MatMul with dynamic T.
    """

    def __init__(self, hidden_size: int, scorer_size: int = 32, ema_decay: float = 0.9) -> None:
        super().__init__()
        if not 0.0 <= ema_decay < 1.0:
            raise ValueError(f"ema_decay must be in [0, 1), got {ema_decay}")
        self.ema_decay = ema_decay
        self.W = nn.Linear(hidden_size, scorer_size)
        self.U = nn.Linear(hidden_size, scorer_size, bias=False)
        self.v = nn.Linear(scorer_size, 1)
        nn.init.normal_(self.v.weight, std=0.02)
        nn.init.zeros_(self.v.bias)

    def summary_weights(self, seq_len_like: torch.Tensor) -> torch.Tensor:
        """Decay matrix D (T, T) with D[t, k] = (1-γ) γ^{t-1-k} for k < t, else 0."""
        positions = torch.arange(seq_len_like.shape[1], device=seq_len_like.device)  # (T,)
        lag = positions[:, None] - positions[None, :] - 1  # (T, T): t-1-k
        strictly_before = lag >= 0
        log_decay = math.log(self.ema_decay) if self.ema_decay > 0 else -1e4
        decay = torch.exp(lag.clamp(min=0).to(seq_len_like.dtype) * log_decay)  # (T, T)
        return torch.where(strictly_before, decay * (1.0 - self.ema_decay), torch.zeros_like(decay))

    def forward(self, hidden: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """hidden (B, T, d), valid (B, T) bool → scores (B, T). Invalid slots do not feed the summary."""
        if torch.is_autocast_enabled(hidden.device.type):
            # Mixed-precision training: scores in fp32, since the gates' log-odds and the top-M order
            # they feed are sensitive where bf16 keeps 8 bits of mantissa.
            with torch.autocast(hidden.device.type, enabled=False):
                return self.forward(hidden.float(), valid)
        projected = self.U(hidden) * valid.unsqueeze(-1).to(hidden.dtype)  # (B, T, r)
        summary = torch.matmul(self.summary_weights(hidden), projected)  # (T,T)@(B,T,r) → (B, T, r)
        return self.v(torch.tanh(self.W(hidden) + summary)).squeeze(-1)  # (B, T)


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
# Budget schedule: ρ → keep counts per pruning point
# --------------------------------------------------------------------------------------------
def keep_fractions(rho: torch.Tensor, num_points: int, power: float = 1.0, interval: int = 1) -> torch.Tensor:
    """Fraction of real tokens alive *entering* each layer: rho (B,) → (B, P).

    frac_p = ρ^(((p+1)/P)^power), p = 0..P-1. Point 0 scores the embeddings (before layer 1), so
    layer 1 already runs shorter; the last point reaches exactly ρ. power=1 is a geometric descent;
    power<1 front-loads the pruning (more saved compute, earlier decisions). Non-increasing in p.

    ``interval`` k > 1 prunes at every k-th point only (``is_pruning_point``): the layers form
    G = ⌈P / k⌉ groups, group g enters with ρ^(((g+1)/G)^power) and keeps it for its k layers, so the
    points inside a group keep every token they receive and their selection can be skipped.
    """
    groups = -(-num_points // interval)  # ⌈P / k⌉
    steps = torch.arange(1, groups + 1, dtype=rho.dtype, device=rho.device) / groups  # (G,)
    exponents = (steps**power).repeat_interleave(interval)[:num_points]  # (P,)
    return rho.unsqueeze(-1) ** exponents  # (B, 1) ** (P,) → (B, P)


def is_pruning_point(point: int, interval: int) -> bool:
    """Whether point ``point`` selects under a pruning interval (the first point of each group)."""
    return point % interval == 0


def floor_tokens(num_real: torch.Tensor, min_kept: int) -> torch.Tensor:
    """The kept-token floor of each row: min(min_kept, n_real). (B,) → (B,) int64.

    Short inputs cost little and lose most when pruned (four tokens at ρ = 0.3 keep one), so every
    pruning point keeps at least this many: a row at or under the floor runs dense at any ρ, a longer
    one never drops below it. ``min_kept`` is a constant of the model (the manifest's
    ``schedule.min_kept_tokens``); the clamp keeps the result a tensor of n_real, so it traces.
    """
    return torch.clamp(num_real, max=max(int(min_kept), 0))


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


def keep_counts(
    rho: torch.Tensor,
    num_real: torch.Tensor,
    num_protected: torch.Tensor,
    num_points: int,
    power: float = 1.0,
    min_kept: int = 0,
    interval: int = 1,
) -> torch.Tensor:
    """Tokens kept entering each layer: (B,) ρ, real and protected counts → (B, P) int64.

    count = round(frac·n_real), at least the protected tokens, at least min(min_kept, n_real) (the
    kept-token floor, ``floor_tokens``) and at least 1, at most n_real. ρ = 1 keeps every real token at
    every point, which reproduces the dense model; so does any ρ for a row of at most ``min_kept``
    tokens.
    """
    fractions = keep_fractions(rho, num_points, power, interval)  # (B, P)
    counts = torch.floor(fractions * num_real.unsqueeze(-1).to(rho.dtype) + 0.5).to(torch.long)
    lower = torch.clamp(num_protected, min=1)  # (B,)
    if min_kept > 0:
        lower = torch.maximum(lower, floor_tokens(num_real, min_kept))
    counts = torch.maximum(counts, lower.unsqueeze(-1))
    return torch.minimum(counts, num_real.unsqueeze(-1))  # (B, P)


def leading_span(positions: torch.Tensor, counts: torch.Tensor, share: float) -> torch.Tensor:
    """The protected leading span of one pruning point: the ``share`` of its kept count that goes to the
    earliest real tokens, whatever they score. positions (B, T) original positions of the current slots,
    counts (B,) this point's keep counts → (B, T) bool.

    Counts never grow with depth, so each point's span lies inside the previous one's (already kept):
    share 1 is first-k truncation inside the schedule, share 0 the learned selection alone. Real tokens
    are right-padded, so the first n original positions are the first n real tokens.
    """
    span = torch.floor(counts.to(torch.float32) * share).to(positions.dtype)  # (B,)
    return positions < span.unsqueeze(-1)


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


def attention_received(probs: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """The attention each token receives, summed over heads and valid queries (PoWER-BERT, H2O, the
    Length-Adaptive Transformer's ranking): probs (B, H, T, T), valid (B, T) bool → (B, T)."""
    if probs.dtype != torch.float32:  # bf16 autocast: sum in fp32, the ranking needs the digits
        probs = probs.float()
    query_weight = valid.to(probs.dtype)[:, None, :, None]  # (B, 1, T, 1)
    return (probs * query_weight).sum(dim=(1, 2))  # (B, T)


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


# --------------------------------------------------------------------------------------------
# Deterministic selection at inference
# --------------------------------------------------------------------------------------------
def masked_scores(scores: torch.Tensor, valid: torch.Tensor, protected: torch.Tensor) -> torch.Tensor:
    """Scores ready for top-k: pads / dropped slots excluded, protected tokens lifted. (B, T)"""
    lifted = scores + protected.to(scores.dtype) * PROTECTED_SCORE_BONUS
    return torch.where(valid, lifted, torch.full_like(scores, EXCLUDED_SCORE))


def select_top_tokens(scores: torch.Tensor, counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep the ``counts[b]`` best tokens of every row, in original order.

    scores (B, T) already masked (see ``masked_scores``), counts (B,) int64 →
    index (B, K) positions into T, sorted ascending within the valid slots; valid (B, K) bool.
    K = max(counts) stays a tensor so the exporter keeps it data-dependent. Rows with a smaller
    budget fill their extra slots with masked entries placed after their valid ones.
    """
    k_max = counts.max()  # () tensor, never .item()
    _, ranked = torch.topk(scores, k_max, dim=1)  # type: ignore[arg-type]  # (B, K) best first; tensor k
    slot = torch.arange(ranked.shape[1], device=scores.device).unsqueeze(0)  # (1, K)
    valid = slot < counts.unsqueeze(-1)  # (B, K)
    seq_len = scores.shape[1]
    # Valid slots sort by position; padding slots sort after them.
    sort_key = torch.where(valid, ranked, ranked + seq_len)  # (B, K)
    order = torch.argsort(sort_key, dim=1)  # (B, K)
    index = torch.gather(ranked, 1, order)  # (B, K)
    return index, torch.gather(valid, 1, order)


def gather_tokens(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """values (B, T, ...) , index (B, K) → (B, K, ...): physically keep only the selected slots.

    States are gathered as rows of the flattened (B·T, d) batch: one ``Gather`` of B·K rows, where an
    index expanded to (B, K, d) would build and read an int64 tensor as large as the states."""
    if values.dim() == 2:
        return torch.gather(values, 1, index)
    batch, length, width = values.shape
    offsets = torch.arange(batch, device=index.device).unsqueeze(-1) * length  # (B, 1)
    rows = (index + offsets).reshape(-1)  # (B·K,)
    return values.reshape(-1, width).index_select(0, rows).view(batch, -1, width)  # (B, K, d)


# --------------------------------------------------------------------------------------------
# Merging what a pruning point drops (ToMe's size-weighted merge with proportional attention)
# --------------------------------------------------------------------------------------------
# A dropped token is not thrown away: its state is added into the kept token it is most similar to,
# as a size-weighted mean, and sizes travel with the tokens. Attention then counts a merged token as
# as many tokens as it holds (log-size on its key logit) and the final mean pool weighs each survivor
# by its size, so the pooled vector still averages every real token. With nothing dropped (ρ = 1)
# every token lands alone in its own slot with size 1: the arithmetic is x·1/1 and log 1 = 0, so the
# pass is bit-for-bit the dense one.
MERGE_NORM_FLOOR = 1e-6  # cosine of a zero state stays finite


def dropped_tokens(
    sizes: torch.Tensor, index: torch.Tensor, kept: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The real tokens a pruning point drops, gathered: sizes (B, T) (> 0 marks a real token), index /
    kept (B, K) the kept slots → positions (B, D) in original order and which are valid (B, D), D the
    most any row drops (0 at ρ = 1, so merging then costs nothing)."""
    is_kept = torch.zeros_like(sizes).scatter(1, index, kept.to(sizes.dtype)) > 0  # (B, T)
    dropped = (sizes > 0) & ~is_kept  # (B, T)
    order = torch.where(dropped, torch.zeros_like(sizes), torch.full_like(sizes, EXCLUDED_SCORE))  # (B, T)
    return select_top_tokens(order, dropped.sum(1))


def nearest_kept(dropped: torch.Tensor, kept_states: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """The kept slot of highest cosine for every dropped token: dropped (B, D, d), kept_states (B, K, d),
    kept (B, K) bool which slots are valid → (B, D) int64 slot in [0, K)."""
    unit = dropped / dropped.norm(dim=-1, keepdim=True).clamp(min=MERGE_NORM_FLOOR)  # (B, D, d)
    targets = kept_states / kept_states.norm(dim=-1, keepdim=True).clamp(min=MERGE_NORM_FLOOR)  # (B, K, d)
    similarity = torch.matmul(unit, targets.transpose(1, 2))  # (B, D, K)
    similarity = torch.where(kept.unsqueeze(1), similarity, torch.full_like(similarity, EXCLUDED_SCORE))
    return similarity.argmax(dim=-1)


def merge_dropped(
    hidden: torch.Tensor, sizes: torch.Tensor, index: torch.Tensor, kept: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep the selected slots and fold every other real token into its nearest kept one.

    hidden (B, T, d), sizes (B, T) ≥ 0 (how many original tokens a slot holds; 0 for pads and invalid
    slots), index/kept (B, K) from ``select_top_tokens`` → merged states (B, K, d) and sizes (B, K):
    x_k ← (s_k·x_k + Σ_{t→k} s_t·x_t) / M_k with M_k = s_k + Σ_{t→k} s_t, computed as
    x_k + Σ_{t→k} (s_t / M_k)·(x_t − x_k): all arithmetic is on the D dropped tokens (D ≪ T at most
    points, 0 at ρ = 1), and the K kept states are only gathered and scattered into once. Invalid
    slots receive nothing and hold no mass.
    """
    kept_states = gather_tokens(hidden, index)  # (B, K, d)
    kept_sizes = gather_tokens(sizes, index) * kept.to(sizes.dtype)  # (B, K)
    drop_index, drop_valid = dropped_tokens(sizes, index, kept)  # (B, D)
    drop_states = gather_tokens(hidden, drop_index)  # (B, D, d)
    drop_sizes = gather_tokens(sizes, drop_index) * drop_valid.to(sizes.dtype)  # (B, D)
    destination = nearest_kept(drop_states, kept_states, kept)  # (B, D)
    mass = kept_sizes.scatter_add(1, destination, drop_sizes)  # (B, K)
    share = drop_sizes / torch.gather(mass, 1, destination).clamp(min=1.0)  # (B, D): s_t / M_k
    pull = (drop_states - gather_tokens(kept_states, destination)) * share.unsqueeze(-1)  # (B, D, d)
    spread = destination.unsqueeze(-1).expand_as(pull)  # (B, D, d)
    return kept_states.scatter_add(1, spread, pull), mass


def proportional_bias(valid: torch.Tensor, sizes: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``attention_bias`` plus log(size) on every valid key, so a merged token weighs as the tokens it
    holds: valid (B, T) bool, sizes (B, T) → (B, 1, 1, T). log 1 = 0 leaves unmerged keys unchanged."""
    log_size = torch.log(sizes.clamp(min=1.0)).to(dtype)  # (B, T); 0 for invalid slots (masked anyway)
    return attention_bias(valid, dtype) + log_size[:, None, None, :]


def add_layer_survivors(depth: torch.Tensor, positions: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Survival depth so far (B, T) int64, plus one at the original position of every valid kept slot of
    the layer about to run: positions (B, K), valid (B, K) bool → (B, T).

    Added, not written: a padding slot may carry the same position as a kept one and adds 0. Protected
    tokens and the kept-token floor need no case of their own: they are kept slots, so they count at
    every layer they enter. Stays a tensor op end to end (ScatterElements with add), so it traces.
    """
    return depth.scatter_add(1, positions, valid.to(depth.dtype))


def attention_bias(valid: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Additive key mask (B, T) bool → (B, 1, 1, T): 0 where attended, very negative elsewhere.

    Unsqueezed before the cast and the arithmetic, in the order BERT builds its mask: onnxruntime's
    attention fusion matches only that pattern (the same values either way)."""
    extended = valid.unsqueeze(1).unsqueeze(2)  # (B, 1, 1, T)
    return (1.0 - extended.to(dtype)) * MASKED_ATTENTION_BIAS


def soft_attention_bias(gate_product: torch.Tensor) -> torch.Tensor:
    """Training-time key bias from cumulative gates (B, T) → (B, 1, 1, T): log z, floored."""
    return torch.log(gate_product.clamp(min=LOG_GATE_FLOOR))[:, None, None, :]


def random_scores(valid: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Random-k baseline: uniform scores (B, T) on ``valid``'s device (drawn on the generator's)."""
    device = valid.device if generator is None else generator.device
    return torch.rand(valid.shape, generator=generator, device=device).to(valid.device)


def encoder_token_work(
    counts: torch.Tensor, num_real: torch.Tensor, last_layer_queries: int | None
) -> torch.Tensor:
    """Fraction of dense encoder token-work done, per row: (B, P) counts → (B,).

    The definition is ``retention_core.usage.token_work`` (what serving reports); this is its per-row
    torch form for evaluation on tensors, checked against it in tests/training/test_retention_math.py.
    Token-work = Σ_layers tokens processed; the last layer counts only its queries when the head
    reads a fixed number of positions (classification reads [CLS]: 1 query).
    """
    work = counts.to(torch.float32)  # (B, P)
    if last_layer_queries is not None:
        last = torch.full_like(work[:, -1:], float(last_layer_queries))
        work = torch.cat([work[:, :-1], last], dim=1)
    dense = num_real.to(torch.float32) * counts.shape[1]  # (B,)
    return work.sum(1) / dense


__all__ = [
    "HardConcrete",
    "RetentionScorer",
    "add_layer_survivors",
    "attention_bias",
    "budget_gap",
    "calibrated_shift",
    "candidate_keep_fractions",
    "conditional_keep_rates",
    "dropped_tokens",
    "dual_ascent",
    "encoder_token_work",
    "floor_tokens",
    "floored_fractions",
    "gather_tokens",
    "is_pruning_point",
    "keep_counts",
    "keep_fractions",
    "lagrangian_penalty",
    "leading_span",
    "masked_scores",
    "merge_dropped",
    "nearest_kept",
    "proportional_bias",
    "quantile_shift",
    "random_scores",
    "salient_keep_loss",
    "sample_rho",
    "select_top_tokens",
    "soft_attention_bias",
]
