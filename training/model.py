"""The retention engine: an encoder backbone + one scorer per pruning point + a task head.

Two forward passes share every parameter:

- ``forward_soft`` (training): Hard-Concrete gates soft-mask the keys of every layer with the
  running product of gates, and report the expected number of surviving tokens per point for the
  Lagrangian budget.
- ``forward_pruned`` (inference, export, evaluation): deterministic top-M per point; kept tokens are
  gathered (physically removed from the sequence), in original order, [CLS] and protected tokens
  always kept, pads never kept. Optional Drop-and-Restore scatters every token's last state back to
  its position for token-level heads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn

from retention_core.tasks import task_spec
from training import retention as R
from training.encoders import EncoderBackbone, LayerView

# Selector: (point index, next layer, hidden (B,T,d), valid (B,T), generator) → scores (B, T).
Selector = Callable[[int, LayerView, torch.Tensor, torch.Tensor], torch.Tensor]
GateKind = Literal["hard_concrete", "sigmoid", "none"]
ScoreShift = Literal["quantile", "calibrated"]
SCORE_SHIFTS = {"quantile": R.budget_threshold, "calibrated": R.calibrated_threshold}
OPEN_GATE_PROBABILITY = 0.5  # threshold ablation: a gate counts as open when P(z > 0) exceeds this


@dataclass(frozen=True)
class RetentionConfig:
    scorer_size: int = 32
    ema_decay: float = 0.9
    schedule_power: float = 1.0
    hard_concrete: R.HardConcrete = field(default_factory=R.HardConcrete)
    normalize_scores: bool = False  # training only: shift scores per row so the budget sets counts
    score_shift: ScoreShift = "quantile"  # with normalize_scores: budget_threshold or calibrated_threshold


@dataclass
class SoftOutput:
    logits: torch.Tensor  # (B, C) or (B, T, C)
    expected_kept: torch.Tensor  # (B, P) expected survivors entering each layer
    target_kept: torch.Tensor  # (B, P) budget M_p = frac_p(ρ)·n_real
    num_real: torch.Tensor  # (B,)
    open_prob: torch.Tensor | None = None  # (B, P, T) P(z > 0) of each token's gate; None without gates


@dataclass
class PrunedOutput:
    logits: torch.Tensor  # (B, C) or (B, T, C)
    kept_counts: torch.Tensor  # (B, P) tokens entering each layer
    survivors: torch.Tensor | None = None  # (B, P, T) bool: real tokens entering each layer, if asked


class ClassificationHead(nn.Module):
    """[CLS] → tanh(dense) → labels, as BERT/RoBERTa classification heads do."""

    def __init__(self, hidden_size: int, num_labels: int, dropout: float) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.out = nn.Linear(hidden_size, num_labels)
        self.dropout = nn.Dropout(dropout)

    def forward(self, cls_state: torch.Tensor) -> torch.Tensor:
        """(B, d) → (B, C)."""
        return self.out(self.dropout(torch.tanh(self.dense(self.dropout(cls_state)))))


class TokenHead(nn.Module):
    """Per-token logits (span start/end, sentence salience): (B, T, d) → (B, T, C)."""

    def __init__(self, hidden_size: int, num_outputs: int, dropout: float) -> None:
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.out = nn.Linear(hidden_size, num_outputs)

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        return self.out(self.dropout(states))


class RetentionModel(nn.Module):
    def __init__(
        self,
        backbone: EncoderBackbone,
        task: str,
        num_outputs: int,
        config: RetentionConfig | None = None,
        head_dropout: float = 0.1,
    ) -> None:
        super().__init__()
        self.spec = task_spec(task)  # KeyError for an unregistered task
        self.backbone = backbone
        self.task = task
        self.config = config or RetentionConfig()
        width = backbone.info.hidden_size
        self.scorers = nn.ModuleList(
            R.RetentionScorer(width, self.config.scorer_size, self.config.ema_decay)
            for _ in range(backbone.info.num_layers)
        )
        self.head: nn.Module
        if self.spec.head == "sequence":
            self.head = ClassificationHead(width, num_outputs, head_dropout)
        else:
            self.head = TokenHead(width, num_outputs, head_dropout)

    @property
    def num_points(self) -> int:
        return len(self.scorers)

    @property
    def last_layer_queries(self) -> int | None:
        """A head that reads only [CLS] lets the last layer compute one query."""
        return self.spec.last_layer_queries

    def default_protected(self, attention_mask: torch.Tensor) -> torch.Tensor:
        """[CLS] (position 0) of every row. (B, T) bool"""
        positions = torch.arange(attention_mask.shape[1], device=attention_mask.device)
        return (positions == 0).unsqueeze(0) & attention_mask.bool()

    # ------------------------------------------------------------------ training
    def forward_soft(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        rho: torch.Tensor,
        protected: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        gates: GateKind = "hard_concrete",
    ) -> SoftOutput:
        """Soft-masked pass for training. input_ids/attention_mask (B, T), rho (B,).

        ``gates``: "hard_concrete" (the method), "sigmoid" (ablation: deterministic sigmoid gates,
        no noise, no exact zeros) or "none" (dense; every token kept).
        """
        valid = attention_mask.bool()  # (B, T)
        protected = self.default_protected(attention_mask) if protected is None else protected & valid
        num_real = valid.sum(1)  # (B,)
        fractions = R.keep_fractions(rho, self.num_points, self.config.schedule_power)  # (B, P)
        rates = R.conditional_keep_rates(self._droppable_fractions(fractions, num_real, protected))
        prior = self.config.hard_concrete.log_alpha_for_rate(rates)  # (B, P)
        hidden = self.backbone.embed(input_ids, token_type_ids)  # (B, T, d)
        gate_product = valid.to(hidden.dtype)  # (B, T)
        prob_product = valid.to(hidden.dtype)  # (B, T)
        expected = []
        open_probs: list[torch.Tensor] = []  # per point (B, T)
        for point, layer in enumerate(self.backbone.views):
            if gates != "none":
                scores = self.scorers[point](hidden, valid)  # (B, T)
                if self.config.normalize_scores:
                    candidates = torch.where(protected, torch.zeros_like(prob_product), prob_product)
                    threshold = SCORE_SHIFTS[self.config.score_shift]
                    scores = scores - threshold(scores, candidates, rates[:, point])
                log_alpha = scores + prior[:, point : point + 1]  # (B, T)
                prob = self.config.hard_concrete.prob_nonzero(log_alpha)
                open_probs.append(prob)
                gate = self._gate(log_alpha, prob, gates, generator)
                gate_product = gate_product * torch.where(protected, torch.ones_like(gate), gate)
                prob_product = prob_product * torch.where(protected, torch.ones_like(prob), prob)
            expected.append(prob_product.sum(1))
            key_bias = torch.where(
                valid[:, None, None, :],
                R.soft_attention_bias(gate_product),
                torch.full_like(gate_product[:, None, None, :], R.MASKED_ATTENTION_BIAS),
            )  # (B, 1, 1, T)
            is_last = point == self.num_points - 1
            updated = layer(hidden, key_bias, self.last_layer_queries if is_last else None)
            if self.spec.restores_tokens:
                # Drop-and-Restore, soft: a closed gate freezes the token at its last state.
                keep = gate_product.unsqueeze(-1)  # (B, T, 1)
                updated = keep * updated + (1.0 - keep) * hidden
            hidden = updated
        target = fractions * num_real.unsqueeze(-1).to(fractions.dtype)  # (B, P)
        open_prob = torch.stack(open_probs, dim=1) if open_probs else None  # (B, P, T)
        return SoftOutput(self._head(hidden), torch.stack(expected, dim=1), target, num_real, open_prob)

    def _droppable_fractions(
        self, fractions: torch.Tensor, num_real: torch.Tensor, protected: torch.Tensor
    ) -> torch.Tensor:
        """(B, P) schedule → the share of droppable tokens the soft gates aim at. The calibrated shift
        counts protected tokens against the budget like top-M inference; the quantile shift keeps the
        recorded runs' accounting (a share of the droppable tokens equal to the schedule)."""
        if self.config.normalize_scores and self.config.score_shift == "calibrated":
            return R.candidate_keep_fractions(fractions, num_real, protected.sum(1))
        return fractions

    def _gate(
        self,
        log_alpha: torch.Tensor,
        prob: torch.Tensor,
        gates: GateKind,
        generator: torch.Generator | None,
    ) -> torch.Tensor:
        if gates == "sigmoid":
            return prob
        if self.training:
            return self.config.hard_concrete.sample(log_alpha, generator)
        return self.config.hard_concrete.deterministic(log_alpha)

    # ------------------------------------------------------------------ inference
    def forward_pruned(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        rho: torch.Tensor,
        protected: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        selector: Selector | None = None,
        threshold: bool = False,
        record_survivors: bool = False,
    ) -> PrunedOutput:
        """Physically pruned pass. input_ids/attention_mask (B, T), rho (B,) → logits, kept counts (B, P).

        ``threshold`` (ablation): instead of the scheduled top-M, keep every token whose gate would be
        open, P(z > 0) > ½ under the budget prior; counts then vary per example and miss the budget.
        ``record_survivors`` (diagnostics, not exported): also return which original positions entered
        each layer.
        """
        valid = attention_mask.bool()  # (B, T)
        protected = self.default_protected(attention_mask) if protected is None else protected & valid
        num_real = valid.sum(1)  # (B,)
        counts = R.keep_counts(
            rho, num_real, protected.sum(1), self.num_points, self.config.schedule_power
        )  # (B, P)
        if threshold:
            fractions = R.keep_fractions(rho, self.num_points, self.config.schedule_power)  # (B, P)
            prior = self.config.hard_concrete.log_alpha_for_rate(R.conditional_keep_rates(fractions))
        hidden = self.backbone.embed(input_ids, token_type_ids)  # (B, T, d)
        restore = self.spec.restores_tokens
        restored = hidden  # (B, T, d): every token's latest state, scattered back at the end
        survivors: list[torch.Tensor] = []  # per point (B, T) bool, filled if record_survivors
        positions = torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0).expand_as(valid)  # (B,T)
        for point, layer in enumerate(self.backbone.views):
            raw = selector(point, layer, hidden, valid) if selector else self.scorers[point](hidden, valid)
            if threshold:
                counts[:, point] = self._open_gates(raw, prior[:, point], valid, protected)
            index, valid = R.select_top_tokens(R.masked_scores(raw, valid, protected), counts[:, point])
            hidden = R.gather_tokens(hidden, index)  # (B, K, d)
            protected = R.gather_tokens(protected, index)  # (B, K)
            positions = R.gather_tokens(positions, index)  # (B, K)
            if record_survivors:
                survivors.append(_alive_positions(positions, valid, input_ids.shape[1]))
            is_last = point == self.num_points - 1
            hidden = layer(
                hidden, R.attention_bias(valid, hidden.dtype), self.last_layer_queries if is_last else None
            )
            if restore:
                restored = _scatter_valid(restored, positions, hidden, valid)
        logits = self._head(restored if restore else hidden)
        return PrunedOutput(logits, counts, torch.stack(survivors, dim=1) if record_survivors else None)

    def _open_gates(
        self, raw: torch.Tensor, prior: torch.Tensor, valid: torch.Tensor, protected: torch.Tensor
    ) -> torch.Tensor:
        """Tokens (B, T) whose gate is open at this point → count per row (B,). Since the prior is one
        number per row, these are exactly the top-count tokens by score, so top-k can select them."""
        log_alpha = raw + prior.unsqueeze(-1)  # (B, T)
        open_gate = self.config.hard_concrete.prob_nonzero(log_alpha) > OPEN_GATE_PROBABILITY
        return (valid & (open_gate | protected)).sum(1)

    def _head(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.spec.head == "sequence":
            return self.head(hidden[:, 0])  # (B, d) → (B, C)
        return self.head(hidden)  # (B, T, d) → (B, T, C)


def _alive_positions(positions: torch.Tensor, valid: torch.Tensor, length: int) -> torch.Tensor:
    """Kept slots (B, K) → (B, T) bool over the original positions. Counts, not a bool scatter: a
    padding slot may carry the same position as a kept one."""
    hits = torch.zeros(positions.shape[0], length, dtype=torch.long, device=positions.device)  # (B, T)
    return hits.scatter_add(1, positions, valid.long()) > 0


def _scatter_valid(
    restored: torch.Tensor, positions: torch.Tensor, hidden: torch.Tensor, valid: torch.Tensor
) -> torch.Tensor:
    """Write the valid slots of hidden (B, K, d) back to their positions in restored (B, T, d)."""
    index = positions.unsqueeze(-1).expand(-1, -1, hidden.shape[-1])  # (B, K, d)
    current = torch.gather(restored, 1, index)  # (B, K, d)
    update = torch.where(valid.unsqueeze(-1), hidden, current)  # (B, K, d)
    return restored.scatter(1, index, update)


# ---------------------------------------------------------------------- baseline selectors
def random_selector(generator: torch.Generator) -> Selector:
    """Random-k: every token equally likely to be kept (protected tokens still kept)."""

    def select(point: int, layer: LayerView, hidden: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        return R.random_scores(valid, generator)

    return select


def attention_selector() -> Selector:
    """PoWER-BERT / H2O style: the attention each token receives in the next layer, summed over
    heads and (valid) queries. Needs the attention probabilities, so it cannot use fused attention."""

    def select(point: int, layer: LayerView, hidden: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        probs = layer.attention_probs(hidden, R.attention_bias(valid, hidden.dtype))  # (B, H, T, T)
        query_weight = valid.to(probs.dtype)[:, None, :, None]  # (B, 1, T, 1)
        return (probs * query_weight).sum(dim=(1, 2))  # (B, T)

    return select
