"""A retrofit whose pruned branch has weights of its own (issue 56, ``retrofit.pruned_branch: copy``):
ρ = 1 is the original model exactly, every ρ < 1 runs the copy, and only the copy and the scorers train."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import ValidationError
from safetensors.torch import load_file

from benchmarks.retrieval_parts import weights_fingerprint
from tests.tasks.test_embedding import TEXTS, write_sentence_transformer
from tests.tiny import tiny_model, tiny_recipe
from training.__main__ import main as training_main
from training.__main__ import parser
from training.engine.encoders import load_backbone
from training.engine.model import RetentionConfig, RetentionModel
from training.fitting.fit import (
    LOG_FILE,
    RECIPE_FILE,
    WEIGHTS_FILE,
    build_model,
    load_run,
    parameter_groups,
    save_run,
)
from training.fitting.objective import Objective
from training.fitting.retrofit import (
    PRUNED_BRANCH_EMBEDDINGS,
    PRUNED_BRANCH_LR,
    PRUNED_BRANCH_RHO_LOW,
    default_pruned_branch,
    retrofit_recipe,
)
from training.recipes.recipe import ObjectiveSpec, RetentionSpec, RetrofitSpec
from training.tasks.batch import Batch
from training.tiny import TINY_TOKENIZER

# The product embedding's selection: merging, a leading share, selection at every other layer.
PRODUCT = RetentionConfig(merge_dropped=True, leading_share=0.25, pruning_interval=2)
TASKS = ("embedding", "classification", "qa")  # a pooled, a sequence and a token head


def inputs(seed: int = 0, batch: int = 4, length: int = 14) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 1000, (batch, length), generator=generator)  # (B, T)
    mask = torch.ones(batch, length, dtype=torch.long)  # (B, T)
    mask[1, 9:] = 0  # ragged
    ids[1, 9:] = 0
    return ids, mask


def branched(task: str) -> tuple[RetentionModel, RetentionModel]:
    """(the frozen original, the same model with a pruned branch of its own), same weights."""
    original, _ = tiny_model(task, seed=3, config=PRODUCT)
    original.freeze_backbone()
    model, _ = tiny_model(task, seed=3, config=PRODUCT)
    model.freeze_backbone()
    model.add_pruned_branch()
    return original.eval(), model.eval()


def perturb(model: RetentionModel) -> None:
    assert model.pruned_backbone is not None
    generator = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for param in model.pruned_backbone.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=generator))


@pytest.mark.parametrize("task", TASKS)
def test_rho_1_is_the_original_and_rho_below_1_runs_the_copy(task: str) -> None:
    original, model = branched(task)
    ids, mask = inputs()
    ones, half = torch.ones(4), torch.full((4,), 0.5)
    with torch.no_grad():
        dense = original.forward_unpruned(ids, mask).logits
        shared_half = original.forward_pruned(ids, mask, half)
        # The copy starts as the original's weights: the pruned pass is the shared model's, bit for bit.
        assert torch.equal(model.forward_pruned(ids, mask, half).logits, shared_half.logits)
        perturb(model)
        at_1 = model.forward_pruned(ids, mask, ones)
        at_half = model.forward_pruned(ids, mask, half)
    assert torch.equal(at_1.logits, dense)  # ρ = 1: the original, exactly, whatever the copy holds
    assert torch.equal(model.forward_unpruned(ids, mask).logits, dense)
    assert not torch.allclose(at_half.logits, shared_half.logits, atol=1e-3)  # ρ < 1: the copy's weights
    assert torch.equal(at_half.kept_counts, shared_half.kept_counts)  # the same schedule
    assert torch.equal(at_1.kept_counts, mask.sum(1, keepdim=True).expand(-1, model.num_points))


@pytest.mark.parametrize("task", TASKS)
def test_a_mixed_batch_gives_each_row_its_own_path(task: str) -> None:
    """A ρ = 1 row shares a batch with ρ < 1 rows: it still gets the original model's output."""
    original, model = branched(task)
    perturb(model)
    ids, mask = inputs(seed=1)
    mixed = torch.tensor([1.0, 0.5, 0.3, 1.0])
    with torch.no_grad():
        dense = original.forward_unpruned(ids, mask).logits
        out = model.forward_pruned(ids, mask, mixed)
        alone = [model.forward_pruned(ids[i : i + 1], mask[i : i + 1], mixed[i : i + 1]) for i in range(4)]
    for row in (0, 3):
        assert torch.equal(out.logits[row], dense[row])
    for row in (1, 2):  # the pruned pass on the copy, as when the row runs alone (padding aside)
        real = int(mask[row].sum())
        expected = alone[row].logits[0, :real] if out.logits.dim() == 3 else alone[row].logits[0]
        got = out.logits[row, :real] if out.logits.dim() == 3 else out.logits[row]
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
        assert torch.equal(out.kept_counts[row], alone[row].kept_counts[0])


