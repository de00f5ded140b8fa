"""Every metric the dashboards use exists (labelled series from startup) and moves with traffic."""

from __future__ import annotations

import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from retention_core.tasks import TASKS
from service.api.app import create_app
from service.metrics import Metrics
from tests.service.conftest import running, settings_for, wait_until

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
    "retention_event_loop_lag_seconds": "histogram",
    "retention_activation_memory_estimate_bytes": "histogram",
    "retention_model_info": "gauge",
    "retention_model_memory_bytes": "gauge",
}
MODELS = ("tiny-classification", "tiny-qa", "tiny-summarization", "tiny-embedding")
# endpoint label -> the task label of its requests
ROUTE_TASKS = {
    "classify": "classification",
    "qa": "qa",
    "summarize": "summarization",
    "embed": "embedding",
    "v1/embeddings": "embedding",
}


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


def task_of(model: str) -> str:
    """The task of one of the tiny models ("tiny-<task>")."""
    return model.removeprefix("tiny-")


def test_metrics_exist_before_and_after_traffic(models_root: Path) -> None:
    with running(settings_for(models_root)) as (_, client):
        before = client.get("/metrics").text
        assert {name: kind for name, kind in families(before).items() if name in NAMES} == NAMES
        # labelled series exist at 0 before any inference traffic
        classify = {"endpoint": "classify", "task": "classification"}
        assert value(before, "retention_requests_total", **classify, status_class="5xx") == 0
        for endpoint, task in ROUTE_TASKS.items():
            assert value(before, "retention_degraded_requests_total", endpoint=endpoint, task=task) == 0
            assert value(before, "retention_input_tokens_count", endpoint=endpoint, task=task) == 0
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
            saved = value(before, "retention_token_layers_saved_total", model=model, task=task_of(model))
            assert saved == 0
        info = [key for key in samples(before) if key[0] == "retention_model_info"]
        assert {dict(labels)["model"] for _, labels in info} == set(MODELS)
        assert dict(info[0][1]).keys() == {"model", "task", "backbone", "precision"}
        assert value(before, "retention_process_resident_memory_bytes") > 0
        # what each model costs to hold: every loaded model has its series, and loading them grew the
        # process (the first session alone maps onnxruntime's buffers)
        per_model = [value(before, "retention_model_memory_bytes", model=model) for model in MODELS]
        assert all(bytes_ >= 0 for bytes_ in per_model) and sum(per_model) > 0
        bucket = (
            'retention_request_duration_seconds_bucket{endpoint="classify",le="0.5",task="classification"}'
        )
        assert f"{bucket} 0.0" in before

        client.post("/classify?rho=0.3", json={"text": "counting tokens"})
        client.post("/qa?rho=0.5", json={"question": "q?", "context": "some context here"})
        client.post("/summarize", json={"text": "One. Two. Three.", "rho": "auto"})
        client.post("/embed", json={"text": "a vector, please"})
        client.post("/classify?rho=2", json={"text": "x"})
        # a batch is counted when it ends, which may be just after its answers went out
        wait_until(
            lambda: all(
                value(client.get("/metrics").text, "retention_batch_size_count", model=model) >= 1
                for model in MODELS
            ),
            what="every model's batch counted",
        )
        after = client.get("/metrics").text
        assert value(after, "retention_requests_total", **classify, status_class="2xx") == 1
        assert value(after, "retention_requests_total", **classify, status_class="4xx") == 1
        assert value(after, "retention_rejections_total", reason="invalid") == 1
        assert value(after, "retention_requested_rho_count", **classify) == 1
        assert value(after, "retention_requested_rho_bucket", **classify, le="0.3") == 1
        summarize = {"endpoint": "summarize", "task": "summarization"}
        assert value(after, "retention_effective_rho_count", **summarize) == 1
        assert value(after, "retention_requested_rho_count", **summarize) == 0  # auto: no number asked
        for model in MODELS:
            per_request = {"model": model, "task": task_of(model)}
            assert value(after, "retention_batch_size_count", model=model) >= 1
            assert value(after, "retention_batch_tokens_count", model=model) >= 1
            assert value(after, "retention_queue_duration_seconds_count", **per_request) >= 1
            assert value(after, "retention_inference_duration_seconds_count", model=model) >= 1
            assert value(after, "retention_token_layers_computed_total", **per_request) > 0
            assert value(after, "retention_activation_memory_estimate_bytes_count", **per_request) == 1
        saved = value(
            after, "retention_token_layers_saved_total", model="tiny-classification", task="classification"
        )
        assert saved > 0
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


