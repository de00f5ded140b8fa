"""Static checks of the deployment artifacts with the real tools (no Docker engine, no cluster).

hadolint (Dockerfile), check-jsonschema's vendored compose-spec schema (compose files),
kubernetes-validate (k8s manifests), promtool (Prometheus config and rules), plus the metric
names every dashboard / alert / HPA query uses against the service's metric contract.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.deploy import promql
from tests.deploy.conftest import DEPLOY, REPO, tool

DASHBOARD = DEPLOY / "grafana" / "dashboards" / "retention.json"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
K8S = DEPLOY / "k8s"
COMPOSE_FILES = sorted(DEPLOY.glob("docker-compose*.yml"))


def run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, **kwargs)  # type: ignore[call-overload]


# ------------------------------------------------------------------------------------- Dockerfile


def test_hadolint_dockerfile() -> None:
    result = run([tool("hadolint"), "--failure-threshold", "info", str(REPO / "Dockerfile")])
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_catches_a_bad_dockerfile(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install requests\n")
    assert run([tool("hadolint"), str(bad)]).returncode != 0


def test_dockerfile_promises() -> None:
    text = (REPO / "Dockerfile").read_text()
    stages = set(re.findall(r"^FROM\s+\S+\s+AS\s+(\S+)", text, flags=re.M))
    assert {"base", "serve-build", "serve", "train"} <= stages
    serve = text.split("AS serve\n", 1)[1].split("\nFROM ", 1)[0]
    assert re.search(r"^USER\s+10001", serve, flags=re.M), "serving image must run as non-root"
    assert re.search(r"^HEALTHCHECK .*\n?.*/livez", serve, flags=re.M)
    serve_build = text.split("AS serve-build\n", 1)[1].split("\nFROM ", 1)[0]
    assert "torch" not in serve_build.replace("import torch", "").replace("torch must not", "")
    assert "ARG VARIANT" in serve_build and "onnxruntime-gpu" in serve_build
    train = text.split("AS train\n", 1)[1].split("\nFROM ", 1)[0]
    assert 'python", "-m", "training"' in train and '"build"' in train
    # the GPU serving image: the torch backend over CUDA torch, a stage of its own
    assert {"serve-gpu-build", "serve-gpu"} <= stages
    serve_gpu = text.split("AS serve-gpu\n", 1)[1].split("\nFROM ", 1)[0]
    assert "RETENTION_BACKEND=torch" in serve_gpu and re.search(r"^USER\s+10001", serve_gpu, flags=re.M)
    # the default target is the CPU serving image
    assert text.rstrip().splitlines()[-1].strip() == "FROM serve"


def test_dockerignore_keeps_everything_the_dockerfile_copies() -> None:
    ignore = (REPO / ".dockerignore").read_text().splitlines()
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    text = (REPO / "Dockerfile").read_text()
    for line in re.findall(r"^COPY (?!--from)(.+)$", text, flags=re.M):
        for source in line.split()[:-1]:
            parents = [str(parent) for parent in Path(source.rstrip("/")).parents]
            assert source.rstrip("/") in allowed or allowed & set(parents), (
                f"{source} is copied but excluded by .dockerignore"
            )


# ---------------------------------------------------------------------------------------- compose


@pytest.mark.parametrize("compose", COMPOSE_FILES, ids=lambda p: p.name)
def test_compose_matches_compose_spec_schema(compose: Path) -> None:
    result = run([tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(compose)])
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_schema_rejects_a_bad_file(tmp_path: Path) -> None:
    bad = tmp_path / "docker-compose.yml"
    bad.write_text("services:\n  a:\n    image: x\n    depends_on:\n      b: {condition: when_ready}\n")
    result = run([tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(bad)])
    assert result.returncode != 0


def test_compose_stack_wiring() -> None:
    doc = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    services = doc["services"]
    assert services["model-builder"]["build"]["target"] == "train"
    assert services["service"]["depends_on"]["model-builder"]["condition"] == "service_completed_successfully"
    assert services["service"]["build"]["target"] == "serve"
    prom_mount = services["prometheus"]["volumes"][0].split(":")[0]
    assert (DEPLOY / prom_mount).resolve() == (DEPLOY / "prometheus").resolve()
    for mount in services["grafana"]["volumes"][:2]:
        assert (DEPLOY / mount.split(":")[0]).is_dir()
    # the scrape target is the compose service's name and port
    prom = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    job = next(j for j in prom["scrape_configs"] if j["job_name"] == "retention")
    assert job["static_configs"][0]["targets"] == ["service:8000"]


# ------------------------------------------------------------------------------------- Kubernetes


def k8s_files() -> list[Path]:
    """The manifests, the GPU variant's (deploy/k8s/gpu/) included (helm/ holds chart values, not
    manifests)."""
    return sorted([*K8S.glob("*.yaml"), *(K8S / "gpu").glob("*.yaml")])


def test_kubernetes_manifests_validate() -> None:
    result = run([tool("kubernetes-validate"), "--strict", *map(str, k8s_files())])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "passed" in result.stdout + result.stderr


def test_kubernetes_validate_rejects_a_bad_manifest(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec: {replicas: two}\n")
    assert run([tool("kubernetes-validate"), "--strict", str(bad)]).returncode != 0


def k8s_objects() -> dict[tuple[str, str], dict]:
    out = {}
    for path in k8s_files():
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                out[(doc["kind"], doc["metadata"]["name"])] = doc
    return out


def test_deployment_probes_and_resources() -> None:
    objects = k8s_objects()
    container = objects[("Deployment", "retention")]["spec"]["template"]["spec"]["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/livez"
    assert container["resources"]["requests"] and container["resources"]["limits"]
    assert objects[("Service", "retention")]["spec"]["selector"].items() <= (
        objects[("Deployment", "retention")]["spec"]["template"]["metadata"]["labels"].items()
    )
    config = objects[("ConfigMap", "retention-config")]["data"]
    assert all(key.startswith("RETENTION_") for key in config)


def adapter_rules() -> list[dict]:
    cm = k8s_objects()[("ConfigMap", "prometheus-adapter")]
    rules: list[dict] = yaml.safe_load(cm["data"]["config.yaml"])["rules"]
    return rules


def test_hpa_metrics_come_from_adapter_rules() -> None:
    hpa = k8s_objects()[("HorizontalPodAutoscaler", "retention")]
    custom = {m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"] if m["type"] == "Pods"}
    assert custom, "the HPA scales on at least one custom metric"
    assert custom <= {rule["name"]["as"] for rule in adapter_rules()}
    values = yaml.safe_load((K8S / "helm" / "prometheus-adapter-values.yaml").read_text())
    assert values["rules"]["custom"] == adapter_rules(), (
        "helm values and the ConfigMap must hold the same rules"
    )
    for rule in adapter_rules():
        assert promql.metric_names(rule["seriesQuery"]) <= promql.KNOWN_SERIES


def test_k8s_prometheus_config(tmp_path: Path) -> None:
    """promtool on the in-cluster config. Debian's Prometheus is built without Kubernetes service
    discovery, so its kubernetes_sd_configs block is swapped for a static target; everything else
    (relabelling regexes, rule file globs, intervals) is checked as written."""
    cm = k8s_objects()[("ConfigMap", "prometheus-config")]
    config = yaml.safe_load(cm["data"]["prometheus.yml"])
    for job in config["scrape_configs"]:
        assert job.pop("kubernetes_sd_configs", None), "pods are discovered through the Kubernetes API"
        job["static_configs"] = [{"targets": ["pod:8000"]}]
        targets = {r.get("target_label") for r in job["relabel_configs"]}
        assert {"namespace", "pod"} <= targets, "prometheus-adapter needs namespace and pod labels"
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    result = run([tool("promtool"), "check", "config", str(tmp_path / "prometheus.yml")])
    assert result.returncode == 0, result.stdout + result.stderr


# ------------------------------------------------------------------------------------- Prometheus


def test_promtool_check_config() -> None:
    result = run([tool("promtool"), "check", "config", str(DEPLOY / "prometheus" / "prometheus.yml")])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 rule files found" in result.stdout + result.stderr


def test_promtool_check_rules() -> None:
    result = run([tool("promtool"), "check", "rules", str(ALERTS)])
    assert result.returncode == 0, result.stdout + result.stderr


def test_alerts_cover_the_required_conditions() -> None:
    names = {name for name, _ in promql.rule_exprs(ALERTS)}
    for required in (
        "RetentionHighP99Latency",
        "RetentionHighErrorRatio",
        "RetentionQueueSaturated",
        "RetentionSustainedRhoDegradation",
    ):
        assert required in names


def test_every_query_uses_known_metrics() -> None:
    exprs = promql.dashboard_exprs(DASHBOARD) + promql.rule_exprs(ALERTS)
    exprs += [(name, f"{metric}") for metric, name in promql.dashboard_variable_queries(DASHBOARD)]
    assert len(exprs) > 30
    for name, expr in exprs:
        used = promql.metric_names(expr)
        assert used or "up{" in expr, f"{name}: no retention metric in {expr!r}"
        unknown = used - promql.KNOWN_SERIES
        assert not unknown, f"{name}: unknown series {sorted(unknown)} in {expr!r}"


def test_no_query_lists_endpoints_or_tasks() -> None:
    """Inference traffic is selected by ``task!=""`` (service/metrics.py): no dashboard or rule query
    matches ``endpoint`` or ``task`` against a hand-kept list; a Grafana variable is the user's pick."""
    exprs = promql.dashboard_exprs(DASHBOARD) + promql.rule_exprs(ALERTS)
    listed = [
        (name, f'{label}{op}"{value}"')
        for name, expr in exprs
        for label, op, value in re.findall(r'\b(endpoint|task)\s*(=~|!~|!=|=)\s*"([^"]*)"', expr)
        if value and not value.startswith("$")
    ]
    assert not listed, listed
    selects = [expr for _, expr in exprs if 'task!=""' in expr.replace(" ", "")]
    assert len(selects) >= 4, 'the overview panels, the p99 rule and the p99 alert select task!=""'


