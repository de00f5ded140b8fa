"""The teacher of every label-free retrofit (the embedding task's, a label-free reranker's) and of a
classification retrofit: the model's own dense pass (ρ = 1) under ``no_grad``. In a retrofit the backbone
is frozen (``RetentionModel.freeze_backbone``), so that pass is exactly the original model and no copy is
needed."""

from __future__ import annotations

import torch

from training.engine.model import RetentionModel
from training.tasks.batch import Batch


@torch.no_grad()
def dense_targets(model: RetentionModel, batch: Batch) -> torch.Tensor:
    """The teacher's vectors (B, d): the model's dense pass (ρ = 1 keeps every token). Exactly the
    original model when its backbone is frozen; a retrofit that tunes the backbone passes a frozen copy."""
    rho = torch.ones(batch.input_ids.shape[0], device=batch.input_ids.device)  # (B,)
    return model.forward_pruned(**batch.encoder_inputs(), rho=rho).logits.detach()