def test_the_soft_pass_trains_the_copy_and_the_scorers_only() -> None:
    _, model = branched("embedding")
    model.train()
    assert model.pruned_backbone is not None and model.pruned_backbone.training
    assert not model.backbone.training
    ids, mask = inputs()
    soft = model.forward_soft(ids, mask, torch.full((4,), 0.5), generator=torch.Generator().manual_seed(0))
    soft.logits.sum().backward()
    assert all(param.grad is None for param in model.backbone.parameters())
    assert any(
        param.grad is not None and param.grad.abs().sum() > 0 for param in model.pruned_backbone.parameters()
    )
    assert any(param.grad is not None for param in model.scorers.parameters())


def copy_recipe(steps: int = 3):
    recipe = tiny_recipe("embedding")
    return recipe.model_copy(
        update={
            "retrofit": RetrofitSpec(pooling="mean", normalize=True, pruned_branch="copy"),
            "retention": RetentionSpec(merge_dropped=True, leading_share=0.25, pruning_interval=2),
            "objective": ObjectiveSpec(pruned_loss_weight=1.0, sandwich_random_budgets=2),
            "steps": steps,
        }
    )


def test_recipe_builds_a_frozen_original_and_a_trainable_copy(tmp_path: Path) -> None:
    recipe = copy_recipe()
    assert recipe.pruned_branch_copy and recipe.frozen_backbone
    model, tokenizer = tiny_model("embedding", config=PRODUCT)
    built = build_model(recipe, model.backbone)
    assert built.pruned_backbone is not None and built.pruned_backbone is not built.backbone
    assert not any(param.requires_grad for param in built.backbone.parameters())
    trainable = {id(param) for group in parameter_groups(built, recipe) for param in group["params"]}
    assert {id(param) for param in built.pruned_backbone.parameters()} <= trainable
    assert not {id(param) for param in built.backbone.parameters()} & trainable
    # The run directory holds both weight sets and loads back with both (strict).
    perturb(built)
    save_run(built, recipe, tokenizer, tmp_path / "run")
    loaded, loaded_recipe, _ = load_run(tmp_path / "run")
    assert loaded_recipe.pruned_branch_copy and loaded.pruned_backbone is not None
    for name, value in built.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], value), name


def test_a_copy_can_keep_the_original_embeddings() -> None:
    """``copy_embeddings: original``: the copy's embedding tables do not train (the export then stores
    them once); its layers do."""
    recipe = copy_recipe()
    assert recipe.retrofit is not None
    shared = recipe.model_copy(
        update={"retrofit": recipe.retrofit.model_copy(update={"copy_embeddings": "original"})}
    )
    model, _ = tiny_model("embedding", config=PRODUCT)
    built = build_model(shared, model.backbone)
    assert built.pruned_backbone is not None
    trainable = {id(param) for group in parameter_groups(built, shared) for param in group["params"]}
    assert not {id(param) for param in built.pruned_backbone.embeddings.parameters()} & trainable
    assert {id(param) for param in built.pruned_backbone.layers.parameters()} <= trainable
    with pytest.raises(ValidationError, match="copy_embeddings needs pruned_branch 'copy'"):
        RetrofitSpec(copy_embeddings="original")


def test_copy_needs_the_frozen_original() -> None:
    with pytest.raises(ValidationError, match="needs freeze_backbone"):
        RetrofitSpec(pruned_branch="copy", freeze_backbone=False)
    assert RetrofitSpec().pruned_branch == "shared"  # off by default


def test_the_top_m_passes_skip_the_frozen_rho_1_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sandwich's ρ = 1 pass is the frozen original with a copy: nothing to train, so not run."""
    recipe = copy_recipe()
    objective = Objective.from_recipe(recipe)
    _, model = branched("embedding")
    ids, mask = inputs()
    batch = Batch(ids, mask, torch.zeros(4, 0))
    calls: list[torch.Tensor] = []
    forward = model.forward_pruned

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs["rho"])
        return forward(*args, **kwargs)

    monkeypatch.setattr(model, "forward_pruned", counting)
    rho = torch.full((4,), 0.6)
    passes = objective.top_m_passes(model, batch, rho, torch.Generator().manual_seed(0))
    assert len(passes) == 3  # the batch's ρ, ρ.low, one more random budget
    assert calls[0] is rho and all(bool((budget < 1.0).all()) for budget in calls)


