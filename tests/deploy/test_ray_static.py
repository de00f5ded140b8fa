"""Static checks of the Ray deployment files: the Serve config, the KubeRay RayService, Prometheus."""

from __future__ import annotations

import asyncio
import gc
import warnings
from pathlib import Path
from typing import Any

import yaml

from service.ray_serve import PROXY_CALLBACK, PROXY_CALLBACK_ENV, RetentionService, build_app
from service.settings import Settings
from tests.deploy.conftest import DEPLOY

RAY = DEPLOY / "ray"


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def built_replica(args: dict[str, Any]) -> tuple[Settings, Path | None]:
    """(settings, metrics_sd_dir) of the replica ``build_app(args)`` deploys, constructed as Serve's
    replica does (``bind`` only records the arguments): the deployment's class, its async ``__init__``
    awaited with the bound arguments, then its async ``__del__`` as when Serve stops it."""
    deployment = build_app(args)._bound_deployment
    cls = deployment.func_or_class
    replica = cls.__new__(cls)
    asyncio.run(replica.__init__(*deployment.init_args, **deployment.init_kwargs))
    built = replica.settings, replica.metrics_sd_dir
    asyncio.run(replica.__del__())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the finalizer calls the async __del__ again
        del replica
        gc.collect()
    return built


def test_serve_config_builds_our_application() -> None:
    config = load(RAY / "serve_config.yaml")
    [app] = config["applications"]
    assert app["import_path"] == "service.ray_serve:build_app" and app["route_prefix"] == "/"
    module, name = app["import_path"].split(":")
    assert name == build_app.__name__ and module == build_app.__module__
    args = dict(app["args"])
    sd_dir = Path(args.pop("metrics_sd_dir"))
    # Settings ignores unknown keys: a misspelt override would pass silently, so every other arg must be a
    # Settings field, and the replica's settings must carry its value.
    assert set(args) <= set(Settings.model_fields), set(args) - set(Settings.model_fields)
    settings, metrics_sd_dir = built_replica(app["args"])
    assert metrics_sd_dir == sd_dir
    assert settings.model_dump(include=set(args)) == Settings(**args).model_dump(include=set(args))
    assert (
        settings.models_dir == Path(args["models_dir"])
        and settings.intra_op_threads == args["intra_op_threads"]
    )
    [deployment] = app["deployments"]
    assert deployment["name"] == RetentionService.name
    assert deployment["autoscaling_config"]["target_ongoing_requests"] > 0
    assert Path(args["models_dir"]).is_absolute(), "a path every node sees"


def test_local_serve_config_runs_the_same_application_from_a_checkout() -> None:
    """deploy/ray/serve_config.local.yaml (README's `serve run`): the cluster config's application with
    the checkout's paths: models_dir relative to the repository root (the replicas' working directory),
    no file_sd directory; loopback only. tests/deploy/test_ray.py deploys it with `serve run`."""
    local, cluster = load(RAY / "serve_config.local.yaml"), load(RAY / "serve_config.yaml")
    [app], [cluster_app] = local["applications"], cluster["applications"]
    same = ("name", "route_prefix", "import_path", "runtime_env")
    assert {k: app[k] for k in same} == {k: cluster_app[k] for k in same}
    assert app["args"] == {"models_dir": "models", "intra_op_threads": 1}
    settings, metrics_sd_dir = built_replica(app["args"])
    assert settings.models_dir == Path("models") and metrics_sd_dir is None
    [deployment], [cluster_deployment] = app["deployments"], cluster_app["deployments"]
    assert deployment["name"] == cluster_deployment["name"] == RetentionService.name
    assert deployment["ray_actor_options"] == cluster_deployment["ray_actor_options"]
    assert local["http_options"]["host"] == "127.0.0.1"
    for line in ("serve run deploy/ray/serve_config.local.yaml", PROXY_CALLBACK_ENV):
        assert line in (RAY / "serve_config.local.yaml").read_text(encoding="utf-8")


def test_cluster_serve_config_states_its_assumptions() -> None:
    header = (RAY / "serve_config.yaml").read_text(encoding="utf-8").split("proxy_location")[0]
    args = load(RAY / "serve_config.yaml")["applications"][0]["args"]
    assumptions = (args["models_dir"], args["metrics_sd_dir"], PROXY_CALLBACK_ENV, "serve_config.local.yaml")
    assert all(assumption in header for assumption in assumptions), header


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
