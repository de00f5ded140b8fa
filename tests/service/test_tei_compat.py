"""TEI (Hugging Face text-embeddings-inference) clients against this server, unchanged but for the URL:
``huggingface_hub.InferenceClient`` against a live server on the tiny embedding model (vectors equal to
/v1/embeddings', rho through the URL, normalize, list input, /info, /health), TEI's bodies on /embed beside
ours, /tokenize against the model's own tokenizer, and every bad body a clear 4xx in this server's error
shape. Nothing is mocked: real exported models, onnxruntime, tokenizer and uvicorn."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from huggingface_hub import InferenceClient
from huggingface_hub.errors import HfHubHTTPError
from tokenizers import Tokenizer

from retention_core.contract import Manifest
from service.api.app import task_paths
from service.api.faces import EMBEDDING
from service.api.routers.tei_compat import TEI_EMBED_PATH
from service.settings import Settings
from tests.service.conftest import served, settings_for
from tests.service.test_metrics import value
from tests.tiny import TINY_HIDDEN, TINY_MAX_LENGTH

MODEL = "tiny-embedding"
TEXT = "the film was a delight from start to finish"
TEXTS = [TEXT, "a short one", "retention keeps the tokens that matter and drops the rest"]
LONG_TEXT = "word " * 200  # past the tiny model's max_length
API_KEY = "tei-s3cret"
# Every field TEI's openapi.json requires of GET /info (text-embeddings-inference 1.9, docs/openapi.json)
TEI_INFO_REQUIRED = {
    "model_id",
    "model_dtype",
    "served_model_name",
    "model_type",
    "max_concurrent_requests",
    "max_input_length",
    "max_batch_tokens",
    "max_client_batch_size",
    "auto_truncate",
    "tokenization_workers",
    "version",
}


@pytest.fixture(autouse=True)
def hub_online(monkeypatch: pytest.MonkeyPatch) -> None:
    """huggingface_hub refuses every request while HF_HUB_OFFLINE=1 (read once, at import), even to a
    local server; `make test` sets it for transformers. A TEI user's client runs online."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)


@pytest.fixture(scope="module")
def live_url(models_root: Path) -> Iterator[str]:
    with served(settings_for(models_root)) as url:
        yield url


def hub_client(url: str, **options: Any) -> InferenceClient:
    """What a TEI user writes, with this server's URL (``?rho=...`` may ride on it)."""
    return InferenceClient(base_url=url, timeout=30, **options)


def openai_vectors(url: str, inputs: str | list[str], rho: float) -> np.ndarray:
    """The same texts through this server's OpenAI-compatible route: the reference vectors."""
    response = httpx.post(f"{url}/v1/embeddings", json={"input": inputs, "rho": rho}, timeout=30)
    assert response.status_code == 200, response.text
    return np.asarray([item["embedding"] for item in response.json()["data"]], dtype=np.float32)


def assert_our_error(response: httpx.Response, status: int, code: str) -> str:
    """A 4xx in this server's error shape (``service.errors``), never a stack trace; its message."""
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code and error["message"], response.text
    assert "Traceback" not in response.text and "/work/" not in response.text
    return str(error["message"])


# ------------------------------------------------------------------ huggingface_hub.InferenceClient
def test_feature_extraction_at_rho_one_equals_the_openai_route(live_url: str) -> None:
    vectors = hub_client(f"{live_url}/?rho=1").feature_extraction(TEXT)
    assert vectors.shape == (1, TINY_HIDDEN) and vectors.dtype == np.float32
    np.testing.assert_allclose(vectors, openai_vectors(live_url, TEXT, rho=1.0), atol=1e-6)
    assert np.linalg.norm(vectors[0]) == pytest.approx(1.0, abs=1e-5)  # TEI's default: normalised


def test_rho_rides_on_the_url(live_url: str) -> None:
    pruned = hub_client(f"{live_url}/?rho=0.3").feature_extraction(TEXT)
    np.testing.assert_allclose(pruned, openai_vectors(live_url, TEXT, rho=0.3), atol=1e-6)
    dense = hub_client(f"{live_url}/?rho=1").feature_extraction(TEXT)
    assert not np.allclose(pruned, dense, atol=1e-4)  # the budget reached the graph


