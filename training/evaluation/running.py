"""Running predictions for evaluation: ``forward_pruned`` (or a baseline's selector, or the layer-exit
model) over codec rows in padded batches of similar length, each row's kept fraction and token-work; the
exported graph over the same rows in onnxruntime, as the service runs it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from retention_core.codecs.base import Row, pad_rows
from retention_core.schedule import keep_exponents
from training.engine import selection as S
from training.engine.baselines import attention_selector, layer_exit, leading_selector, random_selector
from training.engine.model import RetentionModel, Selector
from training.evaluation.methods import CODEC_METHODS, LEARNED
from training.recipes.data import EVAL_SEED
from training.tasks.codecs import rows_to_tensors


@dataclass
class RowPrediction:
    logits: np.ndarray  # token heads (T_i, C) unpadded; sequence heads (C,)
    kept_fraction: float  # tokens reaching the last layer / real tokens
    token_work: float  # encoder token-work / dense token-work


def make_selector(method: str, seed: int = EVAL_SEED) -> Selector | None:
    """The token choice of a selection method: None = the trained scorers."""
    if method == LEARNED:
        return None
    if method == "random":
        return random_selector(torch.Generator().manual_seed(seed))
    if method == "attention":
        return attention_selector()
    if method == "leading":
        return leading_selector()
    raise ValueError(f"unknown selection method {method!r}; known: {CODEC_METHODS}")


def length_sorted_chunks(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Indices in batches of similar length (less padding), shortest first."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    return [order[begin : begin + batch_size] for begin in range(0, len(order), batch_size)]


def unpad(first: np.ndarray, index: int, length: int) -> np.ndarray:
    """Row ``index`` of a graph's first output: token outputs (B, T, k) lose their padding, (B, C) not."""
    return first[index, :length] if first.ndim == 3 else first[index]


# A batch's forward: padded feeds (B, T) → head outputs, kept fraction (B,), token-work fraction (B,).
BatchForward = Callable[[dict[str, torch.Tensor]], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


@torch.no_grad()
def batched_predictions(
    model: RetentionModel, rows: list[Row], pad_id: int, batch_size: int, forward: BatchForward
) -> list[RowPrediction]:
    """``forward`` over codec rows in padded batches of similar length; unpadded outputs in row order."""
    model.eval()
    device = next(model.parameters()).device
    predictions: list[RowPrediction | None] = [None] * len(rows)
    for members in length_sorted_chunks([len(row) for row in rows], batch_size):
        chunk = [rows[i] for i in members]
        feeds = {name: tensor.to(device) for name, tensor in rows_to_tensors(chunk, pad_id).items()}
        logits, kept, work = (value.cpu() for value in forward(feeds))
        outputs = logits.numpy()
        for i, (member, row) in enumerate(zip(members, chunk, strict=True)):
            predictions[member] = RowPrediction(unpad(outputs, i, len(row)), float(kept[i]), float(work[i]))
    return [prediction for prediction in predictions if prediction is not None]


def predict_rows(
    model: RetentionModel,
    rows: list[Row],
    rho: float,
    pad_id: int,
    selector: Selector | None = None,
    batch_size: int = 16,
) -> list[RowPrediction]:
    """Run ``forward_pruned`` over codec rows in padded batches; unpadded outputs in row order."""

    def forward(feeds: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        batch = len(feeds["input_ids"])
        out = model.forward_pruned(
            feeds["input_ids"],
            feeds["attention_mask"],
            torch.full((batch,), float(rho), device=feeds["input_ids"].device),
            protected=feeds["protected_mask"].bool() if "protected_mask" in feeds else None,
            token_type_ids=feeds.get("token_type_ids"),
            selector=selector,
        )
        num_real = feeds["attention_mask"].sum(1)  # (B,)
        work = S.encoder_token_work(out.kept_counts, num_real, model.last_layer_queries)  # (B,)
        kept = out.kept_counts[:, -1].to(torch.float32) / num_real.to(torch.float32)  # (B,)
        return out.logits, kept, work

    return batched_predictions(model, rows, pad_id, batch_size, forward)


def exit_layers(model: RetentionModel, rho: float) -> int:
    """The layer count whose token-work (k / L) is nearest the learned schedule's at ``rho`` (its mean
    keep fraction over the pruning points, the pruning interval's groups included, floors aside), at
    least one layer."""
    config = model.config
    exponents = keep_exponents(model.num_points, config.schedule_power, config.pruning_interval)  # (P,)
    fractions = np.float32(rho) ** exponents  # (P,) float32, the graph's arithmetic
    return max(1, round(float(fractions.mean()) * model.num_points))


def layer_exit_rows(
    model: RetentionModel, rows: list[Row], num_layers: int, pad_id: int, batch_size: int = 16
) -> list[RowPrediction]:
    """``layer_exit`` over codec rows in padded batches; every token kept, token-work k / L."""

    def forward(feeds: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        ids = feeds["input_ids"]
        out = layer_exit(model, ids, feeds["attention_mask"], num_layers, feeds.get("token_type_ids"))
        every_token_kept = torch.ones(len(ids))  # (B,)
        return out, every_token_kept, every_token_kept * (num_layers / model.num_points)

    return batched_predictions(model, rows, pad_id, batch_size, forward)


def onnx_predict_rows(
    session: Any, rows: list[Row], rho: float, pad_id: int, batch_size: int
) -> list[np.ndarray]:
    """What the service does: pad codec rows, add ρ, run the graph, unpad the first output."""
    names = {graph_input.name for graph_input in session.get_inputs()}
    outputs: list[np.ndarray] = [np.empty(0)] * len(rows)
    for members in length_sorted_chunks([len(row) for row in rows], batch_size):
        chunk = [rows[i] for i in members]
        feeds: dict[str, np.ndarray] = dict(pad_rows(chunk, pad_id))
        feeds["rho"] = np.full(len(chunk), rho, dtype=np.float32)
        first = session.run(None, {name: value for name, value in feeds.items() if name in names})[0]
        for i, (member, row) in enumerate(zip(members, chunk, strict=True)):
            outputs[member] = unpad(first, i, len(row))
    return outputs
