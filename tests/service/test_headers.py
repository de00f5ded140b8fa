"""One rule for the headers the server reads, ``x-request-timeout`` and ``x-latency-target``: a positive
decimal number of seconds, anything else a 422 that names the header (never silently ignored)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

HEADERS = ("x-request-timeout", "x-latency-target")
JUNK = ("abc", "0", "-1", "inf", "nan", "1_0", "0x10", "", " ", "2 s")
TEXT = "headers are read by one rule"


@pytest.mark.parametrize("header", HEADERS)
@pytest.mark.parametrize("junk", JUNK)
def test_junk_in_either_header_is_a_422_naming_it(client: TestClient, header: str, junk: str) -> None:
    response = client.post("/classify?rho=auto", json={"text": TEXT}, headers={header: junk})
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_request"
    assert error["message"].startswith(f"{header} must be a positive number of seconds")
    # Under /v1/ the error takes OpenAI's shape, with the header as the field at fault.
    openai = client.post("/v1/embeddings", json={"input": TEXT}, headers={header: junk})
    assert openai.status_code == 422
    assert openai.json()["error"]["param"] == header


@pytest.mark.parametrize("header", HEADERS)
def test_a_number_of_seconds_in_either_header_is_served(client: TestClient, header: str) -> None:
    for value in ("30", "12.5", "1e1"):
        response = client.post("/classify", json={"text": TEXT}, headers={header: value})
        assert response.status_code == 200, response.text


def test_the_latency_target_header_sets_rho_auto_target_and_loses_to_max_latency_ms(
    client: TestClient,
) -> None:
    def target(path: str, body: dict[str, object]) -> float:
        response = client.post(path, json=body, headers={"x-latency-target": "0.5"})
        assert response.status_code == 200, response.text
        value: float = response.json()["usage"]["latency_target_s"]
        return value

    assert target("/classify?rho=auto", {"text": TEXT}) == pytest.approx(0.5)
    assert target("/classify?rho=auto&max_latency_ms=200", {"text": TEXT}) == pytest.approx(0.2)
    assert target("/classify?rho=auto&max_latency_ms=200", {"text": TEXT, "max_latency_ms": 300}) == (
        pytest.approx(0.3)
    )
    assert target("/classify", {"text": TEXT, "rho": 0.5}) is None  # a fixed rho has no target
