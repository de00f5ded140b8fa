"""The training objective in one object, built from a recipe: ``Objective.from_recipe(recipe)``.

- ``SoftGates`` (``training.engine.gates``, below the model that asks it; ``soft_gates`` reads a
  recipe's): how the soft (training) pass opens its gates — the gate kind (Hard-Concrete, the method;
  sigmoid, an ablation) and the per-row score shift that lets the budget set the counts.
- ``BudgetRule``: budget accounting — the ρ drawn per example, the Lagrangian term λ·gap and how λ
  moves (dual ascent, one- or two-sided, or frozen by the ``fixed_lambda`` ablation).
- ``LossWeights``: the terms beyond the soft pass's task loss — the hard top-M pass, the dense pass and
  the distillation between them (the sandwich rule), and the salient-token term for the scorers.
- ``DistillTarget``: what the distillation divergence is taken from — the model's own dense pass (in-place,
  the sandwich rule), or a retention stage's teacher (the finished dense run it starts from).

``Objective.terms`` runs the passes of one step and returns every term; ``Objective.total`` adds them.
The retention math itself lives in ``training.engine.terms`` (gates, shifts, λ) and
``training.engine.selection``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import torch

from training.engine import terms as T
from training.engine.gates import SoftGates
from training.engine.model import RetentionModel, SoftOutput
from training.recipes.recipe import Recipe
from training.tasks.batch import Batch
from training.tasks.registry import TrainingTask, retrofit_task, training_task
from training.tasks.teacher import dense_targets

# "dense_pass": the top-M pass learns from the same step's dense pass (in-place distillation);
# "teacher": a retention stage (recipes.RetentionStageSpec) — the soft and top-M passes learn from the
# dense pass of the run it starts from, computed first and without gradient.
DistillTarget = Literal["dense_pass", "teacher"]


def soft_gates(recipe: Recipe) -> SoftGates:
    """The soft pass's gates of a recipe: its gate kind and score shift."""
    return SoftGates(recipe.retention.gates, recipe.retention.score_shift)


@dataclass(frozen=True)
class BudgetRule:
    """ρ per example, the Lagrangian term and the dual update of λ (one value per pruning point)."""

    rho_low: float
    rho_high: float
    dual_lr: float
    two_sided: bool = False  # equality constraint: λ may go negative
    fixed_lambda: float | None = None  # ablation: λ frozen at this value

    @classmethod
    def from_recipe(cls, recipe: Recipe) -> BudgetRule:
        budget = recipe.budget
        return cls(recipe.rho.low, recipe.rho.high, budget.dual_lr, budget.two_sided, budget.fixed_lambda)

    def sample_rho(self, batch_size: int, generator: torch.Generator) -> torch.Tensor:
        """One budget per example, uniform in [low, high]: (B,) on the generator's device."""
        return T.sample_rho(batch_size, self.rho_low, self.rho_high, generator)

    def sandwich(
        self, rho: torch.Tensor, random_budgets: int, generator: torch.Generator | None
    ) -> list[torch.Tensor]:
        """The budgets of one multi-budget step, each (B,): the widest (ρ = 1), the narrowest (ρ.low),
        the batch's own ρ and ``random_budgets − 1`` fresh per-example draws. ``random_budgets`` 0: the
        batch's ρ alone (one top-M pass, as before the sandwich existed)."""
        if random_budgets <= 0:
            return [rho]
        draws = generator or torch.Generator(device=rho.device)  # training always passes its own
        fresh = [self.sample_rho(rho.shape[0], draws).to(rho.device) for _ in range(random_budgets - 1)]
        return [torch.ones_like(rho), torch.full_like(rho, self.rho_low), rho, *fresh]

    def initial_lambda(self, lam: torch.Tensor) -> torch.Tensor:
        """λ to start from: the given one (zeros, or a parent run's), or the frozen value."""
        return lam if self.fixed_lambda is None else lam.fill_(self.fixed_lambda)

    def updated_lambda(self, lam: torch.Tensor, gap: torch.Tensor) -> torch.Tensor:
        """λ after one step with budget gap (P,): dual ascent, unless λ is frozen."""
        if self.fixed_lambda is not None:
            return lam
        return T.dual_ascent(lam, gap, self.dual_lr, self.two_sided)


