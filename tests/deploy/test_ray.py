"""The service on Ray Serve and the batch client on Ray Data, on a real local Ray cluster of two nodes.

One cluster for the module (``ray.cluster_utils.Cluster``: a head and a worker node, 1 CPU each, real
raylets and object stores); the tiny exported models of the service tests; the application deployed as
README says, ``serve run deploy/ray/serve_config.local.yaml`` (the real CLI, against this cluster, from
a temporary copy of that file whose ``models_dir`` names the tiny models); real HTTP through Ray's
proxy, compared with the same app under uvicorn (``python -m service``'s server).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import ray
import yaml
from ray import serve
from ray.cluster_utils import Cluster

from clients import batch
from service.ray_serve import PROXY_CALLBACK, PROXY_CALLBACK_ENV
from tests.deploy.conftest import DEPLOY, free_port
from tests.service.conftest import models_root, served, settings_for, tiny_models, wait_until  # noqa: F401

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
LOCAL_CONFIG = DEPLOY / "ray" / "serve_config.local.yaml"  # what README's `serve run` names
SERVE_CLI = Path(sys.executable).with_name("serve")  # Ray's own `serve` command, of this venv

APP = "retention"
REPLICAS = 2
PROXY_PROBES = 12  # fresh connections that must all see the route: two proxies share the port
# Both sides (the replicas, plain uvicorn) run these: one ORT intra-op thread per session, so the same
# kernels in the same order. A one-row request runs as the same (1, T) shape on both sides: vectors equal
# to the last bit. A request of several rows is cut into runs by a plan that weighs padding against the
# per-run cost each process learns online (plan_runs), so two processes may run its rows in different
# shapes, and ORT's kernels then differ in the last float32 bit (≤ 3e-8 seen): those compare to
# MULTI_ROW_TOLERANCE, everything else exactly.
SETTINGS = {"intra_op_threads": 1, "max_batch_wait_ms": 1.0, "auto_latency_target_s": 30.0}
TIMING = ("queue_time_s", "inference_time_s")  # measured per request: the only fields that may differ
TEXT = "the film was a delight from start to finish"
CONTEXT = "Ada Lovelace wrote the first program. She worked with Charles Babbage on the engine."
# One request per task: (path, body); each answered by the proxy and by plain uvicorn.
REQUESTS: list[tuple[str, dict[str, Any]]] = [
    ("/classify", {"text": TEXT, "rho": 0.5}),
    ("/classify", {"texts": [TEXT, "bad", TEXT + " again"], "rho": "auto"}),
    ("/qa", {"question": "Who wrote it?", "context": CONTEXT, "rho": 0.5}),
    ("/summarize", {"sentences": [TEXT, CONTEXT, "It rained.", "The end came."], "ratio": 0.4}),
    ("/embed", {"texts": [TEXT, CONTEXT], "rho": 0.3}),
    ("/embed", {"text": TEXT, "normalize": False, "rho": 1}),
]
MULTI_ROW_TOLERANCE = 1e-6
DEADLINE_S = 30.0  # no request under the replica kill may take longer
CLIENTS = 6  # concurrent clients during the kill: several requests in flight on the victim
BATCH_ROWS = 10_000


def first_difference(got: Any, want: Any, where: str = "", tolerance: float = 0.0) -> str | None:
    """Where two JSON bodies first differ (None: equal, floats within ``tolerance``; 0: the last bit)."""
    if isinstance(want, dict) and isinstance(got, dict) and got.keys() == want.keys():
        keys = (first_difference(got[k], want[k], f"{where}.{k}", tolerance) for k in want)
        return next((d for d in keys if d), None)
    if isinstance(want, list) and isinstance(got, list) and len(got) == len(want):
        pairs = enumerate(zip(got, want, strict=True))
        items = (first_difference(g, w, f"{where}[{i}]", tolerance) for i, (g, w) in pairs)
        return next((d for d in items if d), None)
    if tolerance and isinstance(want, float) and isinstance(got, float) and abs(got - want) <= tolerance:
        return None
    return None if type(got) is type(want) and got == want else f"{where}: {got!r} != {want!r}"


def rows_of(body: dict[str, Any]) -> int:
    """The inputs a request body carries: its ``texts``, else one (a text, a question, a document)."""
    texts = body.get("texts")
    return len(texts) if isinstance(texts, list) else 1


def assert_same_body(got: Any, want: Any, where: str = "", rows: int = 1) -> None:
    """Equal bodies: structure, strings, ints and flags exactly; floats to the last bit for a one-row
    request, to MULTI_ROW_TOLERANCE for several rows (see SETTINGS)."""
    difference = first_difference(got, want, where, MULTI_ROW_TOLERANCE if rows > 1 else 0.0)
    assert difference is None, difference


def without_timing(body: Any) -> Any:
    if isinstance(body, dict):
        return {k: without_timing(v) for k, v in body.items() if k not in TIMING}
    if isinstance(body, list):
        return [without_timing(v) for v in body]
    return body


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    # the nodes' processes (Serve's proxies among them) inherit this: replica lost -> 503, not 500
    previous = os.environ.get(PROXY_CALLBACK_ENV)
    os.environ[PROXY_CALLBACK_ENV] = PROXY_CALLBACK
    nodes = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    nodes.add_node(num_cpus=1)
    ray.init(address=nodes.address, log_to_driver=False)
    try:
        yield nodes
    finally:
        serve.shutdown()
        ray.shutdown()
        nodes.shutdown()
        if previous is None:
            os.environ.pop(PROXY_CALLBACK_ENV, None)
        else:
            os.environ[PROXY_CALLBACK_ENV] = previous


@pytest.fixture(scope="module")
def sd_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ray-metrics-sd")


def local_config_copy(models_root: Path, sd_dir: Path, port: int) -> dict[str, Any]:  # noqa: F811
    """deploy/ray/serve_config.local.yaml with only what must differ here: the models (the tiny ones,
    through the file's own ``args``, as a user points it elsewhere), the file_sd directory, a free
    loopback port, the replica count pinned to REPLICAS (the kill needs a second one serving), and the
    test's settings in ``args`` (the same ones the plain uvicorn side runs: see SETTINGS)."""
    config = yaml.safe_load(LOCAL_CONFIG.read_text(encoding="utf-8"))
    [app] = config["applications"]
    assert app["name"] == APP and app["args"]["models_dir"] == "models"
    app["args"] |= {"models_dir": str(models_root), "metrics_sd_dir": str(sd_dir), **SETTINGS}
    config["http_options"] |= {"host": "127.0.0.1", "port": port}
    [deployment] = app["deployments"]
    deployment["autoscaling_config"] |= {"min_replicas": REPLICAS, "max_replicas": REPLICAS}
    return config


@pytest.fixture(scope="module")
def serve_url(
    cluster: Cluster,
    models_root: Path,  # noqa: F811
    sd_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[str]:
    port = free_port()
    config = tmp_path_factory.mktemp("serve-config") / LOCAL_CONFIG.name
    config.write_text(yaml.safe_dump(local_config_copy(models_root, sd_dir, port)), encoding="utf-8")
    # `serve run` as a user runs it from the repository root, against this cluster; --non-blocking: it
    # submits the config to Serve's (detached) controller and returns.
    command = [str(SERVE_CLI), "run", str(config), "--address", cluster.address, "--non-blocking"]
    submitted = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=180, check=False)
    assert submitted.returncode == 0, submitted.stdout[-2000:] + submitted.stderr[-2000:]

    def running() -> bool:
        app = serve.status().applications.get(APP)
        assert app is None or app.status != "DEPLOY_FAILED", app.message if app else None
        return app is not None and app.status == "RUNNING" and running_replicas() == REPLICAS

    wait_until(running, timeout=240, what=f"{APP} RUNNING from {LOCAL_CONFIG.name}")
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: every_proxy_routes(url), timeout=120, what="every proxy's route table")
    yield url
    serve.delete(APP)


