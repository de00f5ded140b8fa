"""Retrofit vs joint training (issue 20): a plain dense classifier (the user's model), retention
retrofitted onto it label-free, and the jointly trained retention model, on the same examples.

``python -m experiments.retrofit_comparison <dense run> <retrofit run> --joint results/imdb-minilm-full
--split test --limit 5000 --rhos 1.0 0.5 0.3 --out results/imdb-minilm-retrofit/comparison.json``

Dense and retrofit are evaluated here, example by example (learned retention; the dense run at ρ = 1),
so the retrofit's difference from the user's model comes with its paired standard error. The joint
model's numbers are read from its committed evaluation (``--joint``: an ``evaluate`` output dir on the
same split, subset and size); its weights are not needed, and its difference from the retrofit gets the
unpaired standard error of two proportions (the subsets are the same examples, so this over-states the
uncertainty). Training time: each run's ``train_log.jsonl`` (seconds at its last step).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import publish
from experiments.paired import outcomes, paired

LEARNED = "learned"
Payload = dict[str, Any]


def training_seconds(run_dir: Path) -> float | None:
    """Seconds at the last logged step of a run (``train_log.jsonl``), None without a log."""
    log = run_dir / "train_log.jsonl"
    if not log.exists():
        return None
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    return float(lines[-1]["seconds"]) if lines else None


def unpaired_error(first: float, second: float, n: int) -> float:
    """Standard error (points) of the difference of two accuracies (percent) over ``n`` examples each."""
    p, q = first / 100.0, second / 100.0
    return 100.0 * math.sqrt((p * (1 - p) + q * (1 - q)) / n)


def versus(accuracy: float, joint: float, n: int) -> dict[str, float]:
    return {"accuracy_diff": accuracy - joint, "standard_error": unpaired_error(accuracy, joint, n)}


def joint_results(joint_dir: Path) -> tuple[Payload, dict[float, float]]:
    """The joint model's evaluation meta and learned accuracy (percent) per ρ."""
    report = json.loads((joint_dir / "eval.json").read_text())
    accuracy = {
        float(r["rho"]): 100.0 * float(r["accuracy"]) for r in report["results"] if r["method"] == LEARNED
    }
    return report["meta"], accuracy


def measure(
    dense_dir: Path, retrofit_dir: Path, joint_dir: Path, split: str, limit: int, rhos: list[float]
) -> Payload:
    from retention_tasks.classification.learn import tokenize_rows
    from training.__main__ import machine_description
    from training.fitting.fit import load_run
    from training.recipes.data import EVAL_SEED, load_split, shuffled

    joint_meta, joint_accuracy = joint_results(joint_dir)
    grid: dict[str, dict[float, tuple[np.ndarray, np.ndarray]]] = {}
    labels = np.zeros(0)
    dataset = ""
    for name, run_dir, run_rhos in (("dense", dense_dir, [1.0]), ("retrofit", retrofit_dir, rhos)):
        model, recipe, loaded_tokenizer = load_run(run_dir)
        tokenizer: Any = loaded_tokenizer  # a Hugging Face fast tokenizer
        labelled = recipe.evaluation_dataset()  # a retrofit trained on unlabeled text names its own
        rows = shuffled(load_split(labelled, split), EVAL_SEED, limit)
        dataset = labelled.name
        sequences = tokenize_rows(rows, tokenizer, recipe.max_length)
        labels = np.array([int(row["label"]) for row in rows])  # type: ignore[call-overload]
        batch_size, pad = recipe.evaluation.batch_size, tokenizer.pad_token_id
        grid[name] = {
            rho: outcomes(model.eval(), sequences, labels, LEARNED, rho, batch_size, pad) for rho in run_rhos
        }
    dense_correct = grid["dense"][1.0][0]
    n = len(labels)
    rows_out = []
    for rho, (correct, work) in grid["retrofit"].items():
        accuracy = 100.0 * float(correct.mean())
        joint = joint_accuracy.get(rho)
        rows_out.append(
            {
                "rho": rho,
                "retrofit_accuracy": accuracy,
                "token_work": float(work.mean()),
                "vs_dense": paired(correct, dense_correct),
                "joint_accuracy": joint,
                "vs_joint": None
                if joint is None
                else {
                    "accuracy_diff": accuracy - joint,
                    "standard_error": unpaired_error(accuracy, joint, n),
                },
            }
        )
    return {
        "split": f"{dataset}/{split}",
        "num_examples": n,
        "subset": f"first {n} after a seeded shuffle (seed {EVAL_SEED})",
        "joint": {
            "dir": str(joint_dir),
            "split": joint_meta.get("split"),
            "subset": joint_meta.get("subset"),
        },
        "dense_accuracy": 100.0 * float(dense_correct.mean()),
        "training_seconds": {
            "dense": training_seconds(dense_dir),
            "retrofit": training_seconds(retrofit_dir),
            "joint": training_seconds(joint_dir),
        },
        "results": rows_out,
        "machine": machine_description(),
    }


def markdown(payload: Payload) -> str:
    seconds = payload["training_seconds"]

    def shown(value: float | None) -> str:
        return "—" if value is None else f"{value / 60:.0f} min"

    lines = [
        f"Retrofit vs joint training, {payload['split']}, {payload['num_examples']} examples "
        f"({payload['subset']}); the user's dense model: {payload['dense_accuracy']:.2f}",
        "",
        f"Training time (2-core CPU): dense {shown(seconds['dense'])}, retrofit (on the dense model) "
        f"{shown(seconds['retrofit'])}, joint {shown(seconds['joint'])}",
        "",
        "| ρ | retrofit | token-work | Δ vs dense (paired) ± SE | joint | Δ vs joint ± SE (unpaired) |",
        "|---|---|---|---|---|---|",
    ]
    for row in payload["results"]:
        dense, joint = row["vs_dense"], row["vs_joint"]
        joint_cell = "—" if row["joint_accuracy"] is None else f"{row['joint_accuracy']:.2f}"
        diff_cell = "—" if joint is None else f"{joint['accuracy_diff']:+.2f} ± {joint['standard_error']:.2f}"
        lines.append(
            f"| {row['rho']:g} | {row['retrofit_accuracy']:.2f} | {row['token_work']:.3f} "
            f"| {dense['accuracy_diff']:+.2f} ± {dense['standard_error']:.2f} | {joint_cell} | {diff_cell} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m experiments.retrofit_comparison", description=__doc__)
    parser.add_argument("dense_run", type=Path, help="the plain dense classifier's run (the user's model)")
    parser.add_argument("retrofit_run", type=Path, help="the retrofit of that model")
    parser.add_argument("--joint", type=Path, required=True, help="the joint run's committed evaluation dir")
    parser.add_argument("--split", default="test")
    parser.add_argument("--limit", type=int, default=5000)
    parser.add_argument("--rhos", type=float, nargs="+", default=[1.0, 0.5, 0.3])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    payload = measure(args.dense_run, args.retrofit_run, args.joint, args.split, args.limit, args.rhos)
    publish(payload, markdown, args.out, "experiments.retrofit_comparison", argv)


if __name__ == "__main__":
    main()
