"""A task of another shape than classification, a package of the tests (``tests/task_packages/
toy_rerank/``: its spec, training entry and face) put on the list of tasks (``$RETENTION_TASKS``) and
nowhere else, runs the whole pipeline with no edit anywhere else: trained, exported (validated), evaluated
with ranking metrics through the CLI, put in the results page's tables, served over HTTP by the real
service, sent rows by the batch client, load-benchmarked and shown by the explorer page, each of which
learns the task from a registry or from the served ``GET /models``. Off the list, it is nowhere.

The toy task is a reranker: one query and several passages in, one relevance score per passage out. Each
passage is one graph row ``[CLS] query [SEP] passage [SEP]`` (token type ids, the query protected), read
by a one-output sequence head; its evaluation ranks the passages and scores the gold passage's rank with
the core's ranking metrics (MRR@10, nDCG@10); its face is ``POST /toy_rerank`` with ``{query,
passages}`` in and ``{scores, ranking}`` out.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from selenium import webdriver
from selenium.webdriver.common.by import By

from benchmarks import load as load_benchmark
from benchmarks import report as report_module
from benchmarks._http import wait_ready
from clients import batch
from clients.ray_batch import face_routes
from clients.records import BatchConfig, served_routes, with_served_fields
from retention_core.contract import Manifest
from retention_core.tasks import TASKS, TASKS_VARIABLE
from retention_core.text import pad_token_id
from service.api import faces
from service.api.app import create_app
from service.settings import Settings
from tests.browser.conftest import browser  # noqa: F401  (the session's headless chromium)
from tests.browser.test_explorer import (
    choose_model,
    error_text,
    open_page,
    run_and_wait,
    set_rho,
    severe_console_entries,
)
from tests.service.conftest import SERVED_READY_S, running, served, settings_for
from tests.service.test_metrics import value as metric_value
from tests.task_packages import RERANK, RERANK_LABEL_FREE, listed
from tests.task_packages.toy_rerank.face import MAX_PASSAGES, PATH, RerankResponse
from tests.task_packages.toy_rerank.spec import SPEC, TASK
from tests.task_packages.toy_rerank.training import DATASET, FOLDER, HEADLINE, METRICS
from tests.test_toy_task import listed_pieces, module_dicts, resolve, short_run
from tests.tiny import tiny_model, tiny_recipe, write_rows
from training.__main__ import main as training_main
from training.__main__ import parser as training_parser
from training.engine.model import RetentionModel
from training.evaluation.methods import CODEC_METHODS, TRUNCATION
from training.fitting.fit import fit
from training.fitting.retrofit import retrofit_recipe
from training.recipes.data import REGISTRY
from training.recipes.recipe import Recipe
from training.tasks.codecs import rows_to_tensors
from training.tasks.registry import TRAINING_TASKS

PASSAGES = 4  # per training and evaluation example
WORDS = ["apple", "river", "stone", "cloud", "green", "house", "light", "music", "paper", "table"]


# ---------------------------------------------------------------------- fixtures
def examples(count: int, offset: int = 0) -> list[dict[str, object]]:
    """Queries of one word; the gold passage is the one that holds the word."""
    rows: list[dict[str, object]] = []
    for i in range(count):
        word = WORDS[(i + offset) % len(WORDS)]
        others = [w for w in WORDS if w != word]
        gold = (i + offset) % PASSAGES
        passages = [
            f"the {word} by the {others[(i + j) % len(others)]}"
            if j == gold
            else f"a {others[(i + j) % len(others)]} and a {others[(i + 2 * j) % len(others)]}"
            for j in range(PASSAGES)
        ]
        rows.append({"query": word, "passages": passages, "gold": gold})
    return rows


def rerank_registered(package: str = RERANK) -> AbstractContextManager[None]:
    """The toy reranker's package on the list of tasks: in every registry a task needs
    (docs/architecture.md), then, off the list, in none."""
    return listed(package)


@dataclasses.dataclass(frozen=True)
class Built:
    """What the pipeline wrote: the trained model, the models root, the evaluation's eval.json."""

    trained: RetentionModel
    tokenizer: Any
    recipe: Recipe
    models_dir: Path
    eval_json: Path


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Built]:
    """Trained (training.fitting.fit), exported and evaluated through the CLI once for the module, with the
    task listed only meanwhile: each test lists it again (``registered``)."""
    tmp_path = tmp_path_factory.mktemp("toy-rerank")
    root = tmp_path / "data"
    for split, offset in (("validation", 0), ("test", 3)):
        write_rows(root / FOLDER / f"{split}.jsonl.gz", examples(12, offset))
    with rerank_registered():
        model, hf_tokenizer = tiny_model(TASK, seed=5)
        recipe = short_run(tiny_recipe(TASK), root)
        run_dir = tmp_path / "run"
        trained = fit(
            recipe,
            run_dir,
            backbone=model.backbone,
            tokenizer=hf_tokenizer,
            train_rows=examples(16),
            progress=False,
        )
        models_dir = tmp_path / "models"
        training_main(["export", str(run_dir), "--out", str(models_dir / "toy-rerank")])
        out = tmp_path / "results"
        training_main(["evaluate", str(run_dir), "--out", str(out), "--rhos", "0.5", "1.0"])
    yield Built(trained.eval(), hf_tokenizer, recipe, models_dir, out / "eval.json")


