"""The torch backend on the CPU: the GPU-shaped forward (``retention_torch``) against the ONNX graph of
the same model directory, its shape plans and compiled-plan cache, and the service serving on it.

Real parts only: tiny models through the real exporter (which writes ``weights.safetensors`` beside
``model.onnx``), real onnxruntime sessions, the real app over HTTP (TestClient). On the CPU the compiled
plans run their static-buffer path eagerly; on a GPU the same path is captured as CUDA graphs (the GPU
check, ``scripts/gpu_check.sh``, measures that)."""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from retention_core.contract import WEIGHTS_FILE, Manifest, Schedule
from retention_core.schedule import keep_counts
from retention_core.shapes import bucket
from retention_core.tasks import task_spec
from retention_torch.runner import BATCH_BUCKETS, LENGTH_BUCKETS, make_plan
from service.backends import ModelLoadError, open_backend
from service.backends.onnx_backend import OnnxBackend
from service.backends.torch_backend import TorchBackend
from service.runtime import load_model
from service.scheduling.planner import plan_runs
from tests.service.conftest import running, settings_for
from training.engine import selection as R
from training.engine.model import RetentionConfig
from training.export.graph import example_inputs
from training.export.install import export_model
from training.tiny import tiny_model, tiny_recipe

EMBEDDING_TEXTS = ["a fine film with a slow start", "a dull one", "x " * 40]
RAGGED_RHOS = (1.0, 0.3, 0.7, 0.5, 1.0)  # mixed budgets in one batch, a dense row among them
OUTPUT_ATOL = 1e-4  # the export's own bound (training.export.graph.LOGIT_ATOL)
# The product's embedding selection (models/recipes/minilm-embed.yaml): merging, a leading share, a floor,
# selecting at every other layer.
PRODUCT_SELECTION = RetentionConfig(
    merge_dropped=True, leading_share=0.25, min_kept_tokens=4, pruning_interval=2, schedule_power=0.5
)


def torch_settings(root: Path, **overrides: object) -> object:
    return settings_for(root, backend="torch", **overrides)


@pytest.fixture(scope="module")
def merging_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny embedding model with the product's selection (merging, every other layer, floor)."""
    model, tokenizer = tiny_model("embedding", seed=3, config=PRODUCT_SELECTION)
    directory = tmp_path_factory.mktemp("merging") / "tiny-merging"
    export_model(model, tiny_recipe("embedding", name="tiny-merging"), tokenizer, directory)
    return directory


def both_backends(directory: Path) -> tuple[OnnxBackend, TorchBackend, Manifest]:
    manifest = Manifest.read(directory)
    spec = task_spec(manifest.task)
    root = directory.parent
    onnx = open_backend(directory, manifest, spec, settings_for(root))
    ours = open_backend(directory, manifest, spec, settings_for(root, backend="torch"))
    assert isinstance(onnx, OnnxBackend) and isinstance(ours, TorchBackend)
    return onnx, ours, manifest


def ragged_feeds(
    manifest: Manifest, rhos: tuple[float, ...], length: int, seed: int
) -> dict[str, np.ndarray]:
    example = example_inputs(len(rhos), length, 30522, rhos, seed)
    return {spec.name: example[spec.name].numpy() for spec in task_spec(manifest.task).inputs}


@pytest.mark.parametrize("task", ["embedding", "classification", "qa", "summarization"])
def test_the_export_writes_weights_that_match_the_graph(tiny_models: dict[str, Path], task: str) -> None:
    """Every task's directory carries weights.safetensors, described and parity-checked in the manifest."""
    manifest = Manifest.read(tiny_models[task])
    described = manifest.torch_weights
    assert described is not None and described.file == WEIGHTS_FILE
    assert (tiny_models[task] / WEIGHTS_FILE).stat().st_size == described.bytes
    assert described.parity.kept_tokens_equal and described.parity.max_abs_diff <= OUTPUT_ATOL
    assert described.parity.cases >= 20


