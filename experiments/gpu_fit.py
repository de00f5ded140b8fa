"""Seconds per training step on a GPU against the CPU: the frozen embedding retrofit's quick profile
(``minilm-embed-frozen.yaml``, what was measured; the two-path product trains a copy too), the same rows
and backbone, ``--steps`` steps on CUDA and fewer on this machine's
CPU (or ``--cpu-seconds-per-step``), warm-up steps dropped. Once the ``fit`` part of
``benchmarks.gpu``; its one device measurement is in ``results/bench/gpu.json`` ("fit").

    python -m experiments.gpu_fit --out results/experiments/gpu-fit       # on the GPU machine
    python -m experiments.gpu_fit --dry-run --out /tmp/gpu-fit            # this CPU, tiny, seconds
    python -m experiments.gpu_fit --write-assets DIR   # the tokenizer and the recipe's training texts,
                                                       #   for a machine without the package or the data
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
import tempfile
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.embedding_graphs import DEFAULT_RECIPE, documents
from benchmarks.gpu_service import TOKENIZER_DIR, tokenizer_for
from benchmarks.harness import cli, publish

MODULE = "experiments.gpu_fit"
RESULT_FILE = "gpu_fit.json"
DRY_RUN_DEVICE = "cpu dry run"
# The MiniLM shape (all-MiniLM-L6-v2): what the device measures when the package is not installed.
MINILM_SHAPE: dict[str, Any] = {
    "vocab_size": 30522,
    "hidden_size": 384,
    "num_hidden_layers": 6,
    "num_attention_heads": 12,
    "intermediate_size": 1536,
    "max_position_embeddings": 512,
}
WARMUP_STEPS = 2  # step times dropped: CUDA kernels, allocator growth, first batches
DATA_DIR = "data"
PROFILE = "quick"
DRY_BATCH, DRY_ROWS, DRY_SEQ_LEN = 2, 6, 16  # the dry run's fit (the recipe's quick profile has batch 8)


@dataclass(frozen=True)
class Plan:
    dry_run: bool
    device: str
    label: str
    steps: int
    cpu_steps: int  # fewer: a CPU step of the real recipe takes seconds
    cpu_seconds_per_step: float | None
    assets: Path | None


def minilm_backbone() -> tuple[Any, str]:
    """The packaged all-MiniLM-L6-v2 when installed, else its shape with random weights."""
    from transformers import BertConfig

    from training.engine.encoders import DEFAULT_BACKBONE, backbone_from_config, load_backbone

    try:
        return load_backbone(DEFAULT_BACKBONE), f"{DEFAULT_BACKBONE} weights"
    except ImportError:  # the package is missing (a bare GPU machine): the same shape, random weights
        return backbone_from_config(BertConfig(**MINILM_SHAPE)), "MiniLM shape, random weights"


def fit_recipe(plan: Plan) -> Any:
    """The embedding recipe's quick profile, logging every step (each log line syncs the device, so its
    clock is the step's). A dry run shrinks its batch and length; ``--assets`` supplies its texts."""
    from training.recipes.recipe import load_recipe

    recipe = load_recipe(DEFAULT_RECIPE, PROFILE).model_copy(update={"log_every": 1})
    if plan.dry_run:
        return recipe.model_copy(update={"batch_size": DRY_BATCH, "max_length": DRY_SEQ_LEN})
    if plan.assets is not None and (plan.assets / DATA_DIR).is_dir():
        dataset = recipe.dataset.model_copy(update={"root": str(plan.assets / DATA_DIR)})
        return recipe.model_copy(update={"dataset": dataset})
    return recipe


def step_seconds(log_path: Path) -> list[float]:
    """Each step's seconds from the run's log (cumulative seconds since the loop started)."""
    cumulative = [json.loads(line)["seconds"] for line in log_path.read_text(encoding="utf-8").splitlines()]
    return [later - earlier for earlier, later in pairwise([0.0, *cumulative])]


def seconds_per_step(plan: Plan, device: str, steps: int, inputs: tuple[Any, Any, list[Any]]) -> float:
    """Median seconds per step of ``steps`` steps of the recipe on ``device``, warm-up steps dropped; a
    fresh backbone per fit (a fit trains it): the tiny one in a dry run, else MiniLM."""
    from training.engine.encoders import backbone_from_config
    from training.fitting.fit import LOG_FILE, fit
    from training.tiny import tiny_config

    recipe, tokenizer, rows = inputs
    backbone = (
        backbone_from_config(tiny_config(tokenizer.vocab_size)) if plan.dry_run else minilm_backbone()[0]
    )
    with tempfile.TemporaryDirectory(prefix="gpu-fit-") as tmp:
        run_dir = Path(tmp) / "run"
        fit(
            recipe,
            run_dir,
            backbone=backbone,
            tokenizer=tokenizer,
            train_rows=rows,
            progress=False,
            device=device,
            stop_at=steps,
        )
        times = step_seconds(run_dir / LOG_FILE)
    return statistics.median(times[WARMUP_STEPS:] or times)


