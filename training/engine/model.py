"""The retention engine: an encoder backbone + one scorer per pruning point + a task head.

Two forward passes share every parameter:

- ``forward_soft`` (training): gates (``training.engine.gates.SoftGates``) soft-mask the keys of every
  layer with their running product, and report the expected number of surviving tokens per point
  for the Lagrangian budget.
- ``forward_pruned`` (inference, export, evaluation): deterministic top-M per point; kept tokens are
  gathered (physically removed from the sequence), in original order, [CLS] and protected tokens
  always kept, pads never kept. Optional Drop-and-Restore scatters every token's last state back to
  its position for token-level heads. Its inputs are the exported graph's, plus an optional baseline
  ``selector``.
- ``forward_evaluation``: the same pass with evaluation-only probes (the open-gate ablation, survivor
  diagnostics); never exported.

A retrofit may give the pruned branch weights of its own (``add_pruned_branch``: a trainable copy of the
backbone, ``pruned_backbone``): then the soft pass and every row the pruned pass runs at ρ < 1 use the
copy, while ρ = 1 (``forward_unpruned``, and each ρ ≥ 1 row of ``forward_pruned``) is the original
backbone, exactly.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn

from retention_core import contract as C
from retention_core.contract import Pooling
from retention_core.schedule import SCHEDULE_DEFAULTS
from retention_core.tasks import task_spec
from training.engine import selection as S
from training.engine import terms as T
from training.engine.encoders import EncoderBackbone, LayerView
from training.engine.gates import SoftGates
from training.engine.heads import CLS_QUERIES, ClassificationHead, CLSPooling, MeanPooling, TokenHead
from training.engine.probe import EvaluationProbe

# Selector: (point index, next layer, hidden (B,T,d), valid (B,T), the layer's attention bias on those
# slots (B,1,1,T) or (B,H,T,T)) → scores (B, T).
Selector = Callable[[int, LayerView, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
# Which path(s) ``forward_pruned`` runs on a model whose pruned branch has weights of its own: "by_batch"
# decides from the batch (every row ρ ≥ 1: the original; none: the copy; mixed: both), "pruned" runs
# the copy's pruned pass on every row, "both" runs both on every row (each row takes its own).
BranchPaths = Literal["by_batch", "pruned", "both"]
METHOD_GATES = SoftGates()  # Hard-Concrete gates without a score shift


@dataclass(frozen=True)
class RetentionConfig:
    """What a trained model needs at inference: scorer shape, schedule and its gates' distribution."""

    scorer_size: int = 32
    ema_decay: float = 0.9
    # The schedule's settings (retention_core.schedule.ScheduleSettings: defaults, bounds and meaning
    # declared there once; power is schedule_power here, as in the recipe).
    schedule_power: float = SCHEDULE_DEFAULTS.power
    min_kept_tokens: int = SCHEDULE_DEFAULTS.min_kept_tokens
    merge_dropped: bool = SCHEDULE_DEFAULTS.merge_dropped
    leading_share: float = SCHEDULE_DEFAULTS.leading_share
    pruning_interval: int = SCHEDULE_DEFAULTS.pruning_interval
    # What a pooled head (embedding) pools: the retrofitted model's own sentence-transformers pooling
    # (training.fitting.fit.head_pooling). Ignored by the other heads.
    pooling: Pooling = "mean"
    hard_concrete: T.HardConcrete = field(default_factory=T.HardConcrete)


# The retention settings the exported graph bakes into its schedule, one line each: the field of the
# recipe's ``retention`` and of ``RetentionConfig`` (same name) → the field of the manifest's
# ``contract.Schedule``. ``training.fitting.fit.retention_config`` copies them recipe → model,
# ``manifest_schedule`` model → manifest; a new schedule setting is added here (and to the three types),
# nowhere else.
SCHEDULE_FIELDS: dict[str, str] = {
    "schedule_power": "power",
    "min_kept_tokens": "min_kept_tokens",
    "merge_dropped": "merge_dropped",
    "leading_share": "leading_share",
    "pruning_interval": "pruning_interval",
}


