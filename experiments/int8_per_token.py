"""Per-token int8 against the per-tensor int8 it replaced (issue 64; study:
docs/experiments/2026-11-29-batch-invariant-int8.md): does a text get the same vector alone and in any
batch, and what does it cost?

One exported embedding model (its fp32 ``model.onnx``), quantized both ways by
``training.export.int8.quantize_int8`` (``activations="token"``: the product's; ``"tensor"``: before):

- **invariance**: ``--texts`` SQuAD dev paragraphs embedded one at a time and in random batches of 1–32
  (the same shuffled order for every graph) at each ρ; per graph and ρ the largest absolute difference,
  the lowest cosine between a text's two vectors and how many texts kept other token counts;
- **quality**: nDCG@10 of every query of ``--quality-sets`` (SQuAD dev question → paragraph, SciTLDR-A
  test TLDR → abstract; ``benchmarks.retrieval``'s sets and search) with documents and queries encoded
  by each graph at each ρ, paired per query: per-token − fp32 and per-token − per-tensor at the same ρ,
  and each against fp32 dense;
- **speed**: the first ``--documents`` paragraphs at their own lengths (≤ 256 tokens), batches of 8, every
  graph at every ρ in the same interleaved rounds; per ρ, per-token seconds against per-tensor's;
- **where the time goes** (``--profile``): onnxruntime's profiler on one batch of 8 × 256 SQuAD tokens,
  kernel time by operator type per int8 graph at ρ 1 and 0.5 (``experiments.op_profile``'s reading).

Decided before the run: per-token int8 is adopted if its vectors are identical alone and batched (max
difference 0), it is within 0.2 nDCG@10 of fp32 at ρ = 1 and no worse than per-tensor int8 at ρ 0.5
(paired, beyond 2 SE) on both sets, and it runs ≥ 0.9× per-tensor's speed at every ρ.

    python -m experiments.int8_per_token <export dir> \\
        --out results/experiments/batch-invariant-int8/int8_per_token.json

``--variants`` names the int8 graphs built beside fp32 (``GRAPHS``; default the two above), ``--baseline``
the one that quality differences and speed ratios are taken against (default per-tensor), ``--rhos`` the
budgets. The weight-bits pilot: per-token int8 with 7-bit weights (the product's) against 8-bit int8
weights (u8 × s8: saturates on AVX2, run here only to isolate the weights' share of the loss) and 8-bit
weights stored as uint8 with zero point 128 (MLAS's U8U8 kernels, exact on every x86 CPU), both built by
``experiments.int8_weight_forms`` (not adopted: the product keeps its 7-bit weights):

    python -m experiments.int8_per_token <export dir> --variants int8-per-token int8-per-token-s8 \\
        int8-per-token-u8 --baseline int8-per-token --rhos 1 0.5 0.3 \\
        --out results/experiments/int8-weight-bits/int8_weight_bits.json
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.frontier import calls
from benchmarks.harness import cli, ort_session, publish, speedups, timed_rounds
from benchmarks.timed_documents import batched, dataset_rows, padded

MODULE = "experiments.int8_per_token"
RHOS = (1.0, 0.7, 0.5, 0.3)
MAX_LENGTH, SPEED_BATCH, LARGEST_BATCH = 256, 8, 32
FP32, PER_TOKEN, PER_TENSOR = "fp32", "int8-per-token", "int8-per-tensor"
PER_TOKEN_S8, PER_TOKEN_U8 = "int8-per-token-s8", "int8-per-token-u8"
# int8 graph → how it is built: the product's ``training.export.int8.quantize_int8`` with these activation
# scales ("token" / "tensor"), or per token with another weight form of ``experiments.int8_weight_forms``
PRODUCT_GRAPHS = {PER_TOKEN: "token", PER_TENSOR: "tensor"}
WEIGHT_FORM_GRAPHS = {PER_TOKEN_S8: "s8", PER_TOKEN_U8: "u8"}
GRAPHS = (*PRODUCT_GRAPHS, *WEIGHT_FORM_GRAPHS)
DEFAULT_VARIANTS = (PER_TOKEN, PER_TENSOR)
SEED = 0
ENCODE_BATCH = 32  # rows per run when encoding a retrieval set (length-sorted, as the retrieval batches)


def graph_files(export: Path, workdir: Path, variants: tuple[str, ...] = DEFAULT_VARIANTS) -> dict[str, Path]:
    """fp32 ``model.onnx`` and its int8 forms ``variants`` (names of ``GRAPHS``), in ``workdir``."""
    from experiments.int8_weight_forms import quantize_per_token
    from training.export.int8 import quantize_int8

    files = {FP32: export / "model.onnx"}
    for name in variants:
        files[name] = workdir / f"{name}.onnx"
        if name in WEIGHT_FORM_GRAPHS:
            quantize_per_token(files[FP32], files[name], weights=WEIGHT_FORM_GRAPHS[name])
        else:
            quantize_int8(files[FP32], files[name], activations=PRODUCT_GRAPHS[name])
    return files


def label(graph: str) -> str:
    """The key part naming a reference graph: int8-per-tensor → per_tensor."""
    return graph.removeprefix("int8-").replace("-", "_")


def embed(session: Any, rows: list[list[int]], rho: float) -> tuple[np.ndarray, np.ndarray]:
    """(vectors (B, d), kept counts (B, P)) of ``rows`` in one run, padded to the longest."""
    feeds = padded(rows)  # in the given order
    names = {graph_input.name for graph_input in session.get_inputs()}
    feeds = {**feeds, "rho": np.full(len(rows), rho, np.float32)}
    outputs = session.run(None, {name: feeds[name] for name in names})
    return outputs[0], outputs[1]


def random_batches(count: int, rng: np.random.Generator) -> list[list[int]]:
    """Indices 0..count-1, shuffled, cut into batches of 1–``LARGEST_BATCH`` rows."""
    order = rng.permutation(count).tolist()
    batches = []
    while order:
        size = int(rng.integers(1, LARGEST_BATCH + 1))
        batches.append(order[:size])
        order = order[size:]
    return batches


def invariance(session: Any, rows: list[list[int]], rho: float) -> dict[str, float]:
    alone = [embed(session, [row], rho) for row in rows]
    vectors = np.zeros_like(np.stack([a[0][0] for a in alone]))
    kept: list[np.ndarray] = [np.empty(0)] * len(rows)
    for batch in random_batches(len(rows), np.random.default_rng(SEED)):
        batch_vectors, batch_kept = embed(session, [rows[i] for i in batch], rho)
        for position, index in enumerate(batch):
            vectors[index], kept[index] = batch_vectors[position], batch_kept[position]
    single = np.stack([a[0][0] for a in alone])
    cosine = np.sum(single * vectors, 1) / (np.linalg.norm(single, axis=1) * np.linalg.norm(vectors, axis=1))
    return {
        "max_abs_difference": float(np.abs(single - vectors).max()),
        "min_cosine": float(cosine.min()),
        "mean_cosine": float(cosine.mean()),
        "texts_with_other_kept_counts": sum(
            not np.array_equal(a[1][0], k) for a, k in zip(alone, kept, strict=True)
        ),
    }


def encode(session: Any, rows: list[list[int]], rho: float) -> np.ndarray:
    """Vectors (N, d) of ``rows``, run in length-sorted batches, back in the rows' order."""
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
    vectors: list[np.ndarray] = [np.empty(0)] * len(rows)
    for start in range(0, len(order), ENCODE_BATCH):
        chosen = order[start : start + ENCODE_BATCH]
        batch_vectors, _ = embed(session, [rows[i] for i in chosen], rho)
        for position, index in enumerate(chosen):
            vectors[index] = batch_vectors[position]
    return np.stack(vectors)