@pytest.mark.parametrize("task", ["embedding", "classification", "qa"])
def test_mixed_rho_on_a_ragged_batch_equals_the_onnx_graph(tiny_models: dict[str, Path], task: str) -> None:
    """Mixed ρ on ragged rows: outputs within the export's bound, kept counts and every token's survival
    depth (which tokens entered which layer) equal. ρ = 1 alone: the dense model, cosine ≥ 0.9999."""
    onnx, ours, manifest = both_backends(tiny_models[task])
    for seed, length in enumerate((7, 24, 50)):
        feeds = ragged_feeds(manifest, RAGGED_RHOS, length, seed)
        expected, got = onnx.run(feeds), ours.run(feeds)
        np.testing.assert_array_equal(got[1], expected[1])
        assert expected[2] is not None and got[2] is not None
        np.testing.assert_array_equal(got[2], expected[2])
        assert float(np.max(np.abs(got[0] - expected[0]))) <= OUTPUT_ATOL
    dense = ragged_feeds(manifest, (1.0,) * 3, 40, seed=9)
    expected_main, got_main = onnx.run(dense)[0].reshape(3, -1), ours.run(dense)[0].reshape(3, -1)
    cosine = np.sum(expected_main * got_main, 1) / (
        np.linalg.norm(expected_main, axis=1) * np.linalg.norm(got_main, axis=1)
    )
    assert float(cosine.min()) >= 0.9999


def test_the_product_selection_equals_the_onnx_graph(merging_model: Path) -> None:
    """Merging, the leading span, the floor and every-other-layer selection, at every length bucket
    boundary the runner pads to."""
    onnx, ours, manifest = both_backends(merging_model)
    for seed, (length, rhos) in enumerate(itertools.product((5, 16, 17, 33, 64), ((0.3,), RAGGED_RHOS))):
        feeds = ragged_feeds(manifest, rhos * (1 if len(rhos) > 1 else 3), length, seed)
        expected, got = onnx.run(feeds), ours.run(feeds)
        np.testing.assert_array_equal(got[1], expected[1])
        assert expected[2] is not None and got[2] is not None
        np.testing.assert_array_equal(got[2], expected[2])
        assert float(np.max(np.abs(got[0] - expected[0]))) <= OUTPUT_ATOL


def test_batch_padding_to_a_bucket_changes_no_row(merging_model: Path) -> None:
    """Three rows run padded to the 4-row bucket (and to a length bucket) answer as the same rows among
    five: a padding row never leaks into a real one."""
    _, ours, manifest = both_backends(merging_model)
    feeds = ragged_feeds(manifest, RAGGED_RHOS, 29, seed=4)
    first_three = {name: value[:3] for name, value in feeds.items()}
    assert bucket(3, BATCH_BUCKETS) == 4
    whole, part = ours.run(feeds), ours.run(first_three)
    np.testing.assert_allclose(part[0], whole[0][:3], atol=1e-5)
    np.testing.assert_array_equal(part[1], whole[1][:3])


def test_a_plan_is_compiled_once_reused_and_evicted_least_recent_first(merging_model: Path) -> None:
    """The CPU form of the graph cache: the same shapes reuse one compiled plan (its static buffers
    refilled with each batch's data, so a second batch of other values answers for itself); past
    ``max_cuda_graphs`` the least recently used plan leaves."""
    manifest = Manifest.read(merging_model)
    spec = task_spec(manifest.task)
    ours = open_backend(
        merging_model, manifest, spec, settings_for(merging_model.parent, backend="torch", max_cuda_graphs=2)
    )
    assert isinstance(ours, TorchBackend)
    runner = ours.runner
    first, second = (ragged_feeds(manifest, (0.3,) * 2, 20, seed) for seed in (1, 2))
    answer_first = ours.run(first)[0]
    assert len(runner.compiled) == 1
    answer_second = ours.run(second)[0]
    assert len(runner.compiled) == 1  # same plan: same batch, length and slots
    assert not np.allclose(answer_first, answer_second)
    np.testing.assert_allclose(ours.run(first)[0], answer_first, atol=1e-6)  # buffers refilled, not stale
    plans = list(runner.compiled)
    ours.run(ragged_feeds(manifest, (1.0,) * 2, 20, 3))  # the dense plan
    ours.run(ragged_feeds(manifest, (0.3,) * 5, 60, 4))  # another batch and length bucket
    assert len(runner.compiled) == 2 and plans[0] not in runner.compiled
    assert runner.stats.captured == 0 and runner.stats.evictions == 1  # the CPU runs the plans eagerly


