"""The embedding head's pooling option (``retention.pooling: kept | restored``, issue 20): what each
averages, that ρ = 1 stays the dense model, that the exported graph pools as torch does, that run dirs
without the key load as ``kept``, and that ``benchmarks.retrieval --pooling`` keeps its own cache keys."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from benchmarks import retrieval
from retention_core.contract import MODEL_FILE, Manifest
from retention_core.onnx import open_session
from tests.tasks.test_embedding import TEXTS, dense_mean_pooling
from tests.test_retrieval import squad_file, tiny_embedding_run
from tests.tiny import tiny_model, tiny_recipe
from training.embedding import with_pooling
from training.export import export_model
from training.fit import RECIPE_FILE, load_run, save_run
from training.model import PrunedInputs, RetentionConfig, RetentionModel
from training.recipes import Recipe, RetentionSpec

RHO = 0.4  # low enough that the tiny model drops tokens before its last layer


def restored_model(seed: int) -> tuple[RetentionModel, Any]:
    model, tokenizer = tiny_model("embedding", seed=seed)
    model.config = replace(model.config, pooling="restored")
    return model, tokenizer


def restored_recipe() -> Recipe:
    recipe = tiny_recipe("embedding")
    retention = recipe.retention.model_copy(update={"pooling": "restored"})
    return recipe.model_copy(update={"retention": retention})


def batch(hf_tokenizer: Any, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    encoded = hf_tokenizer(TEXTS[:count], padding=True, return_tensors="pt")
    return encoded["input_ids"], encoded["attention_mask"]  # (B, T) each


def last_states(
    model: RetentionModel, input_ids: torch.Tensor, attention_mask: torch.Tensor, rho: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Independently of the restore path: each real token's state when it last left a layer (its
    embedding if dropped before the first), from the survivors and each layer's output slots, which hold
    the kept tokens in original order. → pooled logits (B, d), last states (B, T, d)."""
    outputs: list[torch.Tensor] = []
    for layer in model.backbone.views:
        layer.register_forward_hook(lambda module, args, output: outputs.append(output))
    inputs = PrunedInputs(input_ids, attention_mask, torch.full((input_ids.shape[0],), rho))
    with torch.no_grad():
        out = model.forward_evaluation(inputs, record_survivors=True)
        states = model.backbone.embed(input_ids).clone()  # (B, T, d)
    assert out.survivors is not None
    survivors = out.survivors  # (B, P, T) bool: real tokens entering each layer
    for point, layer_output in enumerate(outputs):  # (B, K, d) per layer
        for row in range(input_ids.shape[0]):
            positions = survivors[row, point].nonzero().squeeze(-1)  # (K_row,)
            states[row, positions] = layer_output[row, : len(positions)]
    return out.logits, states


def test_restored_pooling_averages_every_real_token_at_its_last_state(hf_tokenizer: Any) -> None:
    model, _ = restored_model(seed=4)
    input_ids, attention_mask = batch(hf_tokenizer, 3)
    logits, states = last_states(model, input_ids, attention_mask, RHO)
    with torch.no_grad():
        counts = model.forward_pruned(input_ids, attention_mask, torch.full((3,), RHO)).kept_counts  # (B, P)
    assert (counts[:, -1] < attention_mask.sum(1)).all()  # tokens were dropped: restoring matters
    for row in range(3):
        real = attention_mask[row].bool()
        torch.testing.assert_close(logits[row], states[row, real].mean(0))


def test_both_poolings_are_the_dense_model_at_rho_1_and_differ_below(hf_tokenizer: Any) -> None:
    kept, _ = tiny_model("embedding", seed=2)
    restored, _ = restored_model(seed=2)
    input_ids, attention_mask = batch(hf_tokenizer, 4)
    with torch.no_grad():
        reference = dense_mean_pooling(kept, input_ids, attention_mask)
        dense = restored.forward_pruned(input_ids, attention_mask, torch.ones(4)).logits
        pruned = {
            name: model.forward_pruned(input_ids, attention_mask, torch.full((4,), RHO)).logits
            for name, model in (("kept", kept), ("restored", restored))
        }
    torch.testing.assert_close(dense, reference, rtol=0.0, atol=1e-6)
    assert not torch.allclose(pruned["kept"], pruned["restored"], atol=1e-4)


def test_soft_pass_with_restored_pooling_trains_the_scorers(hf_tokenizer: Any) -> None:
    """The soft restore keeps the pooled vector differentiable in every scorer."""
    model, _ = restored_model(seed=3)
    model.train()
    input_ids, attention_mask = batch(hf_tokenizer, 4)
    out = model.forward_soft(input_ids, attention_mask, torch.full((4,), RHO))
    with torch.no_grad():
        target = model.forward_pruned(input_ids, attention_mask, torch.ones(4)).logits  # (B, d)
    (1.0 - torch.nn.functional.cosine_similarity(out.logits, target, dim=-1)).mean().backward()
    for scorer in model.scorers:
        grads = [p.grad for p in scorer.parameters() if p.requires_grad]
        assert any(g is not None and g.abs().sum() > 0 for g in grads)


