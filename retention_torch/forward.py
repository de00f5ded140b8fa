"""The retention forward written for a GPU: static shapes, few kernels per pruning point, SDPA.

The exported ONNX graph sizes every pruning point by the data (top-k of ``max(counts)``): on a GPU each
such size is a device → host read and the whole forward replays nothing (``docs/experiments/
2026-11-27-gpu-host-bound.md``: 483 kernels and 6 host waits per forward). Here a ``Plan`` fixes every
shape before the forward runs: batch B, length T and the slots K_p entering each layer. The host knows
each row's keep counts before the run (they depend on ρ and token counts only:
``retention_core.schedule``), so a plan's slots are an upper bound of its rows' counts and each row's
own budget is a mask (slot j of row b is valid while j < count[b, p]), mixed ρ in one batch included.
Nothing reads a device value back: the whole forward can be captured as one CUDA graph
(``retention_torch.runner``).

One pruning point is: the scorer (three small GEMMs), one ``sort`` of the masked scores (the kept slots'
positions in original order come out of the sort keys, no argsort-and-gather), gathers of the kept
states and, for a merging model, one more gather, a cosine matmul and two scatter-adds for the dropped
tokens. Attention is ``scaled_dot_product_attention`` with padding, merged-token log-size and (MPNet)
relative-position bias summed into one additive mask; a plan without any padding slot and without
merging passes no mask at all, so SDPA may use its flash kernel.

The arithmetic is ``training.engine.selection``'s and ``training.engine.model``'s (the export checks this
forward against ``model.onnx`` on its validation grid); the shapes are the static ones.

Shapes: B batch, T slots entering a layer, K slots it keeps, D dropped candidates, d hidden, H heads,
P pruning points (one per layer), r scorer size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from retention_core.contract import Architecture, Schedule
from retention_core.schedule import is_pruning_point
from retention_torch.weights import LayerWeights, ModelWeights, ScorerWeights

# The same constants as training.engine.selection (the ONNX graph's), so selection orders tokens identically.
PROTECTED_SCORE_BONUS = 1e4
EXCLUDED_SCORE = -1e9
MASKED_ATTENTION_BIAS = -1e9
MERGE_NORM_FLOOR = 1e-6
POOL_FLOOR = 1e-9


@dataclass(frozen=True)
class Plan:
    """Every shape of one forward: what a CUDA graph is captured for.

    ``slots[p]``: slots entering layer p (``length`` for every p and ``selecting`` False: the dense
    model, no scorer runs). ``masked``: some slot of some row is padding (or merged tokens weigh more
    than one), so attention needs its additive mask.
    """

    batch: int
    length: int
    slots: tuple[int, ...]
    selecting: bool
    masked: bool


@dataclass(frozen=True)
class Head:
    """What the model's head reads: its kind, a pooled head's pooling, the last layer's queries."""

    kind: str  # "sequence" | "token" | "pooled"
    pooling: str = "mean"  # pooled heads: "mean" | "cls"
    last_layer_queries: int | None = None


TOKEN_INPUTS = ("input_ids", "attention_mask", "protected", "token_type_ids")  # rows of ``Inputs.tokens``


@dataclass
class Inputs:
    """One batch on the device, padded to its plan: the per-token inputs packed in one (4, B, T) int64
    tensor (one host → device copy), keep counts (B, P)."""

    tokens: torch.Tensor  # (4, B, T) int64: ids, mask (1 = real), protected (1 = never dropped), types
    counts: torch.Tensor  # (B, P) int64: tokens each row keeps entering each layer

    @property
    def input_ids(self) -> torch.Tensor:
        return self.tokens[0]

    @property
    def attention_mask(self) -> torch.Tensor:
        return self.tokens[1]

    @property
    def protected(self) -> torch.Tensor:
        return self.tokens[2].bool()

    @property
    def token_type_ids(self) -> torch.Tensor:
        return self.tokens[3]


