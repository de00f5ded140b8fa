"""The GPU path on one NVIDIA GPU in one command (docs/benchmarks.md, "GPU"; ``scripts/gpu_check.sh``):
the serving forward written for the GPU (``retention_torch``) vs HF dense SDPA eager and as a CUDA graph
(``benchmarks.gpu_forward``), with the image's versions and every distribution the run imported.
``--budget-s`` stops adding cells. ``--dry-run``: the same code paths on the CPU, tiny, labelled ``cpu dry
run``. The earlier parts (``torch``: the exported graph's torch forward, whose numbers
``results/bench/gpu.md`` holds; ``onnxruntime``: the CUDA provider, whose wheel no device call can carry)
are in ``git show 670730a:benchmarks/gpu.py``; ``fit`` is the study ``experiments.gpu_fit``.

    python -m benchmarks.gpu --out results/bench            # on the GPU machine
    python -m benchmarks.gpu --dry-run --out /tmp/gpu       # this CPU, seconds
"""

from __future__ import annotations

import importlib.metadata
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from benchmarks import gpu_forward
from benchmarks.harness import cli, describe, publish

MODULE = "benchmarks.gpu"
RESULT_FILE = "gpu.json"
DRY_RUN_DEVICE = "cpu dry run"
MEASURED = "measured"


def measure_forward(dry_run: bool, budget_s: float | None) -> dict[str, Any]:
    """The forward cells on this machine's device (the CPU in a dry run), none started past ``budget_s``;
    a failure is recorded, not raised: the device's minutes are few."""
    deadline = None if budget_s is None else time.perf_counter() + budget_s
    started = time.perf_counter()
    try:
        result = gpu_forward.measure_forward(
            gpu_forward.ForwardPlan(
                device="cpu" if dry_run else "cuda",
                dry_run=dry_run,
                shapes=gpu_forward.DRY_SHAPES if dry_run else gpu_forward.SHAPES,
                batches=gpu_forward.DRY_BATCHES if dry_run else gpu_forward.BATCHES,
                lengths=gpu_forward.DRY_LENGTHS if dry_run else gpu_forward.LENGTHS,
                seconds_left=lambda: float("inf") if deadline is None else deadline - time.perf_counter(),
            )
        )
    except Exception as exc:
        traceback.print_exc()
        result = {"status": f"failed: {type(exc).__name__}: {exc}"}
    result["seconds"] = round(time.perf_counter() - started, 1)
    print(f"forward: {result['status']} ({result['seconds']} s)", flush=True)
    return result


def versions() -> dict[str, Any]:
    """Library versions as imported (onnxruntime-gpu installs under the module name onnxruntime); on a
    machine without onnx or onnxruntime (a device image), each as installed, or None."""
    import torch

    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    try:
        import onnxruntime as ort

        from training.export.manifest import versions as export_versions

        found: dict[str, Any] = {**export_versions(), "onnxruntime_providers": ort.get_available_providers()}
    except ImportError:
        libraries = ("transformers", "onnx", "onnxruntime")
        found = {"torch": torch.__version__, **{name: installed(name) for name in libraries}}
    return {**found, "cuda": torch.version.cuda, "cudnn": cudnn}


def installed(distribution: str) -> str | None:
    """The installed version of ``distribution``, or None."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def loaded_distributions() -> dict[str, str]:
    """Every installed distribution a module of this run came from, with its version and where it was
    imported from (what a device image must hold, or scripts/gpu_check.sh carry)."""
    owners = importlib.metadata.packages_distributions()
    names = sorted({module.split(".")[0] for module in list(sys.modules)})
    imported = [name for name in names if name not in sys.stdlib_module_names and not name.startswith("_")]
    found = {dist: installed(dist) for name in imported for dist in owners.get(name, [])}
    return {dist: version for dist, version in found.items() if version is not None}


def gpu_name() -> str | None:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def markdown(payload: dict[str, Any]) -> str:
    device = payload["device"]
    where = "no GPU number here" if payload["dry_run"] else f"GPU: {payload['gpu']}"
    forward = payload["forward"]
    lines = [
        f"# The GPU path: {device}",  # the title line docs/benchmarks.md replaces with its own
        "",
        f"Device: {device} ({where}). Forward: {forward['status']}.",
        "",
    ]
    if forward.get("cells"):
        lines += [
            "## The serving forward (retention_torch) vs dense SDPA",
            "",
            f"Selection: {forward['selection']}. Each ρ: its speed-up over the faster dense variant of "
            "the same precision, as one CUDA graph / eager, and (its limit, 1 / token-work).",
            "",
            *gpu_forward.markdown_rows(forward["cells"]),
            "",
        ]
        for note in forward.get("skipped_for_time", []) + forward.get("failed_cells", []):
            lines.append(f"- forward, not measured: {note}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    import torch

    argv = sys.argv[1:] if argv is None else argv
    parser = cli(MODULE, __doc__)
    parser.add_argument("--out", type=Path, required=True, help=f"directory for {RESULT_FILE} and its table")
    parser.add_argument("--dry-run", action="store_true", help="the same code paths on the CPU, tiny")
    parser.add_argument("--budget-s", type=float, default=None, help="stop adding cells past this")
    parser.add_argument("--image-check", type=Path, default=None, help="a JSON file to embed as 'image'")
    args = parser.parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        raise SystemExit("no CUDA device here: run it on a GPU machine, or --dry-run on this CPU")
    started = time.perf_counter()
    payload: dict[str, Any] = {
        "dry_run": args.dry_run,
        "device": DRY_RUN_DEVICE if args.dry_run else torch.cuda.get_device_name(0),
        "gpu": gpu_name(),
        "forward": measure_forward(args.dry_run, args.budget_s),
        "wall_seconds": round(time.perf_counter() - started, 1),
        "machine": describe(),
        "versions": versions(),
        "distributions": loaded_distributions(),
    }
    if args.image_check is not None:
        payload["image"] = json.loads(args.image_check.read_text(encoding="utf-8"))
    publish(payload, markdown, args.out / RESULT_FILE, MODULE, argv)
    if payload["forward"]["status"].startswith("failed"):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