@pytest.fixture(scope="module")
def plain_url(models_root: Path) -> Iterator[str]:  # noqa: F811
    with served(settings_for(models_root, **SETTINGS)) as url:
        yield url


def every_proxy_routes(url: str) -> bool:
    """True once PROXY_PROBES fresh connections all find the app in the proxy's route table. With
    EveryNode, both nodes' proxies listen on the one loopback port (the kernel spreads connections
    between them), and a proxy can lag the controller: /readyz through one, 404 through the other."""
    for _ in range(PROXY_PROBES):
        try:
            routes = httpx.get(f"{url}/-/routes", timeout=10)  # a new connection each time
        except httpx.HTTPError:
            return False
        if routes.status_code != 200 or "/" not in routes.json():
            return False
    return True


def running_replicas() -> int:
    deployment = serve.status().applications[APP].deployments["RetentionService"]
    return int(deployment.replica_states.get("RUNNING", 0))


def test_every_task_answers_through_the_proxy_as_plain_uvicorn(serve_url: str, plain_url: str) -> None:
    assert httpx.get(f"{serve_url}/readyz", timeout=30).json()["status"] == "ready"
    for path, body in REQUESTS:
        # one request at a time on both sides: the same batch shapes, so bit-equal vectors
        proxied = httpx.post(f"{serve_url}{path}", json=body, timeout=60)
        plain = httpx.post(f"{plain_url}{path}", json=body, timeout=60)
        assert proxied.status_code == plain.status_code == 200, proxied.text
        assert_same_body(without_timing(proxied.json()), without_timing(plain.json()), path, rows_of(body))
        assert proxied.headers["x-rho-effective"] == plain.headers["x-rho-effective"]
    bad = httpx.post(f"{serve_url}/classify", json={"text": ""}, timeout=30)
    assert bad.status_code == httpx.post(f"{plain_url}/classify", json={"text": ""}, timeout=30).status_code
    assert bad.json() == httpx.post(f"{plain_url}/classify", json={"text": ""}, timeout=30).json()


