"""Kept-token floor (issue 20): a classification run's accuracy with and without the floor, paired.

``python -m experiments.kept_token_floor accuracy runs/sst2-minilm-quick --split validation --floors 0 16
--rhos 0.2 0.3 0.5 1.0 --out results/sst2-minilm-quick-floor/floor.json``

``python -m experiments.kept_token_floor work models/recipes/sst2.yaml --profile quick --split validation
--out results/sst2-minilm-quick-floor/work.json``: what the floor costs, from the schedule alone (no
trained model: the keep counts depend only on the lengths, ρ and the floor).

The same trained weights and the same examples at every floor (the floor is a schedule setting, not a
weight): for every method (learned and the baselines at equal token-work, which take their counts from
the same schedule) and ρ, accuracy and token-work per floor, and the paired difference of each floor
from the first one over the same examples — mean of correct_F − correct_0 with its standard error
sd/√n — split by whether a row is at or under the floor (those run dense) or longer. ``learned`` also
gets the first floor's accuracy interpolated at the other floor's token-work: the floor spends more
work, and this says whether it buys more than spending that work through ρ would.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import publish
from experiments.paired import outcomes, paired

DEFAULT_FLOORS = (0, 16)
DEFAULT_RHOS = (0.2, 0.3, 0.5, 1.0)
LEARNED = "learned"

Payload = dict[str, Any]


def at_equal_work(curve: list[tuple[float, float]], work: float) -> float | None:
    """Accuracy of a (token-work, accuracy) curve linearly interpolated at ``work``; None outside it."""
    points = sorted(curve)
    works = [w for w, _ in points]
    if not points or work < works[0] or work > works[-1]:
        return None
    return float(np.interp(work, works, [a for _, a in points]))


def measure(
    run_dir: Path, split: str, floors: list[int], rhos: list[float], methods: list[str], limit: int | None
) -> Payload:
    from retention_tasks.classification.learn import TRUNCATION_METHODS, tokenize_rows
    from training.__main__ import machine_description
    from training.fitting.fit import load_run, with_min_kept_tokens
    from training.recipes.data import EVAL_SEED, load_split, shuffled

    model, recipe, loaded_tokenizer = load_run(run_dir)
    tokenizer: Any = loaded_tokenizer  # a Hugging Face fast tokenizer
    if recipe.task != "classification":
        raise SystemExit(f"{run_dir} is a {recipe.task} run; this study measures classification")
    rows = shuffled(load_split(recipe.dataset, split), EVAL_SEED, limit)
    sequences = tokenize_rows(rows, tokenizer, recipe.max_length)
    labels = np.array([int(row["label"]) for row in rows])  # type: ignore[call-overload]
    lengths = np.array([len(seq) for seq in sequences])
    batch_size, pad = recipe.evaluation.batch_size, tokenizer.pad_token_id
    per_floor: dict[int, dict[tuple[str, float], tuple[np.ndarray, np.ndarray]]] = {}
    for floor in floors:
        with_min_kept_tokens(model, recipe, floor)
        per_floor[floor] = {
            (method, rho): outcomes(model, sequences, labels, method, rho, batch_size, pad)
            for method in methods
            for rho in rhos
            if not (method in TRUNCATION_METHODS and rho >= 1.0)  # the dense model: learned at ρ = 1
        }
    return {
        "run": str(run_dir),
        "model": recipe.name,
        "profile": recipe.profile,
        "split": f"{recipe.dataset.name}/{split}",
        "num_examples": len(rows),
        "subset": f"first {len(rows)} after a seeded shuffle (seed {EVAL_SEED})",
        "tokens": {"mean": float(lengths.mean()), "median": float(np.median(lengths))},
        "floors": floors,
        "rhos": rhos,
        "results": results_of(per_floor),
        "paired": paired_of(per_floor, lengths),
        "machine": machine_description(),
    }


def results_of(per_floor: dict[int, dict[tuple[str, float], tuple[np.ndarray, np.ndarray]]]) -> list[Payload]:
    return [
        {
            "floor": floor,
            "method": method,
            "rho": rho,
            "accuracy": 100.0 * float(correct.mean()),
            "token_work": float(work.mean()),
        }
        for floor, grid in per_floor.items()
        for (method, rho), (correct, work) in grid.items()
    ]


def paired_of(
    per_floor: dict[int, dict[tuple[str, float], tuple[np.ndarray, np.ndarray]]], lengths: np.ndarray
) -> list[Payload]:
    """Each floor after the first against the first, per (method, ρ): all rows, rows at or under the
    floor, longer rows."""
    reference_floor, *others = list(per_floor)
    reference = per_floor[reference_floor]
    learned_curve = [
        (float(work.mean()), 100.0 * float(correct.mean()))
        for (method, _), (correct, work) in reference.items()
        if method == LEARNED
    ]
    out = []
    for floor in others:
        short = lengths <= floor
        for (method, rho), (correct, work) in per_floor[floor].items():
            base_correct, base_work = reference[(method, rho)]
            entry: Payload = {
                "floor": floor,
                "against_floor": reference_floor,
                "method": method,
                "rho": rho,
                "token_work_diff": float(work.mean() - base_work.mean()),
                "all": paired(correct, base_correct),
                "at_or_under_floor": paired(correct[short], base_correct[short]),
                "longer": paired(correct[~short], base_correct[~short]),
            }
            if method == LEARNED:
                entry["reference_accuracy_at_equal_work"] = at_equal_work(learned_curve, float(work.mean()))
            out.append(entry)
    return out


def markdown(payload: Payload) -> str:
    lines = [
        f"{payload['model']} ({payload['profile']}), {payload['split']}, {payload['num_examples']} examples "
        f"(mean {payload['tokens']['mean']:.1f} tokens)",
        "",
        "| method | ρ | floor | accuracy | token-work | Δ acc (pp) ± SE | Δ at/under floor | Δ longer |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lookup = {(r["floor"], r["method"], r["rho"]): r for r in payload["results"]}
    for entry in payload["paired"]:
        base = lookup[(entry["against_floor"], entry["method"], entry["rho"])]
        mine = lookup[(entry["floor"], entry["method"], entry["rho"])]
        both = entry["all"]
        lines.append(
            f"| {entry['method']} | {entry['rho']:g} | {entry['against_floor']} → {entry['floor']} "
            f"| {base['accuracy']:.2f} → {mine['accuracy']:.2f} "
            f"| {base['token_work']:.3f} → {mine['token_work']:.3f} "
            f"| {both['accuracy_diff']:+.2f} ± {both['standard_error']:.2f} "
            f"| {_cell(entry['at_or_under_floor'])} | {_cell(entry['longer'])} |"
        )
    learned = [e for e in payload["paired"] if e["method"] == LEARNED]
    if learned:
        lines += [
            "",
            "learned at the floor vs learned without it at the same token-work (interpolated over ρ):",
        ]
        for entry in learned:
            mine = lookup[(entry["floor"], LEARNED, entry["rho"])]
            equal = entry.get("reference_accuracy_at_equal_work")
            shown = "outside the measured curve" if equal is None else f"{equal:.2f}"
            lines.append(f"- ρ={entry['rho']:g}: {mine['accuracy']:.2f} vs {shown}")
    return "\n".join(lines) + "\n"


def _cell(stats: dict[str, float | int]) -> str:
    if not stats["examples"]:
        return "—"
    return f"{stats['accuracy_diff']:+.2f} ± {stats['standard_error']:.2f} (n={stats['examples']})"


def schedule_work(
    recipe_path: Path, profile: str, split: str, floors: list[int], rhos: list[float]
) -> Payload:
    """Token-work and kept tokens of the recipe's schedule over the split's real lengths, per floor and ρ."""
    import torch
    from transformers import AutoConfig

    from retention_core.tasks import task_spec
    from retention_tasks.classification.learn import tokenize_rows
    from training.__main__ import machine_description
    from training.engine import selection as R
    from training.engine.encoders import load_tokenizer, resolve_backbone_path
    from training.recipes.data import load_split
    from training.recipes.recipe import load_recipe

    recipe = load_recipe(recipe_path, profile)
    rows = load_split(recipe.dataset, split)
    lengths = torch.tensor(
        [len(seq) for seq in tokenize_rows(rows, load_tokenizer(recipe.backbone), recipe.max_length)]
    )
    num_points = int(AutoConfig.from_pretrained(resolve_backbone_path(recipe.backbone)).num_hidden_layers)
    queries = task_spec(recipe.task).last_layer_queries
    grid = []
    for floor in floors:
        for rho in rhos:
            budgets = torch.full(lengths.shape, rho)  # (N,)
            counts = R.keep_counts(
                budgets, lengths, torch.ones_like(lengths), num_points, recipe.retention.schedule_power, floor
            )  # (N, P); [CLS] protected, as in classification
            bare = R.keep_counts(
                budgets, lengths, torch.ones_like(lengths), num_points, recipe.retention.schedule_power
            )
            grid.append(
                {
                    "floor": floor,
                    "rho": rho,
                    "token_work": float(R.encoder_token_work(counts, lengths, queries).mean()),
                    "last_layer_kept_fraction": float((counts[:, -1] / lengths).mean()),
                    "rows_raised_by_floor": int((counts != bare).any(1).sum()),
                }
            )
    return {
        "recipe": str(recipe_path),
        "profile": profile,
        "split": f"{recipe.dataset.name}/{split}",
        "num_examples": len(rows),
        "tokens": {
            "mean": float(lengths.float().mean()),
            "median": float(lengths.float().median()),
            **{f"at_or_under_{floor}": int((lengths <= floor).sum()) for floor in floors if floor > 0},
        },
        "schedule": {
            "num_points": num_points,
            "power": recipe.retention.schedule_power,
            "last_layer_queries": queries,
        },
        "results": grid,
        "machine": machine_description(),
    }


def work_markdown(payload: Payload) -> str:
    rhos = sorted({r["rho"] for r in payload["results"]})
    lookup = {(r["floor"], r["rho"]): r for r in payload["results"]}
    lines = [
        f"{payload['split']}, {payload['num_examples']} examples, "
        f"mean {payload['tokens']['mean']:.1f} tokens; "
        f"schedule {payload['schedule']['num_points']} points, power {payload['schedule']['power']:g}",
        "",
        "| floor | " + " | ".join(f"ρ={rho:g}" for rho in rhos) + " |",
        "|---" * (len(rhos) + 1) + "|",
    ]
    for floor in dict.fromkeys(r["floor"] for r in payload["results"]):
        cells = [
            f"{lookup[(floor, rho)]['token_work']:.3f} ({lookup[(floor, rho)]['rows_raised_by_floor']})"
            for rho in rhos
        ]
        lines.append(f"| {floor} | " + " | ".join(cells) + " |")
    return (
        "\n".join(lines) + "\n\nCells: mean fraction of dense encoder token-work (rows the floor raised).\n"
    )


def main(argv: list[str] | None = None) -> None:
    from retention_tasks.classification.learn import DEFAULT_METHODS

    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m experiments.kept_token_floor", description=__doc__)
    sub = parser.add_subparsers(dest="mode", required=True)
    accuracy = sub.add_parser("accuracy", help="a trained classification run, paired across floors")
    accuracy.add_argument("run_dir", type=Path)
    accuracy.add_argument("--limit", type=int, default=None, help="default: the whole split")
    accuracy.add_argument("--methods", nargs="+", default=list(DEFAULT_METHODS))
    work = sub.add_parser("work", help="the schedule's token-work per floor, from a recipe (no model)")
    work.add_argument("recipe", type=Path)
    work.add_argument("--profile", default="quick")
    for command in (accuracy, work):
        command.add_argument("--split", default="validation")
        command.add_argument(
            "--floors", type=int, nargs="+", default=list(DEFAULT_FLOORS), help="the first is the reference"
        )
        command.add_argument("--rhos", type=float, nargs="+", default=list(DEFAULT_RHOS))
        command.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if len(args.floors) < 2 or min(args.floors) < 0:
        raise SystemExit("--floors: at least two floors, each >= 0")
    if args.mode == "work":
        payload = schedule_work(args.recipe, args.profile, args.split, args.floors, args.rhos)
        publish(payload, work_markdown, args.out, "experiments.kept_token_floor", argv)
        return
    payload = measure(args.run_dir, args.split, args.floors, args.rhos, args.methods, args.limit)
    publish(payload, markdown, args.out, "experiments.kept_token_floor", argv)


if __name__ == "__main__":
    main()
