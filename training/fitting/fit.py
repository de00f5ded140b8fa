"""Fine-tune a backbone with learned retention: ``python -m training fit models/recipes/<name>.yaml``.

A run directory (git-ignored) holds everything export needs without the network:
``weights.safetensors``, ``backbone/config.json``, the tokenizer, ``recipe.json`` and ``train_log.jsonl``.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from retention_core.contract import Pooling
from retention_core.tasks import task_spec
from training.engine import terms as T
from training.engine.encoders import EncoderBackbone, backbone_from_config, load_backbone, load_tokenizer
from training.engine.model import SCHEDULE_FIELDS, RetentionConfig, RetentionModel
from training.fitting.objective import Objective, StepTerms
from training.fitting.retrofit import frozen_teacher, start_from_original
from training.recipes.data import Example, load_split, shuffled
from training.recipes.recipe import Recipe
from training.tasks.batch import Batch

WEIGHTS_FILE = "weights.safetensors"
BACKBONE_CONFIG_DIR = "backbone"
RECIPE_FILE = "recipe.json"
LOG_FILE = "train_log.jsonl"
TOKENIZER_DIR = "tokenizer"
CHECKPOINT_FILE = "checkpoint.pt"
NO_DECAY_SUFFIXES = ("bias", "LayerNorm.weight", "layer_norm.weight", "norm.weight")


def lr_multiplier(step: int, total_steps: int, warmup_steps: int) -> float:
    """Linear warm-up to 1, then linear decay to 0. Pure; step is 0-based."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    remaining = max(total_steps - warmup_steps, 1)
    return max(0.0, (total_steps - step) / remaining)


def usable_cores() -> int:
    """Cores this process may run on (its affinity, e.g. under ``taskset``), not the machine's."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def head_pooling(recipe: Recipe) -> Pooling:
    """What a pooled head pools: a retrofitted model's own pooling (its sentence-transformers config),
    else mean (an embedding recipe without a retrofit; the other heads ignore it)."""
    retrofit = recipe.retrofit
    return retrofit.pooling if retrofit is not None and retrofit.pooling is not None else "mean"


def retention_config(recipe: Recipe) -> RetentionConfig:
    spec = recipe.retention
    return RetentionConfig(
        scorer_size=spec.scorer_size,
        ema_decay=spec.ema_decay,
        pooling=head_pooling(recipe),
        hard_concrete=T.HardConcrete(spec.gate_temperature, spec.gate_left, spec.gate_right),
        **{name: getattr(spec, name) for name in SCHEDULE_FIELDS},
    )


def build_model(recipe: Recipe, backbone: EncoderBackbone) -> RetentionModel:
    width = task_spec(recipe.task).head_width(recipe.labels)
    frozen = recipe.frozen_backbone
    # A frozen retrofit's (or retention stage's) head runs without dropout, as the backbone does
    # (freeze_backbone): its dense pass in training is then exactly the original model, the teacher.
    head = {"head_dropout": 0.0} if frozen else {}
    model = RetentionModel(backbone, recipe.task, width, retention_config(recipe), **head)
    if frozen:
        model.freeze_backbone()
        model.head.requires_grad_(False)
    if recipe.pruned_branch_copy:  # ρ < 1 trains weights of its own; ρ = 1 stays the frozen original
        assert recipe.retrofit is not None
        model.add_pruned_branch(own_embeddings=recipe.retrofit.copy_embeddings == "own")
    return model


def parameter_groups(model: RetentionModel, recipe: Recipe) -> list[dict]:
    """Backbone + head at the fine-tuning lr (no decay on biases/norms); fresh scorers at scorer_lr."""
    decay, no_decay, scorer = [], [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:  # a frozen retrofit's backbone and head
            continue
        if name.startswith("scorers."):
            scorer.append(param)
        elif name.endswith(NO_DECAY_SUFFIXES):
            no_decay.append(param)
        else:
            decay.append(param)
    opt = recipe.optimizer
    groups = [
        {"params": decay, "lr": opt.lr, "weight_decay": opt.weight_decay},
        {"params": no_decay, "lr": opt.lr, "weight_decay": 0.0},
        {"params": scorer, "lr": opt.scorer_lr, "weight_decay": 0.0},
    ]
    # A retrofit trains the scorers only: no empty groups, so the logged lr (group 0) is the scorers'.
    return [group for group in groups if group["params"]]


@dataclass
class StepLog:
    """One line of ``train_log.jsonl``."""

    step: int
    loss: float
    task_loss: float
    kept_fraction: float  # expected survivors at the last point / real tokens
    target_fraction: float  # mean ρ of the batch
    pruned_loss: float | None  # task loss of the hard top-M pass, when the objective has one
    dense_loss: float | None  # task loss of the dense pass, when the objective distills
    distill_loss: float | None  # divergence of the top-M pass from the dense pass (or the stage's teacher)
    lam: list[float]
    lr: float
    seconds: float
    salient_loss: float | None = None  # −log P(gate open) of the salient tokens, when trained on
    soft_distill_loss: float | None = None  # a retention stage: divergence of the soft pass from the teacher
    precision: str = "fp32"  # the forward passes' autocast (PRECISIONS)


@dataclass
class TrainState:
    """Everything a training step changes, and everything a checkpoint holds besides the recipe."""

    model: RetentionModel
    optimizer: torch.optim.Optimizer
    base_lrs: list[float]  # per parameter group, before the warm-up / decay multiplier
    lam: torch.Tensor  # (P,) Lagrange multipliers, one per pruning point
    generator: torch.Generator  # ρ and gate noise (dropout draws from torch's global generator)
    step: int = 0  # the next step to run
    # A retrofit or retention stage that tunes the backbone: a frozen copy of the starting model, the
    # teacher (not saved: rebuilt from the original checkpoint or init_from run on resume). None when the
    # model is its own teacher (or has none).
    teacher: RetentionModel | None = None
    # Mixed precision of the forward passes (None = fp32). bf16 autocast on CPUs with AMX (and on
    # GPUs) cuts a MiniLM step 1.75x (results/bench/train-step-precision.json); weights, optimizer
    # state, λ and the scorers stay fp32.
    autocast_dtype: torch.dtype | None = None


PRECISIONS: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class StepSchedule:
    """The optimizer's per-step settings: the learning-rate schedule and gradient clipping."""

    total_steps: int
    warmup_steps: int
    grad_clip: float

    @classmethod
    def from_recipe(cls, recipe: Recipe) -> StepSchedule:
        warmup = int(recipe.optimizer.warmup_ratio * recipe.steps)
        return cls(recipe.steps, warmup, recipe.optimizer.grad_clip)


