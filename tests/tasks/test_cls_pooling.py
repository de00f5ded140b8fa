"""CLS pooling (BGE, Arctic-embed): a sentence-transformers model whose Pooling module reads [CLS] is
retrofitted end to end. The pooled head is the final [CLS] state (the last layer computes that one
query), [CLS] is never dropped, the manifest says ``cls``, and the served vector at ρ = 1 is the
original model's ``encode``. Other pooling modes are still refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from sentence_transformers import SentenceTransformer
from tokenizers import Tokenizer

from retention_core.codecs.base import pad_rows
from retention_core.contract import MODEL_FILE, EmbeddingInfo, Manifest
from retention_core.text import pad_token_id
from retention_ort import open_session
from retention_tasks.embedding.codec import EmbeddingCodec
from retention_tasks.embedding.learn import embedding_loss
from retention_tasks.embedding.retrofit import sentence_transformers_pooling
from tests.tasks.test_embedding import TEXTS, served_vectors, write_sentence_transformer
from training.__main__ import main as training_main
from training.engine import selection as R
from training.engine.model import RetentionConfig, RetentionModel
from training.fitting.fit import RECIPE_FILE
from training.recipes.recipe import RetrofitSpec
from training.tasks.batch import Batch
from training.tiny import TINY_LAYERS, tiny_model

PRUNED_RHO = 0.3
PARITY_ATOL = 1e-5  # served fp32 graph vs sentence-transformers' torch encode


def cls_model(seed: int = 3, merge_dropped: bool = False) -> RetentionModel:
    """A tiny random embedding model with CLS pooling."""
    config = RetentionConfig(pooling="cls", merge_dropped=merge_dropped)
    model, _ = tiny_model("embedding", seed=seed, config=config)
    return model


def dense_cls_state(
    model: RetentionModel, input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> torch.Tensor:
    """The unpruned encoder, every query of every layer, then the [CLS] state: (B, d)."""
    hidden = model.backbone.embed(input_ids)  # (B, T, d)
    bias = R.attention_bias(attention_mask.bool(), hidden.dtype)  # (B, 1, 1, T)
    for layer in model.backbone.views:
        hidden = layer(hidden, bias)
    return hidden[:, 0]


# ---------------------------------------------------------------------- reading the model's pooling
def test_sentence_transformers_pooling_reads_cls_and_refuses_other_modes(tmp_path: Path) -> None:
    cls_dir = write_sentence_transformer(tmp_path / "cls", pooling="cls_token")
    assert sentence_transformers_pooling(cls_dir) == RetrofitSpec(pooling="cls", normalize=True)
    unnormalised = write_sentence_transformer(tmp_path / "cls-raw", pooling="cls_token", normalize=False)
    assert sentence_transformers_pooling(unnormalised) == RetrofitSpec(pooling="cls", normalize=False)

    max_dir = write_sentence_transformer(tmp_path / "max", pooling="max_tokens")
    supported = r"retrofit supports exactly one of \['pooling_mode_cls_token', 'pooling_mode_mean_tokens'\]"
    with pytest.raises(
        ValueError, match=r"pooling \['pooling_mode_max_tokens'\] is not supported; " + supported
    ):
        sentence_transformers_pooling(max_dir)
    pooling_config = cls_dir / "1_Pooling" / "config.json"
    both = {**json.loads(pooling_config.read_text()), "pooling_mode_mean_tokens": True}
    pooling_config.write_text(json.dumps(both))  # cls and mean at once: a concatenation, not supported
    with pytest.raises(ValueError, match="'pooling_mode_cls_token', 'pooling_mode_mean_tokens'] is not"):
        sentence_transformers_pooling(cls_dir)


def test_older_manifests_read_as_mean_pooling() -> None:
    assert EmbeddingInfo.model_validate({"dimensions": 8}).pooling == "mean"
    assert EmbeddingInfo.model_validate({"pooling": "cls", "dimensions": 8}).pooling == "cls"
    with pytest.raises(ValueError, match="pooling"):
        EmbeddingInfo.model_validate({"pooling": "max", "dimensions": 8})


# ---------------------------------------------------------------------- the CLS-pooled head
def test_cls_pooled_head_at_rho_1_is_the_dense_cls_state(hf_tokenizer: Any) -> None:
    model = cls_model()
    mean_model, _ = tiny_model("embedding", seed=3)
    assert model.last_layer_queries == 1 and mean_model.last_layer_queries is None
    encoded = hf_tokenizer(TEXTS[:4], padding=True, return_tensors="pt")
    ids, mask = encoded["input_ids"], encoded["attention_mask"]
    with torch.no_grad():
        dense = model.forward_pruned(ids, mask, torch.ones(4))
        reference = dense_cls_state(model, ids, mask)
        mean = mean_model.forward_pruned(ids, mask, torch.ones(4))
    assert dense.logits.shape == (4, model.backbone.info.hidden_size)
    torch.testing.assert_close(dense.logits, reference)  # one query vs all: the same [CLS] row
    assert not torch.allclose(dense.logits, mean.logits)  # same weights, the other pooling


@pytest.mark.parametrize("merge_dropped", [False, True])
def test_cls_is_kept_at_every_layer_and_the_soft_pass_trains_the_scorers(
    hf_tokenizer: Any, merge_dropped: bool
) -> None:
    """[CLS] is protected, so at ρ < 1 it enters every layer (merging may fold dropped tokens into it);
    the soft pass returns the [CLS] vector and its loss reaches the scorers."""
    model = cls_model(merge_dropped=merge_dropped)
    encoded = hf_tokenizer(TEXTS[:4], padding=True, return_tensors="pt")
    ids, mask = encoded["input_ids"], encoded["attention_mask"]
    rho = torch.full((4,), PRUNED_RHO)
    with torch.no_grad():
        pruned = model.forward_pruned(ids, mask, rho)
        dense = model.forward_pruned(ids, mask, torch.ones(4))
    assert (pruned.kept_counts[:, -1] < mask.sum(1)).any()
    assert torch.equal(pruned.survival_depth[:, 0], torch.full((4,), TINY_LAYERS))
    assert torch.isfinite(pruned.logits).all() and not torch.allclose(pruned.logits, dense.logits)

    model.train()
    soft = model.forward_soft(ids, mask, rho, generator=torch.Generator().manual_seed(0))
    assert soft.logits.shape == dense.logits.shape
    batch = Batch(ids, mask, dense.logits)  # the teacher's vectors: the dense pass
    embedding_loss(soft.logits, batch).backward()
    assert all(scorer.v.weight.grad is not None for scorer in model.scorers)
    assert any(scorer.v.weight.grad.abs().sum() > 0 for scorer in model.scorers)  # type: ignore[union-attr]


# ---------------------------------------------------------------------- the retrofit, end to end
def graph_counts(model_dir: Path, texts: list[str], rho: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The serving codec's rows through the exported graph: real tokens (B,), kept_counts (B, P) and
    survival_depth (B, T)."""
    manifest = Manifest.read(model_dir)
    tokenizer = Tokenizer.from_file(str(model_dir / manifest.tokenizer))
    codec = EmbeddingCodec(tokenizer, manifest.max_length)
    feeds = dict(pad_rows([codec.encode(text).rows[0] for text in texts], pad_token_id(tokenizer)))
    feeds["rho"] = np.full(len(texts), rho, dtype=np.float32)
    _, kept_counts, survival_depth = open_session(model_dir / MODEL_FILE).run(None, feeds)
    return feeds["attention_mask"].sum(1), kept_counts, survival_depth


