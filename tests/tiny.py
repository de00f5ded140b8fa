"""Test helpers: the tiny models of ``training.tiny`` and dataset files in the layout of ../shared/data."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from training.tiny import (
    TINY_FFN,
    TINY_HEADS,
    TINY_HIDDEN,
    TINY_LAYERS,
    TINY_MAX_LENGTH,
    build_tiny_model_dir,
    tiny_model,
    tiny_recipe,
)

__all__ = [
    "TINY_FFN",
    "TINY_HEADS",
    "TINY_HIDDEN",
    "TINY_LAYERS",
    "TINY_MAX_LENGTH",
    "build_tiny_model_dir",
    "tiny_model",
    "tiny_recipe",
    "write_rows",
    "write_squad_paragraphs",
]


def write_rows(path: Path, rows: list[dict]) -> None:
    """A dataset split file in the layout of ../shared/data (gzip JSON Lines)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")


def write_squad_paragraphs(root: Path, articles: int = 40) -> Path:
    """A data root holding SQuAD's train-subset file (the embedding recipe's texts): one short paragraph
    per article. Returns ``root``."""
    rows = [
        {
            "title": f"article {i}",
            "context": f"Paragraph {i} about rivers, stones and clouds.",
            "question": "?",
        }
        for i in range(articles)
    ]
    write_rows(root / "squad" / "train_subset.jsonl.gz", rows)
    return root
