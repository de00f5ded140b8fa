"""Sentence embeddings (label-free): the training side of the ``embedding`` task (its evaluation:
``training.evaluation.embedding``).

Batches are unlabeled texts (rows with a ``"text"`` field), one row each, encoded by the serving codec.
The targets are the *teacher's* pooled vectors, computed every step from the model being trained
(``dense_targets``, the task's ``teacher``): its dense pass (ρ = 1) under ``no_grad``. In a retrofit the
backbone is frozen (``RetentionModel.freeze_backbone``), so that pass is exactly the original model and
no copy is needed. Loss: 1 − cosine(student pooled, teacher pooled), mean over the batch.

Pooling (the "pooled" head, ``training.engine.heads.MeanPooling``): the mean of the final states of the
tokens that reach the end; nothing is restored. A CLS-pooled model (BGE, Arctic-embed;
``training.engine.heads.CLSPooling``) pools the final [CLS] state, which is never dropped; its teacher
and loss are the same. Restoring dropped tokens with their last state (as token
heads do) averages earlier-layer states into the vector and pulls it away from the model's (the
study, docs/experiments/2026-11-25-embedding-pooling.md: −5.9 nDCG@10 at ρ = 0.5 with these scorers,
−7.2 when trained for it; the switch it used was removed afterwards). Both are exactly the dense model at
ρ = 1.

The generic retrofit objective uses ``dense_targets`` as every label-free task's teacher.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from retention_core.text import pad_token_id
from training.engine.model import RetentionModel
from training.recipes.data import Example
from training.tasks.batch import Batch
from training.tasks.codecs import EVERY_WINDOW, rows_to_tensors, task_codec

TASK = "embedding"
METRIC = "cosine_to_dense"
TEXT_FIELD = "text"


def example_text(example: Example) -> str:
    if TEXT_FIELD not in example:
        raise KeyError(f"an embedding example needs a {TEXT_FIELD!r} field; got {sorted(example)}")
    return str(example[TEXT_FIELD])


def embedding_batch(examples: list[Example], tokenizer: Any, max_length: int) -> Batch:
    """One row per text, as the service encodes it. ``targets`` is empty (B, 0) until the teacher
    (``dense_targets``) fills it in with the dense pooled vectors."""
    codec = task_codec(TASK, tokenizer, max_length, options=EVERY_WINDOW)
    rows = [row for example in examples for row in codec.encode(example_text(example)).rows]
    feeds = rows_to_tensors(rows, pad_token_id(codec.tokenizer))
    return Batch(feeds["input_ids"], feeds["attention_mask"], torch.zeros(len(rows), 0))


@torch.no_grad()
def dense_targets(model: RetentionModel, batch: Batch) -> torch.Tensor:
    """The teacher's vectors (B, d): the model's dense pass (ρ = 1 keeps every token). Exactly the
    original model when its backbone is frozen; a retrofit that tunes the backbone passes a frozen copy."""
    rho = torch.ones(batch.input_ids.shape[0], device=batch.input_ids.device)  # (B,)
    return model.forward_pruned(**batch.encoder_inputs(), rho=rho).logits.detach()


def embedding_loss(pooled: torch.Tensor, batch: Batch) -> torch.Tensor:
    """pooled (B, d), targets (B, d) the teacher's → mean of 1 − cosine."""
    return (1.0 - F.cosine_similarity(pooled, batch.targets, dim=-1)).mean()
