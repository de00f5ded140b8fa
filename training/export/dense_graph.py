"""The dense speed baseline: the same weights as a trained classifier, without any pruning, as an ONNX
graph (``export_dense_onnx``). Benchmarks time it against the exported retention graph; it is never
served, so it has no manifest and no validation grid.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from training.engine import selection as S
from training.engine.model import RetentionModel
from training.export.graph import OPSET, example_inputs


class DenseClassificationGraph(nn.Module):
    """The same weights without any pruning: (input_ids, attention_mask) → logits. The speed baseline."""

    def __init__(self, model: RetentionModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        backbone = self.model.backbone
        hidden = backbone.embed(input_ids)  # (B, T, d)
        valid = attention_mask.bool()  # (B, T)
        positions = torch.arange(valid.shape[1], device=valid.device).unsqueeze(0).expand_as(valid)  # (B, T)
        key_bias = backbone.layer_bias(S.attention_bias(valid, hidden.dtype), positions)  # (B, 1|H, 1|T, T)
        for layer in backbone.views:
            hidden = layer(hidden, key_bias)
        return self.model.head(hidden[:, 0])


def export_dense_onnx(model: RetentionModel, path: Path) -> None:
    """Dense baseline graph with dynamic batch and sequence axes."""
    example = example_inputs(
        batch=2, length=8, vocab_size=model.backbone.info_vocab_size, rhos=(1.0,), seed=0
    )
    axes = {"batch": 0, "sequence": 1}
    with torch.no_grad():
        torch.onnx.export(
            DenseClassificationGraph(model.eval()).eval(),
            (example["input_ids"], example["attention_mask"]),
            str(path),
            input_names=["input_ids", "attention_mask"],
            output_names=["logits"],
            dynamic_axes={
                "input_ids": {axes["batch"]: "batch", axes["sequence"]: "sequence"},
                "attention_mask": {axes["batch"]: "batch", axes["sequence"]: "sequence"},
                "logits": {axes["batch"]: "batch"},
            },
            opset_version=OPSET,
            dynamo=False,
        )