def test_only_a_pooled_head_restores_into_its_pooling() -> None:
    model, _ = tiny_model("classification")
    with pytest.raises(ValueError, match="pooled head"):
        RetentionModel(model.backbone, "classification", 2, RetentionConfig(pooling="restored"))
    with pytest.raises(ValidationError):
        RetentionSpec.model_validate({"pooling": "mean"})


def test_run_dirs_without_the_key_load_as_kept_and_restored_round_trips(tmp_path: Path) -> None:
    model, tokenizer = restored_model(seed=0)
    run_dir = tmp_path / "restored"
    save_run(model, restored_recipe(), tokenizer, run_dir)
    loaded, recipe, _ = load_run(run_dir)
    assert loaded.config.pooling == recipe.retention.pooling == "restored"

    saved = json.loads((run_dir / RECIPE_FILE).read_text(encoding="utf-8"))
    del saved["retention"]["pooling"]  # a run dir written before the option
    (run_dir / RECIPE_FILE).write_text(json.dumps(saved), encoding="utf-8")
    legacy, legacy_recipe, _ = load_run(run_dir)
    assert legacy.config.pooling == legacy_recipe.retention.pooling == "kept"

    switched = with_pooling(legacy, legacy_recipe, "restored")
    assert legacy.config.pooling == switched.retention.pooling == "restored"
    assert with_pooling(legacy, switched, None) is switched
    with pytest.raises(ValidationError):
        with_pooling(legacy, switched, "mean")


def test_the_exported_graph_pools_as_torch_does(tmp_path: Path, hf_tokenizer: Any) -> None:
    """Export parity runs on the restored graph; its output at ρ < 1 is torch's restored vector, not the
    kept one of the same weights."""
    model, tokenizer = restored_model(seed=5)
    out = tmp_path / "model"
    export_model(model, restored_recipe(), tokenizer, out)
    trained = Recipe.model_validate(Manifest.read(out).training["recipe"])
    assert trained.retention.pooling == "restored"  # the manifest says how the graph pools
    input_ids, attention_mask = batch(hf_tokenizer, 3)
    rho = torch.full((3,), RHO)
    feeds = {"input_ids": input_ids.numpy(), "attention_mask": attention_mask.numpy(), "rho": rho.numpy()}
    served = open_session(out / MODEL_FILE).run(None, feeds)[0]  # (B, d)
    with torch.no_grad():
        restored = model.forward_pruned(input_ids, attention_mask, rho).logits.numpy()
        model.config = replace(model.config, pooling="kept")
        kept = model.forward_pruned(input_ids, attention_mask, rho).logits.numpy()
    np.testing.assert_allclose(served, restored, atol=1e-5)
    assert np.abs(served - kept).max() > 1e-3
    with pytest.raises(ValueError, match="misdescribe"):  # model now pools kept, recipe says restored
        export_model(model, restored_recipe(), tokenizer, tmp_path / "mismatch")


def test_retrieval_pooling_override_has_its_own_cache_keys(tmp_path: Path) -> None:
    run_dir, data = tiny_embedding_run(tmp_path), squad_file(tmp_path)
    cache = tmp_path / "cache"
    arguments = [str(run_dir), "--data", str(data), "--rhos", "1", "0.3", "--cache-dir", str(cache)]
    arguments += ["--methods", "learned", "truncation", "--query-rhos"]
    retrieval.main([*arguments, "--out", str(tmp_path / "kept")])
    restored_out = tmp_path / "restored"
    retrieval.main(
        [*arguments, "--out", str(restored_out), "--pooling", "restored", "--paired-with", str(run_dir)]
    )

    kept = json.loads((tmp_path / "kept" / "retrieval.json").read_text())
    payload = json.loads((restored_out / "retrieval.json").read_text())
    assert (kept["pooling"], payload["pooling"]) == ("kept", "restored")
    assert "pooling restored" in (restored_out / "retrieval.md").read_text()
    results = payload["results"]
    # Dense and truncation (the dense model on fewer tokens) do not depend on the pooling: reused.
    assert results["dense"]["1"]["document_cached"] and results["truncation"]["0.3"]["document_cached"]
    assert not results["learned"]["0.3"]["document_cached"]  # same weights, other vectors
    cosine = {
        name: result["results"]["learned"]["0.3"]["document_cosine_to_dense"]["mean"]
        for name, result in (("kept", kept), ("restored", payload))
    }
    assert cosine["kept"] != pytest.approx(cosine["restored"], abs=1e-6)
    # --paired-with keeps the other run's own pooling: restored minus kept of the same scorers.
    paired = payload["paired_with"]["learned_minus_other"]["0.3"]
    expected = results["learned"]["0.3"]["ndcg@10"] - kept["results"]["learned"]["0.3"]["ndcg@10"]
    assert paired["difference"] == pytest.approx(expected, abs=0.01)  # the cells are rounded