def test_plans_bound_every_row_and_take_the_dense_branch_at_rho_one() -> None:
    schedule = Schedule(num_points=6, power=0.5, min_kept_tokens=4, pruning_interval=2, merge_dropped=True)
    num_real = np.array([100, 37, 3, 128])
    rho = np.array([0.3, 0.5, 0.3, 0.7], dtype=np.float32)
    counts = keep_counts(schedule, rho, num_real, np.ones(4, dtype=np.int64))
    plan = make_plan(schedule, counts, num_real, 4, 128)
    assert plan.selecting and plan.masked
    assert all(plan.slots[p] >= counts[:, p].max() for p in range(6))
    assert all(a >= b for a, b in itertools.pairwise(plan.slots)) and plan.slots[0] <= 128
    assert plan.slots[0] == plan.slots[1] and plan.slots[2] == plan.slots[3]  # inside a group: no selection
    assert all(slot % 16 == 0 or slot == 128 for slot in plan.slots)  # the quantum: 128 / 8
    dense = keep_counts(schedule, np.ones(4, dtype=np.float32), num_real, np.ones(4, dtype=np.int64))
    assert make_plan(schedule, dense, num_real, 4, 128) == make_plan(schedule, dense, num_real, 4, 128)
    assert not make_plan(schedule, dense, num_real, 4, 128).selecting
    full = np.full(4, 128)
    unmasked = make_plan(
        schedule, keep_counts(schedule, np.ones(4, np.float32), full, np.ones(4, np.int64)), full, 4, 128
    )
    assert not unmasked.masked  # full rows at ρ = 1: SDPA runs without a mask (flash on a GPU)


def test_host_keep_counts_equal_the_training_schedule() -> None:
    """The numpy schedule the torch backend sizes its plans with is the graph's, to the token, over a
    grid of powers, intervals, floors, protected tokens, lengths and ρ."""
    rhos = np.array([0.05, 0.1, 0.25, 0.3, 1 / 3, 0.5, 0.55, 0.7, 0.9, 0.999, 1.0], dtype=np.float32)
    lengths = np.array([1, 2, 3, 5, 17, 32, 33, 100, 255, 256, 511, 512])
    rho, real = (a.ravel() for a in np.meshgrid(rhos, lengths))
    protected = np.minimum(real, np.arange(len(real)) % 7 + 1)
    for points, power, interval, floor in itertools.product((6, 12, 5), (0.5, 1.0, 2.0), (1, 2, 3), (0, 32)):
        schedule = Schedule(num_points=points, power=power, pruning_interval=interval, min_kept_tokens=floor)
        expected = R.keep_counts(
            torch.from_numpy(rho),
            torch.from_numpy(real),
            torch.from_numpy(protected),
            points,
            power,
            floor,
            interval,
        )
        np.testing.assert_array_equal(keep_counts(schedule, rho, real, protected), expected.numpy())


