"""Static checks of the Ray deployment files: the Serve config, the KubeRay RayService, Prometheus."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from service.ray_serve import PROXY_CALLBACK, PROXY_CALLBACK_ENV, RetentionService, build_app
from tests.deploy.conftest import DEPLOY

RAY = DEPLOY / "ray"


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def test_serve_config_builds_our_application() -> None:
    config = load(RAY / "serve_config.yaml")
    [app] = config["applications"]
    assert app["import_path"] == "service.ray_serve:build_app" and app["route_prefix"] == "/"
    module, name = app["import_path"].split(":")
    assert name == build_app.__name__ and module == build_app.__module__
    build_app(app["args"])  # the args are Settings overrides it accepts
    [deployment] = app["deployments"]
    assert deployment["name"] == RetentionService.name
    assert deployment["autoscaling_config"]["target_ongoing_requests"] > 0
    assert Path(app["args"]["models_dir"]).is_absolute(), "a path every node sees"


def test_rayservice_runs_the_serve_config() -> None:
    manifest = load(RAY / "rayservice.yaml")
    assert manifest["apiVersion"] == "ray.io/v1" and manifest["kind"] == "RayService"
    serve_config = load(RAY / "serve_config.yaml")
    assert yaml.safe_load(manifest["spec"]["serveConfigV2"])["applications"] == serve_config["applications"]
    cluster = manifest["spec"]["rayClusterConfig"]
    groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    port = serve_config["http_options"]["port"]
    models_dir = serve_config["applications"][0]["args"]["models_dir"]
    sd_dir = Path(serve_config["applications"][0]["args"]["metrics_sd_dir"])
    images = set()
    for group in groups:
        assert group["rayStartParams"]["metrics-export-port"] == "8080"
        [container] = group["template"]["spec"]["containers"]
        images.add(container["image"])
        assert {"containerPort": port, "name": "serve"} in container["ports"]
        assert {"name": PROXY_CALLBACK_ENV, "value": PROXY_CALLBACK} in container["env"]
        mounts = {m["mountPath"] for m in container["volumeMounts"]}
        assert models_dir in mounts and any(sd_dir.is_relative_to(m) for m in mounts)
    assert len(images) == 1, "one image on every node"


def test_prometheus_scrapes_the_replicas_and_ray() -> None:
    prom = load(DEPLOY / "prometheus" / "prometheus.yml")
    jobs = {job["job_name"]: job for job in prom["scrape_configs"]}
    sd_dir = load(RAY / "serve_config.yaml")["applications"][0]["args"]["metrics_sd_dir"]
    assert jobs["retention-ray-replicas"]["file_sd_configs"][0]["files"] == [f"{sd_dir}/*.json"]
    assert jobs["ray"]["file_sd_configs"][0]["files"] == ["/tmp/ray/prom_metrics_service_discovery.json"]