def test_list_input_is_one_vector_per_text_in_order(live_url: str) -> None:
    client = hub_client(f"{live_url}/?rho=1")
    vectors = client.feature_extraction(TEXTS)
    assert vectors.shape == (len(TEXTS), TINY_HIDDEN)
    np.testing.assert_allclose(vectors, openai_vectors(live_url, TEXTS, rho=1.0), atol=1e-6)
    np.testing.assert_allclose(vectors[:1], client.feature_extraction(TEXT), atol=1e-6)  # batched == alone
    assert not np.allclose(vectors[0], vectors[1], atol=1e-3)


def test_normalize_false_differs_only_by_scale(live_url: str) -> None:
    client = hub_client(live_url)
    raw = client.feature_extraction(TEXT, normalize=False)[0]
    unit = client.feature_extraction(TEXT, normalize=True)[0]
    length = float(np.linalg.norm(raw))
    assert abs(length - 1.0) > 1e-3  # a random tiny model's pooled state is not a unit vector
    np.testing.assert_allclose(raw / length, unit, atol=1e-5)


def test_the_tei_options_a_client_sends_are_served(live_url: str) -> None:
    client = hub_client(live_url)
    plain = client.feature_extraction(TEXT)
    spelled_out = client.feature_extraction(
        TEXT, truncate=True, truncation_direction="right", dimensions=TINY_HIDDEN
    )
    np.testing.assert_allclose(spelled_out, plain, atol=1e-6)
    cut = client.feature_extraction(LONG_TEXT, truncate=True)
    assert cut.shape == (1, TINY_HIDDEN)
    with pytest.raises(HfHubHTTPError) as refused:
        client.feature_extraction(LONG_TEXT, truncate=False)
    assert_our_error(refused.value.response, 413, "input_too_long")


@pytest.mark.parametrize(
    "options,status,code,says",
    [
        ({"prompt_name": "query"}, 422, "invalid_request", "prompt_name is not supported"),
        ({"truncation_direction": "left"}, 422, "invalid_request", "'left' is not supported"),
        ({"dimensions": 7}, 400, "unsupported_value", f"must be {TINY_HIDDEN}"),
        ({"encoding_format": "base64"}, 422, "invalid_request", "encoding_format"),
    ],
)
def test_what_the_client_may_ask_and_cannot_be_served_is_a_clear_4xx(
    live_url: str, options: dict[str, Any], status: int, code: str, says: str
) -> None:
    with pytest.raises(HfHubHTTPError) as refused:
        hub_client(live_url).feature_extraction(TEXT, **options)
    assert says in assert_our_error(refused.value.response, status, code)


def test_endpoint_info_and_health_through_the_client(live_url: str, models_root: Path) -> None:
    # huggingface_hub asks /info and /health only of its own provider (it names none for a bare URL)
    client = hub_client(live_url, provider="hf-inference")
    info = client.get_endpoint_info()
    assert set(info) >= TEI_INFO_REQUIRED
    manifest = Manifest.read(models_root / MODEL)
    assert manifest.embedding is not None
    assert info["model_id"] == info["served_model_name"] == MODEL
    assert info["model_type"] == {"embedding": {"pooling": manifest.embedding.pooling}}
    assert info["max_input_length"] == manifest.max_length == TINY_MAX_LENGTH
    assert info["max_client_batch_size"] == Settings().max_embedding_inputs
    assert info["max_batch_tokens"] == Settings().max_batch_tokens
    assert (info["model_dtype"], info["auto_truncate"]) == ("float32", True)
    assert info["tokenization_workers"] >= 1 and info["version"]
    assert client.health_check() is True


# ------------------------------------------------------------------ TEI's bodies over plain HTTP
def test_embed_reads_both_shapes(live_url: str) -> None:
    tei = httpx.post(f"{live_url}/embed", json={"inputs": TEXTS, "rho": 0.3}, timeout=30)
    assert tei.status_code == 200, tei.text
    assert float(tei.headers["x-rho-effective"]) == pytest.approx(0.3)  # the same pipeline's headers
    ours = httpx.post(f"{live_url}/embed", json={"texts": TEXTS, "rho": 0.3}, timeout=30)
    assert ours.status_code == 200, ours.text
    body = ours.json()  # existing clients: our shape, unchanged
    assert set(body) == {"model", "embedding", "embeddings", "usage", "explanations"}
    assert body["model"] == MODEL and body["usage"]["rho_effective"] == pytest.approx(0.3)
    np.testing.assert_allclose(tei.json(), body["embeddings"], atol=1e-6)
    root = httpx.post(f"{live_url}{TEI_EMBED_PATH}?rho=0.3", json={"inputs": TEXTS}, timeout=30)
    assert root.status_code == 200, root.text
    np.testing.assert_allclose(root.json(), tei.json(), atol=1e-6)


