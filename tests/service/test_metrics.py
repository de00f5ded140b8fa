"""Every metric the dashboards use exists (labelled series from startup) and moves with traffic."""

from __future__ import annotations

from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from service.metrics import Metrics
from tests.service.conftest import running, settings_for

NAMES = {
    "retention_requests_total": "counter",
    "retention_request_duration_seconds": "histogram",
    "retention_queue_duration_seconds": "histogram",
    "retention_inference_duration_seconds": "histogram",
    "retention_queue_depth": "gauge",
    "retention_in_flight_requests": "gauge",
    "retention_rejections_total": "counter",
    "retention_batch_size": "histogram",
    "retention_batch_tokens": "histogram",
    "retention_input_tokens": "histogram",
    "retention_requested_rho": "histogram",
    "retention_effective_rho": "histogram",
    "retention_token_layers_computed_total": "counter",
    "retention_token_layers_saved_total": "counter",
    "retention_degraded_requests_total": "counter",
    "retention_process_resident_memory_bytes": "gauge",
    "retention_activation_memory_estimate_bytes": "histogram",
    "retention_model_info": "gauge",
}
MODELS = ("tiny-classification", "tiny-qa", "tiny-summarization", "tiny-embedding")


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def families(text: str) -> dict[str, str]:
    found = {}
    for family in text_string_to_metric_families(text):
        name = family.name + ("_total" if family.type == "counter" else "")
        found[name] = family.type
    return found


def value(text: str, name: str, **labels: str) -> float:
    return samples(text).get((name, tuple(sorted(labels.items()))), float("nan"))


def test_metrics_exist_before_and_after_traffic(models_root: Path) -> None:
    with running(settings_for(models_root)) as (_, client):
        before = client.get("/metrics").text
        assert {name: kind for name, kind in families(before).items() if name in NAMES} == NAMES
        # labelled series exist at 0 before any inference traffic
        assert value(before, "retention_requests_total", endpoint="classify", status_class="5xx") == 0
        for endpoint in ("classify", "qa", "summarize", "embed", "v1/embeddings"):
            assert value(before, "retention_degraded_requests_total", endpoint=endpoint) == 0
            assert value(before, "retention_input_tokens_count", endpoint=endpoint) == 0
        for reason in (
            "queue_full",
            "deadline",
            "payload_too_large",
            "input_too_long",
            "unauthorized",
            "invalid",
        ):
            assert value(before, "retention_rejections_total", reason=reason) == 0
        for model in MODELS:
            assert value(before, "retention_queue_depth", model=model) == 0
            assert value(before, "retention_token_layers_saved_total", model=model) == 0
        info = [key for key in samples(before) if key[0] == "retention_model_info"]
        assert {dict(labels)["model"] for _, labels in info} == set(MODELS)
        assert dict(info[0][1]).keys() == {"model", "task", "backbone", "precision"}
        assert value(before, "retention_process_resident_memory_bytes") > 0
        assert 'retention_request_duration_seconds_bucket{endpoint="classify",le="0.5"} 0.0' in before

        client.post("/classify?rho=0.3", json={"text": "counting tokens"})
        client.post("/qa?rho=0.5", json={"question": "q?", "context": "some context here"})
        client.post("/summarize", json={"text": "One. Two. Three.", "rho": "auto"})
        client.post("/embed", json={"text": "a vector, please"})
        client.post("/classify?rho=2", json={"text": "x"})
        after = client.get("/metrics").text
        assert value(after, "retention_requests_total", endpoint="classify", status_class="2xx") == 1
        assert value(after, "retention_requests_total", endpoint="classify", status_class="4xx") == 1
        assert value(after, "retention_rejections_total", reason="invalid") == 1
        assert value(after, "retention_requested_rho_count", endpoint="classify") == 1
        assert value(after, "retention_requested_rho_bucket", endpoint="classify", le="0.3") == 1
        assert value(after, "retention_effective_rho_count", endpoint="summarize") == 1
        assert (
            value(after, "retention_requested_rho_count", endpoint="summarize") == 0
        )  # auto: no number asked
        for model in MODELS:
            assert value(after, "retention_batch_size_count", model=model) >= 1
            assert value(after, "retention_batch_tokens_count", model=model) >= 1
            assert value(after, "retention_queue_duration_seconds_count", model=model) >= 1
            assert value(after, "retention_inference_duration_seconds_count", model=model) >= 1
            assert value(after, "retention_token_layers_computed_total", model=model) > 0
            assert value(after, "retention_activation_memory_estimate_bytes_count", model=model) == 1
        assert value(after, "retention_token_layers_saved_total", model="tiny-classification") > 0
        assert value(after, "retention_in_flight_requests") == 1  # the /metrics request itself
        # rho is never a label
        assert all("rho" not in dict(labels) for _, labels in samples(after))


def test_each_app_has_its_own_registry() -> None:
    first, second = Metrics(), Metrics()
    first.rejections.labels(reason="invalid").inc()
    assert second.registry.get_sample_value("retention_rejections_total", {"reason": "invalid"}) in (
        None,
        0.0,
    )
