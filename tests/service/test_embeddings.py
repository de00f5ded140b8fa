"""POST /embed and the OpenAI-compatible POST /v1/embeddings: vectors, rho and usage, headers, metrics,
the real ``openai`` client against a live server, and every bad input (4xx, OpenAI's error shape
under /v1/)."""

from __future__ import annotations

import base64
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import httpx
import numpy as np
import openai
import pytest
from fastapi.testclient import TestClient

from retention_core.contract import Manifest
from service.runtime import ModelLoadError, load_model
from tests.service.conftest import copy_models, running, served, settings_for
from tests.service.test_api import assert_headers, assert_usage
from tests.service.test_metrics import value
from tests.tiny import TINY_HIDDEN, TINY_MAX_LENGTH

MODEL = "tiny-embedding"
TEXT = "the film was a delight from start to finish"
TEXTS = [TEXT, "a short one", "retention keeps the tokens that matter and drops the rest"]
OPENAI_ERROR_KEYS = {"message", "type", "param", "code"}


def norms(vectors: list[list[float]]) -> np.ndarray:
    return np.linalg.norm(np.asarray(vectors, dtype=np.float64), axis=-1)  # (N,)


class JsonResponse(Protocol):  # httpx's, or the test client's (another httpx build)
    @property
    def status_code(self) -> int: ...

    @property
    def text(self) -> str: ...

    def json(self) -> Any: ...


def assert_openai_error(response: JsonResponse, status: int, code: str, kind: str) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == OPENAI_ERROR_KEYS and error["code"] == code and error["type"] == kind
    assert error["message"] and "Traceback" not in response.text and "/work/" not in response.text
    return dict(error)


# ---------------------------------------------------------------------------------------------- /embed
def test_embed_single_and_batch(client: TestClient) -> None:
    one = client.post("/embed?rho=0.3", json={"text": TEXT})
    assert one.status_code == 200, one.text
    body = one.json()
    assert body["model"] == MODEL and one.headers["x-model"] == MODEL
    assert len(body["embedding"]) == TINY_HIDDEN and body["embeddings"] == [body["embedding"]]
    assert norms(body["embeddings"]) == pytest.approx([1.0], abs=1e-5)  # the manifest's default: normalised
    usage = assert_usage(body, 0.3)
    assert usage["rho_requested"] == 0.3 and usage["rows"] == 1
    assert_headers(one, 0.3)

    many = client.post("/embed", json={"texts": TEXTS, "rho": 0.3})
    assert many.status_code == 200, many.text
    batch = many.json()
    assert batch["embedding"] is None and len(batch["embeddings"]) == len(TEXTS)
    assert batch["usage"]["rows"] == len(TEXTS)
    assert norms(batch["embeddings"]) == pytest.approx([1.0] * len(TEXTS), abs=1e-5)
    np.testing.assert_allclose(batch["embeddings"][0], body["embedding"], atol=1e-5)  # batched == alone
    assert not np.allclose(batch["embeddings"][0], batch["embeddings"][1], atol=1e-3)


def test_normalize_off_is_the_raw_pooled_vector(client: TestClient) -> None:
    raw = client.post("/embed", json={"text": TEXT, "normalize": False, "rho": 1}).json()["embedding"]
    unit = client.post("/embed", json={"text": TEXT, "normalize": True, "rho": 1}).json()["embedding"]
    default = client.post("/embed", json={"text": TEXT, "normalize": None, "rho": 1}).json()["embedding"]
    length = float(np.linalg.norm(raw))
    assert abs(length - 1.0) > 1e-3  # a random tiny model's mean state is not a unit vector
    np.testing.assert_allclose(np.asarray(raw) / length, unit, atol=1e-5)
    assert default == unit