def test_tei_requests_are_counted_as_embedding_inference(live_url: str) -> None:
    def counts() -> tuple[float, float]:
        text = httpx.get(f"{live_url}/metrics", timeout=30).text
        labels = {"endpoint": "root", "task": EMBEDDING}
        return (
            value(text, "retention_requests_total", **labels, status_class="2xx"),
            value(text, "retention_input_tokens_count", **labels),
        )

    before = counts()
    assert httpx.post(f"{live_url}/", json={"inputs": TEXT}, timeout=30).status_code == 200
    after = counts()
    assert after[0] == before[0] + 1 and after[1] == before[1] + 1
    assert task_paths()[TEI_EMBED_PATH] == EMBEDDING  # early refusal knows the route's task


BAD_TEI_BODIES = [
    ({"inputs": ""}, 422, "invalid_request"),
    ({"inputs": []}, 422, "invalid_request"),
    ({"inputs": ["fine", ""]}, 422, "invalid_request"),
    ({"inputs": [101, 2023, 102]}, 422, "invalid_request"),
    ({"inputs": None}, 422, "invalid_request"),
    ({"inputs": TEXT, "normalize": "yes"}, 422, "invalid_request"),
    ({"inputs": TEXT, "normalize": None}, 422, "invalid_request"),
    ({"inputs": TEXT, "truncate": 0}, 422, "invalid_request"),
    ({"inputs": TEXT, "truncation_direction": "up"}, 422, "invalid_request"),
    ({"inputs": TEXT, "dimensions": 0}, 422, "invalid_request"),
    ({"inputs": TEXT, "dimensions": 7}, 400, "unsupported_value"),
    ({"inputs": TEXT, "rho": 1.5}, 422, "invalid_request"),
    ({"inputs": TEXT, "explain": True}, 422, "invalid_request"),
    ({"inputs": TEXT, "model": MODEL}, 422, "invalid_request"),
    ({"inputs": ["a"] * (Settings().max_embedding_inputs + 1)}, 413, "payload_too_large"),
    ({}, 422, "invalid_request"),
    ([TEXT], 422, "invalid_request"),
]


@pytest.mark.parametrize("path", ["/embed", TEI_EMBED_PATH])
@pytest.mark.parametrize("body,status,code", BAD_TEI_BODIES)
def test_bad_tei_bodies_are_clear_4xx(live_url: str, path: str, body: Any, status: int, code: str) -> None:
    assert_our_error(httpx.post(f"{live_url}{path}", json=body, timeout=30), status, code)


@pytest.mark.parametrize(
    "query,body,status,code,says",
    [
        ("", {"inputs": TEXT, "text": TEXT}, 422, "invalid_request", "not both"),
        ("", {"inputs": TEXT, "texts": TEXTS}, 422, "invalid_request", "not both"),
        ("", {}, 422, "invalid_request", "'inputs'"),
        ("?explain=true", {"inputs": TEXT}, 422, "invalid_request", "explain is not available"),
        ("?model=tiny-classification", {"inputs": TEXT}, 422, "task_mismatch", "classification"),
        ("?model=nope", {"inputs": TEXT}, 404, "model_not_found", "nope"),
    ],
)
def test_embed_says_which_shape_it_wants(
    live_url: str, query: str, body: dict[str, Any], status: int, code: str, says: str
) -> None:
    response = httpx.post(f"{live_url}/embed{query}", json=body, timeout=30)
    assert says in assert_our_error(response, status, code)


def test_our_bad_bodies_keep_their_errors(live_url: str) -> None:
    """An existing client's mistakes are reported where they were (no union tag in the location)."""
    response = httpx.post(f"{live_url}/embed", json={"text": ""}, timeout=30)
    assert_our_error(response, 422, "invalid_request")
    assert response.json()["error"]["details"][0]["loc"] == ["body", "text"]
    both = httpx.post(f"{live_url}/embed", json={"text": TEXT, "texts": TEXTS}, timeout=30)
    assert "exactly one of 'text' or 'texts'" in assert_our_error(both, 422, "invalid_request")


