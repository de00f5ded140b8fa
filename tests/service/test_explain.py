"""``explain=true``: per-token survival depth with character offsets, on every explaining route, and a
clear 422 for a model directory exported before the graph reported it (which still loads and serves)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import onnx
import pytest
from fastapi.testclient import TestClient

from retention_core.contract import MANIFEST_FILE, MODEL_FILE, SURVIVAL_DEPTH
from tests.service.conftest import running, settings_for

TEXT = " ".join(f"word{i} alpha beta gamma delta" for i in range(4))  # ~30 tokens: under max_length
LONG_TEXT = " ".join(f"word{i} alpha beta gamma delta" for i in range(12))  # over it: truncated
NUM_LAYERS = 2  # training.tiny.TINY_LAYERS


def tokens_of(body: dict, index: int = 0) -> list[dict]:
    explanation = body["explanations"][index]
    assert explanation["num_layers"] == NUM_LAYERS
    tokens: list[dict] = explanation["tokens"]
    return tokens


def test_explain_is_off_by_default_and_on_by_query_or_body(client: TestClient) -> None:
    plain = client.post("/classify", json={"text": TEXT, "rho": 0.3}).json()
    assert plain["explanations"] is None
    by_query = client.post("/classify?explain=true", json={"text": TEXT, "rho": 0.3}).json()
    by_body = client.post("/classify?explain=true", json={"text": TEXT, "rho": 0.3, "explain": False})
    assert by_body.json()["explanations"] is None  # the body wins over the query parameter
    tokens = tokens_of(by_query)
    assert all(t["segment"] == "text" for t in tokens)
    # offsets cover the words of the text in order, and map back into it
    assert [t["start"] for t in tokens] == sorted(t["start"] for t in tokens)
    assert "".join(TEXT[t["start"] : t["end"]] for t in tokens) == TEXT.replace(" ", "")
    assert by_query["label"] == plain["label"]  # explaining changes nothing else


def test_a_truncated_text_explains_the_head_it_read(client: TestClient) -> None:
    body = client.post("/classify", json={"text": LONG_TEXT, "explain": True}).json()
    assert body["usage"]["truncated"]
    tokens = tokens_of(body)
    assert len(tokens) == 64 - 2  # max_length less [CLS] and [SEP]
    assert LONG_TEXT.replace(" ", "").startswith("".join(LONG_TEXT[t["start"] : t["end"]] for t in tokens))


def test_depths_follow_rho_and_match_the_kept_counts(client: TestClient) -> None:
    dense = tokens_of(client.post("/classify", json={"text": LONG_TEXT, "rho": 1.0, "explain": True}).json())
    assert all(t["depth"] == NUM_LAYERS for t in dense)
    body = client.post("/classify", json={"text": LONG_TEXT, "rho": 0.2, "explain": True}).json()
    tokens = tokens_of(body)
    kept = body["usage"]["kept_tokens_per_layer"]
    # kept_tokens_per_layer[p] counts the tokens entering layer p, [CLS] and [SEP] included: the
    # text tokens with depth > p, plus the special tokens that entered it.
    for layer, count in enumerate(kept):
        text_tokens = sum(t["depth"] > layer for t in tokens)
        assert count - 2 <= text_tokens <= count, (layer, count, text_tokens)
    assert min(t["depth"] for t in tokens) < NUM_LAYERS  # something was dropped at rho 0.2


def test_qa_protects_the_question_and_points_into_both_texts(client: TestClient) -> None:
    question, context = "who wrote it?", LONG_TEXT
    body = client.post(
        "/qa", json={"question": question, "context": context, "rho": 0.2, "explain": True}
    ).json()
    tokens = tokens_of(body)
    in_question = [t for t in tokens if t["segment"] == "question"]
    in_context = [t for t in tokens if t["segment"] == "context"]
    assert in_question and in_context
    assert all(t["depth"] == NUM_LAYERS for t in in_question)  # protected: never dropped
    assert "".join(question[t["start"] : t["end"]] for t in in_question) == question.replace(" ", "")
    assert min(t["depth"] for t in in_context) < NUM_LAYERS


def test_embed_and_summarize_explain(client: TestClient) -> None:
    embedded = client.post("/embed", json={"texts": ["one two three", LONG_TEXT], "explain": True}).json()
    assert len(embedded["explanations"]) == 2
    assert len(tokens_of(embedded, 1)) > len(tokens_of(embedded, 0))
    sentences = ["The first sentence is here.", "A second one follows it.", "And a third closes."]
    summary = client.post("/summarize?explain=true", json={"sentences": sentences, "rho": 0.5}).json()
    explanation = summary["explanations"][0]
    assert explanation["document"] == " ".join(sentences)
    assert {t["segment"] for t in explanation["tokens"]} == {"document"}


def test_openai_embeddings_take_no_explain(client: TestClient) -> None:
    response = client.post("/v1/embeddings", json={"input": "hello", "explain": True})
    assert response.status_code == 422
    schema = client.get("/openapi.json").json()
    parameters = schema["paths"]["/v1/embeddings"]["post"].get("parameters", [])
    assert "explain" not in {p["name"] for p in parameters}
    classify = schema["paths"]["/classify"]["post"]
    assert "explain" in {p["name"] for p in classify["parameters"]}
    assert "Explanation" in schema["components"]["schemas"]


def strip_survival_depth(model_dir: Path) -> None:
    """Make ``model_dir`` what the exporter wrote before survival depth existed: the graph ends at
    kept_counts and the manifest says so."""
    graph = onnx.load(str(model_dir / MODEL_FILE))
    kept = [output for output in graph.graph.output if output.name != SURVIVAL_DEPTH.name]
    del graph.graph.output[:]
    graph.graph.output.extend(kept)
    onnx.save(graph, str(model_dir / MODEL_FILE))
    manifest = json.loads((model_dir / MANIFEST_FILE).read_text())
    manifest["outputs"] = [o for o in manifest["outputs"] if o["name"] != SURVIVAL_DEPTH.name]
    (model_dir / MANIFEST_FILE).write_text(json.dumps(manifest))


@pytest.mark.parametrize("task", ["classification", "qa"])
def test_a_model_exported_before_survival_depth_serves_without_explain(
    tiny_models: dict[str, Path], tmp_path: Path, task: str
) -> None:
    root = tmp_path / "models"
    shutil.copytree(tiny_models[task], root / "old")
    strip_survival_depth(root / "old")
    route, body = (
        ("/classify", {"text": LONG_TEXT})
        if task == "classification"
        else ("/qa", {"question": "what?", "context": LONG_TEXT})
    )
    with running(settings_for(root)) as (_, client):
        served = client.post(route, json={**body, "rho": 0.3})
        assert served.status_code == 200, served.text
        assert served.json()["explanations"] is None
        refused = client.post(route, json={**body, "rho": 0.3, "explain": True})
        assert refused.status_code == 422
        assert refused.json()["error"]["code"] == "explain_unavailable"
        listed = client.get("/models").json()["models"]
        assert [m["explain"] for m in listed] == [False]
