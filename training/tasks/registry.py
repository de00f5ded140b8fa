"""The training half of the task registry: one ``TrainingTask`` per task in ``TRAINING_TASKS``.

``retention_core.tasks`` holds what training and serving must agree on (graph inputs/outputs, head,
codec); a ``TrainingTask`` adds the torch side: rows → ``Batch``, the loss, the distillation
divergence, the salient tokens, and how the task is evaluated (``TaskEvaluation``, below: the codec-loop
tasks build theirs with ``training.evaluation.codec_loop.codec_task_evaluation``). ``training.fitting``,
``training.evaluation`` and ``python -m training`` read only these two registries. Both
fill themselves from the one list of task packages (``retention_core.tasks.task_packages``): this one
from each package's ``training.py`` (its ``TRAINING``), so adding a task is a package on that list, no
switch elsewhere. A task that can retrofit an existing model names its recipe builder in its entry
(``retrofit_recipe``): the retrofit command offers exactly those tasks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from retention_core.tasks import TaskRegistry
from training.engine.model import RetentionModel
from training.recipes.data import Example
from training.recipes.recipe import PrunedBranch, Recipe
from training.tasks.batch import Batch, EncoderInputs

__all__ = [
    "TRAINING_TASKS",
    "Batch",
    "Curve",
    "EncoderInputs",
    "EvaluationRun",
    "Report",
    "TaskEvaluation",
    "TrainingTask",
    "retrofit_task",
    "retrofit_tasks",
    "training_task",
]

Report = dict[str, Any]  # an eval.json payload without its "meta"
Curve = list[tuple[float, float]]  # (ρ, quality in 0-1)


@dataclass(frozen=True)
class EvaluationRun:
    """What a task's report measures: a trained model, the tokenizer and recipe it was trained with, and
    the examples to score (``python -m training evaluate`` builds it once; every task's report takes it)."""

    model: RetentionModel
    tokenizer: Any
    recipe: Recipe
    examples: list[Example]


@dataclass(frozen=True)
class TaskEvaluation:
    """How ``python -m training evaluate`` and the manifest's quality curve measure one task."""

    methods: tuple[str, ...]  # every method ``--methods`` accepts, ``learned`` first
    default_methods: tuple[str, ...]
    # (run, ρs, methods) → report (``{"results": …}`` at least)
    report: Callable[[EvaluationRun, Sequence[float], Sequence[str]], Report]
    merge: Callable[[Report, Report], Report]  # (earlier eval.json, new report) → both, new wins
    table: Callable[[Report], str]  # markdown of a report (rows: methods, columns: ρ)
    metrics: tuple[str, ...]  # the report's per-cell metrics, in table order
    quality_metric: Callable[[str], str]  # dataset name → metric of the manifest curve
    # (onnx path, tokenizer, examples, recipe) → the exported graph's quality at recipe.evaluation.rhos
    quality_curve: Callable[[Path, Any, list[Example], Recipe], Curve]
    # The one of ``metrics`` a results page plots against ρ (benchmarks.report), whatever the dataset.
    headline: str

    def __post_init__(self) -> None:
        if self.headline not in self.metrics:
            raise ValueError(f"headline {self.headline!r} is not one of the metrics {list(self.metrics)}")

    def check_methods(self, methods: Sequence[str]) -> None:
        """A misspelt method must not run as another one and be recorded under the typo."""
        unknown = [method for method in methods if method not in self.methods]
        if unknown:
            raise ValueError(f"unknown evaluation method(s) {unknown}; known: {list(self.methods)}")


@dataclass(frozen=True)
class TrainingTask:
    make_batch: Callable[[list[Example], object, int], Batch]  # (examples, tokenizer, max_length)
    loss: Callable[[torch.Tensor, Batch], torch.Tensor]  # (logits, batch) → scalar
    evaluation: TaskEvaluation
    # (student logits, teacher logits (detached), batch) → scalar divergence, for distillation
    distill: Callable[[torch.Tensor, torch.Tensor, Batch], torch.Tensor] | None = None
    # batch → (B, T) bool tokens the scorers should keep (objective.salient_keep_weight)
    salient: Callable[[Batch], torch.Tensor] | None = None
    # The dataset of the task's reference recipe (tiny recipes and examples name it).
    reference_dataset: str = ""
    # Label-free tasks: (teacher model, batch) → the step's targets, computed before the soft pass from the
    # original model's dense pass (the model being trained when its backbone is frozen, else a frozen
    # copy). Such a task can retrofit an existing model.
    teacher: Callable[[RetentionModel, Batch], torch.Tensor] | None = None
    # A labelled task's label-free variant, what a retrofit trains (classification: unlabeled texts, KL to
    # the original model's logits); None when the task cannot be retrofitted.
    retrofit: TrainingTask | None = None
    # (model, profile) → the recipe of a retrofit of an existing model of this task (its sizes for the
    # profile; a ValueError for an unknown one); None: ``python -m training retrofit`` does not offer it.
    retrofit_recipe: Callable[[str, str], Recipe] | None = None
    # The pruned branch a retrofit of this task trains unless ``--pruned-branch`` names one: "copy" (ρ < 1
    # runs weights of its own) only where it was measured to gain, "shared" (the frozen retrofit) elsewhere.
    retrofit_pruned_branch: PrunedBranch = "shared"


def training_entries(module: ModuleType) -> list[tuple[str, TrainingTask]]:
    """A task package's ``training.py``: its ``TRAINING``, under the name of the package's ``SPEC``."""
    task: TrainingTask = module.TRAINING
    return [(module.SPEC.name, task)]


TRAINING_TASKS: TaskRegistry[TrainingTask] = TaskRegistry("training", training_entries)


def training_task(name: str) -> TrainingTask:
    if name not in TRAINING_TASKS:
        raise KeyError(f"task {name!r} has no training entry; known: {sorted(TRAINING_TASKS)}")
    return TRAINING_TASKS[name]


def retrofit_tasks() -> tuple[str, ...]:
    """The tasks ``python -m training retrofit --task`` offers: those naming a retrofit recipe builder,
    in registry order."""
    return tuple(name for name, task in TRAINING_TASKS.items() if task.retrofit_recipe is not None)


def retrofit_task(name: str) -> TrainingTask:
    """What a retrofit of task ``name`` trains: the task itself when it is label-free (it has a
    teacher), else its label-free variant; raises when it has neither."""
    task = training_task(name)
    label_free = task if task.teacher is not None else task.retrofit
    if label_free is None or label_free.teacher is None:
        raise ValueError(f"retrofit trains label-free; task {name!r} needs labels (it has no teacher)")
    return label_free