@pytest.fixture
def registered() -> Iterator[None]:
    with rerank_registered():
        yield


QUERY = "stone"
BODY_PASSAGES = ["a river and a cloud", "the stone by the house", "green paper", "music and light"]


# ---------------------------------------------------------------------- what adding a task takes
def test_a_reranker_takes_what_the_architecture_page_lists() -> None:
    """As the classification-shaped toy (tests/test_toy_task.py): exactly the listed registries gain the
    reranker's entry, no other registry of the project changes, all is gone again afterwards."""
    registries, _ = listed_pieces()
    named = {id(resolve(registry)) for registry in registries}
    before = module_dicts()
    with rerank_registered():
        grown = {key: set(value) - keys for key, (_, value, keys) in before.items() if set(value) != keys}
    assert set(grown) == named, sorted(before[key][0] for key in grown)
    assert all(len(added) == 1 and added <= {TASK, DATASET} for added in grown.values())
    assert all(set(value) == keys for _, value, keys in before.values())


# ---------------------------------------------------------------------- train, export, evaluate, report
def test_a_reranker_is_trained_exported_and_evaluated_with_ranking_metrics(
    built: Built, registered: None
) -> None:
    manifest = Manifest.read(built.models_dir / "toy-rerank")
    assert manifest.task == TASK and manifest.labels == []
    assert [spec.name for spec in manifest.inputs] == [spec.name for spec in SPEC.inputs]
    assert [spec.name for spec in manifest.outputs] == ["relevance", "kept_counts", "survival_depth"]
    assert manifest.quality is not None and manifest.quality.metric == HEADLINE
    assert all(0.0 <= point.value <= 1.0 for point in manifest.quality.points)

    report = json.loads(built.eval_json.read_text())
    assert report["task"] == TASK and report["meta"]["num_examples"] == 12
    assert set(report["results"]) == set(CODEC_METHODS)
    for by_rho in report["results"].values():
        for cell in by_rho.values():
            assert set(METRICS) <= set(cell) and all(0.0 <= cell[name] <= 100.0 for name in METRICS)
    dense = {method: by_rho["1"][HEADLINE] for method, by_rho in report["results"].items()}
    assert len(set(dense.values())) == 1  # at ρ = 1 every method is the dense model
    truncated = report["results"][TRUNCATION]["0.5"]
    assert truncated["token_work"] < 1.0  # the baseline cut passages, not the query

    # The results page's section: its table of the registered metrics, the paired differences, the plot's
    # headline, all read from the training registry.
    section = "\n".join(report_module.quality_section(report, built.eval_json))
    assert f"Cells: {' / '.join(METRICS)} (fraction of dense encoder token-work)" in section
    assert f"{HEADLINE} minus the dense reference on the same 12 examples" in section
    assert "| learned |" in section and "| truncation |" in section
    points = report_module.quality_points(report)
    assert points["learned"] == sorted(
        (float(rho), cell[HEADLINE]) for rho, cell in report["results"]["learned"].items()
    )


