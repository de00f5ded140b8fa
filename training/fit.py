"""Fine-tune a backbone with learned retention: ``python -m training fit models/recipes/<name>.yaml``.

A run directory (git-ignored) holds everything export needs without the network:
``weights.safetensors``, ``backbone/config.json``, the tokenizer, ``recipe.json`` and ``train_log.jsonl``.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from retention_core.tasks import task_spec
from training import retention as R
from training.data import Row, load_split, shuffled
from training.encoders import EncoderBackbone, backbone_from_config, load_backbone, load_tokenizer
from training.model import RetentionConfig, RetentionModel, SoftOutput
from training.recipes import Recipe
from training.tasks import training_task

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


def retention_config(recipe: Recipe) -> RetentionConfig:
    spec = recipe.retention
    return RetentionConfig(
        scorer_size=spec.scorer_size,
        ema_decay=spec.ema_decay,
        schedule_power=spec.schedule_power,
        hard_concrete=R.HardConcrete(spec.gate_temperature, spec.gate_left, spec.gate_right),
        normalize_scores=spec.normalize_scores,
        score_shift=spec.score_shift,
    )


def build_model(recipe: Recipe, backbone: EncoderBackbone) -> RetentionModel:
    width = task_spec(recipe.task).head_width(recipe.labels)
    return RetentionModel(backbone, recipe.task, width, retention_config(recipe))


def parameter_groups(model: RetentionModel, recipe: Recipe) -> list[dict]:
    """Backbone + head at the fine-tuning lr (no decay on biases/norms); fresh scorers at scorer_lr."""
    decay, no_decay, scorer = [], [], []
    for name, param in model.named_parameters():
        if name.startswith("scorers."):
            scorer.append(param)
        elif name.endswith(NO_DECAY_SUFFIXES):
            no_decay.append(param)
        else:
            decay.append(param)
    opt = recipe.optimizer
    return [
        {"params": decay, "lr": opt.lr, "weight_decay": opt.weight_decay},
        {"params": no_decay, "lr": opt.lr, "weight_decay": 0.0},
        {"params": scorer, "lr": opt.scorer_lr, "weight_decay": 0.0},
    ]


@dataclass
class StepLog:
    step: int
    loss: float
    task_loss: float
    kept_fraction: float  # expected survivors at the last point / real tokens
    target_fraction: float  # mean ρ of the batch
    pruned_loss: float | None  # task loss of the hard top-M pass, when the objective has one
    dense_loss: float | None  # task loss of the dense pass, when the objective distills
    distill_loss: float | None  # divergence of the top-M pass from the dense pass
    lam: list[float]
    lr: float
    seconds: float
    salient_loss: float | None = None  # −log P(gate open) of the salient tokens, when trained on


def _batches(rows: list[Row], batch_size: int, seed: int, skip: int = 0):
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


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Write atomically: an interrupted save must not destroy the previous checkpoint."""
    partial = path.with_suffix(".partial")
    torch.save(state, partial)
    partial.replace(path)


def _trim_log(log_path: Path, next_step: int) -> None:
    """Drop log lines a crashed run wrote after its last checkpoint; the resumed run rewrites them."""
    kept = [
        line
        for line in log_path.read_text(encoding="utf-8").splitlines()
        if line and json.loads(line)["step"] < next_step
    ]
    log_path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")