@dataclass
class StepResult:
    """What ``train_step`` did, as tensors (no device sync until ``log`` reads them)."""

    step: int
    loss: torch.Tensor
    terms: StepTerms
    rho: torch.Tensor  # (B,)
    lam: torch.Tensor  # (P,) after the dual update
    lr: float

    def log(self, seconds: float, precision: str = "fp32") -> StepLog:
        extra = self.terms.extra
        return StepLog(
            step=self.step,
            loss=self.loss.item(),
            task_loss=self.terms.task.item(),
            kept_fraction=self.kept_fraction(),
            target_fraction=self.rho.mean().item(),
            pruned_loss=_item(extra.pruned),
            dense_loss=_item(extra.dense),
            distill_loss=_item(extra.distill),
            lam=[round(x, 5) for x in self.lam.tolist()],
            lr=self.lr,
            seconds=seconds,
            salient_loss=_item(extra.salient),
            soft_distill_loss=_item(extra.soft_distill),
            precision=precision,
        )

    def kept_fraction(self) -> float:
        """Expected share of real tokens reaching the last layer in the soft pass; without that pass
        the hard top-M pass keeps exactly the batch's ρ."""
        soft = self.terms.soft
        if soft is None:
            return self.rho.mean().item()
        return (soft.expected_kept[:, -1] / soft.num_real).mean().item()


def _item(value: torch.Tensor | None) -> float | None:
    return None if value is None else value.item()


