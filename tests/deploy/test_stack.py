"""The compose stack's processes, run natively on loopback (no Docker engine needed):

the real service (``python -m service``) on three tiny models, a real Prometheus (the Debian binary)
loaded with deploy/prometheus/{prometheus.yml,alerts.yml} -- scrape target rewritten to the local
service, intervals shortened -- and traffic from the batch client's console entry point. Then every
PromQL expression of the Grafana dashboard, the alert and recording rules and the prometheus-adapter
rules is evaluated through Prometheus's HTTP API and must return data. A comparison that is
legitimately empty (no alert firing) has each of its operands evaluated instead.

Bounded: every wait has a deadline, the whole test stays well under 90 s, processes always stop.
"""

from __future__ import annotations

import json
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

from tests.deploy import promql
from tests.deploy.conftest import DEPLOY, REPO, free_port, tool

DASHBOARD = DEPLOY / "grafana" / "dashboards" / "retention.json"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
TINY_TASKS = {"classification": "tiny-classification", "qa": "tiny-qa", "summarization": "tiny-summarization"}


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


def test_stack_every_dashboard_and_alert_query_returns_data(stack: dict[str, Any]) -> None:
    prom_url: str = stack["prom_url"]
    procs: list[Proc] = stack["procs"]
    wait_until(
        "a first scrape of the service", lambda: query(prom_url, 'up{job="retention"} == 1'), 20, procs
    )

    total = run_batch_client(stack)

    counted = (
        f'sum(retention_requests_total{{endpoint=~"classify|qa|summarize", status_class="2xx"}}) >= {total}'
    )
    wait_until("Prometheus to scrape the traffic", lambda: query(prom_url, counted), 20, procs)
    time.sleep(2.5)  # two more scrapes and rule evaluations after the traffic
    at = time.time()

    failures: list[str] = []
    checked = 0

    def must_return_data(source: str, name: str, expr: str) -> None:
        nonlocal checked
        checked += 1
        if query(prom_url, expr, at):
            return
        operands = promql.top_level_split(expr)
        if operands == [expr.strip()] or not operands:
            failures.append(f"{source} {name!r}: no data for {expr}")
            return
        for operand in operands:
            if not query(prom_url, operand, at):
                failures.append(f"{source} {name!r}: no data for operand {operand} of {expr}")

    for title, expr in promql.dashboard_exprs(DASHBOARD):
        must_return_data("dashboard panel", title, promql.substitute_grafana(expr))
    for metric, label in promql.dashboard_variable_queries(DASHBOARD):
        must_return_data("dashboard variable", label, f"count by ({label}) ({metric})")
    for name, expr in promql.rule_exprs(ALERTS):
        must_return_data("rule", name, expr)
    adapter = yaml.safe_load((DEPLOY / "k8s" / "prometheus-adapter.yaml").read_text())
    adapter_rules = yaml.safe_load(adapter["data"]["config.yaml"])["rules"]
    for name, expr in promql.adapter_exprs(adapter_rules, 'job="retention"', "instance"):
        must_return_data("prometheus-adapter rule", name, expr)
    assert not failures, "\n".join(failures)
    assert checked >= 45

    # Prometheus loaded the rule file and evaluated every rule without error.
    groups = httpx.get(f"{prom_url}/api/v1/rules", timeout=10).json()["data"]["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    assert len(rules) == len(promql.rule_exprs(ALERTS))
    bad = [(r["name"], r.get("health"), r.get("lastError")) for r in rules if r.get("health") != "ok"]
    assert not bad, bad

    # What the panels show reflects the traffic: requests, tokens saved, both rho histograms.
    assert float(query(prom_url, counted.split(" >=")[0], at)[0]["value"][1]) >= total
    saved = query(prom_url, "sum(retention_token_layers_saved_total)", at)
    assert float(saved[0]["value"][1]) > 0
    assert query(prom_url, 'retention_effective_rho_count{endpoint="qa"} > 0', at)
    assert len(query(prom_url, "retention_model_info", at)) == len(TINY_TASKS)
    assert time.monotonic() - stack["started"] < 90, "the stack test must stay under 90 s"


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
