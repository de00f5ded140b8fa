"""ρ = 1 of a retrofit whose pruned branch has weights of its own (``retrofit.pruned_branch: copy``,
docs/experiments/2026-11-28-pruned-branch.md) is the original model: checked on a trained run.

    python -m experiments.pruned_branch_check <copy run> --frozen <frozen run> \
        --out results/experiments/pruned-branch/check-full.json

- the copy run's ``backbone.*`` tensors against the packaged original's and the frozen run's (equal);
- on the first ``--texts`` SQuAD dev paragraphs: the copy run's ``forward_pruned`` at ρ = 1 (what
  retrieval's dense cell runs) against the frozen run's ``forward_unpruned`` (the exported graph's ρ = 1
  branch): byte-identical or not, and the largest difference; the frozen run's own ``forward_pruned`` at
  ρ = 1 beside it (the pass retrieval runs on it), for scale;
- the copy's size (parameters, fp32 bytes) and how far it moved from the original (relative L2);
- the training log: first and last losses, any non-finite value, seconds;
- with ``--exported <two-path dir> --frozen-exported <frozen dir>`` (``python -m training export … --int8``
  of each run): the two-path graph's ρ = 1 vectors against the frozen export's, fp32 and int8 (byte-
  identical or not), its ρ < 1 vectors against the copy run's torch pass, its manifest's ``pruned_branch``,
  and seconds per batch of both graphs at ρ 0.5 / 0.3 in interleaved rounds (the same operators on the
  same kept tokens: the ratio should be 1).
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import cli, publish
from benchmarks.retrieval_parts import DATASETS, data_file, read_retrieval_set

MODULE = "experiments.pruned_branch_check"
BATCH = 16
TIMED_RHOS, TIMING_ROUNDS = (0.5, 0.3), 15


def graph_vectors(path: Path, feeds: list[dict[str, np.ndarray]], rho: float) -> np.ndarray:
    """(N, d): the exported graph's main output over ``feeds`` (batches of ids and masks) at ``rho``."""
    from retention_ort import open_session

    session = open_session(path)
    return np.concatenate(
        [
            session.run(None, {**batch, "rho": np.full(len(batch["input_ids"]), rho, np.float32)})[0]
            for batch in feeds
        ]
    )


def exported_check(
    model: Any, tokenizer: Any, texts: list[str], max_length: int, two_path: Path, frozen: Path
) -> dict[str, Any]:
    """The two-path export on ``texts``: ρ = 1 against the frozen export, ρ < 1 against torch, speed."""
    import torch

    from retention_core.contract import INT8_MODEL_FILE, MODEL_FILE, Manifest
    from retention_core.text import pad_token_id
    from training.tasks.codecs import evaluation_codec, rows_to_tensors

    codec = evaluation_codec("embedding", tokenizer, max_length)
    rows = [codec.encode(text).rows[0] for text in texts]
    pad = pad_token_id(codec.tokenizer)
    feeds = [
        {
            name: tensor.numpy()
            for name, tensor in rows_to_tensors(rows[i : i + BATCH], pad).items()
            if name in ("input_ids", "attention_mask")
        }
        for i in range(0, len(rows), BATCH)
    ]
    out: dict[str, Any] = {"pruned_branch": Manifest.read(two_path).model_dump(mode="json")["pruned_branch"]}
    for file in (MODEL_FILE, INT8_MODEL_FILE):
        ours, theirs = graph_vectors(two_path / file, feeds, 1.0), graph_vectors(frozen / file, feeds, 1.0)
        out[f"{file}: rho 1 byte-identical to the frozen export"] = bool(ours.tobytes() == theirs.tobytes())
    with torch.no_grad():
        for rho in TIMED_RHOS:
            expected = np.concatenate(
                [
                    model.forward_pruned(
                        torch.from_numpy(b["input_ids"]),
                        torch.from_numpy(b["attention_mask"]),
                        torch.full((len(b["input_ids"]),), rho),
                    ).logits.numpy()
                    for b in feeds
                ]
            )
            got = graph_vectors(two_path / MODEL_FILE, feeds, rho)
            out[f"rho {rho}: max |two-path graph - torch copy pass|"] = float(np.max(np.abs(got - expected)))
    out["seconds_per_batch"] = timed_pair(two_path / MODEL_FILE, frozen / MODEL_FILE, feeds[0])
    return out


