"""Endpoints, usage accounting, headers and the error rules of the HTTP API."""

from __future__ import annotations

import math
from pathlib import Path

import jsonschema  # (dev extra, through check-jsonschema)
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from tests.service.conftest import running, settings_for

TEXT = "the film was a delight from start to finish"
CONTEXT = "Ada Lovelace wrote the first program. She worked with Charles Babbage on the engine."
DOC = "Retention prunes tokens. It keeps the salient ones. The budget is rho. Rho one is dense."


def assert_usage(body: dict, rho: float) -> dict:
    usage = body["usage"]
    layers = usage["num_layers"]
    assert layers == 2 and len(usage["kept_tokens_per_layer"]) == layers
    assert usage["rho_effective"] == pytest.approx(rho)
    assert 0.0 < usage["token_work_fraction"] <= 1.0
    assert usage["processed_tokens"] >= 1 and usage["input_tokens"] >= 1
    assert all(0 < k <= usage["processed_tokens"] for k in usage["kept_tokens_per_layer"])
    assert usage["queue_time_s"] >= 0 and usage["inference_time_s"] >= 0
    assert usage["truncated"] is False and usage["degraded"] is False
    return usage


def assert_headers(response, rho: float) -> None:
    assert float(response.headers["x-rho-effective"]) == pytest.approx(rho)
    assert float(response.headers["x-queue-time"]) >= 0
    assert float(response.headers["x-inference-time"]) >= 0
    assert float(response.headers["x-predicted-wait"]) >= 0  # admission's prediction, idle here


def test_classify_single_and_list(client: TestClient) -> None:
    one = client.post("/classify?rho=0.3", json={"text": TEXT})
    assert one.status_code == 200, one.text
    body = one.json()
    assert body["model"] == "tiny-classification"
    assert body["label"] in ("negative", "positive")
    assert set(body["scores"]) == {"negative", "positive"}
    assert math.isclose(sum(body["scores"].values()), 1.0, rel_tol=1e-6)
    usage = assert_usage(body, 0.3)
    assert usage["rho_requested"] == 0.3
    assert_headers(one, 0.3)

    many = client.post("/classify", json={"texts": [TEXT, "bad", TEXT + " again"], "rho": 0.5})
    assert many.status_code == 200, many.text
    body = many.json()
    assert body["label"] is None and len(body["results"]) == 3
    assert body["usage"]["rows"] == 3
    assert_usage(body, 0.5)


def test_default_rho_comes_from_the_manifest(client: TestClient) -> None:
    body = client.post("/classify", json={"text": TEXT}).json()
    assert body["usage"]["rho_requested"] is None and body["usage"]["rho_reason"] == "default"
    # Tiny models are exported without a quality curve: nothing shows a lower ρ is safe, so dense.
    assert body["usage"]["rho_effective"] == 1.0
    listed = {m["name"]: m for m in client.get("/models").json()["models"]}["tiny-classification"]
    assert (listed["default_rho"], listed["default_rho_rule"]) == (1.0, "no quality curve: dense (rho=1)")


def test_rho_one_is_dense_and_token_work_matches_the_definition(client: TestClient) -> None:
    body = client.post("/classify?rho=1", json={"text": TEXT}).json()
    usage = body["usage"]
    n = usage["processed_tokens"]
    assert usage["kept_tokens_per_layer"] == [n, n]
    # classification: last layer computes only the [CLS] query (schedule.last_layer_queries = 1)
    assert usage["token_work_fraction"] == pytest.approx((n + 1) / (2 * n), abs=1e-6)
    low = client.post("/classify?rho=0.2", json={"text": TEXT}).json()["usage"]
    assert low["kept_tokens_per_layer"][-1] < n
    assert low["token_work_fraction"] < usage["token_work_fraction"]


def test_body_rho_wins_over_query(client: TestClient) -> None:
    response = client.post("/classify?rho=0.9", json={"text": TEXT, "rho": 0.2})
    assert response.json()["usage"]["rho_effective"] == pytest.approx(0.2)