def fit(
    recipe: Recipe,
    run_dir: Path,
    backbone: EncoderBackbone | None = None,
    tokenizer=None,
    train_rows: list[Row] | None = None,
    progress: bool = True,
    device: str = "cpu",
    init_run: Path | None = None,
    resume: bool = False,
    stop_at: int | None = None,
) -> RetentionModel:
    """Train per the recipe and write the run directory. Deterministic given ``recipe.seed`` and
    the device (gate noise and ρ are drawn on it).

    Every ``recipe.checkpoint_every`` steps the full training state (weights, optimizer, λ, random
    generators) goes to ``checkpoint.pt``; ``resume=True`` continues from it, on CPU bit-for-bit
    as if never stopped. ``stop_at`` ends the call after that many steps with a checkpoint (to split
    a long run across sessions). ``init_run`` is the finished run ``recipe.init_from`` names.
    """
    adapter = training_task(recipe.task)
    if recipe.objective.salient_keep_weight > 0.0 and adapter.salient is None:
        raise ValueError(f"objective.salient_keep_weight needs salient tokens; task {recipe.task!r} has none")
    torch.manual_seed(recipe.seed)
    torch.set_num_threads(usable_cores())
    generator = torch.Generator(device=device).manual_seed(recipe.seed)
    backbone = backbone or load_backbone(recipe.backbone)
    tokenizer = tokenizer or load_tokenizer(recipe.backbone)
    model = build_model(recipe, backbone)
    lam = torch.zeros(model.num_points)
    if recipe.init_from is not None:
        if init_run is None:
            raise ValueError(f"recipe {recipe.name} starts from run {recipe.init_from!r}: pass init_run")
        lam = start_from_run(model, recipe, init_run)
    if recipe.budget.fixed_lambda is not None:
        lam.fill_(recipe.budget.fixed_lambda)
    model = model.to(device)
    lam = lam.to(device)
    rows = (
        train_rows
        if train_rows is not None
        else shuffled(
            load_split(recipe.dataset, recipe.dataset.train_split), recipe.seed, recipe.dataset.train_limit
        )
    )
    optimizer = torch.optim.AdamW(parameter_groups(model, recipe))
    base_lrs = [group["lr"] for group in optimizer.param_groups]
    warmup = int(recipe.optimizer.warmup_ratio * recipe.steps)
    run_dir.mkdir(parents=True, exist_ok=True)
    log_path = run_dir / LOG_FILE
    checkpoint_path = run_dir / CHECKPOINT_FILE
    first_step, elapsed_before = 0, 0.0
    if resume:
        if not checkpoint_path.is_file():
            raise FileNotFoundError(f"nothing to resume: {checkpoint_path} does not exist")
        saved = torch.load(checkpoint_path, map_location="cpu", weights_only=False)
        if saved["recipe"] != recipe.model_dump(mode="json"):
            raise ValueError(f"{checkpoint_path} was written by a different recipe; start a new run dir")
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        lam = saved["lam"].to(device)
        generator.set_state(saved["generator"])
        torch.set_rng_state(saved["torch_rng"])
        first_step, elapsed_before = saved["next_step"], saved["seconds"]
        _trim_log(log_path, first_step)
    else:
        log_path.write_text("", encoding="utf-8")
    last_step = recipe.steps if stop_at is None else min(stop_at, recipe.steps)
    batches = _batches(rows, recipe.batch_size, recipe.seed, skip=first_step)
    model.train()
    started = time.perf_counter() - elapsed_before
    bar = tqdm(
        range(first_step, last_step),
        desc=f"fit {recipe.name}",
        disable=not progress,
        mininterval=2.0,
        initial=first_step,
        total=recipe.steps,
    )
    for step in bar:
        scale = lr_multiplier(step, recipe.steps, warmup)
        for group, base in zip(optimizer.param_groups, base_lrs, strict=True):
            group["lr"] = base * scale
        batch = adapter.make_batch(next(batches), tokenizer, recipe.max_length).to(device)
        rho = R.sample_rho(batch.input_ids.shape[0], recipe.rho.low, recipe.rho.high, generator)
        out = model.forward_soft(
            **batch.encoder_inputs(), rho=rho, generator=generator, gates=recipe.retention.gates
        )
        task_loss = adapter.loss(out.logits, batch)
        gap = R.budget_gap(out.expected_kept, out.target_kept, out.num_real)  # (P,)
        loss = task_loss + R.lagrangian_penalty(gap, lam, recipe.budget.quadratic_weight)
        extra = extra_losses(model, adapter, batch, rho, recipe)
        extra.salient = salient_loss(out, adapter, batch, recipe)
        loss = loss + extra.total(recipe)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.optimizer.grad_clip)
        optimizer.step()
        if recipe.budget.fixed_lambda is None:
            lam = R.dual_ascent(lam, gap, recipe.budget.dual_lr, recipe.budget.two_sided)
        if step % recipe.log_every == 0 or step == recipe.steps - 1:
            kept = (out.expected_kept[:, -1] / out.num_real).mean().item()
            entry = StepLog(
                step,
                loss.item(),
                task_loss.item(),
                kept,
                rho.mean().item(),
                extra.item("pruned"),
                extra.item("dense"),
                extra.item("distill"),
                [round(x, 5) for x in lam.tolist()],
                optimizer.param_groups[0]["lr"],
                time.perf_counter() - started,
                extra.item("salient"),
            )
            with log_path.open("a", encoding="utf-8") as handle:
                handle.write(json.dumps(entry.__dict__) + "\n")
            bar.set_postfix(
                loss=f"{entry.task_loss:.3f}",
                kept=f"{kept:.2f}",
                rho=f"{entry.target_fraction:.2f}",
                lam=f"{max(entry.lam):.3f}",
            )
        done = step + 1
        if done < recipe.steps and (done % recipe.checkpoint_every == 0 or done == last_step):
            state = {
                "recipe": recipe.model_dump(mode="json"),
                "next_step": done,
                "seconds": time.perf_counter() - started,
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "lam": lam.detach().cpu(),
                "generator": generator.get_state(),
                "torch_rng": torch.get_rng_state(),
            }
            save_checkpoint(checkpoint_path, state)
    if last_step < recipe.steps:
        return model  # stopped early on purpose; the checkpoint holds everything
    save_run(model, recipe, tokenizer, run_dir)
    checkpoint_path.unlink(missing_ok=True)  # the weights are final; nothing left to resume
    return model


