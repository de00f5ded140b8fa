"""The kept-token floor as served: a short input keeps every token at a low ρ, and ``usage`` says so.

Tiny models exported through the real exporter with and without a floor, served by the real app.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.service.conftest import running, settings_for
from tests.tiny import tiny_model, tiny_recipe
from training.export.install import export_model
from training.fitting.fit import with_min_kept_tokens

FLOOR = 16
SHORT = "great film"  # [CLS] great film [SEP]: 4 tokens
LONG = " ".join(["the film was a delight from start to finish"] * 5)  # 47 tokens


def _export(root: Path, task: str, name: str, floor: int) -> None:
    model, tokenizer = tiny_model(task)
    recipe = with_min_kept_tokens(model, tiny_recipe(task, name), floor)
    export_model(model, recipe, tokenizer, root / name, name=name)


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    root = tmp_path_factory.mktemp("floor-models")
    _export(root, "classification", "tiny-floor", FLOOR)
    _export(root, "classification", "tiny-bare", 0)
    _export(root, "embedding", "tiny-embed-floor", FLOOR)
    with running(settings_for(root)) as (_, test_client):
        yield test_client


def _usage(client: TestClient, path: str, model: str, body: dict) -> dict:
    response = client.post(f"{path}?model={model}", json=body)
    assert response.status_code == 200, response.text
    usage: dict = response.json()["usage"]
    return usage


def test_a_four_token_input_keeps_every_token_at_rho_0_3(client: TestClient) -> None:
    usage = _usage(client, "/classify", "tiny-floor", {"text": SHORT, "rho": 0.3})
    assert usage["processed_tokens"] == 4
    assert usage["kept_tokens_per_layer"] == [4, 4]  # dense: the input is under the floor
    assert usage["min_kept_tokens"] == FLOOR and usage["rows_at_floor"] == 1
    bare = _usage(client, "/classify", "tiny-bare", {"text": SHORT, "rho": 0.3})
    assert bare["kept_tokens_per_layer"][-1] == 1  # without a floor: one token of four
    assert bare["min_kept_tokens"] == 0 and bare["rows_at_floor"] == 0


def test_usage_counts_the_rows_that_ran_at_the_floor(client: TestClient) -> None:
    usage = _usage(client, "/classify", "tiny-floor", {"texts": [SHORT, LONG, LONG], "rho": 0.2})
    assert usage["rows"] == 3 and usage["rows_at_floor"] == 3  # round(0.2·47) = 9 → 16 for the long rows
    roomy = _usage(client, "/classify", "tiny-floor", {"texts": [SHORT, LONG], "rho": 0.9})
    assert roomy["rows_at_floor"] == 1  # 42 of 47 tokens: ρ, not the floor, decides the long row
    assert roomy["kept_tokens_per_layer"][-1] == 4 + 42


def test_embeddings_report_the_floor_on_both_endpoints(client: TestClient) -> None:
    usage = _usage(client, "/embed", "tiny-embed-floor", {"text": SHORT, "rho": 0.2})
    assert usage["kept_tokens_per_layer"] == [4, 4] and usage["token_work_fraction"] == 1.0
    assert usage["min_kept_tokens"] == FLOOR and usage["rows_at_floor"] == 1
    response = client.post("/v1/embeddings", json={"input": SHORT, "model": "tiny-embed-floor", "rho": 0.2})
    assert response.status_code == 200, response.text
    openai_usage = response.json()["usage"]
    assert openai_usage["min_kept_tokens"] == FLOOR and openai_usage["rows_at_floor"] == 1