def timed_pair(two_path: Path, frozen: Path, batch: dict[str, np.ndarray]) -> dict[str, Any]:
    """Median seconds of one batch on each graph at each timed ρ, the two interleaved round by round."""
    from retention_ort import open_session

    sessions = {"two_path": open_session(two_path), "frozen": open_session(frozen)}
    result: dict[str, Any] = {"batch": list(batch["input_ids"].shape)}
    for rho in TIMED_RHOS:
        feeds = {**batch, "rho": np.full(len(batch["input_ids"]), rho, np.float32)}
        seconds: dict[str, list[float]] = {name: [] for name in sessions}
        for _ in range(TIMING_ROUNDS):
            for name, session in sessions.items():
                start = time.perf_counter()
                session.run(None, feeds)
                seconds[name].append(time.perf_counter() - start)
        medians = {name: float(np.median(values)) for name, values in seconds.items()}
        result[f"rho {rho}"] = {**medians, "two_path_over_frozen": medians["two_path"] / medians["frozen"]}
    return result


def vectors(model: Any, tokenizer: Any, texts: list[str], max_length: int, unpruned: bool) -> np.ndarray:
    """(N, d) pooled vectors at ρ = 1: ``forward_unpruned``, or ``forward_pruned`` with ρ = 1."""
    import torch

    from retention_core.text import pad_token_id
    from training.tasks.codecs import evaluation_codec, rows_to_tensors

    codec = evaluation_codec("embedding", tokenizer, max_length)
    rows = [codec.encode(text).rows[0] for text in texts]
    pad = pad_token_id(codec.tokenizer)
    out = []
    with torch.no_grad():
        for start in range(0, len(rows), BATCH):
            feeds = rows_to_tensors(rows[start : start + BATCH], pad)
            ids, mask = feeds["input_ids"], feeds["attention_mask"]
            if unpruned:
                out.append(model.forward_unpruned(ids, mask).logits.numpy())
            else:
                out.append(model.forward_pruned(ids, mask, torch.ones(len(ids))).logits.numpy())
    return np.concatenate(out)


def log_summary(run_dir: Path) -> dict[str, Any]:
    lines = [json.loads(line) for line in (run_dir / "train_log.jsonl").read_text().splitlines() if line]
    finite = all(
        math.isfinite(value)
        for line in lines
        for value in (line["loss"], line["task_loss"], line.get("pruned_loss") or 0.0)
    )
    keep = ("step", "loss", "task_loss", "pruned_loss", "kept_fraction", "target_fraction", "seconds")
    return {
        "all_finite": finite,
        "first": {k: lines[0][k] for k in keep},
        "last": {k: lines[-1][k] for k in keep},
    }


def check(
    run_dir: Path, frozen_dir: Path, texts: int, exported: tuple[Path, Path] | None = None
) -> dict[str, Any]:
    import torch

    from training.engine.encoders import load_backbone
    from training.fitting.fit import load_run

    model, recipe, tokenizer = load_run(run_dir)
    frozen, frozen_recipe, _ = load_run(frozen_dir)
    if model.pruned_backbone is None:
        raise SystemExit(f"{run_dir} has no pruned branch of its own (retrofit.pruned_branch: copy)")
    original = load_backbone(recipe.backbone).state_dict()
    ours = model.backbone.state_dict()
    theirs = frozen.backbone.state_dict()
    copy = model.pruned_backbone.state_dict()
    moved = math.sqrt(sum(float((copy[k] - original[k]).double().pow(2).sum()) for k in original))
    norm = math.sqrt(sum(float(original[k].double().pow(2).sum()) for k in original))
    squad = DATASETS["squad"]
    paragraphs = read_retrieval_set(data_file(squad, None), dataset=squad, limit_documents=texts).paragraphs
    at_1 = vectors(model, tokenizer, paragraphs, recipe.max_length, unpruned=False)
    reference = vectors(frozen, tokenizer, paragraphs, frozen_recipe.max_length, unpruned=True)
    frozen_pruned_pass = vectors(frozen, tokenizer, paragraphs, frozen_recipe.max_length, unpruned=False)
    parameters = sum(p.numel() for p in model.pruned_backbone.parameters())
    # tensors the copy left as the original's (its embedding tables with copy_embeddings: original): the
    # export stores a tensor of identical bytes once, so they cost the two-path model nothing
    unchanged = sum(
        p.numel() for name, p in model.pruned_backbone.named_parameters() if torch.equal(p, original[name])
    )
    return {
        "run": str(run_dir),
        "frozen_run": str(frozen_dir),
        "backbone": recipe.backbone,
        "backbone_equals_original": all(torch.equal(ours[k], original[k]) for k in original),
        "backbone_equals_frozen_run": all(torch.equal(ours[k], theirs[k]) for k in theirs),
        "texts": len(paragraphs),
        "rho_1_byte_identical_to_frozen_unpruned": bool(at_1.tobytes() == reference.tobytes()),
        "rho_1_max_abs_diff_to_frozen_unpruned": float(np.max(np.abs(at_1 - reference))),
        "frozen_pruned_pass_at_rho_1_max_abs_diff_to_unpruned": float(
            np.max(np.abs(frozen_pruned_pass - reference))
        ),
        "copy_parameters": parameters,
        "copy_fp32_bytes": 4 * parameters,
        "copy_parameters_unchanged_from_original": unchanged,
        "copy_relative_l2_from_original": moved / norm,
        "training": log_summary(run_dir),
        "frozen_training": log_summary(frozen_dir),
        "exported": None
        if exported is None
        else exported_check(model, tokenizer, paragraphs, recipe.max_length, *exported),
    }


