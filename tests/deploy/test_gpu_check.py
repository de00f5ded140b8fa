"""scripts/gpu_check.sh end to end on this CPU: ``prepare`` (real wheels for this Python, the real
tokenizer and SQuAD dev paragraphs, checksums) into a temporary folder, then ``run --dry-run``:
the device call's script itself, with tiny sizes, installing the carried wheels with pip --no-index, its
forward part and then its service part (both real servers, real HTTP). And the carried list against the
device image: the service part's imports succeed where only the carried wheels and the image's own
packages can be imported."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

from benchmarks import gpu, gpu_forward, gpu_service
from tests.benchmarks.cells import assert_answered_or_shed
from tests.tiny import write_rows, write_squad_paragraphs

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
    from training.recipes.data import DATA_ROOT_VARIABLE

    # prepare copies the service part's documents from the data root (../shared/data's layout, made here):
    # SQuAD dev paragraphs past the selection's 32-token floor
    data_root = write_squad_paragraphs(tmp_path / "data")
    dev = [
        {"question": "?", "context": f"Paragraph {i}: " + "rivers carry stones to the sea. " * 8}
        for i in range(6)
    ]
    write_rows(data_root / "squad" / "validation.jsonl.gz", dev)
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
    assert (check_dir / "assets" / gpu_service.TOKENIZER_DIR).is_dir() and (
        check_dir / "SHA256SUMS"
    ).is_file()
    paragraphs = json.loads((check_dir / "assets" / gpu_service.PARAGRAPHS_FILE).read_text())
    assert sorted(paragraphs) == sorted(row["context"] for row in dev)
    assert (check_dir / "wheels").is_dir() and all(name.endswith(".whl") for name in manifest["wheels"])

    ran = script(["run", "--dry-run"], env, timeout=360)
    assert ran.returncode == 0, (ran.stdout[-3000:], ran.stderr[-3000:])
    payload = json.loads((out / "gpu-check" / gpu.RESULT_FILE).read_text())
    image = payload["image"]
    assert image["dry_run"] is True and image["carried"].startswith("checksums ok")
    assert image["image"]["python"] == platform.python_version() and image["image"]["python_matches_wheels"]
    assert image["image"]["cuda_available"] is False and image["image"]["versions"]["torch"]
    assert image["install"] == "pip --no-index --target: 2 wheels" and image["installed"]["imports"] == "ok"
    installed = {path.name.split("-")[0] for path in site.glob("*.dist-info")}
    assert installed == {"annotated_types", "typing_inspection"}

    assert payload["dry_run"] is True
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

    # the service part, after the forward part: the CPU dry run of benchmarks.gpu_service
    service = json.loads((out / "gpu-check" / gpu_service.GPU_RESULT).read_text())
    assert service["dry_run"] is True and service["texts"]["source"].endswith(gpu_service.PARAGRAPHS_FILE)
    (shape,) = service["shapes"].values()
    assert shape["status"] == gpu_service.MEASURED and shape["skipped_for_time"] == []
    served = {(c["target"], c["rho"], c["concurrency"]) for c in shape["cells"]}
    assert len(shape["cells"]) == len(served) and served == {
        (target, rho, clients)
        for target, rho in [(gpu_service.PEER, gpu_service.NO_RHO)]
        + [(gpu_service.OURS, rho) for rho in gpu_service.RHOS]
        for clients in gpu_service.CLIENTS
    }
    for cell in shape["cells"]:  # what holds on a loaded machine too: rho=auto may shed (429), never fail
        assert_answered_or_shed(cell)
        assert cell["p50_ms"] <= cell["p99_ms"] and cell["throughput_rps"] > 0
    assert "service part:" in (out / "gpu-check" / "run.log").read_text()
    assert not (site.parent / f"{site.name}.service-pids").exists()  # its servers' groups were killed
    assert len(list((out / "gpu-check").iterdir())) <= 8  # what one device call brings back


def test_the_time_guard_adds_no_cell_past_the_budget(tmp_path: Path) -> None:
    forward = gpu.measure_forward(dry_run=True, budget_s=0)
    assert forward["cells"] == [] and forward["skipped_for_time"]


# The device image's packages (the machine's 'cuda' image, as its lender listed them on 2026-11-17):
# everything else the service part imports must travel in the carried wheels.
DEVICE_IMAGE = """
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build
certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-
core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet
filelock flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore
httpx huggingface-hub humanize hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-
cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities
linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes
mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals networkx ninja numba
numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-
cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-
cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir
onnxruntime onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint
packaging pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client propcache protobuf
psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions pytest pytest-
benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml
regex requests rich sacrebleu safetensors scikit-build-core scikit-image scikit-learn scipy seaborn
sentencepiece sentence-transformers setuptools shellingham simplejson six sortedcontainers statsmodels
sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm
tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers
treescope triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel
wrapt xarray xxhash yarl zipp
""".split()  # noqa: SIM905
# The service part's imports, as the device call runs them: our server (and what uvicorn loads when it
# runs, the app built), the peer, the client, the metrics parser.
SERVICE_IMPORTS = """
import tempfile
from pathlib import Path
import uvicorn.loops.auto, uvicorn.protocols.http.auto, uvicorn.lifespan.on, uvicorn.protocols.http.h11_impl
import service.__main__, service.backends.torch_backend, prometheus_client.parser
from service.api.app import create_app
from service.settings import Settings
import benchmarks.gpu_service, benchmarks.st_peer, benchmarks.load, sentence_transformers, fastapi
create_app(Settings(models_dir=Path(tempfile.mkdtemp())))
print("imported")
"""
HIDE_OTHERS = """
import importlib.metadata, re, sys

def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()

allowed = {norm(name) for name in sys.argv[1].split()}
owners = importlib.metadata.packages_distributions()

class DeviceImage:
    def find_spec(self, name, path=None, target=None):
        dists = owners.get(name.split(".")[0])
        if dists and not allowed & {norm(d) for d in dists}:
            raise ImportError(f"{name} ({', '.join(dists)}) is neither carried nor in the device image")
        return None

sys.meta_path.insert(0, DeviceImage())
"""


def carried_wheels() -> list[str]:
    """DEFAULT_WHEELS of scripts/gpu_check.sh, as the script reads it."""
    text = SCRIPT.read_text()
    block = text.split('DEFAULT_WHEELS="', 1)[1].split('"', 1)[0]
    return block.split()


def test_the_carried_wheels_and_the_image_hold_everything_the_service_part_imports() -> None:
    wheels = carried_wheels()
    assert {"fastapi", "starlette", "uvicorn", "pydantic-settings", "opentelemetry-api"} <= set(wheels)
    allowed = " ".join([*wheels, *DEVICE_IMAGE, "adaptive-retention"])  # the checkout travels
    result = subprocess.run(
        [sys.executable, "-c", HIDE_OTHERS + SERVICE_IMPORTS, allowed],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0 and "imported" in result.stdout, result.stderr[-3000:]
    # and the check itself: without the carried serving stack the same imports fail
    bare = " ".join(name for name in allowed.split() if name not in {"fastapi", "starlette", "uvicorn"})
    refused = subprocess.run(
        [sys.executable, "-c", HIDE_OTHERS + SERVICE_IMPORTS, bare],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert refused.returncode != 0 and "neither carried nor in the device image" in refused.stderr