@dataclass
class ExtraLosses:
    """The terms of the objective beyond the soft pass: scalars, or None when not computed."""

    pruned: torch.Tensor | None = None  # task loss of the hard top-M pass
    dense: torch.Tensor | None = None  # task loss of the dense pass (sandwich rule)
    distill: torch.Tensor | None = None  # divergence of the top-M pass from the dense pass
    salient: torch.Tensor | None = None  # −log P(gate open) of the task's salient tokens

    def total(self, recipe: Recipe) -> torch.Tensor | float:
        objective = recipe.objective
        terms: list[tuple[float, torch.Tensor | None]] = [
            (objective.pruned_loss_weight, self.pruned),
            (1.0, self.dense),
            (objective.distill_weight, self.distill),
            (objective.salient_keep_weight, self.salient),
        ]
        return sum((weight * value for weight, value in terms if value is not None), 0.0)

    def item(self, name: str) -> float | None:
        value = getattr(self, name)
        return None if value is None else value.item()


def extra_losses(model: RetentionModel, adapter, batch, rho: torch.Tensor, recipe: Recipe) -> ExtraLosses:
    """The hard top-M pass at the batch's ρ and, with distillation, the dense pass.

    The soft pass never freezes a token completely, while inference drops tokens for good and
    restores their early states; the top-M pass trains backbone and head on exactly that. Top-M is
    not differentiable, so the scorers still learn only from the soft pass. With ``distill_weight``
    the dense pass (ρ = 1) trains on the gold targets too and its detached outputs teach the top-M
    pass (the Length-Adaptive Transformer's sandwich rule with in-place distillation).
    """
    objective = recipe.objective
    distill = objective.distill_weight > 0.0
    if objective.pruned_loss_weight <= 0.0 and not distill:
        return ExtraLosses()
    if distill and adapter.distill is None:
        raise ValueError(f"task {recipe.task!r} has no distillation loss")
    inputs = batch.encoder_inputs()
    pruned_logits = model.forward_pruned(**inputs, rho=rho).logits
    losses = ExtraLosses(pruned=adapter.loss(pruned_logits, batch))
    if distill:
        dense_logits = model.forward_pruned(**inputs, rho=torch.ones_like(rho)).logits
        losses.dense = adapter.loss(dense_logits, batch)
        losses.distill = adapter.distill(pruned_logits, dense_logits.detach(), batch)
    return losses


def salient_loss(out: SoftOutput, adapter, batch, recipe: Recipe) -> torch.Tensor | None:
    """The scorers' supervised term (``objective.salient_keep_weight``) from the soft pass, or None."""
    if recipe.objective.salient_keep_weight <= 0.0 or out.open_prob is None or adapter.salient is None:
        return None
    return R.salient_keep_loss(out.open_prob, adapter.salient(batch))


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