def test_tiny_cls_retrofit_serves_the_original_at_rho_1_and_keeps_cls(tmp_path: Path) -> None:
    """The default embedding retrofit of a CLS-pooled model (BGE, Arctic-embed): the two-path model."""
    original = write_sentence_transformer(tmp_path / "bge-like", pooling="cls_token")
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    run_dir = tmp_path / "run"
    arguments = ["--task", "embedding", "--texts", str(texts), "--steps", "2", "--run-dir", str(run_dir)]
    training_main(["retrofit", str(original), *arguments, "--no-progress"])
    recipe = json.loads((run_dir / RECIPE_FILE).read_text())
    assert recipe["retrofit"]["pooling"] == "cls" and recipe["retrofit"]["pruned_branch"] == "copy"

    # No kept-token floor: TEXTS are all under the default 16 tokens, which would run them dense at any ρ.
    out = tmp_path / "models" / "tiny-cls-embed"
    training_main(["export", str(run_dir), "--out", str(out), "--min-kept-tokens", "0"])
    manifest = Manifest.read(out)
    assert manifest.embedding is not None
    assert manifest.embedding.pooling == "cls" and manifest.embedding.normalize
    assert manifest.schedule.last_layer_queries == 1 and manifest.pruned_branch is not None

    # At ρ = 1 the served vector is the original model's sentence-transformers encode (CLS pooling).
    expected = SentenceTransformer(str(original), device="cpu").encode(TEXTS, normalize_embeddings=True)
    np.testing.assert_allclose(served_vectors(out, TEXTS, 1.0), expected, atol=PARITY_ATOL)

    # At ρ < 1 tokens are dropped, [CLS] (position 0) enters every layer, and the vector moves.
    real, kept_counts, survival_depth = graph_counts(out, TEXTS, PRUNED_RHO)
    assert (kept_counts[:, -1] < real).any()
    assert (survival_depth[:, 0] == manifest.backbone.num_layers).all()
    assert not np.allclose(served_vectors(out, TEXTS, PRUNED_RHO), expected, atol=PARITY_ATOL)
