"""A task package of the tests (``tests/task_packages/toy_parity/``), put on the list of tasks and
nowhere else, runs the whole pipeline with no edit to fit, export, the CLI, the runtime, the service or
the test helpers: train → export (validated) → evaluate → served over HTTP by the real service (its own
route, in /metrics under its task, in the OpenAPI document).

The toy task: is the first word of a text's token id even? Three labels ("even", "odd", "empty") so
the head width follows the labels; its own codec; its own output name (``parity_logits``); its own
HTTP face (``POST /toy_parity``, its own request and response bodies).
"""

from __future__ import annotations

import importlib
import json
import re
import sys
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer

from benchmarks import report as report_module
from retention_core.contract import Manifest
from retention_core.tasks import TaskRegistry
from retention_core.text import pad_token_id
from tests.service.conftest import running, settings_for
from tests.service.test_metrics import value as metric_value
from tests.task_packages import PARITY, listed
from tests.task_packages.toy_parity.face import PATH, ParityResponse
from tests.task_packages.toy_parity.spec import LABELS, TASK
from tests.task_packages.toy_parity.training import DATASET, FOLDER
from tests.tiny import tiny_model, tiny_recipe, write_rows
from training.__main__ import main as training_main
from training.evaluation.methods import CODEC_METHODS
from training.evaluation.reporting import PAIRED, PER_EXAMPLE_FILE
from training.fitting.fit import LOG_FILE, fit
from training.tasks.codecs import rows_to_tensors

WORDS = ["apple", "river", "stone", "cloud", "green", "house", "light", "music", "paper", "table"]


def parity_label(text: str, tokenizer: Tokenizer) -> int:
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    return LABELS.index("empty") if not ids else ids[0] % 2


# ---------------------------------------------------------------------- fixtures
def examples(tokenizer: Tokenizer, count: int, offset: int = 0) -> list[dict[str, object]]:
    texts = [f"{WORDS[(i + offset) % len(WORDS)]} is word {i}" for i in range(count)]
    return [{"text": text, "label": parity_label(text, tokenizer)} for text in texts]


def short_run(recipe: Any, data_root: Path) -> Any:
    """A tiny recipe cut to three steps of four rows, its dataset under ``data_root``, evaluated on 12
    examples at ρ 0.5 and 1."""
    return recipe.model_copy(
        update={
            "steps": 3,
            "batch_size": 4,
            "log_every": 1,
            "dataset": recipe.dataset.model_copy(update={"root": str(data_root)}),
            "evaluation": recipe.evaluation.model_copy(update={"rhos": (0.5, 1.0), "validation_size": 12}),
        }
    )


def toy_registered() -> AbstractContextManager[None]:
    """The toy task's package on the list of tasks: in every registry a task needs, then in none."""
    return listed(PARITY)


@pytest.fixture
def toy_task(tmp_path: Path) -> Iterator[Path]:
    """The toy task listed, and where its dataset goes on disk."""
    with toy_registered():
        yield tmp_path / "data"