def test_openai_client_against_the_proxy(serve_url: str, plain_url: str) -> None:
    client = openai.OpenAI(base_url=f"{serve_url}/v1", api_key="unused", max_retries=0, timeout=60)
    texts = [TEXT, CONTEXT, "short"]
    answer = client.embeddings.create(model="tiny-embedding", input=texts, extra_body={"rho": 0.3})
    reference = httpx.post(f"{plain_url}/embed", json={"texts": texts, "rho": 0.3}, timeout=60).json()
    got = np.array([d.embedding for d in answer.data], dtype=np.float32)
    want = np.array(reference["embeddings"], dtype=np.float32)
    np.testing.assert_allclose(got, want, rtol=0.0, atol=MULTI_ROW_TOLERANCE)  # several rows: see SETTINGS
    assert answer.usage.prompt_tokens == reference["usage"]["processed_tokens"]
    for text in texts:  # one row a request: the same shape on both sides, so the same bits
        one = client.embeddings.create(model="tiny-embedding", input=text, extra_body={"rho": 0.3})
        alone = httpx.post(f"{plain_url}/embed", json={"text": text, "rho": 0.3}, timeout=60).json()
        assert one.data[0].embedding == alone["embeddings"][0]


def test_each_replica_serves_its_own_metrics_to_prometheus_file_sd(serve_url: str, sd_dir: Path) -> None:
    httpx.post(f"{serve_url}/classify", json={"text": TEXT}, timeout=60)
    wait_until(lambda: len(list(sd_dir.glob("*.json"))) >= REPLICAS, timeout=60, what="replica targets")
    replicas = set()
    for path in sd_dir.glob("*.json"):
        [group] = json.loads(path.read_text())
        assert group["labels"]["app"] == APP and group["labels"]["deployment"] == "RetentionService"
        replicas.add(group["labels"]["replica"])
        text = httpx.get(f"http://{group['targets'][0]}/metrics", timeout=30).text
        assert "retention_requests_total" in text and "retention_queue_depth" in text
    assert len(replicas) == REPLICAS
    assert "retention_requests_total" in httpx.get(f"{serve_url}/metrics", timeout=30).text


def replica_targets(sd_dir: Path) -> dict[str, str]:
    """replica id -> host:port of its own /metrics, from the file_sd files the replicas wrote."""
    targets = {}
    for path in sd_dir.glob("*.json"):
        [group] = json.loads(path.read_text())
        targets[group["labels"]["replica"]] = group["targets"][0]
    return targets


def requests_served(target: str) -> float:
    """The replica's own retention_requests_total (all endpoints, tasks and statuses)."""
    text = httpx.get(f"http://{target}/metrics", timeout=10).text
    lines = (line for line in text.splitlines() if line.startswith("retention_requests_total"))
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines)


def busiest_replica(sd_dir: Path, window_s: float = 1.0) -> tuple[str, float, float]:
    """(replica id, requests it served in the last ``window_s``, in all) of the replica answering the
    most requests right now."""
    live = {a["name"] for a in replica_actors()}
    targets = {r: t for r, t in replica_targets(sd_dir).items() if any(n.endswith(r) for n in live)}
    before = {replica: requests_served(target) for replica, target in targets.items()}
    time.sleep(window_s)
    after = {replica: requests_served(target) for replica, target in targets.items()}
    replica = max(targets, key=lambda r: after[r] - before[r])
    return replica, after[replica] - before[replica], after[replica]


def replica_actors() -> list[dict[str, str]]:
    """The live Serve replica actors (a dead one's name is released)."""
    return [a for a in ray.util.list_named_actors(all_namespaces=True) if "SERVE_REPLICA" in a["name"]]


def replica_pid(name: str, namespace: str) -> int:
    """The process id of a Serve replica actor (every node of the test cluster is on this machine)."""
    actor = ray.get_actor(name, namespace=namespace)
    return int(ray.get(actor.__ray_call__.remote(lambda _self: os.getpid()), timeout=60))