# ------------------------------------------------------------------ /tokenize
def test_tokenize_answers_tei_tokens_from_the_models_tokenizer(live_url: str, models_root: Path) -> None:
    tokenizer = Tokenizer.from_file(str(models_root / MODEL / "tokenizer.json"))
    texts = ["héllo wörld, the film", "ab"]
    response = httpx.post(f"{live_url}/tokenize", json={"inputs": texts}, timeout=30)
    assert response.status_code == 200, response.text
    answered = response.json()
    assert len(answered) == len(texts)
    for text, tokens in zip(texts, answered, strict=True):
        assert [token["id"] for token in tokens] == tokenizer.encode(text).ids
        first, *inner, last = tokens
        for special in (first, last):  # [CLS] ... [SEP]: their own text, no offsets
            assert special["special"] is True and special["start"] is None and special["stop"] is None
        assert (first["text"], last["text"]) == ("[CLS]", "[SEP]")
        encoded = text.encode()
        for token in inner:  # TEI's offsets: UTF-8 bytes of the input
            assert token["special"] is False
            assert encoded[token["start"] : token["stop"]].decode() == token["text"]
    assert answered[0][1]["text"] == "héllo" and answered[0][2]["start"] == len("héllo ".encode())


def test_tokenize_single_input_without_special_tokens_is_not_cut(live_url: str) -> None:
    response = httpx.post(
        f"{live_url}/tokenize", json={"inputs": LONG_TEXT, "add_special_tokens": False}, timeout=30
    )
    assert response.status_code == 200, response.text
    (tokens,) = response.json()
    assert len(tokens) == 200 > TINY_MAX_LENGTH and not any(token["special"] for token in tokens)


@pytest.mark.parametrize(
    "body,status,code",
    [
        ({"inputs": []}, 422, "invalid_request"),
        ({"inputs": ""}, 422, "invalid_request"),
        ({"inputs": [7, 8]}, 422, "invalid_request"),
        ({"inputs": TEXT, "add_special_tokens": "no"}, 422, "invalid_request"),
        ({"inputs": TEXT, "prompt_name": "query"}, 422, "invalid_request"),
        ({"inputs": TEXT, "texts": [TEXT]}, 422, "invalid_request"),
        ({"inputs": ["a"] * (Settings().max_embedding_inputs + 1)}, 413, "payload_too_large"),
    ],
)
def test_bad_tokenize_bodies_are_clear_4xx(
    live_url: str, body: dict[str, Any], status: int, code: str
) -> None:
    assert_our_error(httpx.post(f"{live_url}/tokenize", json=body, timeout=30), status, code)


def test_info_and_tokenize_name_only_embedding_models(live_url: str) -> None:
    for method, path, body in (("GET", "/info", None), ("POST", "/tokenize", {"inputs": TEXT})):
        other = httpx.request(method, f"{live_url}{path}?model=tiny-qa", json=body, timeout=30)
        assert_our_error(other, 422, "task_mismatch")
        missing = httpx.request(method, f"{live_url}{path}?model=nope", json=body, timeout=30)
        assert_our_error(missing, 404, "model_not_found")


# ------------------------------------------------------------------ with an API key
def test_a_keyed_server_takes_the_clients_api_key(models_root: Path) -> None:
    with served(settings_for(models_root, api_key=API_KEY)) as url:
        assert hub_client(url, api_key=API_KEY).feature_extraction(TEXT).shape == (1, TINY_HIDDEN)
        info = hub_client(url, api_key=API_KEY, provider="hf-inference").get_endpoint_info()
        assert info["model_id"] == MODEL
        with pytest.raises(HfHubHTTPError) as refused:
            hub_client(url).feature_extraction(TEXT)
        assert_our_error(refused.value.response, 401, "unauthorized")
        for method, path, body in (("GET", "/info", None), ("POST", "/tokenize", {"inputs": TEXT})):
            anonymous = httpx.request(method, f"{url}{path}", json=body, timeout=30)
            assert_our_error(anonymous, 401, "unauthorized")
        assert hub_client(url, provider="hf-inference").health_check() is True  # probes need no key