def test_qa(client: TestClient) -> None:
    response = client.post("/qa?rho=0.5", json={"question": "Who wrote the program?", "context": CONTEXT})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model"] == "tiny-qa"
    assert CONTEXT[body["start"] : body["end"]] == body["answer"]
    assert 0.0 <= body["score"] <= 1.0
    assert_usage(body, 0.5)
    assert_headers(response, 0.5)
    many = client.post("/qa", json={"items": [{"question": "Who?", "context": CONTEXT}] * 2}).json()
    assert len(many["results"]) == 2 and many["answer"] is None


def test_qa_long_context_uses_windows_and_reports_truncation(client: TestClient) -> None:
    long_context = " ".join([CONTEXT] * 30)
    body = client.post("/qa", json={"question": "Who?", "context": long_context}).json()
    assert body["usage"]["rows"] > 1
    assert long_context[body["start"] : body["end"]] == body["answer"]


def test_summarize(client: TestClient) -> None:
    response = client.post("/summarize?rho=0.7", json={"text": DOC, "max_sentences": 2})
    assert response.status_code == 200, response.text
    body = response.json()
    indices = [s["index"] for s in body["sentences"]]
    assert len(indices) == 2 and indices == sorted(indices)
    assert body["summary"] == " ".join(s["text"] for s in body["sentences"])
    assert_usage(body, 0.7)
    sentences = ["One.", "Two is here.", "Three is there.", "Four.", "Five!"]
    body = client.post("/summarize", json={"sentences": sentences, "ratio": 0.4}).json()
    assert [s["text"] for s in body["sentences"]] == [sentences[s["index"]] for s in body["sentences"]]
    assert len(body["sentences"]) == 2


@pytest.mark.parametrize("rho", ["0", "-0.5", "1.5", "nan", "NaN", "inf", "abc", "", "1e400"])
def test_invalid_query_rho_is_422(client: TestClient, rho: str) -> None:
    response = client.post(f"/classify?rho={rho}", json={"text": TEXT})
    assert response.status_code == 422
    assert "rho must be" in response.json()["error"]["message"]


@pytest.mark.parametrize("rho", [0, -1, 1.0001, "nan", "abc", True, [0.5], {"x": 1}])
def test_invalid_body_rho_is_422(client: TestClient, rho: object) -> None:
    response = client.post("/classify", json={"text": TEXT, "rho": rho})
    assert response.status_code == 422
    assert "rho" in response.json()["error"]["message"]


