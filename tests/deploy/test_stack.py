"""The compose stack's processes, run natively on loopback (no Docker engine needed):

the real service (``python -m service``) on three tiny models, a real Prometheus (the Debian binary)
loaded with deploy/prometheus/{prometheus.yml,alerts.yml} -- scrape target rewritten to the local
service, intervals shortened -- and traffic from the batch client's console entry point (and, for the
embedding model, which the batch client does not speak to, from /embed and /v1/embeddings). Then every
PromQL expression of the Grafana dashboard, the alert and recording rules and the prometheus-adapter
rules is evaluated through Prometheus's HTTP API and must return data. A comparison that is
legitimately empty (no alert firing) has each of its operands evaluated instead. Embedding traffic
alone must show in every panel, in the p99 recording rule and (run through ``promtool test rules``
with the labels the service exports) fire the p99 alert when slow.

Bounded: every wait has a deadline, the whole test stays well under 90 s, processes always stop.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from retention_core.tasks import TASKS
from tests.deploy import promql
from tests.deploy.conftest import DEPLOY, REPO, free_port, tool

pytestmark = pytest.mark.integration  # a real Prometheus

DASHBOARD = DEPLOY / "grafana" / "dashboards" / "retention.json"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
TINY_TASKS = {task: f"tiny-{task}" for task in TASKS}  # one tiny model per task of the registry
# the endpoint labels of the embedding model's routes ("root": TEI's POST /, where its clients post)
EMBEDDING_ROUTES = ("embed", "v1/embeddings", "root")
P99_RULE = "endpoint:retention_request_duration_seconds:p99_5m"
P99_ALERT = "RetentionHighP99Latency"


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def tail(self, lines: int = 40) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return f"--- {self.name} log (last {lines} lines) ---\n" + "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=5)


def start(name: str, cmd: list[str], log: Path, **kwargs: Any) -> Proc:
    handle = log.open("wb")
    try:
        popen = subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT, **kwargs)
    finally:
        handle.close()
    return Proc(name, popen, log)


def wait_until(what: str, check: Any, timeout: float, procs: list[Proc]) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        for proc in procs:
            if proc.popen.poll() is not None:
                pytest.fail(
                    f"{proc.name} exited with {proc.popen.returncode} while waiting for {what}\n{proc.tail()}"
                )
        try:
            last = check()
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(0.25)
    pytest.fail(
        f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})\n"
        + "\n".join(p.tail() for p in procs)
    )


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.tiny import build_tiny_model_dir

    models = tmp_path_factory.mktemp("models")
    for task, name in TINY_TASKS.items():
        build_tiny_model_dir(models / name, task, name=name)
    return models


def service_env(**settings: str) -> dict[str, str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "RETENTION_LOG_LEVEL": "warning",
        "RETENTION_INTRA_OP_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        **settings,
    }
    env.pop("RETENTION_API_KEY", None)
    return env


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, tiny_models: Path) -> Iterator[dict[str, Any]]:
    started = time.monotonic()
    tmp = tmp_path_factory.mktemp("stack")
    models = tiny_models
    procs: list[Proc] = []
    try:
        port = free_port()
        env = service_env()
        service = start(
            "service",
            [
                sys.executable,
                "-m",
                "service",
                "--models-dir",
                str(models),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ],
            tmp / "service.log",
            cwd=tmp,
            env=env,
        )
        procs.append(service)
        service_url = f"http://127.0.0.1:{port}"

        # Prometheus with the deploy files; only the target and the intervals change.
        prom_dir = tmp / "prometheus"
        prom_dir.mkdir()
        config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
        prom_port = free_port()
        config["global"].update(scrape_interval="1s", evaluation_interval="1s")
        for job in config["scrape_configs"]:
            job["scrape_interval"] = "1s"
            if job["job_name"] == "retention":
                job["static_configs"][0]["targets"] = [f"127.0.0.1:{port}"]
            else:
                job["static_configs"] = [{"targets": [f"127.0.0.1:{prom_port}"]}]
        (prom_dir / "prometheus.yml").write_text(yaml.safe_dump(config))
        rules = yaml.safe_load(ALERTS.read_text())
        for group in rules["groups"]:
            group.pop("interval", None)  # evaluate every 1 s (global) instead of 15 s
        rule_file = config["rule_files"][0]
        (prom_dir / rule_file).write_text(yaml.safe_dump(rules, sort_keys=False))
        prometheus = start(
            "prometheus",
            [
                tool("prometheus"),
                f"--config.file={prom_dir / 'prometheus.yml'}",
                f"--storage.tsdb.path={prom_dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
                "--log.level=warn",
            ],
            tmp / "prometheus.log",
            cwd=prom_dir,
        )
        procs.append(prometheus)
        prom_url = f"http://127.0.0.1:{prom_port}"

        wait_until(
            "service /readyz",
            lambda: httpx.get(f"{service_url}/readyz", timeout=2).status_code == 200,
            60,
            procs,
        )
        wait_until(
            "Prometheus /-/ready",
            lambda: httpx.get(f"{prom_url}/-/ready", timeout=2).status_code == 200,
            30,
            procs,
        )
        yield {
            "service_url": service_url,
            "prom_url": prom_url,
            "procs": procs,
            "tmp": tmp,
            "started": started,
        }
    finally:
        for proc in reversed(procs):
            proc.stop()
        shutil.rmtree(tmp / "prometheus" / "data", ignore_errors=True)


def query(prom_url: str, expr: str, at: float | None = None) -> list[dict[str, Any]]:
    params: dict[str, Any] = {"query": expr}
    if at is not None:
        params["time"] = at
    response = httpx.get(f"{prom_url}/api/v1/query", params=params, timeout=10)
    body = response.json()
    assert response.status_code == 200 and body["status"] == "success", f"{expr!r}: {body}"
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def write_inputs(tmp: Path) -> dict[str, tuple[Path, int]]:
    classify = [
        {"id": f"c{i}", "review": f"Review {i}: the film was {'great' if i % 2 else 'dull'}, " * (1 + i % 4)}
        for i in range(40)
    ]
    qa = [
        {"question": f"Who wrote book {i}?", "context": f"Book {i} was written by author {i}. It sold well."}
        for i in range(12)
    ]
    summarize = [
        {"text": f"Document {i} opens here. It has a middle part. Then a detail follows. It ends now."}
        for i in range(12)
    ]
    paths = {}
    for name, rows in (("classify", classify), ("qa", qa), ("summarize", summarize)):
        path = tmp / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        paths[name] = (path, len(rows))
    return paths


def run_batch_client(stack: dict[str, Any]) -> int:
    tmp: Path = stack["tmp"]
    inputs = write_inputs(tmp)
    plans = {
        "classify": ["--rho", "0.3", "--field", "text=review", "--id-field", "id"],
        "qa": ["--rho", "auto"],
        "summarize": ["--rho", "0.5"],
    }
    total = 0
    for endpoint, extra in plans.items():
        path, rows = inputs[endpoint]
        out = tmp / f"{endpoint}.out.jsonl"
        summary = tmp / f"{endpoint}.summary.json"
        cmd = [sys.executable, "-m", "clients.batch", str(path), str(out), "--url", stack["service_url"]]
        cmd += ["--endpoint", endpoint, "--concurrency", "4", "--no-progress", "--summary-json", str(summary)]
        cmd += extra
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=REPO)
        assert result.returncode == 0, f"{endpoint}: {result.stderr}\n" + stack["procs"][0].tail()
        records = [json.loads(line) for line in out.read_text().splitlines()]
        assert [r["index"] for r in records] == list(range(rows))
        assert all(r["ok"] and "usage" in r["response"] for r in records)
        stats = json.loads(summary.read_text())
        assert stats["ok"] == rows and stats["errors"] == 0
        assert stats["token_work_saved"] is not None and 0.0 <= stats["token_work_saved"] < 1.0
        assert "token work saved" in result.stderr
        total += rows
    return total


def send_embedding_traffic(service_url: str, rounds: int = 6) -> int:
    """Requests to every route of the embedding model at a numeric rho; how many were sent."""
    with httpx.Client(base_url=service_url, timeout=30) as client:
        for i in range(rounds):
            text = f"Sentence {i} to embed: the film was {'great' if i % 2 else 'dull'}."
            routes = (
                ("/embed", {"text": text}),
                ("/v1/embeddings", {"input": [text, text]}),
                ("/", {"inputs": text}),
            )
            for path, body in routes:
                response = client.post(path, json={**body, "rho": 0.5})
                assert response.status_code == 200, f"{path}: {response.text}"
    return len(EMBEDDING_ROUTES) * rounds


def scraped(stack: dict[str, Any], selector: str, total: int) -> float:
    """Wait until Prometheus holds ``total`` 2xx requests of ``selector``, then two more scrapes and rule
    evaluations; the time to evaluate at."""
    counted = f'sum(retention_requests_total{{{selector}, status_class="2xx"}}) >= {total}'
    wait_until(
        "Prometheus to scrape the traffic", lambda: query(stack["prom_url"], counted), 20, stack["procs"]
    )
    time.sleep(2.5)
    return time.time()


def missing_data(prom_url: str, source: str, name: str, expr: str, at: float) -> list[str]:
    """Why ``expr`` (else, for a comparison, each of its operands) has no data at ``at``; [] if it has."""
    if query(prom_url, expr, at):
        return []
    operands = promql.top_level_split(expr)
    if operands == [expr.strip()] or not operands:
        return [f"{source} {name!r}: no data for {expr}"]
    return [
        f"{source} {name!r}: no data for operand {operand} of {expr}"
        for operand in operands
        if not query(prom_url, operand, at)
    ]


def test_stack_every_dashboard_and_alert_query_returns_data(stack: dict[str, Any]) -> None:
    prom_url: str = stack["prom_url"]
    procs: list[Proc] = stack["procs"]
    wait_until(
        "a first scrape of the service", lambda: query(prom_url, 'up{job="retention"} == 1'), 20, procs
    )

    total = run_batch_client(stack) + send_embedding_traffic(stack["service_url"])
    inference = 'task!=""'
    at = scraped(stack, inference, total)

    failures: list[str] = []
    exprs = [
        ("dashboard panel", title, promql.substitute_grafana(expr))
        for title, expr in promql.dashboard_exprs(DASHBOARD)
    ]
    exprs += [
        ("dashboard variable", label, f"count by ({label}) ({metric})")
        for metric, label in promql.dashboard_variable_queries(DASHBOARD)
    ]
    exprs += [("rule", name, expr) for name, expr in promql.rule_exprs(ALERTS)]
    adapter = yaml.safe_load((DEPLOY / "k8s" / "prometheus-adapter.yaml").read_text())
    adapter_rules = yaml.safe_load(adapter["data"]["config.yaml"])["rules"]
    exprs += [
        ("prometheus-adapter rule", name, expr)
        for name, expr in promql.adapter_exprs(adapter_rules, 'job="retention"', "instance")
    ]
    for source, name, expr in exprs:
        failures += missing_data(prom_url, source, name, expr, at)
    assert not failures, "\n".join(failures)
    assert len(exprs) >= 45

    # Prometheus loaded the rule file and evaluated every rule without error.
    groups = httpx.get(f"{prom_url}/api/v1/rules", timeout=10).json()["data"]["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    assert len(rules) == len(promql.rule_exprs(ALERTS))
    bad = [(r["name"], r.get("health"), r.get("lastError")) for r in rules if r.get("health") != "ok"]
    assert not bad, bad

    # What the panels show reflects the traffic: requests, tokens saved, both rho histograms.
    counted = query(prom_url, f'sum(retention_requests_total{{{inference}, status_class="2xx"}})', at)
    assert float(counted[0]["value"][1]) >= total
    saved = query(prom_url, "sum(retention_token_layers_saved_total)", at)
    assert float(saved[0]["value"][1]) > 0
    assert query(prom_url, 'retention_effective_rho_count{endpoint="qa"} > 0', at)
    assert len(query(prom_url, "retention_model_info", at)) == len(TINY_TASKS)
    assert time.monotonic() - stack["started"] < 90, "the stack test must stay under 90 s"


def finite(result: list[dict[str, Any]]) -> bool:
    return any(math.isfinite(float(series["value"][1])) for series in result)


def test_stack_embedding_traffic_shows_in_every_panel_and_the_p99_rule(stack: dict[str, Any]) -> None:
    """The dashboard filtered to the embedding model's routes and model (what a user picks in its
    endpoint and model variables) answers every panel with a number, and the p99 recording rule has a
    series for each embedding route."""
    prom_url: str = stack["prom_url"]
    send_embedding_traffic(stack["service_url"])
    metrics_text = httpx.get(f"{stack['service_url']}/metrics", timeout=5).text
    served = sum(
        sample.value
        for family in text_string_to_metric_families(metrics_text)
        for sample in family.samples
        if sample.name == "retention_requests_total"
        and sample.labels.get("endpoint") in EMBEDDING_ROUTES
        and sample.labels["status_class"] == "2xx"
    )
    at = scraped(stack, f'endpoint=~"{"|".join(EMBEDDING_ROUTES)}"', int(served))
    variables = {"endpoint": "|".join(EMBEDDING_ROUTES), "model": TINY_TASKS["embedding"]}
    empty = []
    for title, expr in promql.dashboard_exprs(DASHBOARD):
        panel = promql.substitute_grafana(expr, **variables)
        if not finite(query(prom_url, panel, at)):
            empty.append(f"{title!r}: no number for {panel}")
    assert not empty, "\n".join(empty)

    recorded = query(prom_url, P99_RULE, at)
    embedding = {s["metric"]["endpoint"]: s for s in recorded if s["metric"].get("task") == "embedding"}
    assert set(embedding) == set(EMBEDDING_ROUTES), recorded
    assert all(finite([s]) for s in embedding.values()), embedding


def exported_labels(metrics_text: str, family: str, endpoint: str) -> dict[str, str]:
    """The labels (but ``le``) the service's /metrics gives the ``family`` histogram of ``endpoint``."""
    for metric in text_string_to_metric_families(metrics_text):
        for sample in metric.samples:
            if sample.name == f"{family}_bucket" and sample.labels.get("endpoint") == endpoint:
                return {k: v for k, v in sample.labels.items() if k != "le"}
    raise AssertionError(f"/metrics has no {family} series for endpoint {endpoint!r}")


