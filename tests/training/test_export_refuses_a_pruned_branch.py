"""A model whose pruned branch has weights of its own is not exported until the two-path export exists:
the exporter refuses it, before writing anything, instead of tracing one set of weights for both paths."""

from __future__ import annotations

from pathlib import Path

import pytest

from training.export import ExportValidationError, export_model
from training.tiny import tiny_model, tiny_recipe


def test_export_refuses_a_model_with_a_pruned_branch_of_its_own(tmp_path: Path) -> None:
    model, tokenizer = tiny_model("embedding")
    model.add_pruned_branch()
    with pytest.raises(ExportValidationError, match="two-path export is not built"):
        export_model(model, tiny_recipe("embedding"), tokenizer, tmp_path / "copy")
    assert not (tmp_path / "copy").exists() and list(tmp_path.iterdir()) == []