def train_step(state: TrainState, objective: Objective, batch: Batch, schedule: StepSchedule) -> StepResult:
    """One optimisation step on ``batch`` (already on the device): set the lr, draw ρ, run the
    objective's passes, step the optimizer and λ. Advances ``state`` in place (its step included)."""
    scale = lr_multiplier(state.step, schedule.total_steps, schedule.warmup_steps)
    for group, base in zip(state.optimizer.param_groups, state.base_lrs, strict=True):
        group["lr"] = base * scale
    rho = objective.budget.sample_rho(batch.input_ids.shape[0], state.generator)  # (B,)
    device_type = batch.input_ids.device.type
    with torch.autocast(device_type, dtype=state.autocast_dtype, enabled=state.autocast_dtype is not None):
        terms = objective.terms(state.model, batch, rho, state.lam, state.generator, state.teacher)
        loss = objective.total(terms).float()
    state.optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(state.model.parameters(), schedule.grad_clip)
    state.optimizer.step()
    state.lam = objective.budget.updated_lambda(state.lam, terms.gap)
    result = StepResult(state.step, loss, terms, rho, state.lam, state.optimizer.param_groups[0]["lr"])
    state.step += 1
    return result


def _batches(rows: list[Example], batch_size: int, seed: int, skip: int = 0):
    """Endless seeded batches; ``skip`` drops the first ones (a resumed run sees what it would have)."""
    epoch = 0
    while True:
        order = shuffled(rows, seed + epoch)
        for start in range(0, len(order) - batch_size + 1, batch_size):
            if skip > 0:
                skip -= 1
                continue
            yield order[start : start + batch_size]
        epoch += 1


def final_lambda(run_dir: Path) -> list[float]:
    """The λ a finished run ended with: the last line of its log (fit always logs the last step)."""
    lines = (run_dir / LOG_FILE).read_text(encoding="utf-8").splitlines()
    if not lines:
        raise ValueError(f"run {run_dir} has an empty {LOG_FILE}")
    return [float(x) for x in json.loads(lines[-1])["lam"]]


def start_from_run(model: RetentionModel, recipe: Recipe, parent: Path) -> torch.Tensor:
    """Load a finished run's weights into ``model`` (a second stage) and return the λ it ended with."""
    if not (parent / WEIGHTS_FILE).is_file():
        raise FileNotFoundError(f"init_from run {parent} has no {WEIGHTS_FILE}: train it first")
    parent_recipe = Recipe.model_validate_json((parent / RECIPE_FILE).read_text(encoding="utf-8"))
    if parent_recipe.task != recipe.task:
        raise ValueError(f"init_from run {parent} is a {parent_recipe.task} run, not {recipe.task}")
    model.load_state_dict(load_file(str(parent / WEIGHTS_FILE)))  # strict: shapes must agree
    lam = final_lambda(parent)
    if len(lam) != model.num_points:
        raise ValueError(f"init_from run {parent} has {len(lam)} retention points, not {model.num_points}")
    return torch.tensor(lam)


def save_checkpoint(path: Path, state: TrainState, recipe: Recipe, seconds: float) -> None:
    """The full training state at ``state.step``, written atomically: an interrupted save must not
    destroy the previous checkpoint."""
    payload = {
        "recipe": recipe.model_dump(mode="json"),
        "next_step": state.step,
        "seconds": seconds,
        "model": state.model.state_dict(),
        "optimizer": state.optimizer.state_dict(),
        "lam": state.lam.detach().cpu(),
        "generator": state.generator.get_state(),
        "torch_rng": torch.get_rng_state(),
    }
    partial = path.with_suffix(".partial")
    torch.save(payload, partial)
    partial.replace(path)


def load_checkpoint(path: Path, state: TrainState, recipe: Recipe) -> float:
    """Restore ``state`` (and torch's global generator) from a checkpoint of the same recipe; returns
    the training seconds it had spent. Recipes are compared after loading, so a checkpoint written
    before a recipe key was renamed (see training.recipes.recipe) still resumes."""
    if not path.is_file():
        raise FileNotFoundError(f"nothing to resume: {path} does not exist")
    saved = torch.load(path, map_location="cpu", weights_only=False)
    if Recipe.model_validate(saved["recipe"]) != recipe:
        raise ValueError(f"{path} was written by a different recipe; start a new run dir")
    state.model.load_state_dict(saved["model"])
    state.optimizer.load_state_dict(saved["optimizer"])
    state.lam = saved["lam"].to(state.lam.device)
    state.generator.set_state(saved["generator"])
    torch.set_rng_state(saved["torch_rng"])
    state.step = saved["next_step"]
    return float(saved["seconds"])