def tokenized(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    """[CLS] … [SEP] token ids of ``texts``, cut to ``MAX_LENGTH`` (as the retrieval encodes them)."""
    return [list(ids) for ids in tokenizer(texts, truncation=True, max_length=MAX_LENGTH)["input_ids"]]


def quality(
    sessions: dict[str, Any],
    tokenizer: Any,
    name: str,
    rhos: tuple[float, ...] = RHOS,
    baseline: str = PER_TENSOR,
) -> dict[str, Any]:
    """nDCG@10 of every query of one retrieval set per graph and ρ, and the paired differences (against
    fp32 and against ``baseline`` at the same ρ)."""
    from benchmarks.retrieval_parts import DATASETS, data_file, paired_difference, read_retrieval_set, search
    from retention_core.metrics import query_ndcg

    data = read_retrieval_set(data_file(DATASETS[name]), None, DATASETS[name])
    documents, queries = tokenized(tokenizer, data.paragraphs), tokenized(tokenizer, data.questions)
    ranks: dict[str, dict[str, np.ndarray]] = {}
    for graph, session in sessions.items():
        query_vectors = encode(session, queries, 1.0)  # queries (≤ 32 tokens) run dense at any ρ anyway
        ranks[graph] = {
            f"{rho:g}": search(query_vectors, encode(session, documents, rho), data.gold) for rho in rhos
        }
    dense = ranks[FP32]["1"]
    cells = {
        graph: {
            rho: {
                "ndcg@10": round(float(np.mean(query_ndcg(graph_ranks))), 2),
                "vs_fp32_dense": paired_difference(graph_ranks, dense),
                "vs_fp32_same_rho": paired_difference(graph_ranks, ranks[FP32][rho]),
                f"vs_{label(baseline)}_same_rho": paired_difference(graph_ranks, ranks[baseline][rho]),
            }
            for rho, graph_ranks in by_rho.items()
        }
        for graph, by_rho in ranks.items()
    }
    return {"queries": len(queries), "documents": len(documents), "cells": cells}


PROFILED_RHOS, PROFILE_ITERATIONS, PROFILE_BATCH = (1.0, 0.5), 10, 8
PROFILE_TOP = 10  # operator types per graph in the table (the JSON keeps all)


def profiled(files: dict[str, Path], tokenizer: Any, threads: int, workdir: Path) -> dict[str, Any]:
    """Kernel milliseconds per call by operator type, each int8 graph at ``PROFILED_RHOS``, on the first
    ``PROFILE_BATCH`` SQuAD dev paragraphs cut or padded to ``MAX_LENGTH`` tokens."""
    from dataclasses import asdict

    from experiments.op_profile import profile_variant

    rows = [row[:MAX_LENGTH] for row in dataset_rows(tokenizer, "squad", PROFILE_BATCH, MAX_LENGTH)]
    feeds = padded(rows)
    profiles: dict[str, Any] = {}
    for name in (name for name in files if name != FP32):
        session_inputs = {graph_input.name for graph_input in ort_session(files[name], threads).get_inputs()}
        for rho in PROFILED_RHOS:
            call = {**feeds, "rho": np.full(len(rows), rho, np.float32)}
            call = {key: value for key, value in call.items() if key in session_inputs}
            wall, kernels, operators = profile_variant(
                files[name], call, threads, PROFILE_ITERATIONS, workdir, f"{name}-{rho:g}"
            )
            profiles[f"{name}@{rho:g}"] = {
                "wall_milliseconds_per_call": wall,
                "kernel_milliseconds_per_call": kernels,
                "operators": [asdict(operator) for operator in operators],
            }
    return profiles


def measure(args: Any) -> dict[str, Any]:
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(args.export / "tokenizer.json"))
    variants, baseline, rhos = tuple(args.variants), args.baseline, tuple(args.rhos)
    if baseline not in variants or 1.0 not in rhos:
        raise SystemExit(f"--baseline {baseline} must be one of --variants {variants}; --rhos must hold 1")
    with tempfile.TemporaryDirectory(prefix="int8-per-token-") as tmp:
        files = graph_files(args.export, Path(tmp), variants)
        sessions = {name: ort_session(path, args.threads) for name, path in files.items()}
        texts = dataset_rows(tokenizer, "squad", args.texts, MAX_LENGTH)
        checks = {
            name: {f"{rho:g}": invariance(session, texts, rho) for rho in rhos}
            for name, session in sessions.items()
        }
        qualities = {name: quality(sessions, tokenizer, name, rhos, baseline) for name in args.quality_sets}
        documents = dataset_rows(tokenizer, args.documents_set, args.documents, MAX_LENGTH)
        batches = batched(documents, SPEED_BATCH)
        largest = max(len(feeds["input_ids"]) for feeds in batches)
        runs = {
            f"{name}@{rho:g}": calls(session, batches, {"rho": np.full(largest, rho, np.float32)})
            for rho in rhos
            for name, session in sessions.items()
        }
        rounds = timed_rounds(runs, args.rounds, 1, args.max_seconds)
        profiles = profiled(files, tokenizer, args.threads, Path(tmp)) if args.profile else {}
    speed = {
        f"{rho:g}": {
            name: speedups(
                rounds,
                f"{name}@{rho:g}",
                f"{baseline}@{rho:g}",
                len(documents),
                rate="documents_per_second",
                speedup=f"speed_vs_{label(baseline)}",
            )
            for name in sessions
        }
        for rho in rhos
    }
    return {
        "export": str(args.export),
        "settings": {
            "variants": list(variants),
            "baseline": baseline,
            "rhos": list(rhos),
            "texts": args.texts,
            "documents": args.documents,
            "documents_set": args.documents_set,
            "batch": SPEED_BATCH,
            "largest_random_batch": LARGEST_BATCH,
            "rounds": len(next(iter(rounds.values()))),
            "threads": args.threads,
            "max_length": MAX_LENGTH,
        },
        "invariance": checks,
        "quality": qualities,
        "speed": speed,
        "profiles": profiles,
    }