# ---------------------------------------------------------------------- served over HTTP
def test_a_reranker_is_served_over_http(built: Built, registered: None) -> None:
    body = {"query": QUERY, "passages": BODY_PASSAGES, "rho": 1.0}
    with running(settings_for(built.models_dir)) as (app, client):
        listed = client.get("/models").json()["models"]
        response = client.post(PATH, json=body)
        explained = client.post(PATH, json={**body, "explain": True})
        too_many = client.post(PATH, json={"query": QUERY, "passages": ["p"] * (MAX_PASSAGES + 1)})
        empty = client.post(PATH, json={"query": QUERY, "passages": []})
        metrics = client.get("/metrics").text
        document = client.get("/openapi.json").json()
        served_codec = app.state.server.get(built.recipe.name).codec
    # /models: how a client reaches it, from the face registry.
    assert [(m["task"], m["route"], m["fields"], m["list_fields"]) for m in listed] == [
        (TASK, PATH, ["query", "passages"], ["passages"])
    ]
    assert response.status_code == 200, response.text
    answered = RerankResponse.model_validate(response.json())
    assert len(answered.scores) == len(BODY_PASSAGES) and answered.usage.rows == len(BODY_PASSAGES)
    assert answered.ranking == sorted(range(len(BODY_PASSAGES)), key=lambda i: -answered.scores[i])
    # The service's scores are the trained model's.
    rows = served_codec.encode(QUERY, *BODY_PASSAGES).rows
    feeds = rows_to_tensors(rows, pad_token_id(served_codec.tokenizer))
    with torch.no_grad():
        logits = built.trained.forward_pruned(
            feeds["input_ids"],
            feeds["attention_mask"],
            torch.ones(len(rows)),
            protected=feeds["protected_mask"].bool(),
            token_type_ids=feeds["token_type_ids"],
        ).logits  # (P, 1)
    np.testing.assert_allclose(answered.scores, logits[:, 0].numpy(), atol=1e-4)
    # explain: the query and each passage, named as the request fields they came from.
    (explanation,) = explained.json()["explanations"]
    segments = {token["segment"] for token in explanation["tokens"]}
    assert segments == {"query", *(f"passages[{i}]" for i in range(len(BODY_PASSAGES)))}
    assert {token["depth"] for token in explanation["tokens"] if token["segment"] == "query"} == {
        explanation["num_layers"]
    }  # protected
    # The face's own item limit and its body's rules.
    assert too_many.status_code == 413 and f"at most {MAX_PASSAGES} items" in too_many.text
    assert empty.status_code == 422
    # In /metrics under its task, in the OpenAPI document with its own bodies.
    route = {"endpoint": PATH.strip("/"), "task": TASK}
    assert metric_value(metrics, "retention_requests_total", **route, status_class="2xx") == 2
    assert metric_value(metrics, "retention_requests_total", **route, status_class="4xx") == 2
    operation = document["paths"][PATH]["post"]
    body_schema = operation["requestBody"]["content"]["application/json"]["schema"]
    reply_schema = operation["responses"]["200"]["content"]["application/json"]["schema"]
    assert body_schema["$ref"].endswith("/RerankRequest") and reply_schema["$ref"].endswith("/RerankResponse")


# ---------------------------------------------------------------------- the batch client
@pytest.mark.integration  # a real uvicorn server
def test_the_batch_client_learns_the_reranker_from_the_server(
    built: Built, registered: None, tmp_path: Path
) -> None:
    """No ``--field``: the route's input fields (query, passages) come from the server's GET /models and
    are read from the columns of their names; each record is the direct answer for its row."""
    rows = [{"id": i, **{k: v for k, v in row.items() if k != "gold"}} for i, row in enumerate(examples(3))]
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    out = tmp_path / "out.jsonl"
    with served(settings_for(built.models_dir)) as url:
        options = ["--url", url, "--endpoint", "toy_rerank", "--concurrency", "1", "--id-field", "id"]
        code = batch.main([str(source), str(out), *options, "--rho", "1", "--no-progress"])
        direct = [
            httpx.post(
                f"{url}{PATH}?rho=1", json={"query": r["query"], "passages": r["passages"]}, timeout=30
            ).json()
            for r in rows
        ]
        unserved = batch.main(
            [str(source), str(tmp_path / "none.jsonl"), "--url", url, "--endpoint", "classify"]
        )
    assert code == 0
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [r["id"] for r in records] == [0, 1, 2]
    assert [r["response"]["scores"] for r in records] == [d["scores"] for d in direct]
    assert [r["response"]["ranking"] for r in records] == [d["ranking"] for d in direct]
    assert unserved == 2 and not (tmp_path / "none.jsonl").exists()  # nothing served at /classify