def test_a_task_added_in_a_test_trains_exports_evaluates_and_is_served(
    toy_task: Path, tmp_path: Path
) -> None:
    model, hf_tokenizer = tiny_model(TASK, seed=3, labels=LABELS)
    tokenizer = hf_tokenizer.backend_tokenizer
    for split, offset in (("validation", 0), ("test", 3)):
        write_rows(toy_task / FOLDER / f"{split}.jsonl.gz", examples(tokenizer, 12, offset))
    recipe = short_run(tiny_recipe(TASK, labels=LABELS), toy_task)
    assert recipe.dataset.name == DATASET and recipe.labels == LABELS

    # Train (training.fitting.fit reads the registries only).
    run_dir = tmp_path / "run"
    trained = fit(
        recipe,
        run_dir,
        backbone=model.backbone,
        tokenizer=hf_tokenizer,
        train_rows=examples(tokenizer, 16),
        progress=False,
    )
    assert len((run_dir / LOG_FILE).read_text().splitlines()) == recipe.steps

    # Export through the CLI: the graph, its parity validation and the manifest's quality curve.
    models_dir = tmp_path / "models"
    training_main(["export", str(run_dir), "--out", str(models_dir / "toy")])
    manifest = Manifest.read(models_dir / "toy")
    assert manifest.task == TASK and manifest.labels == list(LABELS)
    assert [spec.name for spec in manifest.outputs] == ["parity_logits", "kept_counts", "survival_depth"]
    assert manifest.quality is not None and manifest.quality.metric == "accuracy"
    assert [point.rho for point in manifest.quality.points] == [0.5, 1.0]

    # Evaluate through the CLI; a misspelt method is refused.
    out = tmp_path / "results"
    training_main(["evaluate", str(run_dir), "--out", str(out), "--rhos", "0.5", "1.0"])
    report = json.loads((out / "eval.json").read_text())
    assert set(report["results"]) == set(CODEC_METHODS) and report["meta"]["num_examples"] == 12
    dense = {method: by_rho["1"]["accuracy"] for method, by_rho in report["results"].items()}
    assert len(set(dense.values())) == 1  # at ρ = 1 every method is the dense model
    assert "| learned |" in (out / "eval.md").read_text()
    # Paired differences to the dense cell, and the per-example scores they came from beside eval.json.
    saved = json.loads((out / PER_EXAMPLE_FILE).read_text())
    assert saved["metric"] == "accuracy" and len(saved["scores"]["random"]["0.5"]) == 12
    for method, by_rho in report["results"].items():
        assert by_rho["1"][PAIRED] == {"examples": 12, "difference": 0.0, "standard_error": 0.0}
        pruned = np.mean(saved["scores"][method]["0.5"]) - np.mean(saved["scores"]["learned"]["1"])
        assert by_rho["0.5"][PAIRED]["difference"] == pytest.approx(pruned)
        assert "per_example" not in by_rho["0.5"]
    assert "± paired standard error" in (out / "eval.md").read_text()
    # ... and in the docs page's section of the run (benchmarks report: its table and metrics read from
    # the training registry, where the toy task registered them).
    section = "\n".join(report_module.quality_section(report, out / "eval.json"))
    assert "accuracy minus the dense reference on the same 12 examples" in section
    assert "Cells: accuracy (fraction of dense encoder token-work)" in section
    assert report_module.quality_points(report)["learned"][-1] == (1.0, dense["learned"])
    # --merge keeps the earlier cells' per-example scores; --paired-reference takes another run's dense.
    training_main(
        ["evaluate", str(run_dir), "--out", str(out), "--rhos", "0.3", "--methods", "random", "--merge"]
    )
    merged = json.loads((out / PER_EXAMPLE_FILE).read_text())["scores"]
    assert (
        set(merged["random"]) == {"0.3", "0.5", "1"}
        and merged["learned"]["1"] == saved["scores"]["learned"]["1"]
    )
    paired_out = tmp_path / "paired"
    training_main(
        ["evaluate", str(run_dir), "--out", str(paired_out), "--rhos", "0.5", "--paired-reference", str(out)]
    )
    paired_report = json.loads((paired_out / "eval.json").read_text())
    assert paired_report["results"]["learned"]["0.5"][PAIRED] == report["results"]["learned"]["0.5"][PAIRED]
    with pytest.raises(SystemExit, match="paired-reference"):
        training_main(
            ["evaluate", str(run_dir), "--out", str(paired_out), "--paired-reference", str(tmp_path)]
        )
    with pytest.raises(SystemExit, match="lerned"):
        training_main(["evaluate", str(run_dir), "--out", str(out), "--methods", "lerned"])

    # Serve: the real app loads the model; the model server answers through the task's registered codec.
    texts = ["stone walls", "a cloud"]
    with running(settings_for(models_dir)) as (app, client):
        listed = client.get("/models").json()["models"]
        assert [(m["name"], m["task"], m["labels"]) for m in listed] == [(recipe.name, TASK, list(LABELS))]
        server = app.state.server
        served = server.get(recipe.name)
        encoded = [served.codec.encode(text) for text in texts]
        rows = [row for item in encoded for row in item.rows]
        deadline = time.monotonic() + 30
        assert client.portal is not None  # the app's event loop, running while the client is open
        result = client.portal.call(server.infer, served, rows, 1.0, deadline)
        labels = [
            served.codec.decode(item, [output])["label"]
            for item, output in zip(encoded, result.outputs, strict=True)
        ]
        # ... and over HTTP: its own route, its own bodies, the one generic handler of every task.
        response = client.post(PATH, json={"texts": texts, "rho": 1.0})
        assert response.status_code == 200, response.text
        answered = ParityResponse.model_validate(response.json())
        single = client.post(PATH, json={"text": texts[1]}, headers={"x-latency-target": "20"})
        assert client.post(PATH, json={"texts": []}).status_code == 422  # its request body's rules
        metrics = client.get("/metrics").text
        document = client.get("/openapi.json").json()
    assert answered.model == recipe.name and answered.parities == labels
    assert answered.usage.rho_effective == 1.0 and answered.usage.rows == len(rows)
    assert single.status_code == 200 and single.json()["parities"] == labels[1:]
    # In /metrics under its task label, whatever the answer (a 422 too), as every task route.
    route = {"endpoint": PATH.strip("/"), "task": TASK}
    assert metric_value(metrics, "retention_requests_total", **route, status_class="2xx") == 2
    assert metric_value(metrics, "retention_requests_total", **route, status_class="4xx") == 1
    assert metric_value(metrics, "retention_input_tokens_count", **route) == 2
    # In the OpenAPI document: its path, with its own request and response bodies.
    operation = document["paths"][PATH]["post"]
    body_schema = operation["requestBody"]["content"]["application/json"]["schema"]
    reply_schema = operation["responses"]["200"]["content"]["application/json"]["schema"]
    assert body_schema["$ref"].endswith("/ParityRequest") and reply_schema["$ref"].endswith("/ParityResponse")
    assert (
        operation["tags"] == ["inference"]
        and "parities" in document["components"]["schemas"]["ParityResponse"]["properties"]
    )
    # The service's answers are the trained model's answers.
    trained.eval()
    feeds = rows_to_tensors(rows, pad_token_id(tokenizer))
    with torch.no_grad():
        logits = trained.forward_pruned(
            feeds["input_ids"], feeds["attention_mask"], torch.ones(len(rows))
        ).logits
    assert labels == [LABELS[int(i)] for i in logits.argmax(-1)]
    np.testing.assert_allclose(np.stack(result.outputs), logits.numpy(), atol=1e-4)