def test_retrofit_cli_trains_the_copy_and_keeps_the_original(tmp_path: Path) -> None:
    """An embedding retrofit's default: the two-path model."""
    original = write_sentence_transformer(tmp_path / "st-model")
    texts = tmp_path / "texts.jsonl"
    texts.write_text("".join(json.dumps({"text": text}) + "\n" for text in TEXTS), encoding="utf-8")
    run_dir = tmp_path / "run"
    arguments = ["--texts", str(texts), "--steps", "3", "--run-dir", str(run_dir), "--no-progress"]
    training_main(["retrofit", str(original), *arguments])  # no --pruned-branch: embedding's default
    retrofit = json.loads((run_dir / RECIPE_FILE).read_text())["retrofit"]
    assert (retrofit["pruned_branch"], retrofit["copy_embeddings"]) == ("copy", PRUNED_BRANCH_EMBEDDINGS)
    log = [json.loads(line) for line in (run_dir / LOG_FILE).read_text().splitlines()]
    assert log[0]["lr"] == pytest.approx(PRUNED_BRANCH_LR)  # the copy's lr (group 0), not the scorers'
    assert all(entry["pruned_loss"] is not None for entry in log)
    trained = load_file(str(run_dir / WEIGHTS_FILE))
    reference = load_backbone(str(original)).state_dict()
    assert all(torch.equal(trained[f"backbone.{name}"], value) for name, value in reference.items())
    assert any(
        not torch.equal(trained[f"pruned_backbone.{name}"], value) for name, value in reference.items()
    )
    # the copy trained its layers on the original's embedding tables, which stayed as they were
    tables = [name for name in reference if name.startswith("embeddings.")]
    assert tables and all(torch.equal(trained[f"pruned_backbone.{name}"], reference[name]) for name in tables)
    with pytest.raises(SystemExit, match="choose one"):
        training_main(
            ["retrofit", str(original), *arguments, "--pruned-branch", "copy", "--backbone-lr", "1e-5"]
        )


def test_each_task_has_its_default_pruned_branch_and_shared_opts_out(tmp_path: Path) -> None:
    """Embedding retrofits train the copy by default (measured to gain there); classification keeps the
    frozen retrofit (the copy was never measured on it); ``--backbone-lr`` tunes the original itself, so
    it keeps one set of weights; ``--pruned-branch shared`` is the frozen retrofit as it was."""
    assert (default_pruned_branch("embedding"), default_pruned_branch("classification")) == ("copy", "shared")
    assert default_pruned_branch("embedding", backbone_lr=1e-5) == "shared"
    assert parser().parse_args(["retrofit", "m", "--texts", "t"]).pruned_branch is None  # the task decides
    (commands,) = [action for action in parser()._actions if isinstance(action, argparse._SubParsersAction)]
    help_text = " ".join(commands.choices["retrofit"].format_help().split())
    assert "Default per task: classification shared, embedding copy" in help_text  # registry order
    tuned = retrofit_recipe(TINY_TOKENIZER, "embedding", tmp_path / "t.txt", backbone_lr=1e-5)
    assert tuned.retrofit is not None and tuned.retrofit.pruned_branch == "shared"
    assert retrofit_recipe(TINY_TOKENIZER, "embedding", tmp_path / "t.txt") == retrofit_recipe(
        TINY_TOKENIZER, "embedding", tmp_path / "t.txt", pruned_branch="copy"
    )
    recipe = retrofit_recipe(TINY_TOKENIZER, "embedding", tmp_path / "t.txt", pruned_branch="shared")
    assert recipe.retrofit is not None and recipe.retrofit.pruned_branch == "shared"
    assert recipe.objective == ObjectiveSpec()
    copy = retrofit_recipe(TINY_TOKENIZER, "embedding", tmp_path / "t.txt")
    # the copy trains at the study's try B settings on the original's embeddings; everything else is the
    # frozen retrofit's
    assert (
        copy.retrofit is not None and copy.retrofit.copy_embeddings == PRUNED_BRANCH_EMBEDDINGS == "original"
    )
    assert recipe.retrofit.copy_embeddings == "own"  # no copy: nothing to share
    assert (
        (copy.rho.low, copy.optimizer.lr)
        == (PRUNED_BRANCH_RHO_LOW, PRUNED_BRANCH_LR)
        != (
            recipe.rho.low,
            recipe.optimizer.lr,
        )
    )
    assert copy.rho.high == recipe.rho.high and copy.optimizer.scorer_lr == recipe.optimizer.scorer_lr
    assert build_model(recipe, tiny_model("embedding")[0].backbone).pruned_backbone is None


def test_retrieval_cache_keys_follow_the_weights_each_method_runs() -> None:
    """Dense and truncation run the original: their cache is shared with the frozen retrofit's. A pruned
    baseline runs the pruned branch: its key changes with the copy."""
    original, model = branched("embedding")
    for method in ("dense", "truncation", "layer-exit-3"):
        assert weights_fingerprint(model, method) == weights_fingerprint(original, method)
    assert weights_fingerprint(original, "random") == weights_fingerprint(original, "dense")  # old keys
    assert weights_fingerprint(model, "random") != weights_fingerprint(original, "random")
    before = weights_fingerprint(model, "attention")
    perturb(model)
    assert weights_fingerprint(model, "attention") != before
    assert weights_fingerprint(model, "dense") == weights_fingerprint(original, "dense")
