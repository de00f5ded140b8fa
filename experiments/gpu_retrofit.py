"""Study: does a longer retrofit make all-mpnet-base-v2's scorers beat truncation? Trained on a lent GPU.

The shipped mpnet-embed run is 300 steps (CPU, 88 min); a GPU runs the same recipe for 4-8x the steps
in minutes. The backbone is frozen (only the scorers train), so only the scorers come back, and the
model travels to the device as fp16 in pieces (a device call carries <= 64 MiB with the work tree):

    python -m experiments.gpu_retrofit prepare                  # here: .gpu-up/p1 ... pN (git-ignored)
    run(command="mkdir -p /tmp/gru && cp -r .gpu-up/pK /tmp/gru/", carry=[".gpu-up/pK"])   # K < N
    run(command="mkdir -p /tmp/gru && cp -r .gpu-up/pN /tmp/gru/ && python3 -m pip install -q --no-index
        --no-deps --target /tmp/site /tmp/gru/p1/wheels/*.whl && PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
        python3 -m experiments.gpu_retrofit device --up /tmp/gru --out $OUT --budget-s 400",
        carry=[".gpu-up/pN"])
    python -m experiments.gpu_retrofit merge <files_at>/scorers.safetensors   # here: one run dir per
                                                                              # variant beside the shipped one

On the device each variant is ``python -m training fit models/recipes/mpnet-embed.yaml`` with only
``steps`` changed (``--device cuda --precision bf16``, as the CPU run's bf16 autocast), on the fp16-rounded
backbone cast back to fp32 (the scorers then run on the original fp32 weights here: the same frozen
model up to fp16 rounding). Variants run in order while the budget lasts, the first one (300 steps) the
control for the device and the rounding.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "models" / "recipes" / "mpnet-embed.yaml"
UPLOAD_DIR = ROOT / ".gpu-up"
PIECE_BYTES = 50 * 1024 * 1024  # + the work tree (~12 MiB) stays under a call's 64 MiB
WEIGHTS = "model.safetensors"
HALF_WEIGHTS = "model.fp16.safetensors"
SCORER_PREFIX = "scorers."
VARIANT_STEPS = (300, 1200, 2400)
RUNS_ROOT = Path("/root/retention-runs")
SHIPPED_RUN = RUNS_ROOT / "mpnet-embed-full"
# What the device image lacks for training.fit (its own torch, numpy, onnxruntime stay).
SKIP_WHEELS = ("onnxruntime-",)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def prepare(out: Path) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    from training.data import default_data_root
    from training.fetch import model_dir

    source = model_dir("all-mpnet-base-v2")
    shutil.rmtree(out, ignore_errors=True)
    first = out / "p1"
    (first / "model").mkdir(parents=True)
    for item in source.iterdir():
        if item.name in (WEIGHTS, "desktop.ini", "README.md"):
            continue
        (shutil.copytree if item.is_dir() else shutil.copy)(item, first / "model" / item.name)
    (first / "data" / "squad").mkdir(parents=True)
    data_root = default_data_root()
    if data_root is None:
        raise SystemExit("no data root: set RETENTION_DATA_ROOT (the squad/ training paragraphs travel)")
    shutil.copy(data_root / "squad" / "train_subset.jsonl.gz", first / "data" / "squad")
    (first / "wheels").mkdir()
    for wheel in sorted((ROOT / ".gpu-check" / "wheels").glob("*.whl")):
        if not wheel.name.startswith(SKIP_WHEELS):
            shutil.copy(wheel, first / "wheels")
    half = out / HALF_WEIGHTS
    tensors = {name: tensor.to(torch.float16) for name, tensor in load_file(source / WEIGHTS).items()}
    save_file(tensors, half)
    data = half.read_bytes()
    used = sum(p.stat().st_size for p in first.rglob("*") if p.is_file())
    bounds, start, budget = [], 0, PIECE_BYTES - used
    while start < len(data):
        bounds.append((start, min(len(data), start + budget)))
        start, budget = bounds[-1][1], PIECE_BYTES
    for index, (begin, end) in enumerate(bounds, start=1):
        folder = out / f"p{index}"
        folder.mkdir(exist_ok=True)
        (folder / f"weights.{index:02d}").write_bytes(data[begin:end])
    manifest = {"pieces": len(bounds), "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    (first / "manifest.json").write_text(json.dumps(manifest) + "\n")
    half.unlink()
    for folder in sorted(out.iterdir()):
        size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
        print(f"{folder.name}: {size / 2**20:.1f} MiB")
    print(json.dumps(manifest))


def assemble(up: Path) -> Path:
    """Join the carried pieces, check them, cast to fp32: the model directory training loads."""
    import torch
    from safetensors.torch import load_file, save_file

    manifest = json.loads((up / "p1" / "manifest.json").read_text())
    half = up / HALF_WEIGHTS
    with half.open("wb") as joined:
        for index in range(1, manifest["pieces"] + 1):
            joined.write((up / f"p{index}" / f"weights.{index:02d}").read_bytes())
    if sha256_of(half) != manifest["sha256"]:
        raise SystemExit("joined weights differ from the manifest's sha256")
    model = up / "p1" / "model"
    tensors = {name: tensor.to(torch.float32) for name, tensor in load_file(half).items()}
    save_file(tensors, model / WEIGHTS)
    return model


def device(up: Path, out: Path, budget_s: float, variant_steps: list[int], torch_device: str) -> None:
    import yaml
    from safetensors.torch import load_file, save_file

    started = time.perf_counter()
    model = assemble(up)
    base = yaml.safe_load(RECIPE.read_text())
    scorers: dict[str, Any] = {}
    report: dict[str, Any] = {"variants": {}, "device": None}
    seconds_per_step = None
    for steps in variant_steps:
        left = budget_s - (time.perf_counter() - started)
        if seconds_per_step is not None and steps * seconds_per_step + 30 > left:
            report["variants"][f"s{steps}"] = {"skipped": f"{left:.0f} s left"}
            continue
        name = f"s{steps}"
        recipe = dict(base, backbone=str(model), steps=steps)
        recipe["dataset"] = dict(base["dataset"], root=str(up / "p1" / "data"))
        recipe_path = up / f"{name}.yaml"
        recipe_path.write_text(yaml.safe_dump(recipe))
        run_dir = up / "runs" / name
        command = [sys.executable, "-m", "training", "fit", str(recipe_path), "--run-dir", str(run_dir)]
        command += ["--device", torch_device, "--precision", "bf16"]
        begun = time.perf_counter()
        try:
            subprocess.run(command, check=True, timeout=max(30.0, left - 15), cwd=ROOT)
        except subprocess.TimeoutExpired:
            report["variants"][name] = {"stopped": "budget"}
            break
        wall = time.perf_counter() - begun
        seconds_per_step = wall / steps
        weights = load_file(run_dir / "weights.safetensors")
        scorers.update({f"{name}/{k}": v for k, v in weights.items() if k.startswith(SCORER_PREFIX)})
        log = [json.loads(line) for line in (run_dir / "train_log.jsonl").read_text().splitlines()]
        report["variants"][name] = {"steps": steps, "wall_s": round(wall, 1), "log": log}
        save_file(scorers, out / "scorers.safetensors")
        (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
        print(f"{name}: {wall:.0f} s ({seconds_per_step:.3f} s/step)", flush=True)
    import torch

    report["device"] = torch.cuda.get_device_name(0) if torch_device == "cuda" else "cpu dry run"
    report["torch"] = torch.__version__
    report["wall_s"] = round(time.perf_counter() - started, 1)
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")


def merge(scorers_path: Path) -> None:
    """One run dir per variant: the shipped run's files with the variant's scorers and steps."""
    from safetensors.torch import load_file, save_file

    trained = load_file(scorers_path)
    report = json.loads((scorers_path.parent / "report.json").read_text())
    base = load_file(SHIPPED_RUN / "weights.safetensors")
    for name in sorted({key.split("/")[0] for key in trained}):
        run_dir = RUNS_ROOT / f"mpnet-embed-gpu-{name}"
        shutil.rmtree(run_dir, ignore_errors=True)
        shutil.copytree(SHIPPED_RUN, run_dir, ignore=shutil.ignore_patterns("weights.safetensors", "*.pt"))
        weights = dict(base)
        for key, tensor in trained.items():
            if key.startswith(name + "/"):
                weights[key.split("/", 1)[1]] = tensor
        save_file(weights, run_dir / "weights.safetensors")
        recipe = json.loads((run_dir / "recipe.json").read_text())
        recipe["steps"] = report["variants"][name]["steps"]
        (run_dir / "recipe.json").write_text(json.dumps(recipe, indent=2) + "\n")
        log = report["variants"][name]["log"]
        (run_dir / "train_log.jsonl").write_text("".join(json.dumps(row) + "\n" for row in log))
        print(run_dir)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("prepare").add_argument("--out", type=Path, default=UPLOAD_DIR)
    on_device = commands.add_parser("device")
    on_device.add_argument("--up", type=Path, required=True)
    on_device.add_argument("--out", type=Path, required=True)
    on_device.add_argument("--budget-s", type=float, default=400.0)
    on_device.add_argument("--steps", type=int, nargs="+", default=list(VARIANT_STEPS))
    on_device.add_argument("--torch-device", default="cuda", help="cpu: a dry run of the same path here")
    commands.add_parser("merge").add_argument("scorers", type=Path)
    args = parser.parse_args(argv)
    if args.command == "prepare":
        prepare(args.out)
    elif args.command == "device":
        args.out.mkdir(parents=True, exist_ok=True)
        device(args.up, args.out, args.budget_s, args.steps, args.torch_device)
    else:
        merge(args.scorers)


if __name__ == "__main__":
    main()