# ---------------------------------------------------------------------- the explorer page
def result_row(driver: webdriver.Chrome, name: str) -> str:
    return str(driver.find_element(By.CSS_SELECTOR, f"#result tr[data-field='{name}'] td:nth-child(2)").text)


@pytest.mark.integration  # headless chromium
def test_the_explorer_lists_runs_and_shows_the_reranker(
    built: Built,
    registered: None,
    browser: webdriver.Chrome,  # noqa: F811
) -> None:
    """The page has no renderer of its own for this task: it builds a form of one box per input field
    the server lists, posts to the listed route and shows the answer's fields and every segment shaded."""
    with served(settings_for(built.models_dir)) as url:
        open_page(browser, url, key="")
        choose_model(browser, built.recipe.name)
        assert not browser.find_element(By.ID, "text").is_displayed()  # no generic text box: its own fields
        query = browser.find_element(By.ID, "field-query")
        query.send_keys(QUERY)
        browser.find_element(By.ID, "field-passages").send_keys("\n".join(BODY_PASSAGES))
        set_rho(browser, 1.0)
        run_and_wait(browser, browser.find_element(By.ID, "run").click)
        direct = httpx.post(
            f"{url}{PATH}?rho=1", json={"query": QUERY, "passages": BODY_PASSAGES}, timeout=30
        ).json()
        assert error_text(browser) == ""
        assert result_row(browser, "scores") == ", ".join(f"{score:.4f}" for score in direct["scores"])
        assert result_row(browser, "ranking") == ", ".join(str(index) for index in direct["ranking"])
        shaded = [
            part.get_attribute("data-segment")
            for part in browser.find_elements(By.CSS_SELECTOR, "#shaded .segment")
        ]
        assert shaded == ["query", *(f"passages[{i}]" for i in range(len(BODY_PASSAGES)))]
        assert browser.find_elements(By.CSS_SELECTOR, "#shaded .segment .tok")
        assert browser.find_element(By.ID, "result-title").text == "Result"
        assert severe_console_entries(browser) == []


# ---------------------------------------------------------------------- every task list reads a registry
def retrofit_choices() -> set[str]:
    """The retrofit command's ``--task`` choices, read off the CLI's own parser."""
    root = training_parser()
    (commands,) = [action for action in root._actions if isinstance(action, argparse._SubParsersAction)]
    (task,) = [action for action in commands.choices["retrofit"]._actions if action.dest == "task"]
    return set(task.choices or ())


def test_every_task_list_includes_a_task_registered_in_a_test(built: Built, tmp_path: Path) -> None:
    """With the toy registered (here also able to retrofit), each list of tasks holds it, and without it
    none does: the CLI's retrofit choices, the results page's metrics and headline, /models' route and
    fields, the batch client's default fields (HTTP and Ray engines), the router's item limit."""
    payload = {"task": TASK}
    with rerank_registered(RERANK_LABEL_FREE):
        assert TASK in retrofit_choices()
        assert retrofit_recipe("toy-model", TASK, tmp_path / "t.txt").task == TASK
        evaluation = report_module.task_evaluation(payload)
        assert (evaluation.metrics, evaluation.headline) == (METRICS, HEADLINE)
        with running(settings_for(built.models_dir)) as (_, client):
            listing = client.get("/models").json()
        assert served_routes(listing) == {PATH: ("query", "passages")}
        cfg = BatchConfig(input_path=tmp_path / "in", output_path=tmp_path / "out", endpoint="toy_rerank")
        assert with_served_fields(cfg, served_routes(listing)).body_fields() == {
            "query": "query",
            "passages": "passages",
        }
        assert with_served_fields(cfg, face_routes()).body_fields() == {
            "query": "query",
            "passages": "passages",
        }
        assert faces.FACES[TASK].item_limit(Settings()) == MAX_PASSAGES
    assert TASK not in retrofit_choices()
    with pytest.raises(KeyError, match=TASK):
        report_module.task_evaluation(payload)
    with pytest.raises(ValueError, match="nothing is served at /toy_rerank"):
        with_served_fields(cfg, face_routes())


