"""The pruned engine on token tasks: Drop-and-Restore, ρ = 1 is dense, protected tokens survive.

Kept positions are recorded by a spy around ``retention.select_top_tokens`` (it calls the real
function), then an independent reference re-runs every layer on exactly those positions, row by row,
without padding, and writes each token's state back by hand.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from retention_core.codecs.base import pad_rows
from retention_core.tasks import task_spec
from retention_tasks.qa.codec import QACodec
from tests.tiny import tiny_model
from training.engine import selection as R
from training.engine.baselines import random_selector
from training.engine.model import RetentionModel
from training.tiny import tiny_config

CONTEXT = (
    "The Normans were the people who in the 10th and 11th centuries gave their name to Normandy, "
    "a region in France. They were descended from Norse raiders and pirates from Denmark."
)


def qa_inputs(hf_tokenizer: Any) -> dict[str, torch.Tensor]:
    codec = QACodec(hf_tokenizer.backend_tokenizer, max_length=48, stride=8)
    rows = codec.encode("Who were the Normans?", CONTEXT).rows
    rows += codec.encode("Where?", "In France, near the sea.").rows
    return {name: torch.from_numpy(value) for name, value in pad_rows(rows, 0).items()}


class KeptPositions:
    """Spy on select_top_tokens: original positions of the kept tokens at every pruning point."""

    def __init__(self, batch: int, length: int) -> None:
        self.positions = torch.arange(length).unsqueeze(0).expand(batch, -1)  # (B, T) current → original
        self.kept: list[list[list[int]]] = []  # point → row → sorted original positions
        self.counts: list[list[int]] = []
        self.real = R.select_top_tokens

    def __call__(self, scores: torch.Tensor, counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        index, valid = self.real(scores, counts)
        self.positions = torch.gather(self.positions, 1, index)
        self.kept.append([self.positions[b][valid[b]].tolist() for b in range(index.shape[0])])
        self.counts.append(counts.tolist())
        return index, valid


def reference_logits(
    model: RetentionModel, feeds: dict[str, torch.Tensor], kept: list[list[list[int]]]
) -> torch.Tensor:
    """Run each layer on exactly the kept positions of each row; dropped tokens keep their state."""
    states = model.backbone.embed(feeds["input_ids"], feeds.get("token_type_ids")).clone()  # (B, T, d)
    for point, layer in enumerate(model.backbone.layers):
        for b in range(states.shape[0]):
            index = torch.tensor(kept[point][b])
            sub = states[b, index].unsqueeze(0)  # (1, K, d)
            states[b, index] = layer(sub, torch.zeros(1, 1, 1, len(index)))[0]
    return model.head(states)


@pytest.mark.parametrize("rho", [0.2, 0.5])
@pytest.mark.parametrize("method", ["learned", "random"])
def test_restore_and_protection(
    hf_tokenizer: Any, monkeypatch: pytest.MonkeyPatch, rho: float, method: str
) -> None:
    model, _ = tiny_model("qa", seed=1)
    feeds = qa_inputs(hf_tokenizer)
    batch, length = feeds["input_ids"].shape
    spy = KeptPositions(batch, length)
    monkeypatch.setattr(R, "select_top_tokens", spy)
    selector = random_selector(torch.Generator().manual_seed(0)) if method == "random" else None
    protected = feeds["protected_mask"].bool()
    with torch.no_grad():
        out = model.forward_pruned(
            feeds["input_ids"],
            feeds["attention_mask"],
            torch.full((batch,), rho),
            protected=protected,
            token_type_ids=feeds["token_type_ids"],
            selector=selector,
        )
        expected = reference_logits(model, feeds, spy.kept)
    real = feeds["attention_mask"].bool()
    assert len(spy.kept) == model.num_points
    for point in range(model.num_points):
        for b in range(batch):
            kept = set(spy.kept[point][b])
            assert len(kept) == spy.counts[point][b] == int(out.kept_counts[b, point])
            assert set(torch.nonzero(protected[b]).flatten().tolist()) <= kept  # question never dropped
            assert all(real[b, p] for p in kept)  # pads never kept
            if point:
                assert kept <= set(spy.kept[point - 1][b])  # once dropped, gone
    assert out.kept_counts[:, -1].lt(real.sum(1)).all(), "ρ < 1 must actually prune"
    torch.testing.assert_close(out.logits[real], expected[real], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("task", ["qa", "summarization"])
def test_rho_one_is_the_dense_hf_model(hf_tokenizer: Any, task: str) -> None:
    from transformers import AutoModel

    from training.engine.encoders import EncoderBackbone

    torch.manual_seed(3)
    config = tiny_config(hf_tokenizer.vocab_size)
    hf = AutoModel.from_config(config, attn_implementation="eager").eval()
    spec = task_spec(task)
    model = RetentionModel(EncoderBackbone(hf), task, spec.head_width(())).eval()
    feeds = qa_inputs(hf_tokenizer)
    batch = feeds["input_ids"].shape[0]
    pairs = "token_type_ids" in {graph_input.name for graph_input in spec.inputs}  # question + context
    types = feeds["token_type_ids"] if pairs else torch.zeros_like(feeds["input_ids"])
    with torch.no_grad():
        dense = hf(
            input_ids=feeds["input_ids"], attention_mask=feeds["attention_mask"], token_type_ids=types
        ).last_hidden_state
        out = model.forward_pruned(
            feeds["input_ids"],
            feeds["attention_mask"],
            torch.ones(batch),
            protected=feeds["protected_mask"].bool() if pairs else None,
            token_type_ids=types if pairs else None,
        )
        expected = model.head(dense)
    real = feeds["attention_mask"].bool()
    assert torch.equal(out.kept_counts, real.sum(1, keepdim=True).expand(-1, model.num_points))
    torch.testing.assert_close(out.logits[real], expected[real], atol=1e-5, rtol=1e-5)
