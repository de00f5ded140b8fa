"""Does training see the budget inference enforces? Expected kept fraction per pruning point.

``python -m experiments.soft_budget runs/<name> --rhos 0.3 0.5 --out results/<name>/soft_budget.json``

Runs the trained model's *soft* pass (the one training optimises; deterministic gates in eval mode)
on validation examples at fixed ρ and reports, per pruning point, the expected fraction of real
tokens kept (Σ P(z > 0) / n_real) next to the schedule's target — the count inference's exact
top-M keeps. A point far above its target means training kept tokens there that inference drops.
"""

from __future__ import annotations

from pathlib import Path

from experiments.cli import run_dir_main

DEFAULT_EXAMPLES = 32
DECIMALS = 4


def soft_budget(run_dir: Path, rhos: list[float], examples: int) -> dict[str, object]:
    """{"rhos": {"<ρ>": {"expected": [P floats], "target": [P floats]}}, ...} for one run."""
    import torch

    from benchmarks.harness import describe
    from training.fitting.fit import load_run
    from training.fitting.objective import soft_gates
    from training.recipes.data import EVAL_SEED, load_split, shuffled
    from training.tasks.registry import training_task

    model, recipe, tokenizer = load_run(run_dir)
    gates = soft_gates(recipe)  # the gate kind and score shift the run trained with
    rows = shuffled(load_split(recipe.dataset, recipe.dataset.validation_split), EVAL_SEED, examples)
    batch = training_task(recipe.task).make_batch(rows, tokenizer, recipe.max_length)
    per_rho: dict[str, dict[str, list[float]]] = {}
    for rho in rhos:
        budgets = torch.full((batch.input_ids.shape[0],), rho)  # (B,)
        with torch.no_grad():
            out = model.forward_soft(**batch.encoder_inputs(), rho=budgets, gates=gates)
        real = out.num_real.unsqueeze(-1).to(out.expected_kept.dtype)  # (B, 1)
        per_rho[f"{rho:g}"] = {
            "expected": [round(x, DECIMALS) for x in (out.expected_kept / real).mean(0).tolist()],
            "target": [round(x, DECIMALS) for x in (out.target_kept / real).mean(0).tolist()],
        }
    return {
        "run": str(run_dir),
        "rows": int(batch.input_ids.shape[0]),
        "examples": len(rows),
        "split": recipe.dataset.validation_split,
        "rhos": per_rho,
        "machine": describe(),
    }


def markdown(payload: dict[str, object]) -> str:
    rhos = payload["rhos"]
    assert isinstance(rhos, dict)
    num_points = len(next(iter(rhos.values()))["expected"])
    header = "| ρ | " + " | ".join(f"point {p}" for p in range(num_points)) + " |"
    lines = [header, "|---" * (num_points + 1) + "|"]
    for rho, values in rhos.items():
        cells = [f"{e:.3f} / {t:.3f}" for e, t in zip(values["expected"], values["target"], strict=True)]
        lines.append(f"| {rho} | " + " | ".join(cells) + " |")
    lines += ["", "Cells: expected kept fraction in the soft (training) pass / the schedule's target."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    run_dir_main(
        argv,
        module="experiments.soft_budget",
        description=__doc__,
        count=("examples", DEFAULT_EXAMPLES),
        measure=soft_budget,
        markdown=markdown,
    )


if __name__ == "__main__":
    main()