def test_rho_one_is_dense_and_lower_rho_does_less_work(client: TestClient) -> None:
    dense = client.post("/embed?rho=1", json={"text": TEXT}).json()
    usage = dense["usage"]
    n = usage["processed_tokens"]
    # a pooled head reads every position: the last layer computes all of them (no query shortcut)
    assert usage["kept_tokens_per_layer"] == [n, n] and usage["token_work_fraction"] == 1.0
    pruned = client.post("/embed?rho=0.3", json={"text": TEXT}).json()
    low = pruned["usage"]
    assert low["processed_tokens"] == n and low["kept_tokens_per_layer"][-1] < n
    assert low["token_work_fraction"] < 1.0
    assert not np.allclose(pruned["embedding"], dense["embedding"], atol=1e-4)


def test_embed_auto_rho_and_truncation(client: TestClient) -> None:
    auto = client.post("/embed?rho=auto&min_rho=0.2", json={"text": TEXT}).json()["usage"]
    assert auto["rho_requested"] == "auto" and auto["min_rho"] == 0.2 and auto["rho_effective"] == 1.0
    long_text = "word " * 200
    cut = client.post("/embed", json={"text": long_text}).json()["usage"]
    assert cut["truncated"] is True and cut["processed_tokens"] == TINY_MAX_LENGTH < cut["input_tokens"]
    refused = client.post("/embed?truncate=false", json={"text": long_text})
    assert refused.status_code == 413 and refused.json()["error"]["code"] == "input_too_long"


@pytest.mark.parametrize(
    "body,code",
    [
        ({}, "invalid_request"),
        ({"text": ""}, "invalid_request"),
        ({"texts": []}, "invalid_request"),
        ({"texts": ["fine", ""]}, "invalid_request"),
        ({"texts": [101, 2023]}, "invalid_request"),
        ({"text": "a", "texts": ["b"]}, "invalid_request"),
        ({"text": "a", "normalize": "yes"}, "invalid_request"),
        ({"text": "a", "rho": 0}, "invalid_request"),
        ({"text": "a", "input": "b"}, "invalid_request"),
    ],
)
def test_embed_bad_bodies_are_422(client: TestClient, body: dict, code: str) -> None:
    response = client.post("/embed", json=body)
    assert response.status_code == 422, response.text
    assert set(response.json()["error"]) >= {"code", "message"} and response.json()["error"]["code"] == code


def test_embed_model_selection(client: TestClient) -> None:
    assert client.post(f"/embed?model={MODEL}", json={"text": TEXT}).status_code == 200
    missing = client.post("/embed?model=nope", json={"text": TEXT})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    other = client.post("/embed?model=tiny-classification", json={"text": TEXT})
    assert other.status_code == 422 and other.json()["error"]["code"] == "task_mismatch"