def _trim_log(log_path: Path, next_step: int) -> None:
    """Drop log lines a crashed run wrote after its last checkpoint; the resumed run rewrites them."""
    kept = [
        line
        for line in log_path.read_text(encoding="utf-8").splitlines()
        if line and json.loads(line)["step"] < next_step
    ]
    log_path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")


def training_rows(recipe: Recipe) -> list[Example]:
    """The recipe's training split, shuffled with its seed and cut to ``train_limit``."""
    split = load_split(recipe.dataset, recipe.dataset.train_split)
    return shuffled(split, recipe.seed, recipe.dataset.train_limit)


def initial_state(
    recipe: Recipe,
    objective: Objective,
    backbone: EncoderBackbone,
    device: str,
    init_run: Path | None,
) -> TrainState:
    """Model, optimizer, λ and the seeded generator at step 0 (from ``init_run`` for a second stage).
    Call after ``torch.manual_seed(recipe.seed)``: the fresh scorers and head draw from it."""
    generator = torch.Generator(device=device).manual_seed(recipe.seed)
    model = build_model(recipe, backbone)
    if recipe.retrofit is not None:
        start_from_original(model, recipe)
    lam = torch.zeros(model.num_points)
    if recipe.init_from is not None:
        if init_run is None:
            raise ValueError(f"recipe {recipe.name} starts from run {recipe.init_from!r}: pass init_run")
        lam = start_from_run(model, recipe, init_run)
    lam = objective.budget.initial_lambda(lam)
    # The starting point (the original model, or the finished run of a retention stage) is the teacher;
    # a frozen backbone makes the model its own, a tuned one distils from a frozen copy taken now.
    tuned = recipe.teacher_student is not None and not recipe.frozen_backbone
    teacher = frozen_teacher(model).to(device) if tuned else None
    model = model.to(device)
    optimizer = torch.optim.AdamW(parameter_groups(model, recipe))
    base_lrs = [group["lr"] for group in optimizer.param_groups]
    return TrainState(model, optimizer, base_lrs, lam.to(device), generator, teacher=teacher)


def fit(
    recipe: Recipe,
    run_dir: Path,
    backbone: EncoderBackbone | None = None,
    tokenizer=None,
    train_rows: list[Example] | None = None,
    progress: bool = True,
    device: str = "cpu",
    init_run: Path | None = None,
    resume: bool = False,
    stop_at: int | None = None,
    precision: str = "fp32",
) -> RetentionModel:
    """Train per the recipe and write the run directory. Deterministic given ``recipe.seed`` and
    the device (gate noise and ρ are drawn on it).

    Every ``recipe.checkpoint_every`` steps the full training state (weights, optimizer, λ, random
    generators) goes to ``checkpoint.pt``; ``resume=True`` continues from it, on CPU bit-for-bit
    as if never stopped. ``stop_at`` ends the call after that many steps with a checkpoint (to split
    a long run across sessions). ``init_run`` is the finished run ``recipe.init_from`` names.
    ``precision`` (a key of PRECISIONS) is the forward passes' autocast; every log line records it.
    """
    objective = Objective.from_recipe(recipe)  # refuses terms the task cannot compute, before any work
    torch.manual_seed(recipe.seed)  # before the backbone loads: the recorded runs seeded here
    torch.set_num_threads(usable_cores())
    backbone = backbone or load_backbone(recipe.backbone)
    tokenizer = tokenizer or load_tokenizer(recipe.backbone)
    state = initial_state(recipe, objective, backbone, device, init_run)
    state.autocast_dtype = PRECISIONS[precision]
    rows = train_rows if train_rows is not None else training_rows(recipe)
    run_dir.mkdir(parents=True, exist_ok=True)
    log_path = run_dir / LOG_FILE
    checkpoint_path = run_dir / CHECKPOINT_FILE
    elapsed_before = 0.0
    if resume:
        elapsed_before = load_checkpoint(checkpoint_path, state, recipe)
        _trim_log(log_path, state.step)
    else:
        log_path.write_text("", encoding="utf-8")
    last_step = recipe.steps if stop_at is None else min(stop_at, recipe.steps)
    batches = _batches(rows, recipe.batch_size, recipe.seed, skip=state.step)
    schedule = StepSchedule.from_recipe(recipe)
    state.model.train()
    started = time.perf_counter() - elapsed_before
    bar = tqdm(
        range(state.step, last_step),
        desc=f"fit {recipe.name}",
        disable=not progress,
        mininterval=2.0,
        initial=state.step,
        total=recipe.steps,
    )
    for step in bar:
        batch = objective.task.make_batch(next(batches), tokenizer, recipe.max_length).to(device)
        result = train_step(state, objective, batch, schedule)
        if step % recipe.log_every == 0 or step == recipe.steps - 1:
            entry = result.log(time.perf_counter() - started, precision)
            with log_path.open("a", encoding="utf-8") as handle:
                handle.write(json.dumps(asdict(entry)) + "\n")
            bar.set_postfix(
                loss=f"{entry.loss:.3f}",
                kept=f"{entry.kept_fraction:.2f}",
                rho=f"{entry.target_fraction:.2f}",
                lam=f"{max(entry.lam):.3f}",
            )
        if state.step < recipe.steps and (
            state.step % recipe.checkpoint_every == 0 or state.step == last_step
        ):
            save_checkpoint(checkpoint_path, state, recipe, time.perf_counter() - started)
    if last_step < recipe.steps:
        return state.model  # stopped early on purpose; the checkpoint holds everything
    save_run(state.model, recipe, tokenizer, run_dir)
    checkpoint_path.unlink(missing_ok=True)  # the weights are final; nothing left to resume
    return state.model


