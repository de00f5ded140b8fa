"""MPNet in the retention model: a relative-position attention bias (buckets of key − query position, one
table for every layer) on top of BERT's layer. ρ = 1 is Hugging Face's MPNetModel; a pruned slot keeps
the bias of the position it came from; the exported graph (the bias in each fused Attention's additive
term) equals torch on ragged batches, uniform and mixed ρ, and in int8."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from retention_ort import open_session
from training.engine.model import RetentionModel
from training.export.graph import example_inputs, export_onnx, graph_for, validate_onnx
from training.export.int8 import quantize_int8
from training.tiny import TINY_LAYERS, tiny_model

RELATIVE_BIAS_SCALE = 1.0  # HF initialises the table at std 0.02; a visible bias makes a wrong one fail
LENGTH = 40  # past MPNet's exact buckets (|Δ| < 8 of 32): the logarithmic ones are exercised too


def mpnet(task: str = "embedding", merge: bool = True) -> RetentionModel:
    model, _ = tiny_model(task, family="mpnet")
    model.config = dataclasses.replace(model.config, merge_dropped=merge, leading_share=0.5 if merge else 0.0)
    table = model.backbone.relative_attention_bias
    assert table is not None
    with torch.no_grad():
        table.weight.normal_(0.0, RELATIVE_BIAS_SCALE)
    return model.eval()


def ragged_batch(vocab: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(3, LENGTH) ids and mask, rows of 40, 27 and 9 real tokens, right-padded with MPNet's pad id 1."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (3, LENGTH), generator=generator)
    mask = torch.ones(3, LENGTH, dtype=torch.long)
    mask[1, 27:] = 0
    mask[2, 9:] = 0
    return ids.masked_fill(mask == 0, 1), mask


def hugging_face_model(model: RetentionModel) -> Any:
    """The MPNetModel whose modules the backbone wraps (same parameters, not copies)."""
    from transformers import AutoModel

    reference = AutoModel.from_config(model.backbone.config, attn_implementation="eager").eval()
    reference.embeddings = model.backbone.embeddings
    for index, layer in enumerate(reference.encoder.layer):
        view = model.backbone.views[index]
        layer.attention.attn.q, layer.attention.attn.k, layer.attention.attn.v = (
            view.query,
            view.key,
            view.value,
        )
        layer.attention.attn.o, layer.attention.LayerNorm = view.attn_out, view.attn_norm
        layer.intermediate.dense, layer.output.dense, layer.output.LayerNorm = (
            view.ffn_in,
            view.ffn_out,
            view.ffn_norm,
        )
    reference.encoder.relative_attention_bias = model.backbone.relative_attention_bias
    return reference


def test_rho_one_is_hugging_face_mpnet_on_a_ragged_batch() -> None:
    model = mpnet()
    ids, mask = ragged_batch(model.backbone.info_vocab_size)
    with torch.no_grad():
        states = hugging_face_model(model)(input_ids=ids, attention_mask=mask).last_hidden_state  # (B, T, d)
        expected = (states * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)  # mean pooling
        unpruned = model.forward_unpruned(ids, mask).logits
        pruned_at_one = model.forward_pruned(ids, mask, torch.ones(3)).logits
    assert torch.allclose(unpruned, expected, atol=1e-5)
    assert torch.equal(pruned_at_one, unpruned)


def test_the_bias_of_the_hf_encoder_and_of_original_positions() -> None:
    """position_bias(arange) is HF's compute_position_bias; a subset of slots gets the rows and columns of
    the positions it came from (not a renumbering 0..K-1)."""
    model = mpnet()
    backbone = model.backbone
    hidden = torch.zeros(2, LENGTH, 32)
    positions = torch.arange(LENGTH).unsqueeze(0).expand(2, -1)  # (B, T)
    full = backbone.position_bias(positions)  # (B, H, T, T)
    assert full is not None
    reference = hugging_face_model(model).encoder.compute_position_bias(hidden)
    assert torch.equal(full, reference)
    survivors = torch.tensor([[0, 3, 4, 17, 30, 39], [0, 1, 12, 13, 25, 26]])  # (B, K), original order
    gathered = backbone.position_bias(survivors)  # (B, H, K, K)
    rows = torch.stack([full[b][:, survivors[b]][:, :, survivors[b]] for b in range(2)])
    assert gathered is not None and torch.equal(gathered, rows)
    renumbered = backbone.position_bias(torch.arange(6).unsqueeze(0).expand(2, -1))
    assert renumbered is not None and not torch.allclose(gathered, renumbered)


@pytest.mark.parametrize(
    ("task", "merge"), [("embedding", True), ("embedding", False), ("summarization", False)]
)
def test_the_exported_graph_equals_torch(tmp_path: Path, task: str, merge: bool) -> None:
    """The validation grid (uniform and mixed ρ, ρ = 1 included, ragged lengths) and a longer ragged batch
    in either If branch; every layer is one fused Attention whose bias input is set."""
    model = mpnet(task, merge)
    path = tmp_path / "model.onnx"
    vocab = model.backbone.info_vocab_size
    export_onnx(model, path, vocab)
    report = validate_onnx(model, path, vocab)  # raises on any mismatch
    assert report.cases > 0 and report.max_abs_diff <= 1e-4
    graph = graph_for(model)
    for rhos in ((1.0,), (1.0, 0.3, 0.5)):
        example = example_inputs(batch=3, length=LENGTH, vocab_size=vocab, rhos=rhos, seed=7)
        with torch.no_grad():
            expected = graph(*(example[name] for name in graph.input_names))
        feeds = {name: example[name].numpy() for name in graph.input_names}
        logits, counts, depth = open_session(path).run(None, feeds)
        assert np.array_equal(counts, expected[1].numpy()) and np.array_equal(depth, expected[2].numpy())
        assert float(np.max(np.abs(logits - expected[0].numpy()))) <= 1e-5


def test_int8_keeps_the_relative_bias(tmp_path: Path) -> None:
    model = mpnet()
    path = tmp_path / "model.onnx"
    vocab = model.backbone.info_vocab_size
    export_onnx(model, path, vocab)
    quantize_int8(path, tmp_path / "model.int8.onnx")
    for rhos in ((1.0,), (1.0, 0.5, 0.3)):
        example = example_inputs(batch=3, length=LENGTH, vocab_size=vocab, rhos=rhos, seed=5)
        feeds = {name: example[name].numpy() for name in ("input_ids", "attention_mask", "rho")}
        fp32 = open_session(path).run(None, feeds)[0]
        int8 = open_session(tmp_path / "model.int8.onnx").run(None, feeds)[0]
        cosine = (fp32 * int8).sum(1) / (np.linalg.norm(fp32, axis=1) * np.linalg.norm(int8, axis=1))
        assert float(cosine.min()) >= 0.98
    assert len(model.backbone.views) == TINY_LAYERS
