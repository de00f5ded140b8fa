"""training.export.optimize: onnxruntime's transformer optimizer fuses attention in every layer of the dense
peer, and the fused graph still matches torch (our own graph is fused at export: test_fused_graph)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from benchmarks.embedding_graphs import tiny_checkpoint
from retention_ort import open_session
from tests.tiny import TINY_LAYERS
from training.engine import selection as R
from training.export.optimize import (
    PEER_INPUTS,
    AttentionFusionError,
    SentenceEmbeddingGraph,
    build_dense_peer,
    fused_attention_count,
    load_eager_encoder,
    require_fused_attention,
)

PARITY_ATOL = 1e-5


def ragged_feeds(batch: int = 3, length: int = 12, seed: int = 0) -> dict[str, np.ndarray]:
    """Right-padded rows of decreasing length: (B, T) int64 each."""
    rng = np.random.default_rng(seed)
    input_ids = rng.integers(1000, 29000, (batch, length)).astype(np.int64)
    attention_mask = np.ones_like(input_ids)
    for row in range(batch):
        attention_mask[row, length - 3 * row :] = 0
    input_ids[attention_mask == 0] = 0
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "token_type_ids": np.zeros_like(input_ids),
    }


def test_dense_peer_fuses_attention_in_every_layer_and_matches_torch(tmp_path: Path) -> None:
    checkpoint = tiny_checkpoint(tmp_path / "checkpoint")
    peer = build_dense_peer(checkpoint, tmp_path)
    assert peer.counts.get("Attention", 0) == TINY_LAYERS
    assert fused_attention_count(peer.counts) == TINY_LAYERS
    feeds = ragged_feeds()
    (fused,) = open_session(peer.fused).run(None, feeds)
    graph = SentenceEmbeddingGraph(load_eager_encoder(checkpoint)).eval()
    with torch.no_grad():
        expected = graph(*(torch.from_numpy(feeds[name]) for name in PEER_INPUTS)).numpy()  # (B, d)
    assert fused.shape == expected.shape
    assert float(np.max(np.abs(fused - expected))) <= PARITY_ATOL


def test_a_layer_exit_peer_is_the_first_k_layers_of_the_checkpoint(tmp_path: Path) -> None:
    checkpoint = tiny_checkpoint(tmp_path / "checkpoint")
    exit_layers = TINY_LAYERS - 1
    peer = build_dense_peer(checkpoint, tmp_path, num_layers=exit_layers)
    assert fused_attention_count(peer.counts) == exit_layers
    feeds = ragged_feeds()
    (fused,) = open_session(peer.fused).run(None, feeds)
    inputs = {name: torch.from_numpy(feeds[name]) for name in PEER_INPUTS}
    with torch.no_grad():  # the whole encoder's state after layer k, mean-pooled over real tokens
        states = load_eager_encoder(checkpoint)(**inputs, output_hidden_states=True).hidden_states
    weights = inputs["attention_mask"].unsqueeze(-1).float()  # (B, T, 1)
    expected = ((states[exit_layers] * weights).sum(1) / weights.sum(1)).numpy()  # (B, d)
    assert float(np.max(np.abs(fused - expected))) <= PARITY_ATOL


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_attention_bias_is_zero_on_kept_keys_and_masks_the_rest(dtype: torch.dtype) -> None:
    valid = torch.rand(4, 17, generator=torch.Generator().manual_seed(0)) > 0.4  # (B, T)
    bias = R.attention_bias(valid, dtype)  # (B, 1, 1, T)
    assert bias.shape == (4, 1, 1, 17) and bias.dtype == dtype
    assert torch.equal(bias[:, 0, 0] == 0, valid)
    assert bool((bias[:, 0, 0][~valid] == R.MASKED_ATTENTION_BIAS).all())


def test_require_fused_attention_names_the_graph_and_the_shortfall() -> None:
    require_fused_attention({"Attention": 6, "BiasGelu": 6}, 6, "peer")
    with pytest.raises(AttentionFusionError, match="ours: 5 fused attention operators for 6 layers"):
        require_fused_attention({"Attention": 4, "MultiHeadAttention": 1}, 6, "ours")