def test_requests_without_rho_run_at_the_manifest_default(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    root = copy_models(tiny_models, tmp_path / "models", ("embedding",))
    exported = Manifest.read(root / MODEL)
    assert exported.default_rho == 1.0  # exported without a quality curve: dense
    # What an export with a measured curve may choose: a default under 1, and how it was chosen.
    rule = "lowest measured rho within 1 point of rho=1 (cosine_to_dense on texts/validation, 8 examples)"
    exported.model_copy(update={"default_rho": 0.4, "default_rho_rule": rule}).write(root / MODEL)
    with running(settings_for(root)) as (_, client):
        (listed,) = client.get("/models").json()["models"]
        assert (listed["default_rho"], listed["default_rho_rule"]) == (0.4, rule)
        vectors = []
        for path, body in (("/embed", {"text": TEXT}), ("/v1/embeddings", {"input": TEXT, "model": MODEL})):
            response = client.post(path, json=body)
            assert response.status_code == 200, response.text
            usage = response.json()["usage"]
            assert usage["rho_requested"] is None and usage["rho_reason"] == "default"
            assert usage["rho_effective"] == pytest.approx(0.4)
            assert usage["kept_tokens_per_layer"][-1] < usage["processed_tokens"]  # pruned, not dense
            assert_headers(response, 0.4)
            payload = response.json()
            vectors.append(payload["embedding"] if path == "/embed" else payload["data"][0]["embedding"])
        explicit = client.post("/embed?rho=0.4", json={"text": TEXT}).json()["embedding"]
        np.testing.assert_allclose(vectors, [explicit, explicit], atol=1e-6)


# ------------------------------------------------------------------------------- /v1/embeddings (HTTP)
@pytest.mark.parametrize(
    "body,status,code,param",
    [
        ({"model": MODEL}, 422, "invalid_request", "input"),
        ({"input": "", "model": MODEL}, 422, "invalid_request", "input"),
        ({"input": [], "model": MODEL}, 422, "invalid_request", "input"),
        ({"input": ["fine", ""], "model": MODEL}, 422, "invalid_request", "input"),
        ({"input": [101, 2023, 102], "model": MODEL}, 422, "invalid_request", "input"),
        ({"input": [[101, 2023], [101]], "model": MODEL}, 422, "invalid_request", "input"),
        ({"input": None, "model": MODEL}, 422, "invalid_request", "input"),
        (
            {"input": TEXT, "model": MODEL, "encoding_format": "int8"},
            422,
            "invalid_request",
            "encoding_format",
        ),
        ({"input": TEXT, "model": MODEL, "dimensions": 0}, 422, "invalid_request", "dimensions"),
        ({"input": TEXT, "model": MODEL, "dimensions": 7}, 400, "unsupported_value", "dimensions"),
        ({"input": TEXT, "model": MODEL, "rho": 1.5}, 422, "invalid_request", "rho"),
        ({"input": TEXT, "model": MODEL, "min_rho": 0}, 422, "invalid_request", "min_rho"),
        ({"input": TEXT, "model": MODEL, "stream": True}, 422, "invalid_request", "stream"),
        ({"input": TEXT, "model": "nope"}, 404, "model_not_found", None),
        ({"input": TEXT, "model": "tiny-qa"}, 422, "task_mismatch", None),
    ],
)
def test_openai_bad_bodies(client: TestClient, body: dict, status: int, code: str, param: str | None) -> None:
    response = client.post("/v1/embeddings", json=body)
    error = assert_openai_error(response, status, code, "invalid_request_error")
    assert error["param"] == param


def test_openai_token_arrays_say_why(client: TestClient) -> None:
    response = client.post("/v1/embeddings", json={"input": [101, 2023, 102], "model": MODEL})
    assert "token arrays are not supported" in response.json()["error"]["message"]
    dims = client.post("/v1/embeddings", json={"input": TEXT, "model": MODEL, "dimensions": 7})
    assert f"must be {TINY_HIDDEN}" in dims.json()["error"]["message"]


def test_openai_errors_outside_the_body(client: TestClient) -> None:
    responses = {
        "query rho": client.post("/v1/embeddings?rho=abc", json={"input": TEXT}),
        "not json": client.post(
            "/v1/embeddings", content=b"{not json", headers={"content-type": "application/json"}
        ),
        "too long": client.post("/v1/embeddings?truncate=false", json={"input": "word " * 200}),
        "unknown route": client.post("/v1/nope", json={}),
        "wrong method": client.get("/v1/embeddings"),
    }
    assert_openai_error(responses["query rho"], 422, "invalid_request", "invalid_request_error")
    assert responses["query rho"].json()["error"]["param"] == "rho"
    assert_openai_error(responses["not json"], 422, "invalid_request", "invalid_request_error")
    assert_openai_error(responses["too long"], 413, "input_too_long", "invalid_request_error")
    assert_openai_error(responses["unknown route"], 404, "not_found", "invalid_request_error")
    assert_openai_error(responses["wrong method"], 405, "method_not_allowed", "invalid_request_error")
    # elsewhere errors keep this server's own shape
    assert set(client.post("/embed?rho=abc", json={"text": TEXT}).json()["error"]) == {"code", "message"}


def test_limits_on_both_endpoints(models_root: Path) -> None:
    with running(settings_for(models_root, max_embedding_inputs=4, max_body_bytes=2000)) as (_, client):
        for path, field in (("/embed", "texts"), ("/v1/embeddings", "input")):
            too_many = client.post(path, json={field: ["a"] * 5})
            assert too_many.status_code == 413, too_many.text
            assert too_many.json()["error"]["code"] == "payload_too_large"
            assert client.post(path, json={field: ["a"] * 4}).status_code == 200
        v1 = client.post("/v1/embeddings", json={"input": ["a"] * 5})
        assert_openai_error(v1, 413, "payload_too_large", "invalid_request_error")
        assert v1.json()["error"]["param"] == "input"
        big = client.post("/v1/embeddings", json={"input": "x" * 5000})  # rejected by the body limit
        assert_openai_error(big, 413, "payload_too_large", "invalid_request_error")


def test_openai_response_shape_and_usage(client: TestClient) -> None:
    response = client.post("/v1/embeddings?rho=0.3", json={"input": TEXTS, "model": MODEL})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "list" and body["model"] == MODEL
    assert [(d["object"], d["index"]) for d in body["data"]] == [("embedding", i) for i in range(len(TEXTS))]
    usage = body["usage"]
    assert usage["prompt_tokens"] == usage["total_tokens"] == usage["processed_tokens"]
    assert usage["rho_effective"] == pytest.approx(0.3) and usage["token_work_fraction"] < 1.0
    assert_headers(response, 0.3)
    reference = client.post("/embed?rho=0.3", json={"texts": TEXTS}).json()["embeddings"]
    np.testing.assert_allclose([d["embedding"] for d in body["data"]], reference, atol=1e-6)

    # base64 = the little-endian float32 bytes of the same vector (same request: bit-identical)
    request = {"input": TEXT, "rho": 0.3}
    floats = client.post("/v1/embeddings", json=request).json()["data"][0]["embedding"]
    packed = client.post("/v1/embeddings", json={**request, "encoding_format": "base64"})
    vector = np.frombuffer(base64.b64decode(packed.json()["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_array_equal(vector, np.asarray(floats, dtype=np.float32))


def test_openai_is_always_normalised_and_dimensions_equal_is_accepted(client: TestClient) -> None:
    body = {"input": TEXTS, "model": MODEL, "dimensions": TINY_HIDDEN, "user": "someone"}
    response = client.post("/v1/embeddings", json=body)
    assert response.status_code == 200, response.text
    vectors = [d["embedding"] for d in response.json()["data"]]
    assert norms(vectors) == pytest.approx([1.0] * len(TEXTS), abs=1e-5)
    # long input: prompt_tokens counts the tokens the encoder read (after truncation)
    usage = client.post("/v1/embeddings", json={"input": "word " * 200}).json()["usage"]
    assert usage["truncated"] is True and usage["prompt_tokens"] == TINY_MAX_LENGTH < usage["input_tokens"]


def test_metrics_of_both_endpoints(models_root: Path) -> None:
    with running(settings_for(models_root)) as (_, client):
        before = client.get("/metrics").text
        embed = {"endpoint": "embed", "task": "embedding"}
        openai_route = {"endpoint": "v1/embeddings", "task": "embedding"}
        for labels in (embed, openai_route):
            assert value(before, "retention_requests_total", **labels, status_class="2xx") == 0
            assert value(before, "retention_input_tokens_count", **labels) == 0
            assert value(before, "retention_degraded_requests_total", **labels) == 0
        client.post("/embed?rho=0.3", json={"texts": TEXTS})
        client.post("/v1/embeddings", json={"input": TEXT, "rho": "auto"})
        client.post("/v1/embeddings", json={"input": TEXT, "dimensions": 3})
        after = client.get("/metrics").text
        assert value(after, "retention_requests_total", **embed, status_class="2xx") == 1
        assert value(after, "retention_requests_total", **openai_route, status_class="2xx") == 1
        assert value(after, "retention_requests_total", **openai_route, status_class="4xx") == 1
        assert value(after, "retention_requested_rho_count", **embed) == 1
        assert value(after, "retention_requested_rho_count", **openai_route) == 0  # auto
        assert value(after, "retention_effective_rho_count", **openai_route) == 1
        assert value(after, "retention_input_tokens_count", **embed) == 1
        assert value(after, "retention_batch_size_count", model=MODEL) >= 1
        assert value(after, "retention_token_layers_saved_total", model=MODEL, task="embedding") > 0
        assert value(after, "retention_rejections_total", reason="invalid") == 1


def test_openapi_documents_both_routes(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    assert "/embed" in paths and "/v1/embeddings" in paths
    v1 = paths["/v1/embeddings"]["post"]["responses"]
    assert v1["404"]["content"]["application/json"]["schema"]["$ref"].endswith("/OpenAIErrorBody")
    embed = paths["/embed"]["post"]["responses"]
    assert embed["404"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorBody")


# ------------------------------------------------------------------------ the real openai client, live
@pytest.fixture(scope="module")
def live_url(models_root: Path) -> Iterator[str]:
    with served(settings_for(models_root)) as url:
        yield url


@pytest.fixture(scope="module")
def openai_client(live_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{live_url}/v1", api_key="unused", max_retries=0, timeout=30)


def test_openai_client_float_and_base64_equal_embed(openai_client: openai.OpenAI, live_url: str) -> None:
    floats = openai_client.embeddings.create(
        model=MODEL, input=TEXTS, encoding_format="float", extra_body={"rho": 0.3}
    )
    packed = openai_client.embeddings.create(model=MODEL, input=TEXTS, extra_body={"rho": 0.3})  # base64
    reference = httpx.post(f"{live_url}/embed", json={"texts": TEXTS, "rho": 0.3}, timeout=30).json()
    assert floats.model == packed.model == MODEL
    assert [d.index for d in floats.data] == [d.index for d in packed.data] == list(range(len(TEXTS)))
    for as_float, as_base64, expected in zip(floats.data, packed.data, reference["embeddings"], strict=True):
        assert len(as_float.embedding) == len(as_base64.embedding) == TINY_HIDDEN
        np.testing.assert_allclose(as_float.embedding, expected, atol=1e-6)
        np.testing.assert_allclose(as_base64.embedding, expected, atol=1e-6)
    assert floats.usage.prompt_tokens == floats.usage.total_tokens == reference["usage"]["processed_tokens"]
    extra = floats.usage.model_extra or {}
    assert extra["rho_effective"] == pytest.approx(0.3)
    assert extra["token_work_fraction"] == reference["usage"]["token_work_fraction"]


def test_openai_client_rho_in_the_query(openai_client: openai.OpenAI) -> None:
    raw = openai_client.embeddings.with_raw_response.create(
        model=MODEL, input=TEXT, extra_query={"rho": "0.3"}
    )
    assert float(raw.headers["x-rho-effective"]) == pytest.approx(0.3)
    by_query = raw.parse()
    by_body = openai_client.embeddings.create(model=MODEL, input=TEXT, extra_body={"rho": 0.3})
    np.testing.assert_allclose(by_query.data[0].embedding, by_body.data[0].embedding, atol=1e-6)
    dense = openai_client.embeddings.create(model=MODEL, input=TEXT, extra_body={"rho": 1.0})
    assert (dense.usage.model_extra or {})["token_work_fraction"] == 1.0
    assert (by_query.usage.model_extra or {})["token_work_fraction"] < 1.0
    auto = openai_client.embeddings.create(
        model=MODEL, input=TEXT, extra_body={"rho": "auto", "min_rho": 0.2}
    )
    assert (auto.usage.model_extra or {})["rho_requested"] == "auto"


def test_openai_client_errors(openai_client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        openai_client.embeddings.create(model="no-such-model", input=TEXT)
    assert missing.value.code == "model_not_found" and missing.value.type == "invalid_request_error"
    with pytest.raises(openai.BadRequestError) as dims:
        openai_client.embeddings.create(model=MODEL, input=TEXT, dimensions=TINY_HIDDEN + 1)
    assert dims.value.param == "dimensions" and dims.value.code == "unsupported_value"
    with pytest.raises(openai.UnprocessableEntityError) as tokens:
        openai_client.embeddings.create(model=MODEL, input=[[101, 2023, 102]])
    assert tokens.value.param == "input" and "token arrays" in tokens.value.message
    with pytest.raises(openai.UnprocessableEntityError):
        openai_client.embeddings.create(model=MODEL, input="")
    accepted = openai_client.embeddings.create(model=MODEL, input=TEXT, dimensions=TINY_HIDDEN)
    assert len(accepted.data[0].embedding) == TINY_HIDDEN


def test_openai_client_with_an_api_key(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    root = copy_models(tiny_models, tmp_path / "models", ("embedding",))
    with served(settings_for(root, api_key="s3cret")) as url:
        keyed = openai.OpenAI(base_url=f"{url}/v1", api_key="s3cret", max_retries=0, timeout=30)
        assert len(keyed.embeddings.create(model=MODEL, input=TEXT).data) == 1
        wrong = openai.OpenAI(base_url=f"{url}/v1", api_key="nope", max_retries=0, timeout=30)
        with pytest.raises(openai.AuthenticationError) as denied:
            wrong.embeddings.create(model=MODEL, input=TEXT)
        assert denied.value.type == "authentication_error" and denied.value.code == "unauthorized"


def test_a_manifest_that_misstates_the_vector_size_is_not_loaded(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(tiny_models["embedding"], broken)
    manifest = json.loads((broken / "manifest.json").read_text())
    manifest["embedding"]["dimensions"] = TINY_HIDDEN + 1
    (broken / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ModelLoadError, match=f"graph gives {TINY_HIDDEN}-dimensional vectors"):
        load_model(broken, settings_for(tmp_path))


# ------------------------------------------------------------------------- the source model's names
SOURCE_HUB_ID = "sentence-transformers/all-MiniLM-L6-v2"  # the tiny model's recipe names MiniLM's backbone


def test_an_embedding_retrofit_answers_to_its_source_models_names(client: TestClient) -> None:
    """A user's OpenAI client keeps its model=... : the hub id and the short name of the model the
    retrofit was made from route to it."""
    by_name = client.post("/v1/embeddings", json={"input": TEXT, "model": MODEL, "rho": 1.0})
    assert by_name.status_code == 200, by_name.text
    for alias in (SOURCE_HUB_ID, "all-MiniLM-L6-v2"):
        response = client.post("/v1/embeddings", json={"input": TEXT, "model": alias, "rho": 1.0})
        assert response.status_code == 200, response.text
        assert response.json()["model"] == MODEL
        assert response.json()["data"][0]["embedding"] == by_name.json()["data"][0]["embedding"]
    assert client.get("/models").json()["aliases"][SOURCE_HUB_ID] == MODEL


def test_a_source_name_two_models_claim_routes_to_neither(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    root = copy_models(tiny_models, tmp_path / "models", ("embedding",))
    twin = root / "tiny-embedding-twin"
    shutil.copytree(root / "tiny-embedding", twin)
    manifest = Manifest.read(twin)
    manifest.name = "tiny-embedding-twin"
    manifest.write(twin)
    with running(settings_for(root)) as (_, client):
        for name in (MODEL, "tiny-embedding-twin"):
            assert client.post("/v1/embeddings", json={"input": TEXT, "model": name}).status_code == 200
        ambiguous = client.post("/v1/embeddings", json={"input": TEXT, "model": SOURCE_HUB_ID})
        assert_openai_error(ambiguous, 404, "model_not_found", "invalid_request_error")
