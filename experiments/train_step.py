"""Seconds per training step, fp32 against bf16 autocast (``fit --precision``), on a real recipe.

``python -m experiments.train_step models/recipes/squad.yaml --profile quick-dense --steps 4 --rounds 3
--out results/experiments/train-step/train-step-precision.json``

The recipe's model, objective and batch size, a real batch from its training data, ``training.fitting.fit``'s
own ``train_step``: the precisions interleaved round by round (this machine's speed swings over
minutes), each round the median of ``--steps`` steps after one untimed step. Reported: the per-round
seconds and the median ratio fp32 / bf16.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.harness import describe, publish

PRECISIONS = ("fp32", "bf16")


def step_seconds(recipe_path: Path, profile: str, steps: int, rounds: int) -> dict[str, Any]:
    from training.engine.encoders import load_backbone, load_tokenizer
    from training.fitting.fit import PRECISIONS as AUTOCAST
    from training.fitting.fit import StepSchedule, initial_state, train_step, training_rows, usable_cores
    from training.fitting.objective import Objective
    from training.recipes.recipe import load_recipe

    recipe = load_recipe(recipe_path, profile)
    objective = Objective.from_recipe(recipe)
    torch.manual_seed(recipe.seed)
    torch.set_num_threads(usable_cores())
    tokenizer = load_tokenizer(recipe.backbone)
    state = initial_state(recipe, objective, load_backbone(recipe.backbone), "cpu", None)
    state.model.train()
    rows = training_rows(recipe)[: recipe.batch_size]
    batch = objective.task.make_batch(rows, tokenizer, recipe.max_length)
    schedule = StepSchedule(steps * rounds * len(PRECISIONS) * 2 + 2, 0, recipe.optimizer.grad_clip)
    seconds: dict[str, list[float]] = {name: [] for name in PRECISIONS}
    for _ in range(rounds):
        for name in PRECISIONS:
            state.autocast_dtype = AUTOCAST[name]
            train_step(state, objective, batch, schedule)  # untimed: the precision's first step
            timed = []
            for _ in range(steps):
                begin = time.perf_counter()
                train_step(state, objective, batch, schedule)
                timed.append(time.perf_counter() - begin)
            seconds[name].append(statistics.median(timed))
    ratios = [full / mixed for full, mixed in zip(seconds["fp32"], seconds["bf16"], strict=True)]
    return {
        "recipe": str(recipe_path),
        "profile": profile,
        "batch": {
            "rows": len(rows),
            "windows": int(batch.input_ids.shape[0]),
            "length": int(batch.input_ids.shape[1]),
        },
        "steps_per_round": steps,
        "seconds_per_step": seconds,
        "fp32_over_bf16": ratios,
        "fp32_over_bf16_median": statistics.median(ratios),
        "machine": describe(),
    }


def markdown(payload: dict[str, Any]) -> str:
    rounds = zip(payload["seconds_per_step"]["fp32"], payload["seconds_per_step"]["bf16"], strict=True)
    lines = [
        f"| {i + 1} | {full:.2f} | {mixed:.2f} | {full / mixed:.2f} |"
        for i, (full, mixed) in enumerate(rounds)
    ]
    return (
        f"# Training step, fp32 vs bf16 autocast ({payload['recipe']} --profile {payload['profile']})\n\n"
        "| round | fp32 s/step | bf16 s/step | fp32 / bf16 |\n|---:|---:|---:|---:|\n"
        + "\n".join(lines)
        + f"\n\nMedian ratio: {payload['fp32_over_bf16_median']:.2f}.\n"
    )


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m experiments.train_step", description=__doc__)
    parser.add_argument("recipe", type=Path)
    parser.add_argument("--profile", default="full")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    payload = step_seconds(args.recipe, args.profile, args.steps, args.rounds)
    publish(payload, markdown, args.out, "experiments.train_step", argv)


if __name__ == "__main__":
    main()
