"""Adaptive Retention's inference path: which tokens survive, as the exported graph computes it.

Pure tensor functions, shared by the pruned pass (``training.engine.model``, what export traces), evaluation
and the equal-work baselines; the training terms (gates, budget, score shifts) are ``training.engine.terms``.

- ``RetentionScorer``: s_t = vᵀ tanh(W h_t + U m_{t-1}) + b with the summary m_t = γ m_{t-1} + (1-γ) h_t.
- The budget schedule in torch: how a per-example ρ becomes a keep count at every pruning point (the
  graph's arithmetic; ``retention_core.schedule`` is the same in numpy, the one the host reads).
- Deterministic top-M selection that physically gathers the kept tokens in their original order, the
  leading span, merging what a point drops (ToMe's size-weighted merge), the attention masks.
- The baselines' selectors (random, attention received) and the token-work accounting of a pass.

Shapes: B batch, T current sequence length, K kept slots, D dropped tokens, d hidden size, r scorer
size, P pruning points (one before every encoder layer, the first one scoring the embeddings). Nothing
here imports the plumbing (data, recipes, HF wrappers), and everything is traceable by the TorchScript
ONNX exporter: keep counts stay tensors end to end (``int()``/``.item()`` would freeze them into
constants).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from retention_core.schedule import is_pruning_point, token_work

# Numerical guards, named so their role is clear where they are used.
PROTECTED_SCORE_BONUS = 1e4  # lifts [CLS] / question tokens above every learned score
EXCLUDED_SCORE = -1e9  # pads and already-dropped slots: never selected
MASKED_ATTENTION_BIAS = -1e9  # additive attention bias for keys that must not be attended


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
# Budget schedule: ρ → keep counts per pruning point (is_pruning_point: retention_core.schedule)
# --------------------------------------------------------------------------------------------
def keep_fractions(rho: torch.Tensor, num_points: int, power: float = 1.0, interval: int = 1) -> torch.Tensor:
    """Fraction of real tokens alive *entering* each layer: rho (B,) → (B, P).

    frac_p = ρ^(((p+1)/P)^power), p = 0..P-1. Point 0 scores the embeddings (before layer 1), so
    layer 1 already runs shorter; the last point reaches exactly ρ. power=1 is a geometric descent;
    power<1 front-loads the pruning (more saved compute, earlier decisions). Non-increasing in p.

    ``interval`` k > 1 prunes at every k-th point only (``is_pruning_point``): the layers form
    G = ⌈P / k⌉ groups, group g enters with ρ^(((g+1)/G)^power) and keeps it for its k layers, so the
    points inside a group keep every token they receive and their selection can be skipped.

    The graph's torch form of ``retention_core.schedule.keep_fractions``, the schedule's one statement
    (traced into ``model.onnx``; ``tests/test_schedule_agreement.py`` holds the two equal).
    """
    groups = -(-num_points // interval)  # ⌈P / k⌉
    steps = torch.arange(1, groups + 1, dtype=rho.dtype, device=rho.device) / groups  # (G,)
    exponents = (steps**power).repeat_interleave(interval)[:num_points]  # (P,)
    return rho.unsqueeze(-1) ** exponents  # (B, 1) ** (P,) → (B, P)


def floor_tokens(num_real: torch.Tensor, min_kept: int) -> torch.Tensor:
    """The kept-token floor of each row: min(min_kept, n_real). (B,) → (B,) int64.

    Short inputs cost little and lose most when pruned (four tokens at ρ = 0.3 keep one), so every
    pruning point keeps at least this many: a row at or under the floor runs dense at any ρ, a longer
    one never drops below it. ``min_kept`` is a constant of the model (the manifest's
    ``schedule.min_kept_tokens``); the clamp keeps the result a tensor of n_real, so it traces.
    """
    return torch.clamp(num_real, max=max(int(min_kept), 0))


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


# --------------------------------------------------------------------------------------------
# Deterministic selection
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


# --------------------------------------------------------------------------------------------
# Attention masks and survival depth
# --------------------------------------------------------------------------------------------
def attention_bias(valid: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Additive key mask (B, T) bool → (B, 1, 1, T): 0 where attended, very negative elsewhere.

    Unsqueezed before the cast and the arithmetic, in the order BERT builds its mask: onnxruntime's
    attention fusion matches only that pattern (the same values either way)."""
    extended = valid.unsqueeze(1).unsqueeze(2)  # (B, 1, 1, T)
    return (1.0 - extended.to(dtype)) * MASKED_ATTENTION_BIAS


def add_layer_survivors(depth: torch.Tensor, positions: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Survival depth so far (B, T) int64, plus one at the original position of every valid kept slot of
    the layer about to run: positions (B, K), valid (B, K) bool → (B, T).

    Added, not written: a padding slot may carry the same position as a kept one and adds 0. Protected
    tokens and the kept-token floor need no case of their own: they are kept slots, so they count at
    every layer they enter. Stays a tensor op end to end (ScatterElements with add), so it traces.
    """
    return depth.scatter_add(1, positions, valid.to(depth.dtype))


# --------------------------------------------------------------------------------------------
# The baselines' selectors and the token-work accounting
# --------------------------------------------------------------------------------------------
def random_scores(valid: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Random-k baseline: uniform scores (B, T) on ``valid``'s device (drawn on the generator's)."""
    device = valid.device if generator is None else generator.device
    return torch.rand(valid.shape, generator=generator, device=device).to(valid.device)


def attention_received(probs: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """The attention each token receives, summed over heads and valid queries (PoWER-BERT, H2O, the
    Length-Adaptive Transformer's ranking): probs (B, H, T, T), valid (B, T) bool → (B, T)."""
    if probs.dtype != torch.float32:  # bf16 autocast: sum in fp32, the ranking needs the digits
        probs = probs.float()
    query_weight = valid.to(probs.dtype)[:, None, :, None]  # (B, 1, T, 1)
    return (probs * query_weight).sum(dim=(1, 2))  # (B, T)


def encoder_token_work(
    counts: torch.Tensor, num_real: torch.Tensor, last_layer_queries: int | None
) -> torch.Tensor:
    """Fraction of dense encoder token-work done, per row: (B, P) counts, (B,) real tokens → (B,) float32
    on the counts' device.

    ``retention_core.schedule.token_work`` (the one definition, what serving reports: Σ_layers tokens
    processed, the last layer counting only its queries when the head reads a fixed number of positions,
    classification's [CLS]: 1 query) on tensors, for evaluation. float32, as evaluation has always
    recorded it: the float64 quotient of these small integers rounds to the float32 one exactly.
    """
    work = token_work(counts.cpu().numpy(), num_real.cpu().numpy(), last_layer_queries)  # (B,) float64
    return torch.from_numpy(work).to(device=counts.device, dtype=torch.float32)


__all__ = [
    "EXCLUDED_SCORE",
    "MASKED_ATTENTION_BIAS",
    "MERGE_NORM_FLOOR",
    "PROTECTED_SCORE_BONUS",
    "RetentionScorer",
    "add_layer_survivors",
    "attention_bias",
    "attention_received",
    "dropped_tokens",
    "encoder_token_work",
    "floor_tokens",
    "gather_tokens",
    "is_pruning_point",
    "keep_counts",
    "keep_fractions",
    "leading_span",
    "masked_scores",
    "merge_dropped",
    "nearest_kept",
    "proportional_bias",
    "random_scores",
    "select_top_tokens",
]