def markdown(payload: dict[str, Any]) -> str:
    training, frozen = payload["training"], payload["frozen_training"]
    first, last = training["first"], training["last"]
    return "\n".join(
        [
            f"# ρ = 1 of `{payload['run']}` (pruned branch: copy)",
            "",
            f"- backbone tensors equal the original `{payload['backbone']}`: "
            f"{payload['backbone_equals_original']}; equal the frozen run's: "
            f"{payload['backbone_equals_frozen_run']}",
            f"- ρ = 1 vectors on {payload['texts']} SQuAD dev paragraphs byte-identical to the frozen run's "
            f"`forward_unpruned`: {payload['rho_1_byte_identical_to_frozen_unpruned']} (max |diff| "
            f"{payload['rho_1_max_abs_diff_to_frozen_unpruned']:.2e}; the frozen run's own pruned pass at "
            f"ρ = 1: {payload['frozen_pruned_pass_at_rho_1_max_abs_diff_to_unpruned']:.2e})",
            f"- the copy: {payload['copy_parameters']:,} parameters, "
            f"{payload['copy_fp32_bytes'] / 1e6:.1f} MB fp32 (of them "
            f"{payload.get('copy_parameters_unchanged_from_original', 0):,} left the original's, stored once "
            "by the export), moved "
            f"{payload['copy_relative_l2_from_original']:.2e} (relative L2) from the original",
            f"- training: all finite {training['all_finite']}; loss {first['loss']:.4f} → {last['loss']:.4f} "
            f"(top-M term {first['pruned_loss']} → {last['pruned_loss']}), {last['seconds']:.0f} s; the "
            f"frozen run: loss {frozen['first']['loss']:.4f} → {frozen['last']['loss']:.4f}, "
            f"{frozen['last']['seconds']:.0f} s",
            *(
                []
                if payload.get("exported") is None
                else [
                    "",
                    "Exported (two-path graph):",
                    "",
                    "```json",
                    json.dumps(payload["exported"], indent=2),
                    "```",
                ]
            ),
            "",
            f"Command: `{payload.get('command', '')}`",
            "",
        ]
    )


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = cli(MODULE, __doc__)
    parser.add_argument("run_dir", type=Path, help="a run with retrofit.pruned_branch: copy")
    parser.add_argument("--frozen", type=Path, required=True, help="the frozen retrofit of the same recipe")
    parser.add_argument("--texts", type=int, default=300, help="the first N distinct SQuAD dev paragraphs")
    parser.add_argument("--exported", type=Path, help="the copy run's export (two-path graph, with --int8)")
    parser.add_argument("--frozen-exported", type=Path, help="the frozen run's export (with --int8)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    exported = None if args.exported is None else (args.exported, args.frozen_exported)
    payload = check(args.run_dir, args.frozen, args.texts, exported)
    publish(payload, markdown, args.out, MODULE, argv, machine=True, started=started)


if __name__ == "__main__":
    main()