def test_slow_embedding_requests_fire_the_p99_alert(stack: dict[str, Any], tmp_path: Path) -> None:
    """``promtool test rules`` on the shipped rules: 20 minutes of embedding requests that each take
    2.5-5 s, in series labelled as the real service labels its embedding routes, fire the p99 alert for
    both routes."""
    metrics_text = httpx.get(f"{stack['service_url']}/metrics", timeout=5).text
    family = "retention_request_duration_seconds"
    rules = {
        rule.get("alert"): rule
        for group in yaml.safe_load(ALERTS.read_text())["groups"]
        for rule in group["rules"]
    }
    alert = rules[P99_ALERT]
    p99 = "4.975s"  # every request in the (2.5, 5] bucket: 2.5 + 0.99 * 2.5, as humanizeDuration writes it
    series, expected = [], []
    for endpoint in EMBEDDING_ROUTES:
        labels = {
            **exported_labels(metrics_text, family, endpoint),
            "job": "retention",
            "instance": "service:8000",
        }
        for le in ("0.5", "1.0", "2.5", "5.0", "10.0", "+Inf"):
            rate = 0 if le != "+Inf" and float(le) < 5 else 10  # 10 requests a minute, each 2.5-5 s
            selector = ",".join(f'{k}="{v}"' for k, v in {**labels, "le": le}.items())
            series.append({"series": f"{family}_bucket{{{selector}}}", "values": f"0+{rate}x30"})
        annotations = {
            key: text.replace("{{ $labels.endpoint }}", endpoint).replace(
                "{{ $value | humanizeDuration }}", p99
            )
            for key, text in alert["annotations"].items()
        }
        expected.append(
            {
                "exp_labels": {**alert["labels"], "endpoint": endpoint, "task": "embedding"},
                "exp_annotations": annotations,
            }
        )
    unit = {
        "rule_files": [str(ALERTS)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [{"eval_time": "20m", "alertname": P99_ALERT, "exp_alerts": expected}],
            }
        ],
    }
    (tmp_path / "p99.test.yml").write_text(yaml.safe_dump(unit, sort_keys=False))
    result = subprocess.run(
        [tool("promtool"), "test", "rules", str(tmp_path / "p99.test.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_batch_client_rides_out_real_429s(tmp_path: Path, tiny_models: Path) -> None:
    """The real service with a one-slot queue and a 100 ms batching wait answers 429 + Retry-After to
    concurrent requests; the client waits as told, retries, and still finishes every row."""
    port = free_port()
    service = start(
        "service (one-slot queue)",
        [sys.executable, "-m", "service", "--models-dir", str(tiny_models), "--port", str(port)],
        tmp_path / "service.log",
        cwd=tmp_path,
        env=service_env(
            RETENTION_HOST="127.0.0.1", RETENTION_MAX_QUEUE_REQUESTS="1", RETENTION_MAX_BATCH_WAIT_MS="100"
        ),
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(
            "service /readyz", lambda: httpx.get(f"{url}/readyz", timeout=2).status_code == 200, 60, [service]
        )
        rows = 10
        (tmp_path / "in.jsonl").write_text(
            "".join(json.dumps({"text": f"text number {i}"}) + "\n" for i in range(rows))
        )
        cmd = [sys.executable, "-m", "clients.batch", str(tmp_path / "in.jsonl"), str(tmp_path / "out.jsonl")]
        cmd += ["--url", url, "--concurrency", "4", "--max-retries", "40", "--no-progress", "--rho", "0.5"]
        cmd += ["--summary-json", str(tmp_path / "summary.json")]
        started = time.monotonic()
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=REPO)
        assert result.returncode == 0, result.stderr + service.tail()
        stats = json.loads((tmp_path / "summary.json").read_text())
        assert stats["ok"] == rows and stats["errors"] == 0
        assert stats["throttled"] > 0, "the one-slot queue should have answered 429"
        assert time.monotonic() - started >= 1.0, "Retry-After: 1 was not honoured"
        records = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
        assert [r["index"] for r in records] == list(range(rows))
        assert max(r["attempts"] for r in records) > 1
        metrics = httpx.get(f"{url}/metrics", timeout=5).text
        line = next(
            m for m in metrics.splitlines() if m.startswith('retention_rejections_total{reason="queue_full"}')
        )
        assert float(line.split()[-1]) == stats["throttled"]
    finally:
        service.stop()