@dataclass
class Outputs:
    main: torch.Tensor  # pooled (B, d) / sequence (B, C) / token (B, T, C), fp32
    survival_depth: torch.Tensor  # (B, T) int64: layers each input position entered


# ------------------------------------------------------------------------------------------ layers
def activation(x: torch.Tensor, kind: str) -> torch.Tensor:
    if kind == "gelu":
        return F.gelu(x)
    if kind == "gelu_tanh":
        return F.gelu(x, approximate="tanh")
    return F.relu(x)


def encoder_layer(
    w: LayerWeights,
    arch: Architecture,
    hidden: torch.Tensor,
    bias: torch.Tensor | None,
    num_queries: int | None = None,
) -> torch.Tensor:
    """A post-LayerNorm Transformer block: hidden (B, T, d), bias (B, 1, 1, T) / (B, H, T, T) / None →
    (B, Tq, d). ``num_queries`` computes the first Tq positions only (a [CLS] head's last layer)."""
    batch, length, width = hidden.shape
    heads, head_dim = arch.num_heads, width // arch.num_heads
    q, k, v = F.linear(hidden, *w.qkv).split(width, dim=-1)  # (B, T, d) each
    queries_in = hidden
    if num_queries is not None:
        q, queries_in = q[:, :num_queries], hidden[:, :num_queries]  # (B, Tq, d)
        bias = None if bias is None else bias[:, :, :num_queries]
    q = q.reshape(batch, -1, heads, head_dim).transpose(1, 2)  # (B, H, Tq, dh)
    k = k.reshape(batch, length, heads, head_dim).transpose(1, 2)  # (B, H, T, dh)
    v = v.reshape(batch, length, heads, head_dim).transpose(1, 2)  # (B, H, T, dh)
    context = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)  # (B, H, Tq, dh)
    context = context.transpose(1, 2).reshape(batch, -1, width)  # (B, Tq, d)
    eps = arch.layer_norm_eps
    attended = F.layer_norm(F.linear(context, *w.out) + queries_in, (width,), *w.attn_norm, eps)
    expanded = F.linear(activation(F.linear(attended, *w.ffn_in), arch.activation), *w.ffn_out)
    return F.layer_norm(expanded + attended, (width,), *w.ffn_norm, eps)  # (B, Tq, d)


def embed(weights: ModelWeights, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
    """(B, T) ids → (B, T) states after the embedding LayerNorm, in the weights' dtype."""
    arch = weights.architecture
    if arch.positions == "after_padding":  # RoBERTa / MPNet: counted over real tokens from padding_idx + 1
        real = input_ids.ne(arch.padding_idx).to(torch.long)  # (B, T)
        positions = torch.cumsum(real, dim=1) * real + arch.padding_idx
    else:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)  # (1, T)
    hidden = weights.word[input_ids]
    if weights.token_type is not None:
        hidden = hidden + weights.token_type[token_type_ids]
    hidden = hidden + weights.position[positions]
    return F.layer_norm(hidden, (arch.hidden_size,), *weights.embed_norm, arch.layer_norm_eps)


def relative_bucket(relative: torch.Tensor, num_buckets: int, max_distance: int) -> torch.Tensor:
    """MPNet's (T5's bidirectional) bucket of a key − query position difference: (…) int64 → (…)."""
    half = num_buckets // 2
    bucket = (relative > 0).to(torch.long) * half  # keys after the query take the upper half
    distance = relative.abs()
    exact = half // 2
    far = exact + (
        torch.log(distance.float().clamp(min=1) / exact) / math.log(max_distance / exact) * (half - exact)
    ).to(torch.long)
    far = torch.clamp(far, max=half - 1)
    return bucket + torch.where(distance < exact, distance, far)


