"""The QA model `make serve` serves, over HTTP through the real service: the README's `/qa` example at
every ρ, and SQuAD v1.1 dev F1 / exact match on the first ``--questions`` of ``training evaluate``'s
seeded shuffle, beside the quality its manifest states.

    python -m benchmarks.qa_default --models-dir models --out results/bench/qa_default.json
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
from pathlib import Path
from typing import Any

import httpx

from benchmarks.harness import publish
from benchmarks.overload import Policy, server
from retention_core.metrics import squad_scores
from training.recipes.data import EVAL_SEED, load_split, shuffled
from training.recipes.recipe import DatasetSpec

README = Path(__file__).resolve().parents[1] / "README.md"
RHOS = (0.2, 0.3, 0.5, 0.7, 1.0)
EXPECTED_ANSWER = "Denver"  # the README example's answer ("Who won?" / "Denver beat Carolina ...")
# The README's curl line for /qa and the JSON body that follows it.
QA_EXAMPLE = re.compile(r"/qa\?[^']*'[^\n]*\n\s*-d '(?P<body>\{[^']*\})'")


def readme_example(readme: Path = README) -> dict[str, str]:
    """The body of the README's `/qa` curl example."""
    match = QA_EXAMPLE.search(readme.read_text(encoding="utf-8"))
    if match is None:
        raise ValueError(f"{readme} has no /qa curl example")
    body = json.loads(match.group("body"))
    return {"question": body["question"], "context": body["context"]}


def ask(client: httpx.Client, body: dict[str, Any], rho: float) -> dict[str, Any]:
    response = client.post("/qa", params={"rho": f"{rho:g}"}, json=body)
    response.raise_for_status()
    return dict(response.json())


def example_answers(client: httpx.Client, body: dict[str, str]) -> list[dict[str, Any]]:
    answers = []
    for rho in RHOS:
        answer = ask(client, body, rho)["answer"]
        answers.append({"rho": rho, "answer": answer, "correct": answer.strip() == EXPECTED_ANSWER})
    return answers


def dev_scores(client: httpx.Client, questions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean F1 / exact match (0-100) over ``questions`` at each ρ."""
    rows = []
    for rho in RHOS:
        f1 = exact = 0.0
        for row in questions:
            answer = ask(client, {"question": row["question"], "context": row["context"]}, rho)["answer"]
            scores = squad_scores(answer, row["answers"]["text"])
            f1, exact = f1 + scores["f1"], exact + scores["exact_match"]
        rows.append(
            {"rho": rho, "f1": 100 * f1 / len(questions), "exact_match": 100 * exact / len(questions)}
        )
    return rows


def run(args: argparse.Namespace) -> dict[str, Any]:
    manifest = json.loads((args.models_dir / args.model / "manifest.json").read_text(encoding="utf-8"))
    spec = DatasetSpec(name="squad", root=str(args.data_root) if args.data_root else None)
    questions = shuffled(load_split(spec, "test"), EVAL_SEED, args.questions)
    example = readme_example()
    env = {"RETENTION_DEFAULT_MODELS": json.dumps({"qa": args.model})}
    with (
        tempfile.TemporaryDirectory(prefix="qa-default-") as tmp,
        server(args.models_dir, Policy("qa", "1", env), {}, Path(tmp)) as (url, _pid),
        httpx.Client(base_url=url, timeout=60) as client,
    ):
        answers = example_answers(client, example)
        scores = dev_scores(client, questions)
    return {
        "model": args.model,
        "manifest_quality": manifest.get("quality"),
        "training": manifest.get("training"),
        "readme_example": {"body": example, "expected": EXPECTED_ANSWER, "answers": answers},
        "dev": {"split": "squad/test (official dev)", "questions": len(questions), "seed": EVAL_SEED},
        "scores": scores,
    }


def markdown(report: dict[str, Any]) -> str:
    example = report["readme_example"]
    lines = [
        f"# QA default model over HTTP: {report['model']}",
        "",
        f"README example: {example['body']['question']!r} / {example['body']['context']!r} "
        f"(expected {example['expected']!r})",
        "",
        "| ρ | README answer | SQuAD dev F1 | exact match |",
        "|---:|---|---:|---:|",
    ]
    for answer, score in zip(example["answers"], report["scores"], strict=True):
        mark = "✓" if answer["correct"] else "✗"
        said = f"{answer['answer']!r} {mark}"
        lines.append(f"| {answer['rho']:g} | {said} | {score['f1']:.1f} | {score['exact_match']:.1f} |")
    quality = report.get("manifest_quality") or {}
    points = ", ".join(f"ρ {p['rho']:g}: {100 * p['value']:.1f}" for p in quality.get("points", []))
    dev = report["dev"]
    lines += [
        "",
        f"SQuAD dev: the first {dev['questions']} questions after a seeded shuffle (seed {dev['seed']}), "
        "the same order `training evaluate` uses.",
        f"The manifest's own curve ({quality.get('metric', '?')} × 100, {quality.get('split', '?')}, "
        f"{quality.get('num_examples', '?')} questions): {points or 'none'}.",
    ]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models-dir", type=Path, default=Path("models"))
    parser.add_argument("--model", default="squad-minilm")
    parser.add_argument("--questions", type=int, default=200)
    parser.add_argument("--data-root", type=Path, default=None)
    parser.add_argument("--out", type=Path, required=True)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    report = run(args)
    return publish(report, markdown, args.out, "benchmarks.qa_default", argv, machine=True)


if __name__ == "__main__":
    main()