@dataclass(frozen=True)
class LossWeights:
    """Weights of the terms beyond the soft pass's task loss; a term with weight 0 is not computed
    (the dense pass and the distillation run only with ``distill > 0``)."""

    pruned: float = 0.0  # task loss of the hard top-M pass that inference runs
    dense: float = 1.0  # task loss of the dense pass (ρ = 1), when distilling
    distill: float = 0.0  # divergence of the top-M pass from the dense pass's detached outputs
    salient: float = 0.0  # −log P(gate open) of the task's salient tokens
    soft: float = 1.0  # task loss of the soft (gated) pass; 0 skips the pass
    sandwich_random: int = 0  # random budgets of a multi-budget top-M term (0: the batch's ρ only)

    @classmethod
    def from_recipe(cls, recipe: Recipe) -> LossWeights:
        spec = recipe.objective
        return cls(
            spec.pruned_loss_weight,
            spec.dense_loss_weight,
            spec.distill_weight,
            spec.salient_keep_weight,
            spec.soft_loss_weight,
            spec.sandwich_random_budgets,
        )

    @property
    def soft_pass(self) -> bool:
        return self.soft > 0.0


@dataclass
class ExtraTerms:
    """The terms beyond the soft pass's task loss: scalars, or None when not computed."""

    pruned: torch.Tensor | None = None  # task loss of the hard top-M pass
    dense: torch.Tensor | None = None  # task loss of the dense pass (sandwich rule)
    distill: torch.Tensor | None = None  # divergence of the top-M pass from the dense pass (or the teacher)
    salient: torch.Tensor | None = None  # −log P(gate open) of the task's salient tokens
    soft_distill: torch.Tensor | None = None  # a retention stage: the soft pass's divergence from the teacher


@dataclass
class StepTerms:
    """What one step of the objective computed."""

    soft: SoftOutput | None  # the soft (gated) pass; None when the objective skips it
    gap: torch.Tensor  # (P,) expected − target survivors, as a fraction of real tokens; > 0 is over
    task: torch.Tensor  # task loss of the soft pass (0 without it)
    budget: torch.Tensor  # λ·gap, the Lagrangian term
    extra: ExtraTerms


