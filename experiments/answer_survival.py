"""Where does extractive QA lose quality under pruning: dropped answers or degraded states?

``python -m experiments.answer_survival runs/<run> --questions 500 --out results/<name>/answer_survival.json``

For each selection method (the learned scorers, attention-received top-k, random-k) and ρ, runs
the pruned pass over the SQuAD windows that contain the answer and reports, per pruning point, the
share of gold answer tokens still alive entering that layer, next to the share of droppable
(real, unprotected) tokens alive — what a selector blind to the answer keeps. It also splits the
exact span hit rate (argmax start and end both on the gold tokens) by whether every answer token
reached the last layer. A high survival with a low hit rate among survivors points at the
backbone's states; a low survival points at the scorers.

``answer-protected`` is an oracle: the learned scorers with the gold answer tokens protected (kept at
every point, counted against the same budget, so the token-work is the learned method's). Its span hit
is what perfect answer selection would give at that ρ: near the dense rate, the selection is what
loses quality; far below it, the states the kept tokens see (backbone, schedule).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from experiments.cli import run_dir_main

DEFAULT_QUESTIONS = 500
BATCH_WINDOWS = 32
ANSWER_PROTECTED = "answer-protected"  # oracle: learned scorers, gold answer tokens always kept
SELECTION_METHODS = ("learned", "attention", "random", ANSWER_PROTECTED)
NO_ANSWER_POSITION = 0  # qa_batch points windows without the answer at [CLS]
DECIMALS = 4


@dataclass
class SurvivalTally:
    """Running sums over windows that contain the answer."""

    windows: int = 0
    answer_alive: list[float] = field(default_factory=list)  # per point: Σ share of answer tokens
    droppable_alive: list[float] = field(default_factory=list)  # per point: Σ share of droppable tokens
    all_answer_kept: int = 0  # windows whose whole answer entered the last layer
    hits_when_kept: int = 0
    hits_when_dropped: int = 0

    def add(self, answer_share: list[float], droppable_share: list[float]) -> None:
        if not self.answer_alive:
            self.answer_alive = [0.0] * len(answer_share)
            self.droppable_alive = [0.0] * len(droppable_share)
        self.answer_alive = [a + b for a, b in zip(self.answer_alive, answer_share, strict=True)]
        self.droppable_alive = [a + b for a, b in zip(self.droppable_alive, droppable_share, strict=True)]
        self.windows += 1

    def summary(self) -> dict[str, object]:
        dropped = self.windows - self.all_answer_kept
        return {
            "windows": self.windows,
            "answer_alive": [round(x / self.windows, DECIMALS) for x in self.answer_alive],
            "droppable_alive": [round(x / self.windows, DECIMALS) for x in self.droppable_alive],
            "all_answer_kept": round(self.all_answer_kept / self.windows, DECIMALS),
            "span_hit_when_kept": round(self.hits_when_kept / max(self.all_answer_kept, 1), DECIMALS),
            "span_hit_when_dropped": round(self.hits_when_dropped / max(dropped, 1), DECIMALS),
            "span_hit": round((self.hits_when_kept + self.hits_when_dropped) / self.windows, DECIMALS),
        }


def answer_survival(run_dir: Path, rhos: list[float], questions: int) -> dict[str, object]:
    """{"dense_span_hit": float, "methods": {"<method>": {"<ρ>": SurvivalTally.summary()}}, ...}."""
    import torch

    from benchmarks.harness import describe
    from retention_tasks.classification.learn import RANDOM_SEED
    from training.engine.baselines import attention_selector, random_selector
    from training.engine.model import PrunedInputs
    from training.fitting.fit import load_run
    from training.recipes.data import EVAL_SEED, load_split, shuffled
    from training.tasks.registry import training_task

    model, recipe, tokenizer = load_run(run_dir)
    model = model.eval()
    if recipe.task != "qa":
        raise ValueError(f"answer_survival needs an extractive QA run, got task {recipe.task!r}")
    rows = shuffled(load_split(recipe.dataset, recipe.dataset.test_split), EVAL_SEED, questions)
    batch = training_task("qa").make_batch(rows, tokenizer, recipe.max_length)
    has_answer = batch.targets[:, 0] != NO_ANSWER_POSITION  # (N,)
    assert batch.protected is not None and batch.token_type_ids is not None  # qa_batch sets both
    inputs = {
        "input_ids": batch.input_ids[has_answer],  # (N, T)
        "attention_mask": batch.attention_mask[has_answer],
        "protected": batch.protected[has_answer],
        "token_type_ids": batch.token_type_ids[has_answer],
    }
    targets = batch.targets[has_answer]  # (N, 2)
    num_windows = targets.shape[0]

    def run(method: str, rho: float) -> tuple[SurvivalTally, int]:
        selector = {"learned": None, "attention": attention_selector()}.get(method)
        if method == "random":
            selector = random_selector(torch.Generator().manual_seed(RANDOM_SEED))
        tally, dense_hits = SurvivalTally(), 0
        for start in range(0, num_windows, BATCH_WINDOWS):
            chunk = {name: value[start : start + BATCH_WINDOWS] for name, value in inputs.items()}
            gold = targets[start : start + BATCH_WINDOWS]  # (b, 2)
            real = chunk["attention_mask"].bool()  # (b, T)
            positions = torch.arange(real.shape[1]).unsqueeze(0)  # (1, T)
            answer = (positions >= gold[:, :1]) & (positions <= gold[:, 1:])  # (b, T)
            droppable = real & ~chunk["protected"]  # (b, T), before the oracle protects the answer
            if method == ANSWER_PROTECTED:
                chunk = {**chunk, "protected": chunk["protected"] | answer}
            with torch.inference_mode():
                rho_tensor = torch.full((gold.shape[0],), rho)  # (b,)
                out = model.forward_evaluation(
                    PrunedInputs(**chunk, rho=rho_tensor), selector=selector, record_survivors=True
                )
            assert out.survivors is not None
            span = out.logits.masked_fill(~real.unsqueeze(-1), float("-inf")).argmax(1)  # (b, 2)
            hit = (span == gold).all(-1)  # (b,)
            for row in range(gold.shape[0]):
                alive = out.survivors[row]  # (P, T)
                tally.add(
                    (alive[:, answer[row]].float().mean(-1)).tolist(),
                    (alive[:, droppable[row]].float().mean(-1)).tolist(),
                )
                kept = bool(alive[-1, answer[row]].all())
                tally.all_answer_kept += kept
                tally.hits_when_kept += int(hit[row]) * kept
                tally.hits_when_dropped += int(hit[row]) * (not kept)
            dense_hits += int(hit.sum())
        return tally, dense_hits

    _, dense_hits = run("learned", 1.0)
    methods = {
        method: {f"{rho:g}": run(method, rho)[0].summary() for rho in rhos} for method in SELECTION_METHODS
    }
    return {
        "run": str(run_dir),
        "questions": len(rows),
        "windows_with_answer": num_windows,
        "split": recipe.dataset.test_split,
        "dense_span_hit": round(dense_hits / num_windows, DECIMALS),
        "methods": methods,
        "machine": describe(),
    }


def markdown(payload: dict[str, object]) -> str:
    methods = payload["methods"]
    assert isinstance(methods, dict)
    lines = [
        f"{payload['windows_with_answer']} windows with the answer, from {payload['questions']} "
        f"{payload['split']} questions. Dense span hit rate {payload['dense_span_hit']:.3f}.",
        "",
        "| method | ρ | answer tokens alive per point | droppable tokens alive per point | "
        "whole answer reaches last layer | span hit: answer kept / dropped / all |",
        "|---|---|---|---|---|---|",
    ]
    for method, per_rho in methods.items():
        for rho, row in per_rho.items():
            answer = " ".join(f"{x:.2f}" for x in row["answer_alive"])
            droppable = " ".join(f"{x:.2f}" for x in row["droppable_alive"])
            hits = " / ".join(
                f"{row[key]:.3f}" for key in ("span_hit_when_kept", "span_hit_when_dropped", "span_hit")
            )
            lines.append(
                f"| {method} | {rho} | {answer} | {droppable} | {row['all_answer_kept']:.3f} | {hits} |"
            )
    lines += [
        "",
        "Span hit: argmax start and end both on the gold answer tokens (token-level exact match), over "
        "the windows where the whole answer reached the last layer / where it did not / all.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    run_dir_main(
        argv,
        module="experiments.answer_survival",
        description=__doc__,
        count=("questions", DEFAULT_QUESTIONS),
        measure=answer_survival,
        markdown=markdown,
    )


if __name__ == "__main__":
    main()