# ---------------------------------------------------------------------- what adding a task takes
ARCHITECTURE = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"
LIST_BEGIN, LIST_END = "<!-- adding-a-task: begin -->", "<!-- adding-a-task: end -->"
PACKAGES = ("retention_core", "retention_tasks", "training", "service", "benchmarks", "clients")


def listed_pieces() -> tuple[list[str], list[str]]:
    """The registries (``into `x.y.Z```) and registration functions (```x.y.f(...)```) the page's list of
    what adding a task takes names."""
    section = ARCHITECTURE.read_text(encoding="utf-8").split(LIST_BEGIN)[1].split(LIST_END)[0]
    return re.findall(r"into\s+`([\w.]+)`", section), re.findall(r"`([\w.]+)\(", section)


def resolve(dotted: str) -> Any:
    module, _, attribute = dotted.rpartition(".")
    return getattr(importlib.import_module(module), attribute)


def module_dicts() -> dict[int, tuple[str, Any, set[Any]]]:
    """Every module-level dict and task registry of the project's loaded modules (by identity): a name,
    it, its keys now (a registry's for the list of tasks now)."""
    found: dict[int, tuple[str, Any, set[Any]]] = {}
    for name, module in list(sys.modules.items()):
        if name.split(".")[0] in PACKAGES and module is not None:
            for attribute, value in vars(module).items():
                if type(value) is dict or isinstance(value, TaskRegistry):
                    found.setdefault(id(value), (f"{name}.{attribute}", value, set(value)))
    return found


def test_adding_a_task_takes_what_the_architecture_page_lists() -> None:
    """The toy package on the list of tasks fills exactly the registries docs/architecture.md lists: each
    gains the toy's entry, no other registry of the project changes, and all is gone again once the
    package is off the list."""
    registries, functions = listed_pieces()
    assert registries and functions, "docs/architecture.md lists no registry or registration function"
    assert all(callable(resolve(function)) for function in functions)
    listed = {id(resolve(registry)): registry for registry in registries}
    before = module_dicts()
    with toy_registered():
        grown = {key: set(value) - keys for key, (_, value, keys) in before.items() if set(value) != keys}
    assert set(grown) == set(listed), (sorted(listed.values()), sorted(before[key][0] for key in grown))
    assert all(len(added) == 1 and added <= {TASK, DATASET} for added in grown.values())
    assert all(set(value) == keys for _, value, keys in before.values())
