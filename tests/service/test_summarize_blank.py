"""/summarize answers every text its schema accepts: a text of whitespace only (which the sentence
splitter finds no sentence in) used to be a 422 "the document has no sentences" (schemathesis, ST202)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient


@pytest.mark.parametrize("text", ["\u00a0", " \u2028 ", "\t"])
def test_a_whitespace_only_text_is_answered_with_an_empty_summary(client: TestClient, text: str) -> None:
    response = client.post("/summarize", json={"text": text, "max_sentences": 1})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["summary"] == "" and body["sentences"] == []  # nothing to select in blank text
    assert body["usage"]["rows"] == 1