def test_a_replica_killed_under_load_answers_or_refuses_and_is_replaced(serve_url: str, sd_dir: Path) -> None:
    # (status or transport error, seconds, Retry-After, our error code or None)
    results: list[tuple[int | str, float, str | None, str | None]] = []
    stop = threading.Event()

    def client() -> None:
        with httpx.Client(timeout=DEADLINE_S) as http:
            while not stop.is_set():
                start = time.monotonic()
                retry_after = code = None
                try:
                    response = http.post(f"{serve_url}/classify", json={"text": TEXT})
                    status: int | str = response.status_code
                    retry_after = response.headers.get("retry-after")
                    if status != 200:
                        code = response.json()["error"]["code"]
                except httpx.TimeoutException:
                    status = "timeout"
                except httpx.TransportError as exc:
                    status = type(exc).__name__
                results.append((status, time.monotonic() - start, retry_after, code))

    threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
    for thread in threads:
        thread.start()
    wait_until(lambda: len(replica_targets(sd_dir)) >= REPLICAS, timeout=60, what="replica targets")
    wait_until(lambda: len(results) >= 20, timeout=60, what="load running")
    # the victim: the replica serving the most requests at this moment (its own counter, just read)
    replica, recent, served = busiest_replica(sd_dir)
    [victim] = [actor for actor in replica_actors() if actor["name"].endswith(replica)]
    pid = replica_pid(victim["name"], victim["namespace"])
    os.kill(pid, signal.SIGKILL)  # a crash: no drain, no goodbye
    killed_at = len(results)
    print(f"killed replica {replica} (pid {pid}): {recent:g} requests in the last second, {served:g} in all")
    assert recent > 0 and served > 0, "the killed replica was serving requests when it was killed"
    wait_until(lambda: len(results) >= killed_at + 40, timeout=120, what="load after the kill")
    stop.set()
    for thread in threads:
        thread.join(timeout=DEADLINE_S + 10)
    assert not any(thread.is_alive() for thread in threads)
    statuses = {status for status, *_ in results}
    assert statuses <= {200, 429, 503}, statuses  # an answer or a clear refusal, never a hang or a 500
    assert max(elapsed for _, elapsed, *_ in results) < DEADLINE_S
    refusals = [(status, retry_after, code) for status, _, retry_after, code in results if status != 200]
    assert all(retry_after is not None and code is not None for _, retry_after, code in refusals), refusals
    print(f"replica SIGKILLed under load: {len(results)} requests, refusals {refusals}")
    assert [status for status, *_ in results[-10:]] == [200] * 10  # serving again

    def replaced() -> bool:
        names = [actor["name"] for actor in replica_actors()]
        return len(names) == REPLICAS and victim["name"] not in names and running_replicas() == REPLICAS

    wait_until(replaced, timeout=120, what="the replica replaced")
    for _ in range(2 * REPLICAS):
        assert httpx.post(f"{serve_url}/classify", json={"text": TEXT}, timeout=60).status_code == 200


def test_ray_data_job_on_two_nodes_equals_the_single_process_client(
    cluster: Cluster,
    serve_url: str,
    plain_url: str,
    models_root: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    serve.delete(APP)  # the replicas' CPUs go to the actor pool
    rng = random.Random(0)
    words = ["the", "film", "was", "good", "bad", "great", "awful", "plot", "actor", "scene", "long", "short"]
    rows = [
        {"id": f"r{i}", "text": " ".join(rng.choices(words, k=rng.randint(1, 10)))} for i in range(BATCH_ROWS)
    ]
    source = tmp_path / "rows.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    common = [str(source), "--id-field", "id", "--rho", "0.5", "--no-progress"]
    assert batch.main([common[0], str(tmp_path / "http.jsonl"), *common[1:], "--url", plain_url]) == 0
    ray_out = tmp_path / "ray.jsonl"
    ray_args = [
        "--engine",
        "ray",
        "--models-dir",
        str(models_root),
        "--actors",
        "2",
        "--rows-per-batch",
        "500",
    ]
    # resume: the first 1234 records are already there (as an interrupted run leaves them)
    reference = (tmp_path / "http.jsonl").read_text(encoding="utf-8").splitlines()
    ray_out.write_text("\n".join(reference[:1234]) + "\n", encoding="utf-8")
    summary = tmp_path / "summary.json"
    assert batch.main([common[0], str(ray_out), *common[1:], *ray_args, "--summary-json", str(summary)]) == 0
    got = [json.loads(line) for line in ray_out.read_text(encoding="utf-8").splitlines()]
    want = [json.loads(line) for line in reference]
    assert len(got) == BATCH_ROWS
    exact = sum(without_timing(g) == without_timing(w) for g, w in zip(got, want, strict=True))
    print(f"ray data vs single-process: {exact}/{len(want)} records bit-equal")
    # rows batched differently on each side (an actor's 256 at once, the client's requests): see SETTINGS
    assert_same_body([without_timing(r) for r in got], [without_timing(r) for r in want], rows=len(want))
    report = json.loads(summary.read_text())
    assert report["resumed"] == 1234 and report["processed"] == BATCH_ROWS - 1234 and report["errors"] == 0
    assert report["token_work_saved"] > 0