def measure_fit(plan: Plan) -> dict[str, Any]:
    from training.fitting.fit import training_rows

    recipe = fit_recipe(plan)
    tokenizer = tokenizer_for(plan.assets)
    if plan.dry_run:  # random texts of the dry run's length
        texts = documents(tokenizer, DRY_ROWS, DRY_SEQ_LEN, np.random.default_rng(0))
        rows: list[Any] = [{"text": text} for text in texts]
    else:
        rows = training_rows(recipe)
    inputs = (recipe, tokenizer, rows)
    device = seconds_per_step(plan, plan.device, plan.steps, inputs)
    if plan.cpu_seconds_per_step is not None:
        cpu, cpu_source = plan.cpu_seconds_per_step, "passed in (--cpu-seconds-per-step)"
    else:
        cpu = seconds_per_step(plan, "cpu", plan.cpu_steps, inputs)
        cpu_source = f"measured on this machine's CPU, {plan.cpu_steps} steps"
    return {
        "status": "measured",
        "recipe": f"{DEFAULT_RECIPE.name} ({recipe.profile} profile)",
        "batch_size": recipe.batch_size,
        "max_length": recipe.max_length,
        "rows": "random texts (dry run)" if plan.dry_run else f"{recipe.dataset.name} train",
        "device": plan.label,
        "steps": plan.steps,
        "warmup_steps_dropped": WARMUP_STEPS,
        "device_seconds_per_step": device,
        "cpu_seconds_per_step": cpu,
        "cpu_source": cpu_source,
        "speedup_vs_cpu": cpu / device,
    }


def write_assets(directory: Path) -> None:
    """What the fit needs where neither the backbone package nor the data root is: the tokenizer and the
    file of the recipe's training split, in the data root's layout (checked by loading it)."""
    from training.engine.encoders import load_tokenizer
    from training.fitting.fit import training_rows
    from training.recipes.data import REGISTRY, default_data_root
    from training.recipes.recipe import load_recipe

    recipe = load_recipe(DEFAULT_RECIPE, PROFILE)
    load_tokenizer(recipe.backbone).save_pretrained(str(directory / TOKENIZER_DIR))
    root = Path(recipe.dataset.root) if recipe.dataset.root else default_data_root()
    if root is None:
        raise SystemExit("no data root (../shared/data): the recipe's texts cannot be copied")
    source = REGISTRY[recipe.dataset.name][recipe.dataset.train_split].file
    (directory / DATA_DIR / source).parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(root / source, directory / DATA_DIR / source)
    dataset = recipe.dataset.model_copy(update={"root": str(directory / DATA_DIR)})
    rows = training_rows(recipe.model_copy(update={"dataset": dataset}))
    print(f"wrote {directory}: {TOKENIZER_DIR}/ and {len(rows)} training texts under {DATA_DIR}/")


def markdown(payload: dict[str, Any]) -> str:
    fit = payload["fit"]
    return (
        f"# Training step, {fit['device']} vs CPU\n\n"
        f"- fit {fit['recipe']}, batch {fit['batch_size']} × ≤ {fit['max_length']}: "
        f"{fit['device_seconds_per_step']:.3f} s/step on {fit['device']} vs "
        f"{fit['cpu_seconds_per_step']:.3f} s/step on the CPU ({fit['cpu_source']}): "
        f"{fit['speedup_vs_cpu']:.1f}×\n"
    )


def make_plan(args: Any) -> Plan:
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        raise SystemExit("no CUDA device here: run it on a GPU machine, or --dry-run on this CPU")
    return Plan(
        dry_run=args.dry_run,
        device="cpu" if args.dry_run else "cuda",
        label=DRY_RUN_DEVICE if args.dry_run else torch.cuda.get_device_name(0),
        steps=args.steps if args.steps is not None else (3 if args.dry_run else 30),
        cpu_steps=3 if args.dry_run else 5,
        cpu_seconds_per_step=args.cpu_seconds_per_step,
        assets=args.assets,
    )


def parse(argv: list[str]) -> Any:
    parser = cli(MODULE, __doc__)
    parser.add_argument("--out", type=Path, help=f"directory for {RESULT_FILE} and its table")
    parser.add_argument("--dry-run", action="store_true", help="the same code paths on the CPU, tiny")
    parser.add_argument("--assets", type=Path, default=None, help="what --write-assets saved")
    parser.add_argument("--write-assets", type=Path, default=None, metavar="DIR", help="save them and exit")
    parser.add_argument("--steps", type=int, default=None, help="steps of the device fit (default 30)")
    parser.add_argument("--cpu-seconds-per-step", type=float, help="the CPU's number, not measured")
    args = parser.parse_args(argv)
    if args.out is None and args.write_assets is None:
        parser.error("--out is required")
    return args


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    if args.write_assets is not None:
        write_assets(args.write_assets)
        return
    plan = make_plan(args)
    payload = {"dry_run": plan.dry_run, "fit": measure_fit(plan)}
    publish(payload, markdown, args.out / RESULT_FILE, MODULE, argv, machine=True)


if __name__ == "__main__":
    main()