def test_nan_literal_in_body_is_422(client: TestClient) -> None:
    body = b'{"text": "hello", "rho": NaN}'
    response = client.post("/classify", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 422


@pytest.mark.parametrize(
    "path,body",
    [
        ("/classify", {}),
        ("/classify", {"text": "a", "texts": ["b"]}),
        ("/classify", {"texts": []}),
        ("/classify", {"text": ""}),
        ("/qa", {"question": "q"}),
        ("/summarize", {"text": "x", "max_sentences": 1, "ratio": 0.5}),
        ("/summarize", {"text": "x", "max_sentences": 0}),
        ("/classify?min_rho=2", {"text": "x", "rho": "auto"}),
    ],
)
def test_invalid_bodies_are_422(client: TestClient, path: str, body: dict) -> None:
    response = client.post(path, json=body)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["code"] == "invalid_request"


def test_model_selection(client: TestClient) -> None:
    assert client.post("/classify?model=tiny-classification", json={"text": TEXT}).status_code == 200
    missing = client.post("/classify?model=nope", json={"text": TEXT})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    wrong_task = client.post("/classify?model=tiny-qa", json={"text": TEXT})
    assert wrong_task.status_code == 422 and wrong_task.json()["error"]["code"] == "task_mismatch"


def test_default_model_is_configurable(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    from tests.service.conftest import copy_models

    root = copy_models(tiny_models, tmp_path / "models", ("classification",))
    import shutil

    shutil.copytree(tiny_models["classification"], root / "second")
    manifest = (root / "second" / "manifest.json").read_text()
    (root / "second" / "manifest.json").write_text(manifest.replace('"tiny-classification"', '"zz-second"'))
    settings = settings_for(root, default_models={"classification": "zz-second"})
    with running(settings) as (_, client):
        assert client.post("/classify", json={"text": TEXT}).json()["model"] == "zz-second"
        models = {m["name"]: m["is_default"] for m in client.get("/models").json()["models"]}
        assert models == {"tiny-classification": False, "zz-second": True}


def test_models_endpoints(client: TestClient) -> None:
    listing = client.get("/models").json()
    names = {m["name"]: m for m in listing["models"]}
    assert set(names) == {"tiny-classification", "tiny-qa", "tiny-summarization", "tiny-embedding"}
    assert all(m["is_default"] for m in names.values())
    assert names["tiny-classification"]["labels"] == ["negative", "positive"]
    detail = client.get("/models/tiny-qa").json()
    assert detail["manifest"]["task"] == "qa"
    assert "quality" in detail["manifest"] and "schedule" in detail["manifest"]
    assert client.get("/models/unknown").status_code == 404


def test_health_docs_and_openapi(client: TestClient) -> None:
    assert client.get("/livez").json()["status"] == "alive"
    ready = client.get("/readyz").json()
    assert ready["status"] == "ready" and len(ready["models"]) == 4
    assert client.get("/docs").status_code == 200
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/classify", "/qa", "/summarize", "/embed", "/v1/embeddings"} <= set(paths)
    assert {"/models", "/models/{name}", "/readyz"} <= set(paths)


def test_payload_limits(models_root: Path) -> None:
    settings = settings_for(models_root, max_body_bytes=2000, max_items=4)
    with running(settings) as (_, client):
        big = client.post("/classify", json={"text": "x" * 5000})
        assert big.status_code == 413 and big.json()["error"]["code"] == "payload_too_large"

        def chunks():  # no Content-Length: streamed body
            yield b'{"text": "'
            yield b"y" * 5000
            yield b'"}'

        streamed = client.post("/classify", content=chunks(), headers={"content-type": "application/json"})
        assert streamed.status_code == 413
        too_many = client.post("/classify", json={"texts": ["a"] * 5})
        assert too_many.status_code == 413
        assert client.post("/classify", json={"texts": ["a"] * 4}).status_code == 200


def test_truncation_policy(client: TestClient) -> None:
    long_text = "word " * 200  # more than the tiny max_length of 64 tokens
    kept = client.post("/classify", json={"text": long_text})
    assert kept.status_code == 200
    usage = kept.json()["usage"]
    assert usage["truncated"] is True and usage["input_tokens"] > 64 and usage["processed_tokens"] == 64
    for request in (
        client.post("/classify?truncate=false", json={"text": long_text}),
        client.post("/classify", json={"text": long_text, "truncate": False}),
        client.post("/summarize?truncate=false", json={"text": "Many words here. " * 400}),
    ):
        assert request.status_code == 413
        assert request.json()["error"]["code"] == "input_too_long"
    short = client.post("/classify?truncate=false", json={"text": TEXT})
    assert short.status_code == 200


def test_api_key(models_root: Path) -> None:
    with running(settings_for(models_root, api_key="s3cret")) as (_, client):
        assert client.post("/classify", json={"text": TEXT}).status_code == 401
        wrong = client.post("/classify", json={"text": TEXT}, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and wrong.headers["www-authenticate"] == "Bearer"
        assert client.get("/models").status_code == 401
        ok = client.post("/classify", json={"text": TEXT}, headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200
        # probes and metrics stay open
        assert client.get("/livez").status_code == 200 and client.get("/readyz").status_code == 200
        assert "retention_rejections_total" in client.get("/metrics").text


def test_cors_is_off_by_default_and_configurable(client: TestClient, models_root: Path) -> None:
    origin = {"Origin": "https://example.com"}
    assert "access-control-allow-origin" not in client.get("/livez", headers=origin).headers
    with running(settings_for(models_root, cors_origins=["https://example.com"])) as (_, cors):
        response = cors.get("/livez", headers=origin)
        assert response.headers["access-control-allow-origin"] == "https://example.com"
        # A browser client (the explorer page, a dashboard) reads the budget and admission headers.
        exposed = response.headers["access-control-expose-headers"].lower().split(",")
        for header in ("x-rho-effective", "x-rho-reason", "x-predicted-wait", "retry-after"):
            assert header in [name.strip() for name in exposed]


def test_error_bodies_never_leak_internals(app_client: tuple[FastAPI, TestClient], models_root: Path) -> None:
    _, client = app_client
    responses = [
        client.post("/classify?rho=abc", json={"text": TEXT}),
        client.post("/classify", content=b"{not json", headers={"content-type": "application/json"}),
        client.post("/classify?model=../../etc/passwd", json={"text": TEXT}),
        client.get("/nope"),
    ]
    for response in responses:
        assert 400 <= response.status_code < 500
        text = response.text
        assert "Traceback" not in text and str(models_root) not in text and "/work/" not in text
        assert "error" in response.json()


def test_not_ready_without_models(tmp_path: Path) -> None:
    from service.api.app import create_app

    app = create_app(settings_for(tmp_path))
    with TestClient(app) as client:
        from tests.service.conftest import wait_until

        wait_until(lambda: app.state.server.started, what="first load")
        assert client.get("/livez").status_code == 200
        ready = client.get("/readyz")
        assert ready.status_code == 503 and ready.json()["status"] == "no_models"
        assert client.post("/classify", json={"text": TEXT}).status_code == 404


# (path, body, the server's status): each body is valid by the OpenAPI document iff the server takes it.
SCHEMA_CASES = [
    ("/classify", {"texts": None}, 422),  # null is not "left out"
    ("/classify", {"text": TEXT, "texts": None}, 422),
    ("/classify", {"text": TEXT, "truncate": 0}, 422),  # strict: 0 is not false
    ("/classify", {"text": TEXT, "rho": "0.5"}, 422),  # in a JSON body a number is a JSON number
    ("/classify", {"text": TEXT, "rho": "AUTO"}, 422),
    ("/classify", {"text": TEXT, "rho": None, "min_rho": None, "truncate": None}, 200),  # null: default
    ("/classify", {"text": TEXT, "rho": 1}, 200),
    ("/qa", {"context": CONTEXT, "items": [{"question": "who?", "context": CONTEXT}]}, 422),
    ("/qa", {"items": [{"question": "who?", "context": CONTEXT}]}, 200),
    ("/summarize", {"text": DOC, "max_sentences": None, "ratio": 0.5}, 422),
    ("/summarize", {"text": DOC, "max_sentences": "2"}, 422),
    ("/summarize", {"text": DOC, "max_sentences": 2.0}, 200),  # JSON Schema: 2.0 is an integer
]


def test_the_openapi_document_and_the_server_agree_on_bodies(client: TestClient) -> None:
    openapi = client.get("/openapi.json").json()
    for path, body, status in SCHEMA_CASES:
        ref = openapi["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        validator = jsonschema.Draft202012Validator({"$ref": ref, "components": openapi["components"]})
        assert validator.is_valid(body) == (status == 200), (path, body)
        assert client.post(path, json=body).status_code == status, (path, body)


def test_query_rho_is_a_decimal_or_auto(client: TestClient) -> None:
    assert client.post("/classify?rho=0.5", json={"text": TEXT}).status_code == 200
    assert client.post("/classify?rho=auto", json={"text": TEXT}).status_code == 200
    for text in ("AUTO", " 0.5", "inf", "nan", "1_0"):
        assert client.post("/classify", params={"rho": text}, json={"text": TEXT}).status_code == 422, text
