"""Typed training recipes (``models/recipes/<name>.yaml``) with named profiles (quick / full)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from training.encoders import DEFAULT_BACKBONE


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DatasetSpec(Strict):
    name: str = Field(description="registry name in training.data, e.g. sst2, imdb, squad, scitldr_a")
    root: str | None = Field(default=None, description="data dir; default ../shared/data when present")
    train_split: str = "train"
    validation_split: str = "validation"
    test_split: str = "test"
    train_limit: int | None = None


class RetentionSpec(Strict):
    scorer_size: int = 32
    ema_decay: float = Field(default=0.9, ge=0.0, lt=1.0)
    schedule_power: float = Field(default=1.0, gt=0.0)
    gate_temperature: float = 0.66
    gate_left: float = -0.1
    gate_right: float = 1.1
    gates: Literal["hard_concrete", "sigmoid"] = Field(
        default="hard_concrete", description="ablation: 'sigmoid' trains with plain deterministic gates"
    )
    normalize_scores: bool = Field(
        default=False, description="training: shift scores per row to the budget quantile (budget_threshold)"
    )
    score_shift: Literal["quantile", "calibrated"] = Field(
        default="quantile",
        description="with normalize_scores: 'quantile' puts the budget quantile at P = rate; 'calibrated' "
        "makes the expected kept count equal the budget (calibrated_threshold)",
    )


class RhoSpec(Strict):
    """Budgets sampled per example during training so one model serves every ρ."""

    low: float = Field(default=0.1, gt=0.0, le=1.0)
    high: float = Field(default=1.0, gt=0.0, le=1.0)
    default: float = Field(default=0.5, gt=0.0, le=1.0)

    @model_validator(mode="after")
    def _ordered(self) -> RhoSpec:
        if self.low > self.high:
            raise ValueError("rho.low must be <= rho.high")
        return self


class BudgetSpec(Strict):
    """Lagrangian budget: λ(Σp − M) with projected dual ascent; quadratic term optional."""

    dual_lr: float = Field(default=1e-2, ge=0.0)
    quadratic_weight: float = Field(default=0.0, ge=0.0)
    fixed_lambda: float | None = Field(default=None, description="ablation: freeze λ at this value")
    two_sided: bool = Field(default=False, description="equality constraint: λ may go negative")

    @model_validator(mode="before")
    @classmethod
    def _drop_legacy_use_gates(cls, data: Any) -> Any:
        """Runs written before the gate kind moved to ``retention.gates`` carry ``use_gates: true``
        (the default, Hard-Concrete); anything else stays an error."""
        if isinstance(data, dict) and data.get("use_gates") is True:
            return {key: value for key, value in data.items() if key != "use_gates"}
        return data


class OptimizerSpec(Strict):
    lr: float = 3e-5
    scorer_lr: float = 1e-3
    weight_decay: float = 0.01
    warmup_ratio: float = Field(default=0.06, ge=0.0, le=1.0)
    grad_clip: float = 1.0


class ObjectiveSpec(Strict):
    """What the training loss is made of, beyond the task loss of the soft (gated) pass."""

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
            "of the hard top-M pass from the dense pass's (detached) outputs"
        ),
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


class EvalSpec(Strict):
    validation_size: int = 500
    rhos: tuple[float, ...] = (0.1, 0.2, 0.3, 0.5, 0.7, 1.0)
    batch_size: int = 16


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
    profile: str = "full"


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
    recipe is read first and this file's values override it, so an ablation is a few lines."""
    path = Path(path)
    raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    parent = raw.pop("extends", None)
    if parent is None:
        return raw
    return _merge(read_recipe_yaml(path.parent / parent), raw)


def load_recipe(path: Path | str, profile: Literal["quick", "full"] | str = "full") -> Recipe:
    """Read a recipe YAML; ``profiles.<profile>`` overrides the top-level values."""
    raw = read_recipe_yaml(path)
    profiles = raw.pop("profiles", {}) or {}
    if profile != "full" and profile not in profiles:
        raise ValueError(f"recipe {path} has no profile {profile!r}; has {sorted(profiles)}")
    merged = _merge(raw, profiles.get(profile, {}))
    merged["profile"] = profile
    return Recipe.model_validate(merged)


def recipe_profiles(path: Path | str) -> list[str]:
    """Every profile a recipe file offers: ``full`` (the top level) and its named profiles."""
    return ["full", *sorted(read_recipe_yaml(path).get("profiles") or {})]