def save_run(model: RetentionModel, recipe: Recipe, tokenizer, run_dir: Path) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    state = {name: tensor.detach().cpu().contiguous() for name, tensor in model.state_dict().items()}
    save_file(state, str(run_dir / WEIGHTS_FILE))
    model.backbone.config.save_pretrained(str(run_dir / BACKBONE_CONFIG_DIR))
    (run_dir / RECIPE_FILE).write_text(recipe.model_dump_json(indent=2), encoding="utf-8")
    tokenizer.save_pretrained(str(run_dir / TOKENIZER_DIR))


def load_run(run_dir: Path, device: str = "cpu") -> tuple[RetentionModel, Recipe, object]:
    """Rebuild a trained model from its run directory, offline, on ``device``."""
    from transformers import AutoConfig, AutoTokenizer

    recipe = Recipe.model_validate_json((run_dir / RECIPE_FILE).read_text(encoding="utf-8"))
    config = AutoConfig.from_pretrained(str(run_dir / BACKBONE_CONFIG_DIR))
    model = build_model(recipe, backbone_from_config(config))
    model.load_state_dict(load_file(str(run_dir / WEIGHTS_FILE)))
    tokenizer = AutoTokenizer.from_pretrained(str(run_dir / TOKENIZER_DIR), use_fast=True)
    return model.to(device).eval(), recipe, tokenizer


def with_schedule(model: RetentionModel, recipe: Recipe, **settings: Any) -> Recipe:
    """Re-export or re-evaluate a trained run with other schedule settings (``SCHEDULE_FIELDS``: the
    kept-token floor, schedule power, leading share, merging). They are not weights: ``model`` (a
    RetentionModel) gets them in its config and the returned recipe (what the manifest records) says
    them. A setting given as None keeps the run's own; with none given the recipe is returned as is."""
    chosen = {name: value for name, value in settings.items() if value is not None}
    unknown = set(chosen) - set(SCHEDULE_FIELDS)
    if unknown:
        raise ValueError(f"not schedule settings: {sorted(unknown)}; known: {sorted(SCHEDULE_FIELDS)}")
    if not chosen:
        return recipe
    model.config = replace(model.config, **chosen)
    retention = recipe.retention.model_copy(update=chosen)
    return recipe.model_copy(update={"retention": retention})


def with_min_kept_tokens(model: RetentionModel, recipe: Recipe, floor: int | None) -> Recipe:
    """``--min-kept-tokens``: ``with_schedule`` for the kept-token floor alone."""
    return with_schedule(model, recipe, min_kept_tokens=floor)
