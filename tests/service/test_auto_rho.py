"""rho=auto: the server picks rho to hold a latency target, never below the client's min_rho."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.service.conftest import engine_of, running, settings_for

TEXT = "auto budget under pressure"


def test_auto_without_pressure_is_full_quality(client: TestClient) -> None:
    usage = client.post("/classify?rho=auto", json={"text": TEXT}).json()["usage"]
    assert usage["rho_requested"] == "auto" and usage["rho_effective"] == 1.0 and usage["degraded"] is False


@pytest.mark.parametrize("min_rho", [0.05, 0.25, 0.6])
def test_auto_under_pressure_never_goes_below_min_rho(models_root: Path, min_rho: float) -> None:
    # A target no batch can meet: every auto request is under pressure.
    with running(settings_for(models_root, auto_latency_target_s=1e-9)) as (_, client):
        for path, body in (
            (f"/classify?rho=auto&min_rho={min_rho}", {"text": TEXT}),
            ("/classify", {"text": TEXT, "rho": "auto", "min_rho": min_rho}),
            (f"/qa?rho=auto&min_rho={min_rho}", {"question": "what?", "context": TEXT}),
            (f"/summarize?rho=auto&min_rho={min_rho}", {"text": "One here. Two there."}),
        ):
            response = client.post(path, json=body)
            assert response.status_code == 200, response.text
            usage = response.json()["usage"]
            assert usage["rho_effective"] >= min_rho
            assert usage["rho_effective"] == pytest.approx(min_rho)
            assert usage["degraded"] is True and usage["min_rho"] == min_rho
            assert float(response.headers["x-rho-effective"]) == pytest.approx(min_rho)
        metrics = client.get("/metrics").text
        assert 'retention_degraded_requests_total{endpoint="classify"} 2.0' in metrics
        assert 'retention_degraded_requests_total{endpoint="qa"} 1.0' in metrics


def test_auto_controller_scales_with_estimated_latency(models_root: Path) -> None:
    with running(settings_for(models_root, auto_latency_target_s=0.1, auto_min_rho=0.2)) as (app, _):
        engine = engine_of(app)
        model = engine.get("tiny-classification")
        batcher = engine.batcher_of(model.name)
        batcher.batch_latency = 0.05  # observed latency of recent runs
        assert engine.auto_rho(model, 10, 0.2).rho == 1.0
        batcher.batch_latency = 0.4  # 4x over target
        choice = engine.auto_rho(model, 10, 0.2)
        assert choice.rho == pytest.approx(0.25) and choice.degraded
        batcher.batch_latency = 10.0
        assert engine.auto_rho(model, 10, 0.2).rho == 0.2
        assert engine.auto_rho(model, 10, 0.5).rho == 0.5
