"""The inputs scripts/image_test.py (``make image-test``) hands to the containers, checked without
podman: the model builder's recipe and dataset train here, and the torch wheel lookup finds only the
pinned CPU build. The image test itself runs in CI (.ci/run), not in the test suite."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

from retention_core.tasks import TASKS
from training.recipes.data import load_split
from training.recipes.recipe import load_recipe

REPO = Path(__file__).resolve().parents[2]


def image_test_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("image_test", REPO / "scripts" / "image_test.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


def test_model_builder_recipe_and_dataset_are_trainable(tmp_path: Path) -> None:
    module = image_test_module()
    recipes, data = module.write_builder_inputs(tmp_path)
    recipe = load_recipe(recipes / "image-test.yaml", "quick")
    assert recipe.name == module.BUILDER_MODEL
    dataset = recipe.dataset.model_copy(update={"root": str(data)})
    train, validation = load_split(dataset, "train"), load_split(dataset, "validation")
    assert {row["label"] for row in train} == {0, 1}
    assert len(train) >= recipe.batch_size * recipe.steps
    assert len(validation) >= recipe.evaluation.validation_size  # the export's quality curve reads these
    # the container user (uid 10001) reads the mounted files
    assert all(path.stat().st_mode & 0o004 for path in data.rglob("*"))


def test_torch_wheel_lookup_takes_only_the_pinned_cpu_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = image_test_module()
    pin = re.search(r"^torch==(\S+)", (REPO / "constraints" / "cpu.txt").read_text(), re.M)
    assert pin is not None
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    (tmp_path / f"torch-{pin.group(1)}-cp311-cp311-manylinux_2_28_x86_64.whl").touch()  # PyPI's CUDA build
    (tmp_path / "torch-0.0.1+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").touch()  # another version
    assert module.local_cpu_torch_wheel() is None
    cpu = tmp_path / f"torch-{pin.group(1)}+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
    cpu.touch()
    assert module.local_cpu_torch_wheel() == cpu


def test_serve_stage_asks_every_task_and_finds_it_in_the_metrics(tmp_path: Path) -> None:
    """The serve stage's request of each task of the registry, against the real service on tiny models
    (in-process here, in the container there), and its check that /metrics counts each under its task."""
    from fastapi.testclient import TestClient

    from service.api.app import create_app
    from service.settings import Settings

    module = image_test_module()
    tasks = module.serve_tasks()
    assert set(tasks) == set(TASKS)
    module.export_tiny_models(tmp_path / "models")
    with TestClient(create_app(Settings(models_dir=tmp_path / "models", intra_op_threads=1))) as client:
        module.wait_ready(client, {f"tiny-{task}" for task in tasks}, timeout_s=60)
        with pytest.raises(module.Failure, match="no 2xx count"):
            module.check_metrics(client, tasks)
        module.check_task_requests(client, tasks)
        module.check_metrics(client, tasks)