def test_a_directory_without_torch_weights_is_a_clear_load_error(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    """An export from before the torch backend (no weights, no manifest entry) fails to load on it with
    a message an operator can act on, and still loads on onnxruntime."""
    directory = tmp_path / "old-model"
    shutil.copytree(tiny_models["embedding"], directory)
    (directory / WEIGHTS_FILE).unlink()
    manifest = Manifest.read(directory)
    manifest.model_copy(update={"torch_weights": None}).write(directory)
    with pytest.raises(ModelLoadError, match=r"no torch weights .* RETENTION_BACKEND=onnxruntime"):
        load_model(directory, settings_for(tmp_path, backend="torch"))
    assert load_model(directory, settings_for(tmp_path)).backend_kind == "onnxruntime"


def test_the_service_serves_on_the_torch_backend(models_root: Path) -> None:
    """RETENTION_BACKEND=torch: every task answers over HTTP; /models and /metrics say what runs it; the
    vectors equal the onnxruntime server's."""
    answers = {}
    for backend in ("onnxruntime", "torch"):
        with running(settings_for(models_root, backend=backend)) as (_, client):
            listed = {m["name"]: m for m in client.get("/models").json()["models"]}
            assert {m["backend"] for m in listed.values()} == {backend}
            assert {m["device"] for m in listed.values()} == {"cpu"}
            metrics = client.get("/metrics").text
            assert (
                f'retention_model_backend_info{{backend="{backend}",device="cpu",model="tiny-embedding"}} 1.0'
                in metrics
            )
            response = client.post(
                "/v1/embeddings", json={"model": "tiny-embedding", "input": EMBEDDING_TEXTS, "rho": 0.3}
            )
            assert response.status_code == 200, response.text
            answers[backend] = np.array([item["embedding"] for item in response.json()["data"]])
            for path, body in (
                ("/classify?rho=0.5", {"text": "a slow start, but a wonderful last hour"}),
                ("/qa?rho=0.5", {"question": "Who won?", "context": "Denver beat Carolina 24-10."}),
                ("/summarize?rho=0.5", {"text": "First sentence. Second one. Third.", "max_sentences": 1}),
            ):
                assert client.post(path, json=body).status_code == 200, (backend, path)
    np.testing.assert_allclose(answers["torch"], answers["onnxruntime"], atol=1e-4)


def test_the_planner_fills_the_batch_buckets_of_a_bucketed_backend() -> None:
    """Runs are planned as the torch backend pads them: 9 equal rows cost 8 + 1 padded rows as two runs
    and 16 as one, so without a per-run cost they become two runs; a large enough per-run cost makes one
    run of them; every row is planned once and no run passes the token budget."""
    nine = [32] * 9
    assert sorted(len(run) for run in plan_runs(nine, 10_000, 0.0, BATCH_BUCKETS)) == [1, 8]
    assert [len(run) for run in plan_runs(nine, 10_000, 500.0, BATCH_BUCKETS)] == [9]
    assert [len(run) for run in plan_runs(nine, 10_000, 0.0)] == [9]  # unbucketed: padding alone
    rng = np.random.default_rng(0)
    lengths = [int(bucket(int(n), LENGTH_BUCKETS)) for n in rng.integers(5, 500, size=300)]
    runs = plan_runs(lengths, 8192, 64.0, BATCH_BUCKETS)
    assert sorted(i for run in runs for i in run) == list(range(300))
    assert all(len(run) * max(lengths[i] for i in run) <= 8192 for run in runs)


def test_bf16_at_rho_one_is_the_dense_model(merging_model: Path) -> None:
    """bf16 (the GPU default) on the CPU: ρ = 1 vectors against the fp32 ONNX graph, cosine ≥ 0.999; the
    kept counts (computed on the host) equal at every ρ."""
    manifest = Manifest.read(merging_model)
    spec = task_spec(manifest.task)
    onnx = open_backend(merging_model, manifest, spec, settings_for(merging_model.parent))
    ours = open_backend(
        merging_model,
        manifest,
        spec,
        settings_for(merging_model.parent, backend="torch", torch_dtype="bfloat16"),
    )
    assert ours.info.precision == "bf16"
    dense = ragged_feeds(manifest, (1.0,) * 4, 48, seed=11)
    expected, got = onnx.run(dense)[0], ours.run(dense)[0]
    cosine = np.sum(expected * got, 1) / (np.linalg.norm(expected, axis=1) * np.linalg.norm(got, axis=1))
    assert float(cosine.min()) >= 0.999
    mixed = ragged_feeds(manifest, RAGGED_RHOS, 48, seed=12)
    np.testing.assert_array_equal(ours.run(mixed)[1], onnx.run(mixed)[1])
