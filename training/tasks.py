"""The training half of the task registry: one ``TrainingTask`` per task in ``TRAINING_TASKS``.

``retention_core.tasks`` holds what training and serving must agree on (graph inputs/outputs, head,
codec); a ``TrainingTask`` adds the torch side: rows → ``Batch``, the loss, the distillation
divergence, the salient tokens, and how the task is evaluated (``training.evaluation.TaskEvaluation``).
``training.fit``, ``training.export`` and ``python -m training`` read only these two registries, so
adding a task is a ``retention_core.tasks.register`` call, a ``register_training_task`` call, its
codec and its module here: no switch elsewhere. A task that can retrofit an existing model names its
recipe builder here too (``retrofit_recipe``): the retrofit command offers exactly those tasks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from training import classification, embedding, qa, summarization
from training.batch import Batch, EncoderInputs
from training.data import Example
from training.evaluation import TaskEvaluation
from training.model import RetentionModel
from training.recipes import Recipe
from training.retrofit_recipes import classification_recipe, embedding_recipe

__all__ = [
    "TRAINING_TASKS",
    "Batch",
    "EncoderInputs",
    "TrainingTask",
    "register_training_task",
    "retrofit_task",
    "retrofit_tasks",
    "training_task",
]


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


TRAINING_TASKS: dict[str, TrainingTask] = {}


def register_training_task(name: str, task: TrainingTask) -> TrainingTask:
    """Add (or replace) the training side of a task registered in ``retention_core.tasks``."""
    TRAINING_TASKS[name] = task
    return task


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


register_training_task(
    "classification",
    TrainingTask(
        make_batch=classification.classification_batch,
        loss=classification.classification_loss,
        evaluation=classification.EVALUATION,
        distill=classification.classification_distill,
        reference_dataset="sst2",
        retrofit=TrainingTask(
            make_batch=classification.text_batch,
            loss=classification.teacher_divergence,
            evaluation=classification.EVALUATION,
            reference_dataset="imdb",
            teacher=embedding.dense_targets,  # the dense pass (ρ = 1): the original model's logits
        ),
        retrofit_recipe=classification_recipe,
    ),
)
register_training_task(
    "qa",
    TrainingTask(
        make_batch=qa.qa_batch,
        loss=qa.qa_loss,
        evaluation=qa.EVALUATION,
        distill=qa.qa_distill,
        salient=qa.answer_span_mask,
        reference_dataset="squad",
    ),
)
register_training_task(
    "summarization",
    TrainingTask(
        make_batch=summarization.summarization_batch,
        loss=summarization.summarization_loss,
        evaluation=summarization.EVALUATION,
        distill=summarization.summarization_distill,
        reference_dataset="scitldr_a",
    ),
)
register_training_task(
    "embedding",
    TrainingTask(
        make_batch=embedding.embedding_batch,
        loss=embedding.embedding_loss,
        evaluation=embedding.EVALUATION,
        reference_dataset="squad_contexts",
        teacher=embedding.dense_targets,
        retrofit_recipe=embedding_recipe,
    ),
)