@dataclass
class SoftOutput:
    logits: torch.Tensor  # (B, C) or (B, T, C)
    expected_kept: torch.Tensor  # (B, P) expected survivors entering each layer
    target_kept: torch.Tensor  # (B, P) budget M_p = frac_p(ρ)·n_real
    num_real: torch.Tensor  # (B,)
    open_prob: torch.Tensor  # (B, P, T) P(z > 0) of each token's gate


@dataclass
class PrunedOutput:
    logits: torch.Tensor  # (B, C) or (B, T, C)
    kept_counts: torch.Tensor  # (B, P) tokens entering each layer
    # (B, T) int64: how many layers each input position entered (0 for pads, P for a token never dropped)
    survival_depth: torch.Tensor


@dataclass(frozen=True)
class PrunedInputs:
    """The pruned pass's model inputs: the exported graph's, as ``forward_pruned`` takes them."""

    input_ids: torch.Tensor  # (B, T)
    attention_mask: torch.Tensor  # (B, T)
    rho: torch.Tensor  # (B,)
    protected: torch.Tensor | None = None  # (B, T) bool; None = [CLS] only
    token_type_ids: torch.Tensor | None = None  # (B, T)


@dataclass
class EvaluationOutput(PrunedOutput):
    survivors: torch.Tensor | None = None  # (B, P, T) bool: real tokens entering each layer, if asked


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
            S.RetentionScorer(width, self.config.scorer_size, self.config.ema_decay)
            for _ in range(backbone.info.num_layers)
        )
        self.head: nn.Module
        self.backbone_frozen = False
        # The pruned branch's own weights (add_pruned_branch); None: ρ < 1 runs ``backbone`` too.
        self.pruned_backbone: EncoderBackbone | None = None
        if self.spec.head == "sequence":
            self.head = ClassificationHead(width, num_outputs, head_dropout)
        elif self.spec.head == "pooled":
            self.head = CLSPooling() if self.pools_cls else MeanPooling()
        else:
            self.head = TokenHead(width, num_outputs, head_dropout)

    def freeze_backbone(self) -> None:
        """Retrofit: the backbone's weights stop training and it always runs as at inference (no
        dropout), so the dense pass (ρ = 1) stays exactly the original model; only scorers and head
        learn."""
        self.backbone_frozen = True
        self.backbone.requires_grad_(False)
        self.backbone.eval()

    def add_pruned_branch(self, own_embeddings: bool = True) -> EncoderBackbone:
        """Give the pruned branch weights of its own: a trainable copy of the backbone as it is now (the
        original's weights), which the soft pass and the pruned pass at ρ < 1 run from then on. The
        backbone itself stays what ρ = 1 runs (frozen by ``freeze_backbone`` in a retrofit).
        ``own_embeddings`` False: the copy's embeddings stay the original's (frozen), so the export,
        which stores a weight of identical bytes once, shares the tables between the paths."""
        if self.pruned_backbone is not None:
            raise ValueError("this model already has a pruned branch")
        branch = copy.deepcopy(self.backbone)
        branch.requires_grad_(True)
        if not own_embeddings:
            branch.embeddings.requires_grad_(False)
        branch.train(self.training)
        self.pruned_backbone = branch
        return branch

    @property
    def pruned_encoder(self) -> EncoderBackbone:
        """The backbone the pruned branch (ρ < 1) and the soft pass run: its own copy when it has one."""
        return self.backbone if self.pruned_backbone is None else self.pruned_backbone

    def train(self, mode: bool = True) -> RetentionModel:
        super().train(mode)
        if self.backbone_frozen:
            self.backbone.eval()
        return self

    @property
    def num_points(self) -> int:
        return len(self.scorers)

    @property
    def pools_cls(self) -> bool:
        """A pooled head with CLS pooling (an embedding model such as BGE or Arctic-embed)."""
        return self.spec.head == "pooled" and self.config.pooling == "cls"

    @property
    def last_layer_queries(self) -> int | None:
        """A head that reads only [CLS] (a sequence head, CLS pooling) lets the last layer compute one
        query."""
        return CLS_QUERIES if self.pools_cls else self.spec.last_layer_queries

    def keep_fractions(self, rho: torch.Tensor, num_real: torch.Tensor) -> torch.Tensor:
        """The schedule's share of real tokens alive entering each layer, floor included: (B,), (B,) →
        (B, P), the pruning interval's groups included: what the soft pass and the open-gate ablation aim
        at, the counts the graph keeps (the graph's torch arithmetic, ``retention_core.schedule.
        keep_fractions`` in numpy; tests/test_schedule_agreement.py holds them together)."""
        config = self.config
        fractions = S.keep_fractions(rho, self.num_points, config.schedule_power, config.pruning_interval)
        return T.floored_fractions(fractions, num_real, self.config.min_kept_tokens)

    def keep_counts(
        self, rho: torch.Tensor, num_real: torch.Tensor, num_protected: torch.Tensor
    ) -> torch.Tensor:
        """Tokens kept entering each layer under this model's schedule and floor: (B,) × 3 → (B, P).
        The one place the pruned pass and the equal-work baselines get their budgets from."""
        return S.keep_counts(
            rho,
            num_real,
            num_protected,
            self.num_points,
            self.config.schedule_power,
            self.config.min_kept_tokens,
            self.config.pruning_interval,
        )

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
        gates: SoftGates = METHOD_GATES,
    ) -> SoftOutput:
        """Soft-masked pass for training. input_ids/attention_mask (B, T), rho (B,).

        ``gates`` (the objective's, ``SoftGates.from_recipe``) picks the gate kind and the score shift.
        """
        valid = attention_mask.bool()  # (B, T)
        protected = self.default_protected(attention_mask) if protected is None else protected & valid
        num_real = valid.sum(1)  # (B,)
        distribution = self.config.hard_concrete
        fractions = self.keep_fractions(rho, num_real)  # (B, P); the floor's targets, as top-M keeps
        rates = gates.keep_rates(fractions, num_real, protected)  # (B, P)
        prior = distribution.log_alpha_for_rate(rates)  # (B, P)
        encoder = self.pruned_encoder  # the weights the pruned branch runs at ρ < 1
        hidden = encoder.embed(input_ids, token_type_ids)  # (B, T, d)
        relative = encoder.position_bias(original_positions(valid))  # (B, H, T, T) or None
        gate_product = valid.to(hidden.dtype)  # (B, T)
        prob_product = valid.to(hidden.dtype)  # (B, T)
        expected = []
        open_probs: list[torch.Tensor] = []  # per point (B, T)
        for point, layer in enumerate(encoder.views):
            scores = gates.shift(self.scorers[point](hidden, valid), prob_product, protected, rates[:, point])
            log_alpha = scores + prior[:, point : point + 1]  # (B, T)
            prob = distribution.prob_nonzero(log_alpha)
            open_probs.append(prob)
            gate = gates.gate(distribution, log_alpha, prob, generator, self.training)
            gate_product = gate_product * torch.where(protected, torch.ones_like(gate), gate)
            prob_product = prob_product * torch.where(protected, torch.ones_like(prob), prob)
            expected.append(prob_product.sum(1))
            key_bias = torch.where(
                valid[:, None, None, :],
                T.soft_attention_bias(gate_product),
                torch.full_like(gate_product[:, None, None, :], S.MASKED_ATTENTION_BIAS),
            )  # (B, 1, 1, T)
            if relative is not None:
                key_bias = key_bias + relative  # (B, H, T, T)
            is_last = point == self.num_points - 1
            updated = layer(hidden, key_bias, self.last_layer_queries if is_last else None)
            if self.spec.restores_tokens:
                # Drop-and-Restore, soft: a closed gate freezes the token at its last state.
                keep = gate_product.unsqueeze(-1)  # (B, T, 1)
                updated = keep * updated + (1.0 - keep) * hidden
            hidden = updated
        target = fractions * num_real.unsqueeze(-1).to(fractions.dtype)  # (B, P)
        open_prob = torch.stack(open_probs, dim=1)  # (B, P, T)
        # A head that restores nothing (pooled) weighs each token by its soft survival, as inference
        # pools the tokens that reach the end.
        logits = self.head_output(hidden, attention_mask if self.spec.restores_tokens else gate_product)
        return SoftOutput(logits, torch.stack(expected, dim=1), target, num_real, open_prob)

    # ------------------------------------------------------------------ inference
    def forward_pruned(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        rho: torch.Tensor,
        protected: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        *,
        selector: Selector | None = None,
        paths: BranchPaths = "by_batch",
    ) -> PrunedOutput:
        """Physically pruned pass (what export traces). input_ids/attention_mask (B, T), rho (B,) →
        logits, kept counts (B, P). ``selector`` replaces the learned scorers (random / attention
        baselines). ``paths`` matters only to a model whose pruned branch has weights of its own (the
        export traces each choice of ``_branched_pass`` as a graph of its own)."""
        inputs = PrunedInputs(input_ids, attention_mask, rho, protected, token_type_ids)
        if self.pruned_backbone is None or paths == "pruned":
            return self._pruned_pass(inputs, selector, None)
        if paths == "both":
            return self._both_paths(inputs, selector)
        return self._branched_pass(inputs, selector)

    def _branched_pass(self, inputs: PrunedInputs, selector: Selector | None) -> PrunedOutput:
        """``forward_pruned`` of a model whose pruned branch has its own weights: rows at ρ < 1 run the
        pruned pass on the copy, rows at ρ ≥ 1 the original model (``forward_unpruned``), so ρ = 1 is the
        original exactly whatever else shares the batch. A batch all on one side runs only that side."""
        dense = inputs.rho >= 1.0  # (B,)
        if bool(dense.all()):
            return self.forward_unpruned(inputs.input_ids, inputs.attention_mask, inputs.token_type_ids)
        if not bool(dense.any()):
            return self._pruned_pass(inputs, selector, None)
        return self._both_paths(inputs, selector)

    def _both_paths(self, inputs: PrunedInputs, selector: Selector | None) -> PrunedOutput:
        """Both paths over every row, each row keeping its own: the original's output where ρ ≥ 1, the
        copy's pruned pass elsewhere (a mixed batch; the graph's branch for one, with no Python choice)."""
        dense = inputs.rho >= 1.0  # (B,)
        out = self._pruned_pass(inputs, selector, None)
        original = self.forward_unpruned(inputs.input_ids, inputs.attention_mask, inputs.token_type_ids)
        rows = dense.view(-1, *([1] * (out.logits.dim() - 1)))  # (B, 1) or (B, 1, 1)
        # kept counts and survival depth: a ρ ≥ 1 row keeps every token in both passes
        return PrunedOutput(
            torch.where(rows, original.logits, out.logits), out.kept_counts, out.survival_depth
        )

    def forward_evaluation(
        self,
        inputs: PrunedInputs,
        *,
        selector: Selector | None = None,
        open_gates: bool = False,
        record_survivors: bool = False,
    ) -> EvaluationOutput:
        """The pruned pass with evaluation-only options (never exported).

        ``open_gates`` (ablation): keep every token whose gate is open instead of the scheduled top-M
        (``EvaluationProbe``). ``record_survivors`` (diagnostics): also return which original positions
        entered each layer.
        """
        distribution = self.config.hard_concrete
        prior = None
        if open_gates:
            fractions = self.keep_fractions(inputs.rho, inputs.attention_mask.sum(1))  # (B, P)
            prior = distribution.log_alpha_for_rate(T.conditional_keep_rates(fractions))  # (B, P)
        length = inputs.input_ids.shape[1] if record_survivors else None
        probe = EvaluationProbe(distribution, prior, length)
        out = self._pruned_pass(inputs, selector, probe)
        return EvaluationOutput(out.logits, out.kept_counts, out.survival_depth, probe.survivors())

    def _pruned_pass(
        self, inputs: PrunedInputs, selector: Selector | None, probe: EvaluationProbe | None
    ) -> PrunedOutput:
        """Deterministic top-M per point; kept tokens are gathered (physically removed), in original
        order, [CLS] and protected tokens always kept, pads never kept."""
        valid = inputs.attention_mask.bool()  # (B, T)
        given = inputs.protected
        protected = self.default_protected(inputs.attention_mask) if given is None else given & valid
        num_real = valid.sum(1)  # (B,)
        counts = self.keep_counts(inputs.rho, num_real, protected.sum(1))  # (B, P)
        encoder = self.pruned_encoder
        hidden = encoder.embed(inputs.input_ids, inputs.token_type_ids)  # (B, T, d)
        restore = self.spec.restores_tokens
        restored = hidden  # (B, T, d): every token's latest state, scattered back at the end
        positions = original_positions(valid)  # (B, T)
        depth = torch.zeros_like(positions)  # (B, T) int64: layers entered so far, per original position
        merge = self.config.merge_dropped
        sizes = valid.to(hidden.dtype)  # (B, T): original tokens each slot holds (merging only)
        interval = self.config.pruning_interval
        key_bias = torch.empty(0)  # set at point 0, which always selects
        for point, layer in enumerate(encoder.views):
            if S.is_pruning_point(point, interval):
                hidden, sizes, valid, protected, positions = self._select(
                    point, layer, hidden, sizes, valid, protected, positions, counts, selector, probe
                )
                key_bias = encoder.layer_bias(
                    S.proportional_bias(valid, sizes, hidden.dtype)
                    if merge
                    else S.attention_bias(valid, hidden.dtype),
                    positions,
                )  # (B, 1, 1, K); (B, H, K, K) with the survivors' relative positions
            elif probe is not None:  # inside a group: the same survivors enter this layer
                probe.after_selection(positions, valid)
            depth = S.add_layer_survivors(depth, positions, valid)
            is_last = point == self.num_points - 1
            hidden = layer(hidden, key_bias, self.last_layer_queries if is_last else None)
            if restore:
                restored = _scatter_valid(restored, positions, hidden, valid)
        pool_weights = sizes if merge else valid  # a merged survivor stands for every token it holds
        out = (
            self.head_output(restored, inputs.attention_mask)
            if restore
            else self.head_output(hidden, pool_weights)
        )
        return PrunedOutput(out, counts, depth)

    def _select(
        self,
        point: int,
        layer: LayerView,
        hidden: torch.Tensor,
        sizes: torch.Tensor,
        valid: torch.Tensor,
        protected: torch.Tensor,
        positions: torch.Tensor,
        counts: torch.Tensor,
        selector: Selector | None,
        probe: EvaluationProbe | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """One pruning point: score, keep the top ``counts[:, point]`` (gathered, original order), merge
        or drop the rest. hidden (B, T, d), sizes / valid / protected / positions (B, T) → the same for
        the K kept slots."""
        if selector is None:
            raw = self.scorers[point](hidden, valid)  # (B, T)
        else:
            entering = self.pruned_encoder.layer_bias(S.attention_bias(valid, hidden.dtype), positions)
            raw = selector(point, layer, hidden, valid, entering)  # (B, T)
        if probe is not None:
            probe.before_selection(point, raw, valid, protected, counts)
        chosen = protected
        if self.config.leading_share > 0.0:
            chosen = protected | S.leading_span(positions, counts[:, point], self.config.leading_share)
        index, valid = S.select_top_tokens(S.masked_scores(raw, valid, chosen), counts[:, point])
        if self.config.merge_dropped:
            hidden, sizes = S.merge_dropped(hidden, sizes, index, valid)  # (B, K, d), (B, K)
        else:
            hidden = S.gather_tokens(hidden, index)  # (B, K, d)
        protected = S.gather_tokens(protected, index)  # (B, K)
        positions = S.gather_tokens(positions, index)  # (B, K)
        if probe is not None:
            probe.after_selection(positions, valid)
        return hidden, sizes, valid, protected, positions

    def forward_unpruned(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
    ) -> PrunedOutput:
        """What ``forward_pruned`` computes when every row keeps every token (ρ ≥ 1), without the
        scorers, the selection or the merge: the dense model and its head, kept counts n_real at every
        point and survival depth P on every real token. The exported graph's branch for an all-ρ = 1
        batch (``training.export.graph``), so ρ = 1 runs the operators of the dense model and nothing else."""
        valid = attention_mask.bool()  # (B, T)
        embedded = self.backbone.embed(input_ids, token_type_ids)  # (B, T, d)
        # (B, 1, 1, T): every layer sees every token; (B, H, T, T) with a relative-position bias
        bias = self.backbone.layer_bias(S.attention_bias(valid, embedded.dtype), original_positions(valid))
        key_mask = None if self.backbone.has_position_bias else attention_mask  # a mask alone: the 2-D form
        hidden = embedded
        for point, layer in enumerate(self.backbone.views):
            is_last = point == self.num_points - 1
            hidden = layer(hidden, bias, self.last_layer_queries if is_last else None, key_mask=key_mask)
        counts = valid.sum(1, keepdim=True).expand(-1, self.num_points)  # (B, P)
        depth = valid.to(torch.long) * self.num_points  # (B, T)
        if self.spec.restores_tokens:  # pads never run a layer: Drop-and-Restore leaves their embedding
            restored = torch.where(valid.unsqueeze(-1), hidden, embedded)  # (B, T, d)
            return PrunedOutput(self.head_output(restored, attention_mask), counts, depth)
        return PrunedOutput(self.head_output(hidden, valid), counts, depth)

    def head_output(self, hidden: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """``weights`` (B, T): the tokens a mean-pooled head averages (ignored by the other heads)."""
        if self.spec.head == "pooled":
            return self.head(hidden, weights)  # (B, T, d) or CLS pooling's (B, 1, d) → (B, d)
        if self.spec.head == "sequence":
            return self.head(hidden[:, 0])  # (B, d) → (B, C)
        return self.head(hidden)  # (B, T, d) → (B, T, C)


def manifest_schedule(model: RetentionModel) -> C.Schedule:
    """The manifest's ``Schedule`` of ``model``: its config's schedule settings (``SCHEDULE_FIELDS``) and
    the shape of its graph (pruning points, the last layer's queries)."""
    settings = {field: getattr(model.config, name) for name, field in SCHEDULE_FIELDS.items()}
    return C.Schedule(num_points=model.num_points, last_layer_queries=model.last_layer_queries, **settings)


def original_positions(valid: torch.Tensor) -> torch.Tensor:
    """Every slot's original position before any pruning: (B, T) bool → (B, T) int64, 0..T-1 per row."""
    return torch.arange(valid.shape[1], device=valid.device).unsqueeze(0).expand_as(valid)


def _scatter_valid(
    restored: torch.Tensor, positions: torch.Tensor, hidden: torch.Tensor, valid: torch.Tensor
) -> torch.Tensor:
    """Write the valid slots of hidden (B, K, d) back to their positions in restored (B, T, d)."""
    index = positions.unsqueeze(-1).expand(-1, -1, hidden.shape[-1])  # (B, K, d)
    current = torch.gather(restored, 1, index)  # (B, K, d)
    update = torch.where(valid.unsqueeze(-1), hidden, current)  # (B, K, d)
    return restored.scatter(1, index, update)
