"""``python -m experiments.served_models``: every embedding model of a directory answers by its name and
its source model's names with the same vectors, and /metrics gives each model's memory."""

from __future__ import annotations

import json
from pathlib import Path

from experiments.served_models import RHOS, main
from tests.tiny import TINY_HIDDEN, build_tiny_model_dir


def test_embedding_models_answer_by_name_and_alias_with_their_memory(tmp_path: Path) -> None:
    models = tmp_path / "models"
    build_tiny_model_dir(models / "tiny-embedding", "embedding")
    build_tiny_model_dir(models / "tiny-classification", "classification")
    out = tmp_path / "served.json"
    main(["--models-dir", str(models), "--out", str(out)])
    payload = json.loads(out.read_text())
    rows = payload["embeddings"]
    assert [(row["model"], row["rho"]) for row in rows] == [("tiny-embedding", rho) for rho in RHOS]
    for row in rows:
        assert row["dimensions"] == TINY_HIDDEN and row["aliases_answer_the_same"] is True
        assert "sentence-transformers/all-MiniLM-L6-v2" in row["aliases"]
    assert rows[1]["token_work"] < rows[0]["token_work"]  # ρ 0.3 computes less than ρ 1
    memory = payload["model_memory_bytes"]
    assert set(memory) == {"tiny-embedding", "tiny-classification"} and sum(memory.values()) > 0