def label_values(text: str, name: str, label: str, **where: str) -> set[str]:
    """The values ``label`` takes on the samples ``name`` whose labels include ``where``."""
    return {
        dict(labels).get(label, "")
        for sample, labels in samples(text)
        if sample == name and where.items() <= dict(labels).items()
    }


def test_an_embed_request_is_counted_under_the_embedding_task(models_root: Path) -> None:
    """/embed serves the embedding model: every per-request metric of it carries task="embedding"
    (the label the dashboards and alerts select inference traffic by); /metrics itself carries none."""
    with running(settings_for(models_root)) as (_, client):
        assert client.post("/embed?rho=0.5", json={"text": "a vector, please"}).status_code == 200
        after = client.get("/metrics").text
    embed = {"endpoint": "embed", "task": "embedding"}
    model = {"model": "tiny-embedding", "task": "embedding"}
    assert value(after, "retention_requests_total", **embed, status_class="2xx") == 1
    assert value(after, "retention_request_duration_seconds_count", **embed) == 1
    assert value(after, "retention_input_tokens_count", **embed) == 1
    assert value(after, "retention_requested_rho_count", **embed) == 1
    assert value(after, "retention_effective_rho_count", **embed) == 1
    assert value(after, "retention_degraded_requests_total", **embed) == 0
    assert value(after, "retention_served_rho_count", **model, reason="requested") == 1
    assert value(after, "retention_queue_duration_seconds_count", **model) == 1
    assert value(after, "retention_predicted_wait_seconds_count", **model) == 1
    assert value(after, "retention_activation_memory_estimate_bytes_count", **model) == 1
    assert value(after, "retention_token_layers_computed_total", **model) > 0
    # every series of the route is labelled with its task; the non-inference routes with task=""
    for name in ("retention_requests_total", "retention_request_duration_seconds_count"):
        assert label_values(after, name, "task", endpoint="embed") == {"embedding"}
        assert label_values(after, name, "task", endpoint="v1/embeddings") == {"embedding"}
        assert label_values(after, name, "task", endpoint="metrics") == {""}
    assert 'retention_requests_total{endpoint="embed",status_class="2xx",task="embedding"} 1.0' in after


def test_every_task_of_the_registry_has_its_series_from_startup(models_root: Path) -> None:
    """The pre-initialised label sets come from the mounted routes, whose tasks come from the registry:
    every registered task is served by a route and has its series at 0 before any traffic."""
    text = create_app(settings_for(models_root)).state.metrics.render().decode()
    assert label_values(text, "retention_requests_total", "task") == {*TASKS, ""}
    for name in (
        "retention_input_tokens_count",
        "retention_requested_rho_count",
        "retention_effective_rho_count",
        "retention_degraded_requests_total",
    ):
        assert label_values(text, name, "task") == set(TASKS), name
    for endpoint, task in ROUTE_TASKS.items():
        assert value(text, "retention_requests_total", endpoint=endpoint, task=task, status_class="5xx") == 0
    for endpoint in ("livez", "readyz", "metrics", "models", "other"):
        assert label_values(text, "retention_requests_total", "task", endpoint=endpoint) == {""}


def test_a_blocked_event_loop_shows_as_loop_lag(models_root: Path) -> None:
    with running(settings_for(models_root)) as (_, client):
        assert client.portal is not None
        client.portal.call(time.sleep, 0.4)  # runs on the event loop itself: nothing else runs meanwhile
        late = "retention_event_loop_lag_seconds_bucket"

        def over_quarter_second() -> float:
            text = client.get("/metrics").text
            return value(text, "retention_event_loop_lag_seconds_count") - value(text, late, le="0.25")

        wait_until(lambda: over_quarter_second() >= 1, what="a probe that woke more than 0.25 s late")
