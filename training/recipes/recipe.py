"""Typed training recipes (``models/recipes/<name>.yaml``) with named profiles (quick / full)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from retention_core.contract import Pooling
from retention_core.schedule import (
    SCHEDULE_DEFAULTS,
    LeadingShare,
    MergeDropped,
    MinKeptTokens,
    PruningInterval,
    SchedulePower,
)
from training.engine.encoders import DEFAULT_BACKBONE
from training.engine.gates import GateKind, ScoreShift


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# A dataset read from a local text file (``DatasetSpec.path``) is named this prefix + the file name.
TEXT_DATASET_PREFIX = "texts:"


class DatasetSpec(Strict):
    name: str = Field(description="registry name in training.recipes.data, e.g. sst2, imdb, squad, scitldr_a")
    root: str | None = Field(default=None, description="data dir; default ../shared/data when present")
    train_split: str = "train"
    validation_split: str = "validation"
    test_split: str = "test"
    train_limit: int | None = None
    path: str | None = Field(
        default=None,
        description="a local text file (.jsonl, .jsonl.gz or .txt, one text a line) instead of a registry "
        "dataset: unlabeled texts for label-free tasks (training.recipes.data.text_file_split)",
    )
    text_field: str = Field(default="text", description="with path: the JSON field that holds the text")


# The weights a retrofit's pruned branch (ρ < 1) runs: the original's ("shared") or a trained copy ("copy").
PrunedBranch = Literal["shared", "copy"]
CopyEmbeddings = Literal["own", "original"]


class RetentionSpec(Strict):
    scorer_size: int = 32
    ema_decay: float = Field(default=0.9, ge=0.0, lt=1.0)
    # The schedule's settings: type, bounds, meaning and default declared once, in
    # retention_core.schedule (the manifest's contract.Schedule reuses them); power is schedule_power here.
    schedule_power: SchedulePower = SCHEDULE_DEFAULTS.power
    min_kept_tokens: MinKeptTokens = SCHEDULE_DEFAULTS.min_kept_tokens
    merge_dropped: MergeDropped = SCHEDULE_DEFAULTS.merge_dropped
    leading_share: LeadingShare = SCHEDULE_DEFAULTS.leading_share
    pruning_interval: PruningInterval = SCHEDULE_DEFAULTS.pruning_interval
    gate_temperature: float = 0.66
    gate_left: float = -0.1
    gate_right: float = 1.1
    gates: GateKind = Field(
        default="hard_concrete", description="ablation: 'sigmoid' trains with plain deterministic gates"
    )
    score_shift: ScoreShift = Field(
        default="none",
        description="training: shift the scores per row before the budget prior so the budget sets the "
        "soft pass's counts. 'quantile' puts the budget quantile at P = rate (retention.quantile_shift); "
        "'calibrated' makes the expected kept count equal the budget (retention.calibrated_shift)",
    )

    @model_validator(mode="before")
    @classmethod
    def _legacy_normalize_scores(cls, data: Any) -> Any:
        """Older recipes say ``normalize_scores: true|false`` plus ``score_shift:
        quantile|calibrated`` (which only applied with normalize_scores). Both become one
        ``score_shift``: normalize_scores false → "none", true → the kind (default "quantile")."""
        if not isinstance(data, dict) or "normalize_scores" not in data:
            return data
        data = dict(data)
        if data.pop("normalize_scores"):
            data.setdefault("score_shift", "quantile")
        else:
            data["score_shift"] = "none"
        return data


# Keys deleted from RhoSpec. ``default`` was read by nothing once the export chose the manifest's
# default_rho from the measured quality curve (retention_core.contract.choose_default_rho); old run
# directories' recipe.json files carry it at whatever value their recipe set, so it is dropped at any value.
DELETED_RHO_KEYS = ("default",)


class RhoSpec(Strict):
    """Budgets sampled per example during training so one model serves every ρ."""

    low: float = Field(default=0.1, gt=0.0, le=1.0)
    high: float = Field(default=1.0, gt=0.0, le=1.0)

    @model_validator(mode="before")
    @classmethod
    def _drop_deleted_keys(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        return {key: value for key, value in data.items() if key not in DELETED_RHO_KEYS}

    @model_validator(mode="after")
    def _ordered(self) -> RhoSpec:
        if self.low > self.high:
            raise ValueError("rho.low must be <= rho.high")
        return self


# Switches deleted from BudgetSpec, with the value that meant "off". Old run directories'
# recipe.json files carry them at that value, which is dropped on load; any other value asked for a
# behaviour that no longer exists, so loading it is an error.
DELETED_BUDGET_SWITCHES: dict[str, object] = {
    "quadratic_weight": 0.0,  # ToP-style quadratic budget term; 0 in every recorded run
    "use_gates": True,  # the gate kind moved to retention.gates; true was Hard-Concrete, the default
}


class BudgetSpec(Strict):
    """Lagrangian budget: λ(Σp − M) with projected dual ascent."""

    dual_lr: float = Field(default=1e-2, ge=0.0)
    fixed_lambda: float | None = Field(default=None, description="ablation: freeze λ at this value")
    two_sided: bool = Field(default=False, description="equality constraint: λ may go negative")

    @model_validator(mode="before")
    @classmethod
    def _drop_deleted_switches(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        for key, off in DELETED_BUDGET_SWITCHES.items():
            if key in data and data[key] != off:
                raise ValueError(f"budget.{key} was removed; only {key}: {off!r} (off) still loads")
        return {key: value for key, value in data.items() if key not in DELETED_BUDGET_SWITCHES}


class OptimizerSpec(Strict):
    lr: float = 3e-5
    scorer_lr: float = 1e-3
    weight_decay: float = 0.01
    warmup_ratio: float = Field(default=0.06, ge=0.0, le=1.0)
    grad_clip: float = 1.0


# Terms deleted from ObjectiveSpec, with the weight that meant "off". They served only the QA studies of
# experiments/recipes/squad-teacher.yaml (docs/experiments/2026-11-26-qa-lengthdrop.md), which ended;
# that recipe's header names the last commit that has them (version history belongs to the study, not
# to product code). Run directories' recipe.json files written while they existed carry them at 0, which
# is dropped on load; any other weight asked for a term that no longer exists, so loading it is an error
# that points to that header.
DELETED_OBJECTIVE_TERMS: dict[str, float] = {
    "attention_rank_weight": 0.0,  # KL from the dense pass's attention-received ranking to the scorers
    "answer_block_weight": 0.0,  # Block-Skim's answer-block loss on the soft pass's gates
}


class ObjectiveSpec(Strict):
    """What the training loss is made of, beyond the task loss of the soft (gated) pass."""

    soft_loss_weight: float = Field(
        default=1.0,
        ge=0.0,
        description=(
            "the weight of the soft (gated) pass's task loss; 0 skips that pass: with "
            "pruned_loss_weight > 0 and rho fixed at 1 each step is plain dense fine-tuning, one pass "
            "(a dense teacher)"
        ),
    )
    pruned_loss_weight: float = Field(
        default=0.0,
        ge=0.0,
        description=(
            "add this weight × the task loss of the hard top-M pass that inference runs (same ρ, "
            "learned scores): backbone and head then train on really-dropped, restored tokens"
        ),
    )
    distill_weight: float = Field(
        default=0.0,
        ge=0.0,
        description=(
            "sandwich rule with in-place distillation (Length-Adaptive Transformer): each step also "
            "runs the dense pass (ρ = 1) with its own task loss, and adds this weight × the divergence "
            "of the hard top-M pass from the dense pass's (detached) outputs. With retention_stage: "
            "no dense pass of the student; this weight × the divergence of the soft pass (and, when it "
            "runs, the top-M pass) from the teacher's outputs"
        ),
    )
    dense_loss_weight: float = Field(
        default=1.0,
        ge=0.0,
        description="with distill_weight: the weight of the dense pass's own task loss (the sandwich rule)",
    )
    salient_keep_weight: float = Field(
        default=0.0,
        ge=0.0,
        description=(
            "add this weight × the mean −log P(gate open) of the tokens the task marks salient (QA: "
            "the gold answer span) at every point, so the scorers learn to keep them; the budget still "
            "sets how many tokens survive. Needs a task adapter with a salient-token mask"
        ),
    )
    sandwich_random_budgets: int = Field(
        default=0,
        ge=0,
        description=(
            "multi-budget training (the Length-Adaptive Transformer's sandwich rule): with "
            "pruned_loss_weight > 0, the hard top-M pass runs at rho = 1, at rho.low and at this many "
            "random budgets (the batch's own per-example rho, then fresh draws) and its task loss is "
            "their mean, so backbone and head learn to serve every budget; 0 = one pass at the batch's rho"
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _drop_deleted_terms(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        for key, off in DELETED_OBJECTIVE_TERMS.items():
            if key in data and data[key] != off:
                raise ValueError(
                    f"objective.{key} was removed with the ended QA study that used it "
                    f"(experiments/recipes/squad-teacher.yaml); only {key}: {off:g} (off) still loads. "
                    "To rerun that study, check out the commit that file's header names."
                )
        return {key: value for key, value in data.items() if key not in DELETED_OBJECTIVE_TERMS}


class EvalSpec(Strict):
    validation_size: int = 500
    rhos: tuple[float, ...] = (0.1, 0.2, 0.3, 0.5, 0.7, 1.0)
    batch_size: int = 16
    dataset: DatasetSpec | None = Field(
        default=None,
        description="a labelled dataset that evaluation and the manifest's quality curve use instead of "
        "the training dataset (a classification retrofit trains on unlabeled texts; see "
        "Recipe.evaluation_dataset)",
    )


class TeacherStudentSpec(Strict):
    """Retention trained against a teacher that is the starting model itself (its dense pass, ρ = 1):
    what a retrofit and a retention stage share."""

    freeze_backbone: bool = Field(
        default=True,
        description="true: only the scorers train, so ρ = 1 is bit-for-bit the original model (backbone "
        "and head frozen, no dropout). false: backbone and head also train, at optimizer.lr, distilled "
        "from a frozen copy of the original (ρ = 1 then drifts from the original)",
    )


class RetrofitSpec(TeacherStudentSpec):
    """Retention added to a model the user already has, label-free: the original model is the teacher."""

    pooling: Pooling | None = Field(
        default="mean",
        description="embedding: the model's sentence-transformers pooling (mean or cls, the pooled head "
        "the model is built with: training.fitting.fit.head_pooling); None otherwise",
    )
    normalize: bool = Field(
        default=True, description="embedding: the model ends in a sentence-transformers Normalize"
    )
    pruned_branch: PrunedBranch = Field(
        default="shared",
        description="'shared': the pruned branch (rho < 1) runs the original weights, as rho = 1 does. "
        "'copy': it runs weights of its own, a copy of the original's trained with the scorers at "
        "optimizer.lr (the soft pass and the top-M passes at the sampled budgets distilled to the frozen "
        "original's outputs), while rho = 1 stays the original model exactly (RetentionModel."
        "add_pruned_branch; docs/experiments/2026-11-28-pruned-branch.md). Needs freeze_backbone",
    )
    copy_embeddings: CopyEmbeddings = Field(
        default="own",
        description="with pruned_branch 'copy': 'own' trains the copy's embedding tables too; 'original' "
        "keeps them the original's (frozen, so the export stores them once: the copy's extra weights "
        "shrink by the tables' bytes)",
    )

    @model_validator(mode="after")
    def _copy_keeps_the_original(self) -> RetrofitSpec:
        if self.pruned_branch == "copy" and not self.freeze_backbone:
            raise ValueError(
                "retrofit.pruned_branch 'copy' keeps the original model on the rho = 1 path: it needs "
                "freeze_backbone (no --backbone-lr)"
            )
        if self.copy_embeddings != "own" and self.pruned_branch != "copy":
            raise ValueError("retrofit.copy_embeddings needs pruned_branch 'copy'")
        return self


class RetentionStageSpec(TeacherStudentSpec):
    """A labelled task's retention stage on a finished dense run (``Recipe.init_from``, e.g. a dense QA
    teacher): that run's dense pass is the teacher of ``objective.distill_weight``
    (training.fitting.objective: the soft pass and, when the backbone trains, the top-M pass are distilled
    from it, besides their task loss). Frozen, the model is its own teacher; tuned, a frozen copy of the
    starting run is."""


class Recipe(Strict):
    name: str
    task: str = Field(default="classification", description="a name in the task registry")
    backbone: str = DEFAULT_BACKBONE
    dataset: DatasetSpec
    labels: tuple[str, ...] = ()
    max_length: int = Field(default=128, ge=8)
    batch_size: int = Field(default=16, ge=1)
    steps: int = Field(default=500, ge=1)
    seed: int = 0
    log_every: int = 20
    checkpoint_every: int = Field(
        default=50, ge=1, description="steps between resumable checkpoints (fit --resume continues)"
    )
    init_from: str | None = Field(
        default=None,
        description=(
            "a second training stage: start from this finished run (a directory name under the runs "
            "dir) — its weights and the λ it ended with — instead of the pretrained backbone"
        ),
    )
    retention: RetentionSpec = RetentionSpec()
    rho: RhoSpec = RhoSpec()
    budget: BudgetSpec = BudgetSpec()
    optimizer: OptimizerSpec = OptimizerSpec()
    objective: ObjectiveSpec = ObjectiveSpec()
    evaluation: EvalSpec = EvalSpec()
    retrofit: RetrofitSpec | None = Field(
        default=None, description="retrofit an existing model (python -m training retrofit): frozen backbone"
    )
    retention_stage: RetentionStageSpec | None = Field(
        default=None,
        description="a labelled task's retention stage distilled from the finished dense run init_from "
        "names (its dense pass is the teacher): backbone and head frozen, or tuned at optimizer.lr",
    )
    profile: str = "full"

    @model_validator(mode="after")
    def _stage_has_a_teacher(self) -> Recipe:
        if self.retention_stage is not None and self.init_from is None:
            raise ValueError("retention_stage distils from a finished run: set init_from")
        if self.retention_stage is not None and self.retrofit is not None:
            raise ValueError("retention_stage is for a labelled task; a retrofit has its own teacher")
        return self

    @property
    def teacher_student(self) -> TeacherStudentSpec | None:
        """The retrofit or the retention stage: the model is trained against its own starting point."""
        return self.retrofit or self.retention_stage

    @property
    def pruned_branch_copy(self) -> bool:
        """A retrofit whose pruned branch (ρ < 1) trains a copy of the backbone of its own."""
        return self.retrofit is not None and self.retrofit.pruned_branch == "copy"

    @property
    def frozen_backbone(self) -> bool:
        """Backbone and head frozen (no dropout): only the scorers train."""
        return self.teacher_student is not None and self.teacher_student.freeze_backbone

    def evaluation_dataset(self) -> DatasetSpec:
        """Where evaluation and the manifest's quality curve read examples: ``evaluation.dataset`` when
        the recipe names one, else the training dataset."""
        return self.evaluation.dataset or self.dataset


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def read_recipe_yaml(path: Path | str) -> dict[str, Any]:
    """A recipe file as a dict, with ``extends: <file>`` resolved (relative to this file): the named
    recipe is read first and this file's values override it, so an ablation is a few lines. Its
    ``profiles`` are not inherited: a parent's training stages (``init_from`` its own runs) and quick
    sizes belong to the parent, and an ablation declares the profiles it was run with."""
    path = Path(path)
    raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    parent = raw.pop("extends", None)
    if parent is None:
        return raw
    inherited = read_recipe_yaml(path.parent / parent)
    inherited.pop("profiles", None)
    return _merge(inherited, raw)


def load_recipe(path: Path | str, profile: Literal["quick", "full"] | str = "full") -> Recipe:
    """Read a recipe YAML; ``profiles.<profile>`` overrides the top-level values."""
    raw = read_recipe_yaml(path)
    profiles = raw.pop("profiles", {}) or {}
    if profile != "full" and profile not in profiles:
        raise ValueError(f"recipe {path} has no profile {profile!r}; has {sorted(profiles)}")
    merged = _merge(raw, profiles.get(profile, {}))
    merged["profile"] = profile
    return Recipe.model_validate(merged)


def recipe_chain(path: Path | str, profile: str = "full") -> list[Recipe]:
    """The recipes a profile's run needs, first to last: the run ``init_from`` names (a run of another
    profile of the same file, ``<name>-<profile>``), its own ``init_from``, and so on, then the profile
    itself. What ``build`` fits, in order, for a profile that starts from another (e.g. a quick dense
    fine-tune, then the retention stage on it)."""
    chain = [load_recipe(path, profile)]
    while (parent := chain[0].init_from) is not None:
        prefix = f"{chain[0].name}-"
        if not parent.startswith(prefix):
            raise ValueError(
                f"recipe {path}: init_from {parent!r} is not a run of this recipe ({prefix}<profile>)"
            )
        if len(chain) > len(recipe_profiles(path)):
            raise ValueError(f"recipe {path}: init_from runs form a cycle at {parent!r}")
        chain.insert(0, load_recipe(path, parent.removeprefix(prefix)))
    return chain


def recipe_profiles(path: Path | str) -> list[str]:
    """Every profile a recipe file offers: ``full`` (the top level) and its named profiles."""
    return ["full", *sorted(read_recipe_yaml(path).get("profiles") or {})]