def relative_bias(weights: ModelWeights, positions: torch.Tensor) -> torch.Tensor:
    """The relative-position attention bias between slots at original positions (B, T) → (B, H, T, T)."""
    arch = weights.architecture
    assert weights.relative_bias is not None and arch.relative_attention_buckets is not None
    relative = positions[:, None, :] - positions[:, :, None]  # (B, Tq, Tk): key − query position
    buckets = relative_bucket(relative, arch.relative_attention_buckets, arch.relative_attention_max_distance)
    return weights.relative_bias[buckets].permute(0, 3, 1, 2)  # (B, Tq, Tk, H) → (B, H, Tq, Tk)


def attention_mask(
    weights: ModelWeights,
    valid: torch.Tensor,
    sizes: torch.Tensor | None,
    positions: torch.Tensor,
    masked: bool,
) -> torch.Tensor | None:
    """The one additive attention term of a layer: padding, merged tokens' log-size, relative positions:
    valid / sizes / positions (B, T) → (B, 1, 1, T) or (B, H, T, T), or None when there is nothing."""
    terms: torch.Tensor | None = None
    if masked:
        terms = (1.0 - valid.to(torch.float32)) * MASKED_ATTENTION_BIAS  # (B, T)
        if sizes is not None:
            terms = terms + torch.log(sizes.clamp(min=1.0))
        terms = terms[:, None, None, :]  # (B, 1, 1, T)
    if weights.relative_bias is not None:
        relative = relative_bias(weights, positions)  # (B, H, T, T)
        terms = relative if terms is None else terms + relative
    return None if terms is None else terms.to(weights.dtype)


# --------------------------------------------------------------------------------------- selection
def decay_matrix(length: int, ema_decay: float, device: torch.device) -> torch.Tensor:
    """The scorer's EMA as a matrix (``RetentionScorer.summary_weights``): D[t, k] = (1-γ) γ^{t-1-k}
    for k < t, else 0. (T, T) fp32."""
    positions = torch.arange(length, device=device)  # (T,)
    lag = positions[:, None] - positions[None, :] - 1  # (T, T)
    log_decay = math.log(ema_decay) if ema_decay > 0 else -1e4
    decay = torch.exp(lag.clamp(min=0).to(torch.float32) * log_decay)
    return torch.where(lag >= 0, decay * (1.0 - ema_decay), torch.zeros_like(decay))


def score(
    scorer: ScorerWeights, hidden: torch.Tensor, valid: torch.Tensor, decay: torch.Tensor
) -> torch.Tensor:
    """Retention scores, fp32: hidden (B, T, d), valid (B, T), decay (T, T) → (B, T)."""
    states = hidden.float()
    projected = F.linear(states, scorer.U) * valid.unsqueeze(-1).to(torch.float32)  # (B, T, r)
    summary = torch.matmul(decay, projected)  # (T, T) @ (B, T, r) → (B, T, r)
    return F.linear(torch.tanh(F.linear(states, *scorer.W) + summary), *scorer.v).squeeze(-1)  # (B, T)


