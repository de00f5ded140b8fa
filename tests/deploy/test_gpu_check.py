"""scripts/gpu_check.sh end to end on this CPU: ``prepare`` (real wheels for this Python, the real
tokenizer and fit texts, checksums) into a temporary folder, then ``run --dry-run``: the device call's
script itself, with tiny sizes, installing the carried wheels with pip --no-index."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import gpu, gpu_forward
from tests.tiny import write_squad_paragraphs

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_check.sh"
# Pure-Python wheels this venv holds at the same versions: installed into the site ahead of it, harmless.
WHEELS = "annotated-types typing-inspection"


def script(command: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), *command],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_prepare_then_a_dry_run_writes_the_cells_and_the_image_check(tmp_path: Path) -> None:
    from training.data import DATA_ROOT_VARIABLE

    # prepare copies the fit recipe's texts from the data root: one in ../shared/data's layout, made here
    data_root = write_squad_paragraphs(tmp_path / "data")
    check_dir, out, site = tmp_path / "carried", tmp_path / "out", tmp_path / "site"
    python = ".".join(platform.python_version_tuple()[:2])
    env = {
        "GPU_CHECK_DIR": str(check_dir),
        "GPU_CHECK_PYTHON": python,  # the wheels for this Python, so that pip installs them here
        "GPU_CHECK_WHEELS": WHEELS,
        "GPU_CHECK_SITE": str(site),
        "PYTHON": sys.executable,
        "OUT": str(out),
        "OMP_NUM_THREADS": "1",
        DATA_ROOT_VARIABLE: str(data_root),
    }
    prepared = script(["prepare"], env, timeout=120)
    assert prepared.returncode == 0, prepared.stderr[-3000:]
    assert f'carry: ["{check_dir}"]' in prepared.stdout  # outside the checkout: the absolute path
    manifest = json.loads((check_dir / "manifest.json").read_text())
    assert manifest["device_python"] == python and len(manifest["wheels"]) == 2
    assert (check_dir / "assets" / gpu.TOKENIZER_DIR).is_dir() and (check_dir / "SHA256SUMS").is_file()
    assert (check_dir / "wheels").is_dir() and all(name.endswith(".whl") for name in manifest["wheels"])

    ran = script(["run", "--dry-run"], env, timeout=150)
    assert ran.returncode == 0, (ran.stdout[-3000:], ran.stderr[-3000:])
    payload = json.loads((out / "gpu-check" / gpu.RESULT_FILE).read_text())
    image = payload["image"]
    assert image["dry_run"] is True and image["carried"].startswith("checksums ok")
    assert image["image"]["python"] == platform.python_version() and image["image"]["python_matches_wheels"]
    assert image["image"]["cuda_available"] is False and image["image"]["versions"]["torch"]
    assert image["install"] == "pip --no-index --target: 2 wheels" and image["installed"]["imports"] == "ok"
    installed = {path.name.split("-")[0] for path in site.glob("*.dist-info")}
    assert installed == {"annotated_types", "typing_inspection"}

    assert payload["dry_run"] is True and payload["parts"] == ["forward"]
    assert (
        payload["onnxruntime"]["status"] == gpu.NOT_SELECTED
        and payload["torch"]["status"] == gpu.NOT_SELECTED
    )
    forward = payload["forward"]
    assert forward["status"] == gpu.MEASURED and forward["skipped_for_time"] == forward["failed_cells"] == []
    cells = forward["cells"]
    grid = {(c["shape"], c["precision"], c["batch"], c["seq_len"]) for c in cells}
    assert grid == {
        ("tiny", p, b, s)
        for p in gpu_forward.PRECISIONS
        for b in gpu_forward.DRY_BATCHES
        for s in gpu_forward.DRY_LENGTHS
    }
    expected = {
        gpu_forward.DENSE,
        *(f"retention@{rho:g}" for rho in gpu_forward.RHOS),
    }  # no CUDA graph on a CPU
    assert {c["variant"] for c in cells} == expected
    assert all(c["sequences_per_second"] > 0 and c["token_work_limit"] >= 1.0 for c in cells)
    assert any("kernels_per_forward" in c for c in cells)  # the profiled cells
    # what the run imported from outside the standard library: the carried list must hold it on a device
    assert {"torch", "transformers", "pydantic", "safetensors"} <= set(payload["distributions"])
    assert (out / "gpu-check" / "gpu.md").is_file() and (out / "gpu-check" / "run.log").is_file()


def test_the_time_guard_adds_no_cell_past_the_budget(tmp_path: Path) -> None:
    args = ["--dry-run", "--out", str(tmp_path), "--parts", "torch", "--budget-s", "0", "--batches", "1"]
    plan = gpu.make_plan(gpu.parse(args))
    model, _ = gpu.build_model(plan)
    result = gpu.measure_torch(model, plan)
    assert result["cells"] == [] and result["skipped_for_time"] == [
        f"{precision} 1 × {gpu.DRY.seq_len}" for precision in ("fp32", "bf16-autocast")
    ]
    assert gpu.measure_fit(plan) == {"status": gpu.OUT_OF_TIME}


def test_unknown_parts_are_refused() -> None:
    with pytest.raises(SystemExit):
        gpu.parse(["--dry-run", "--out", "x", "--parts", "torch,gpu"])
