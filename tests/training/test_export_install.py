"""Exports replace a model directory in one step: a failed export leaves the previous model as it was,
and nothing half-written is ever visible to the service's scan of the models root."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from retention_core.contract import Manifest
from tests.tiny import tiny_model, tiny_recipe
from training.export.install import export_model, install_directory


def snapshot(directory: Path) -> dict[str, str]:
    """Every file under ``directory`` → sha256 of its bytes."""
    return {
        str(path.relative_to(directory)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }


def visible_to_the_service(models_root: Path) -> list[str]:
    """Directories the service's scan would consider (it skips names starting with a dot)."""
    return sorted(p.name for p in models_root.iterdir() if p.is_dir() and not p.name.startswith("."))


class ExportCrash(RuntimeError):
    pass


def test_failed_export_keeps_the_previous_model_and_hides_its_work(tmp_path: Path) -> None:
    root = tmp_path / "models"
    target = root / "tiny"
    old_model, tokenizer = tiny_model(seed=1)
    export_model(old_model, tiny_recipe(), tokenizer, target)
    before = snapshot(target)

    # A model whose export crashes half-way (a forward hook raising while the exporter traces it).
    seen_during_export: list[list[str]] = []
    new_model, _ = tiny_model(seed=2)

    def crash(*_: object) -> None:
        seen_during_export.append(visible_to_the_service(root))
        raise ExportCrash("export crashed half-way")

    new_model.head.register_forward_hook(crash)
    with pytest.raises(ExportCrash):
        export_model(new_model, tiny_recipe(), tokenizer, target)

    assert seen_during_export == [["tiny"]]  # the staging directory never looks like a model
    assert snapshot(target) == before  # byte-identical
    assert sorted(p.name for p in root.iterdir()) == ["tiny"]  # no staging directory left behind


def test_successful_export_replaces_the_model_and_leaves_nothing_else(tmp_path: Path) -> None:
    root = tmp_path / "models"
    target = root / "tiny"
    tokenizer = tiny_model()[1]
    export_model(tiny_model(seed=1)[0], tiny_recipe(), tokenizer, target)
    first = snapshot(target)
    export_model(tiny_model(seed=2)[0], tiny_recipe(name="renamed"), tokenizer, target)
    assert snapshot(target)["model.onnx"] != first["model.onnx"]
    assert Manifest.read(target).name == "renamed"
    assert sorted(p.name for p in root.iterdir()) == ["tiny"]
    assert target.stat().st_mode & 0o055 == 0o055  # readable by a service running as another user


def test_install_swaps_directories_whole(tmp_path: Path) -> None:
    target, staging = tmp_path / "model", tmp_path / ".model.staging"
    for directory, text in ((target, "old"), (staging, "new")):
        directory.mkdir()
        (directory / "file").write_text(text)
    install_directory(staging, target)
    assert (target / "file").read_text() == "new"
    assert (staging / "file").read_text() == "old"  # the caller removes the replaced model
    fresh = tmp_path / ".fresh"
    fresh.mkdir()
    install_directory(fresh, tmp_path / "first")  # no previous model: a plain rename
    assert (tmp_path / "first").is_dir() and not fresh.exists()


def test_export_refuses_a_recipe_of_another_task_before_writing(tmp_path: Path) -> None:
    """Graph, validation and manifest read the model's TaskSpec; a recipe naming another task would
    describe a graph that is not in the directory, so nothing is written at all."""
    model, tokenizer = tiny_model("classification", seed=1)
    with pytest.raises(ValueError, match="for task 'qa', the model for 'classification'"):
        export_model(model, tiny_recipe("qa"), tokenizer, tmp_path / "models" / "tiny")
    assert not (tmp_path / "models").exists()