def gather_rows(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """values (B, T, d), index (B, K) → (B, K, d): one index_select over the flattened batch."""
    batch, length, width = values.shape
    offsets = torch.arange(batch, device=index.device).unsqueeze(-1) * length  # (B, 1)
    return values.reshape(-1, width).index_select(0, (index + offsets).reshape(-1)).view(batch, -1, width)


@dataclass
class Slots:
    """The tokens alive entering a layer: their states and, per slot, validity, protection, original
    position and (merging) how many original tokens each holds."""

    hidden: torch.Tensor  # (B, T, d)
    valid: torch.Tensor  # (B, T) bool
    protected: torch.Tensor  # (B, T) bool
    positions: torch.Tensor  # (B, T) int64
    sizes: torch.Tensor | None  # (B, T) fp32; None: the model drops what it does not keep


def select(
    slots: Slots,
    scores: torch.Tensor,
    count: torch.Tensor,
    kept_slots: int,
    schedule: Schedule,
) -> Slots:
    """One pruning point: keep each row's ``count[b]`` best tokens (protected and the leading span
    first) in ``kept_slots`` slots, in original order; merge the rest into their nearest kept token or
    drop them. scores (B, T) fp32, count (B,) int64 → the kept ``Slots`` (B, K)."""
    length = scores.shape[1]
    chosen = slots.protected
    if schedule.leading_share > 0.0:
        span = torch.floor(count.to(torch.float32) * schedule.leading_share).to(torch.long)  # (B,)
        chosen = chosen | (slots.positions < span.unsqueeze(-1))
    lifted = scores + chosen.to(scores.dtype) * PROTECTED_SCORE_BONUS
    masked = torch.where(slots.valid, lifted, torch.full_like(scores, EXCLUDED_SCORE))  # (B, T)
    order = torch.argsort(masked, dim=1, descending=True)  # (B, T): every slot, best first
    rank = torch.arange(kept_slots, device=scores.device).unsqueeze(0)  # (1, K)
    kept = rank < count.unsqueeze(-1)  # (B, K): this row's budget
    # Sort keys: a kept slot's position, a padding slot's position + T: one sort gives the kept
    # positions in original order, then the padding slots.
    keys, _ = torch.sort(torch.where(kept, order[:, :kept_slots], order[:, :kept_slots] + length), dim=1)
    valid = keys < length  # (B, K)
    index = torch.where(valid, keys, keys - length)  # (B, K)
    kept_states = gather_rows(slots.hidden, index)  # (B, K, d)
    protected = torch.gather(slots.protected, 1, index) & valid
    positions = torch.gather(slots.positions, 1, index)
    if slots.sizes is None:
        return Slots(kept_states, valid, protected, positions, None)
    kept_sizes = torch.gather(slots.sizes, 1, index) * valid.to(torch.float32)  # (B, K)
    hidden, sizes = merge_dropped(slots, order, count, kept_states, kept_sizes, valid)
    return Slots(hidden, valid, protected, positions, sizes)


def merge_dropped(
    slots: Slots,
    order: torch.Tensor,
    count: torch.Tensor,
    kept_states: torch.Tensor,
    kept_sizes: torch.Tensor,
    kept: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fold every real token a point drops into its most similar kept one (``training.engine.selection.
    merge_dropped``'s size-weighted mean). The dropped tokens of row b are the ranks count[b] …
    n_valid[b] − 1 of ``order`` (B, T); D = T candidates keep the shape static. → states (B, K, d),
    sizes (B, K)."""
    assert slots.sizes is not None
    length = order.shape[1]
    taken = count.unsqueeze(-1) + torch.arange(length, device=order.device).unsqueeze(0)  # (B, D)
    dropped = taken < slots.valid.sum(1, keepdim=True)  # (B, D)
    drop_index = torch.gather(order, 1, taken.clamp(max=length - 1))  # (B, D)
    drop_states = gather_rows(slots.hidden, drop_index)  # (B, D, d)
    drop_sizes = torch.gather(slots.sizes, 1, drop_index) * dropped.to(torch.float32)  # (B, D)
    unit = drop_states / drop_states.norm(dim=-1, keepdim=True).clamp(min=MERGE_NORM_FLOOR)
    targets = kept_states / kept_states.norm(dim=-1, keepdim=True).clamp(min=MERGE_NORM_FLOOR)
    similarity = torch.matmul(unit, targets.transpose(1, 2))  # (B, D, K)
    similarity = torch.where(kept.unsqueeze(1), similarity, torch.full_like(similarity, EXCLUDED_SCORE))
    destination = similarity.argmax(dim=-1)  # (B, D)
    mass = kept_sizes.scatter_add(1, destination, drop_sizes)  # (B, K)
    share = drop_sizes / torch.gather(mass, 1, destination).clamp(min=1.0)  # (B, D)
    pull = (drop_states - gather_rows(kept_states, destination)) * share.unsqueeze(-1).to(drop_states.dtype)
    spread = destination.unsqueeze(-1).expand_as(pull)  # (B, D, d)
    return kept_states.scatter_add(1, spread, pull), mass


# ------------------------------------------------------------------------------------------ forward
def forward(
    weights: ModelWeights,
    schedule: Schedule,
    head: Head,
    plan: Plan,
    inputs: Inputs,
    decays: dict[int, torch.Tensor],
) -> Outputs:
    """The model on one padded batch of ``plan``'s shapes. ``decays``: the scorer's decay matrix per
    slot count (``decay_matrix``), made once per model so a captured graph holds no construction."""
    arch = weights.architecture
    valid = inputs.attention_mask.bool()  # (B, T)
    embedded = embed(weights, inputs.input_ids, inputs.token_type_ids)  # (B, T, d)
    positions = torch.arange(plan.length, device=valid.device).unsqueeze(0).expand_as(inputs.input_ids)
    merging = plan.selecting and schedule.merge_dropped
    slots = Slots(
        embedded, valid, inputs.protected & valid, positions, valid.to(torch.float32) if merging else None
    )
    depth = torch.zeros_like(inputs.input_ids)  # (B, T)
    restored = embedded  # (B, T, d): token heads read every position's latest state
    bias = attention_mask(weights, slots.valid, slots.sizes, slots.positions, plan.masked)
    for point, layer in enumerate(weights.layers):
        if plan.selecting and is_pruning_point(point, schedule.pruning_interval):
            decay = decays[slots.hidden.shape[1]]
            scores = score(weights.scorers[point], slots.hidden, slots.valid, decay)  # (B, T)
            slots = select(slots, scores, inputs.counts[:, point], plan.slots[point], schedule)
            bias = attention_mask(weights, slots.valid, slots.sizes, slots.positions, plan.masked)
        depth = depth.scatter_add(1, slots.positions, slots.valid.to(depth.dtype))
        last = point == len(weights.layers) - 1
        queries = head.last_layer_queries if last else None
        slots.hidden = encoder_layer(layer, arch, slots.hidden, bias, queries)
        if head.kind == "token":
            restored = scatter_valid(restored, slots)
    return Outputs(head_output(weights, head, slots, restored), depth)


def scatter_valid(restored: torch.Tensor, slots: Slots) -> torch.Tensor:
    """Write the valid slots' states (B, K, d) back to their original positions in (B, T, d)."""
    index = slots.positions.unsqueeze(-1).expand(-1, -1, restored.shape[-1])  # (B, K, d)
    current = torch.gather(restored, 1, index)
    return restored.scatter(1, index, torch.where(slots.valid.unsqueeze(-1), slots.hidden, current))


def head_output(weights: ModelWeights, head: Head, slots: Slots, restored: torch.Tensor) -> torch.Tensor:
    """The head on the final slots (pooled, sequence) or on every position (token), fp32."""
    tensors = weights.head_tensors
    if head.kind == "token":
        return F.linear(restored, tensors["head.out.weight"], tensors["head.out.bias"]).float()  # (B, T, C)
    first = slots.hidden[:, 0]  # (B, d): [CLS], always kept
    if head.kind == "sequence":
        dense = torch.tanh(F.linear(first, tensors["head.dense.weight"], tensors["head.dense.bias"]))
        return F.linear(dense, tensors["head.out.weight"], tensors["head.out.bias"]).float()  # (B, C)
    if head.pooling == "cls":
        return first.float()
    weight = (slots.sizes if slots.sizes is not None else slots.valid.to(torch.float32)).unsqueeze(-1)
    total = (weight.transpose(1, 2) @ slots.hidden.float()).squeeze(1)  # (B, d): see MeanPooling
    return total / weight.sum(1).clamp(min=POOL_FLOOR)