# ---------------------------------------------------------------------- the load benchmark
@pytest.mark.integration  # a real uvicorn server
def test_the_load_benchmark_drives_the_reranker(built: Built, registered: None, tmp_path: Path) -> None:
    """``benchmarks.load --task toy_rerank``: its route and its bodies from the face registry (the face's
    example body around each generated text), every request answered."""
    assert load_benchmark.payload(TASK, "a text") == {"query": "a text", "passages": ["a text"]}
    with served(settings_for(built.models_dir)) as url:
        out = tmp_path / "load.json"
        report = load_benchmark.main(
            [url, "--out", str(out), "--task", TASK, "--quick", "--rhos", "1", "0.5"]
        )
    cells = report["results"]
    assert report["task"] == TASK and {cell["rho"] for cell in cells} == {"1", "0.5"}
    assert all(cell["sent"] > 0 and cell["ok"] == cell["sent"] and cell["errors"] == 0 for cell in cells)
    assert all(cell["mean_work_fraction"] is not None for cell in cells)


# ---------------------------------------------------------------------- off the list, nowhere
def test_removing_the_entry_removes_it_everywhere(built: Built) -> None:
    """Without its package on the list (here after other tests of this process listed it): no registry
    holds the task or its dataset, no route serves it, /models does not list its model (a load error:
    no task of that name) and the OpenAPI document has no trace of its bodies."""
    with rerank_registered():
        assert TASK in TASKS and TASK in TRAINING_TASKS and DATASET in REGISTRY and TASK in faces.FACES
    assert TASK not in TASKS and TASK not in TRAINING_TASKS and TASK not in faces.FACES
    assert DATASET not in REGISTRY
    assert (
        set(TASKS)
        == set(TRAINING_TASKS)
        == set(faces.FACES)
        == {"classification", "qa", "summarization", "embedding"}
    )
    # Not ``running``: with its only model refused the app never becomes ready (no_models).
    with TestClient(create_app(settings_for(built.models_dir))) as client:
        # the repository loads in the background: wait until it has tried the directory (and refused it)
        listing = wait_ready(
            str(client.base_url),
            SERVED_READY_S,
            probe=lambda: client.get("/models"),
            accept=lambda response: bool(response.json()["errors"]),
            name="the refusal",
        ).json()
        refused = client.post(PATH, json={"query": QUERY, "passages": BODY_PASSAGES})
        document = client.get("/openapi.json").json()
    assert listing["models"] == [] and TASK in listing["errors"]["toy-rerank"]  # its directory's name
    assert refused.status_code == 404
    assert PATH not in document["paths"] and "RerankRequest" not in document["components"]["schemas"]


FRESH_PROCESS = """
from retention_core.tasks import TASKS
from service.api.faces import FACES
from training.recipes.data import REGISTRY
from training.tasks.registry import TRAINING_TASKS
print(sorted(TASKS), sorted(TRAINING_TASKS), sorted(FACES), "toy_rerank_queries" in REGISTRY)
"""


def test_the_list_alone_decides_in_a_fresh_process() -> None:
    """A process started with the package in ``$RETENTION_TASKS`` has the task in every registry, one
    started without it in none: nothing but the list enables a task."""

    def registries(env: dict[str, str]) -> str:
        result = subprocess.run(
            [sys.executable, "-c", FRESH_PROCESS], env=env, capture_output=True, text=True, timeout=300
        )
        assert result.returncode == 0, result.stderr
        return result.stdout.strip()

    without = {name: value for name, value in os.environ.items() if name != TASKS_VARIABLE}
    shipped = "['classification', 'embedding', 'qa', 'summarization']"
    assert registries(without) == f"{shipped} {shipped} {shipped} False"
    listed_tasks = "['classification', 'embedding', 'qa', 'summarization', 'toy_rerank']"
    expected = f"{listed_tasks} {listed_tasks} {listed_tasks} True"
    assert registries({**without, TASKS_VARIABLE: RERANK}) == expected