def markdown(payload: dict[str, Any]) -> str:
    settings = payload["settings"]
    baseline = settings.get("baseline", PER_TENSOR)
    lines = [
        f"# int8 graphs against {baseline}",
        "",
        f"Alone vs in random batches of 1–{settings['largest_random_batch']}: {settings['texts']} SQuAD dev "
        "paragraphs (≤ 256 tokens).",
        "",
        "| graph | ρ | max abs difference | min cosine | mean cosine | texts with other kept counts |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for name, by_rho in payload["invariance"].items():
        for rho, row in by_rho.items():
            lines.append(
                f"| {name} | {rho} | {row['max_abs_difference']:.2e} | {row['min_cosine']:.6f} | "
                f"{row['mean_cosine']:.6f} | {row['texts_with_other_kept_counts']} |"
            )
    for name, measured in payload["quality"].items():
        lines += [
            "",
            f"Quality, {name}: {measured['queries']} queries search {measured['documents']} documents, both "
            "encoded by the graph. nDCG@10 and paired differences (± standard error, same queries).",
            "",
            f"| graph | ρ | nDCG@10 | − fp32 dense | − fp32 same ρ | − {baseline} same ρ |",
            "|---|---|---:|---|---|---|",
        ]
        for graph, by_rho in measured["cells"].items():
            for rho, cell in by_rho.items():
                differences = [
                    f"{cell[key]['difference']:+.2f} ± {cell[key]['se']:.2f}"
                    for key in ("vs_fp32_dense", "vs_fp32_same_rho", f"vs_{label(baseline)}_same_rho")
                ]
                lines.append(f"| {graph} | {rho} | {cell['ndcg@10']:.2f} | " + " | ".join(differences) + " |")
    lines += [
        "",
        f"Speed: the first {settings['documents']} {settings['documents_set']} documents at their own "
        f"lengths, batches of {settings['batch']}, {settings['rounds']} interleaved rounds, "
        f"{settings['threads']} threads (0: one per core). Ratio: {baseline}'s seconds / the graph's, "
        "per round (median, min–max).",
        "",
        f"| ρ | graph | documents/s | vs {baseline} |",
        "|---|---|---:|---|",
    ]
    ratio = f"speed_vs_{label(baseline)}"
    for rho, rows in payload["speed"].items():
        for name, row in rows.items():
            lines.append(
                f"| {rho} | {name} | {row['documents_per_second']:.1f} | {row[ratio]:.3f} "
                f"({row['speedup_min']:.3f}–{row['speedup_max']:.3f}) |"
            )
    if payload.get("profiles"):
        lines += [
            "",
            "Where the time goes: onnxruntime's profiler, one batch of 8 SQuAD paragraphs padded to the "
            f"longest, {PROFILE_ITERATIONS} calls; kernel milliseconds per call by operator type "
            f"(the {PROFILE_TOP} largest).",
            "",
            "| graph@ρ | wall ms | kernel ms | operators (ms) |",
            "|---|---:|---:|---|",
        ]
        for name, profile in payload["profiles"].items():
            top = ", ".join(
                f"{row['operator']} {row['milliseconds_per_call']:.1f}"
                for row in profile["operators"][:PROFILE_TOP]
            )
            lines.append(
                f"| {name} | {profile['wall_milliseconds_per_call']:.1f} | "
                f"{profile['kernel_milliseconds_per_call']:.1f} | {top} |"
            )
    machine = payload.get("machine", {})
    lines += [
        "",
        f"Machine: {machine.get('cpu')}, cpu class {machine.get('cpu_class')}, flags "
        f"{', '.join(machine.get('cpu_flags', []))}, {machine.get('cores')} cores.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = cli(MODULE, __doc__)
    parser.add_argument("export", type=Path, help="an exported embedding model directory (model.onnx)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--texts", type=int, default=200, help="paragraphs for the invariance check")
    parser.add_argument("--documents", type=int, default=64, help="documents timed")
    parser.add_argument("--documents-set", choices=("squad", "scitldr"), default="squad")
    parser.add_argument(
        "--quality-sets", nargs="*", choices=("squad", "scitldr"), default=["squad", "scitldr"]
    )
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--max-seconds", type=float, default=1200.0)
    parser.add_argument("--profile", action="store_true", help="also where each int8 graph's time goes")
    parser.add_argument(
        "--variants", nargs="+", choices=sorted(GRAPHS), default=list(DEFAULT_VARIANTS), help="int8 graphs"
    )
    parser.add_argument("--baseline", choices=sorted(GRAPHS), default=PER_TENSOR, help="one of --variants")
    parser.add_argument("--rhos", nargs="+", type=float, default=list(RHOS))
    args = parser.parse_args(argv)
    started = time.perf_counter()
    return publish(measure(args), markdown, args.out, MODULE, argv, machine=True, started=started)


if __name__ == "__main__":
    main(sys.argv[1:])