@dataclass(frozen=True)
class Objective:
    task: TrainingTask
    gates: SoftGates
    budget: BudgetRule
    weights: LossWeights
    distill_target: DistillTarget = "dense_pass"

    @classmethod
    def from_recipe(cls, recipe: Recipe) -> Objective:
        """The recipe's objective; refuses terms its task cannot compute, or that would train nothing."""
        # A retrofit trains the task's label-free variant (raises for a task that has none).
        task = retrofit_task(recipe.task) if recipe.retrofit is not None else training_task(recipe.task)
        weights = LossWeights.from_recipe(recipe)
        if weights.salient > 0.0 and task.salient is None:
            raise ValueError(
                f"objective.salient_keep_weight needs salient tokens; task {recipe.task!r} has none"
            )
        if weights.salient > 0.0 and not weights.soft_pass:
            raise ValueError("objective.salient_keep_weight needs the soft pass (soft_loss_weight > 0)")
        if weights.distill > 0.0 and task.distill is None:
            raise ValueError(f"task {recipe.task!r} has no distillation loss")
        if not weights.soft_pass and weights.pruned <= 0.0 and weights.distill <= 0.0:
            raise ValueError(
                "objective.soft_loss_weight 0 needs pruned_loss_weight or distill_weight > 0: "
                "nothing would train"
            )
        target: DistillTarget = "dense_pass"
        if recipe.retention_stage is not None:
            target = "teacher"
            cls.check_stage(weights, recipe.frozen_backbone)
        return cls(task, soft_gates(recipe), BudgetRule.from_recipe(recipe), weights, target)

    @staticmethod
    def check_stage(weights: LossWeights, frozen: bool) -> None:
        """A retention stage trains the scorers through the soft pass; with a frozen backbone and head
        the top-M pass has no gradient at all (top-M is not differentiable), so asking for it is an error
        rather than a silent cost."""
        if not weights.soft_pass:
            raise ValueError("a retention stage trains its scorers on the soft pass (soft_loss_weight > 0)")
        if frozen and weights.pruned > 0.0:
            raise ValueError(
                "retention_stage with freeze_backbone: the top-M pass trains nothing (backbone and head "
                "frozen, top-M not differentiable); set pruned_loss_weight 0"
            )

    def terms(
        self,
        model: RetentionModel,
        batch: Batch,
        rho: torch.Tensor,
        lam: torch.Tensor,
        generator: torch.Generator | None,
        teacher: RetentionModel | None = None,
    ) -> StepTerms:
        """Run the passes of one step (soft, then the hard ones) and compute every term.

        The order of the passes is the order of their random draws (gate noise, dropout): keep it.
        A teacher pass comes first — a label-free task's targets, or a retention stage's teacher logits:
        on ``teacher`` (a frozen copy of the starting model, when the backbone trains) or else on
        ``model`` itself (its backbone and head frozen: it draws nothing)."""
        teacher_model = model if teacher is None else teacher
        if self.task.teacher is not None:
            batch = replace(batch, targets=self.task.teacher(teacher_model, batch))
        if not self.weights.soft_pass:
            return self.hard_pass_terms(model, batch, rho, lam, generator)
        teacher_logits = self.teacher_logits(teacher_model, batch)
        soft = model.forward_soft(**batch.encoder_inputs(), rho=rho, generator=generator, gates=self.gates)
        task_loss = self.task.loss(soft.logits, batch)
        gap = T.budget_gap(soft.expected_kept, soft.target_kept, soft.num_real)  # (P,)
        budget = T.lagrangian_penalty(gap, lam)
        if teacher_logits is None:
            extra = self.hard_pass_losses(model, batch, rho, generator)
        else:
            extra = self.stage_hard_pass_losses(model, batch, rho, teacher_logits, generator)
            extra.soft_distill = self.divergence(soft.logits, teacher_logits, batch)
        extra.salient = self.salient_loss(soft, batch)
        return StepTerms(soft, gap, task_loss, budget, extra)

    def teacher_logits(self, teacher: RetentionModel, batch: Batch) -> torch.Tensor | None:
        """A retention stage's teacher outputs for the batch: the dense pass (ρ = 1) of ``teacher``,
        without gradient; None for in-place distillation."""
        if self.distill_target != "teacher":
            return None
        with torch.no_grad():
            return dense_targets(teacher, batch)

    def divergence(self, student: torch.Tensor, teacher: torch.Tensor, batch: Batch) -> torch.Tensor | None:
        """The task's divergence of ``student`` from the teacher's outputs; None without distillation."""
        if self.weights.distill <= 0.0:
            return None
        assert self.task.distill is not None  # from_recipe refuses distillation without it
        # fp32 under bf16 autocast: log-softmax over a window's 256 positions loses the tail in bf16
        return self.task.distill(student.float(), teacher.float(), batch)

    def stage_hard_pass_losses(
        self,
        model: RetentionModel,
        batch: Batch,
        rho: torch.Tensor,
        teacher_logits: torch.Tensor,
        generator: torch.Generator | None = None,
    ) -> ExtraTerms:
        """A retention stage's top-M pass (only when it trains: a tuned backbone, pruned_loss_weight > 0):
        its task loss and its divergence from the teacher. No dense pass of the student: the teacher is
        the dense model, and the soft pass samples ρ up to 1."""
        if self.weights.pruned <= 0.0:
            return ExtraTerms()
        passes = self.top_m_passes(model, batch, rho, generator)
        distill = [self.divergence(logits, teacher_logits, batch) for logits in passes]
        return ExtraTerms(
            pruned=_mean([self.task.loss(logits, batch) for logits in passes]),
            distill=None if distill[0] is None else _mean([term for term in distill if term is not None]),
        )

    def top_m_passes(
        self, model: RetentionModel, batch: Batch, rho: torch.Tensor, generator: torch.Generator | None
    ) -> list[torch.Tensor]:
        """Outputs of the hard top-M pass at the batch's ρ first, then at the rest of the multi-budget
        sandwich (``BudgetRule.sandwich``; none without it): every budget one model must serve. A model
        whose pruned branch has its own weights (``RetentionModel.pruned_backbone``) skips the sandwich's
        ρ = 1 pass: that is the frozen original, which nothing here trains."""
        inputs = batch.encoder_inputs()
        budgets = self.budget.sandwich(rho, self.weights.sandwich_random, generator)
        ordered = [rho, *(budget for budget in budgets if budget is not rho)]
        if model.pruned_backbone is not None:
            ordered = [rho, *(budget for budget in ordered[1:] if not bool((budget >= 1.0).all()))]
        return [model.forward_pruned(**inputs, rho=budget).logits for budget in ordered]

    def hard_pass_terms(
        self,
        model: RetentionModel,
        batch: Batch,
        rho: torch.Tensor,
        lam: torch.Tensor,
        generator: torch.Generator | None = None,
    ) -> StepTerms:
        """A step without the soft pass: only the hard passes train, so no gate is sampled, no budget
        gap exists and λ stays where it is. With ρ fixed at 1 this is plain dense fine-tuning, one
        pass per step (a dense teacher, three times cheaper than the joint objective)."""
        no_gap = torch.zeros_like(lam)  # (P,)
        zero = no_gap.sum()
        return StepTerms(None, no_gap, zero, zero, self.hard_pass_losses(model, batch, rho, generator))

    def hard_pass_losses(
        self,
        model: RetentionModel,
        batch: Batch,
        rho: torch.Tensor,
        generator: torch.Generator | None = None,
    ) -> ExtraTerms:
        """The hard top-M pass at the batch's ρ and, with distillation, the dense pass.

        The soft pass never freezes a token completely, while inference drops tokens for good and
        restores their early states; the top-M pass trains backbone and head on exactly that. Top-M is
        not differentiable, so the scorers still learn only from the soft pass. With distillation the
        dense pass (ρ = 1) trains on the gold targets too and its detached outputs teach the top-M
        pass (the Length-Adaptive Transformer's sandwich rule with in-place distillation).
        """
        distill = self.weights.distill > 0.0
        if self.weights.pruned <= 0.0 and not distill:
            return ExtraTerms()
        if distill and self.weights.sandwich_random > 0:
            return self.sandwich_distill_losses(model, batch, rho, generator)
        inputs = batch.encoder_inputs()
        passes = self.top_m_passes(model, batch, rho, generator)
        pruned_logits = passes[0]  # the batch's ρ: the in-place distillation's student
        pruned = _mean([self.task.loss(logits, batch) for logits in passes])
        if not distill:
            return ExtraTerms(pruned=pruned)
        assert self.task.distill is not None  # from_recipe refuses distillation without it
        dense_logits = model.forward_pruned(**inputs, rho=torch.ones_like(rho)).logits
        return ExtraTerms(
            pruned=pruned,
            dense=self.task.loss(dense_logits, batch),
            distill=self.task.distill(pruned_logits, dense_logits.detach(), batch),
        )

    def sandwich_distill_losses(
        self, model: RetentionModel, batch: Batch, rho: torch.Tensor, generator: torch.Generator | None
    ) -> ExtraTerms:
        """LengthDrop with in-place distillation (the Length-Adaptive Transformer): the sandwich's widest
        pass (ρ = 1) learns from the gold targets, every narrower one from the widest pass's detached
        outputs (and, with pruned_loss_weight > 0, from the gold targets too)."""
        assert self.task.distill is not None  # from_recipe refuses distillation without it
        inputs = batch.encoder_inputs()
        widest, *narrower = self.budget.sandwich(rho, self.weights.sandwich_random, generator)
        dense_logits = model.forward_pruned(**inputs, rho=widest).logits
        students = [model.forward_pruned(**inputs, rho=budget).logits for budget in narrower]
        teacher = dense_logits.detach()
        return ExtraTerms(
            pruned=_mean([self.task.loss(logits, batch) for logits in students])
            if self.weights.pruned > 0.0
            else None,
            dense=self.task.loss(dense_logits, batch),
            distill=_mean([self.task.distill(logits, teacher, batch) for logits in students]),
        )

    def salient_loss(self, soft: SoftOutput, batch: Batch) -> torch.Tensor | None:
        """The scorers' supervised term from the soft pass, or None when not trained on."""
        if self.weights.salient <= 0.0 or self.task.salient is None:
            return None
        return T.salient_keep_loss(soft.open_prob, self.task.salient(batch))

    def weighted_extra(self, extra: ExtraTerms) -> torch.Tensor | float:
        """Weighted sum of the terms beyond the soft pass (0.0 when there are none)."""
        weighted: list[tuple[float, torch.Tensor | None]] = [
            (self.weights.pruned, extra.pruned),
            (self.weights.dense, extra.dense),
            (self.weights.distill, extra.distill),
            (self.weights.salient, extra.salient),
            (self.weights.distill, extra.soft_distill),
        ]
        return sum((weight * value for weight, value in weighted if value is not None), 0.0)

    def total(self, step: StepTerms) -> torch.Tensor:
        """The loss to minimise: weighted soft task loss + λ·gap + the weighted extra terms."""
        return self.weights.soft * step.task + step.budget + self.weighted_extra(step.extra)


def _mean(terms: list[torch.Tensor]) -> torch.Tensor:
    """The mean of scalar loss terms (one term is returned as it is, so a single pass is unchanged)."""
    return terms[0] if len(terms) == 1 else torch.stack(terms).mean()