# ---------------------------------------------------------------------------------------- Grafana


def test_dashboard_covers_the_required_panels() -> None:
    exprs = " ".join(expr for _, expr in promql.dashboard_exprs(DASHBOARD))
    for metric in (
        "retention_requests_total",
        "retention_request_duration_seconds_bucket",
        "retention_queue_depth",
        "retention_rejections_total",
        "retention_batch_size",
        "retention_batch_tokens",
        "retention_requested_rho",
        "retention_effective_rho",
        "retention_token_layers_saved_total",
        "retention_process_resident_memory_bytes",
        "retention_activation_memory_estimate_bytes",
        "retention_model_info",
    ):
        assert metric in exprs, f"no panel shows {metric}"


def test_dashboard_datasource_is_the_provisioned_one() -> None:
    datasources = yaml.safe_load((DEPLOY / "grafana/provisioning/datasources/prometheus.yml").read_text())
    uid = datasources["datasources"][0]["uid"]
    dashboard = json.loads(DASHBOARD.read_text())
    for panel in promql.dashboard_panels(dashboard):
        if panel.get("type") == "row":
            continue
        assert panel["datasource"]["uid"] == uid, panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == uid
    providers = yaml.safe_load((DEPLOY / "grafana/provisioning/dashboards/retention.yml").read_text())
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    mounts = dict(
        v.split(":")[:2][::-1] for v in compose["services"]["grafana"]["volumes"] if v.startswith("./")
    )
    assert mounts[providers["providers"][0]["options"]["path"]] == "./grafana/dashboards"


def test_promql_operand_splitter() -> None:
    split = promql.top_level_split
    assert split('sum(rate(a{x=">"}[5m])) / sum(rate(b[5m])) > 0.05') == [
        'sum(rate(a{x=">"}[5m])) / sum(rate(b[5m]))'
    ]
    assert split('(up{job="r"} == 1) unless on (instance) info') == ['up{job="r"}', "info"]
    assert split("(a) < 0.8 * (b)") == ["a", "0.8 * (b)"]
    assert split("rate(x[1m])") == ["rate(x[1m])"]
    assert promql.metric_names('a:retention_x:y + retention_y_total{l="retention_z"}') == {
        "retention_y_total"
    }
