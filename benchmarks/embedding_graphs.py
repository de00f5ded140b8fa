"""What the embedding benchmarks time, built once: the dense peer a user would run (exported as optimum
does, fused by onnxruntime's transformer optimizer), our exported graph, their int8 forms, and documents
of random words that tokenize to an exact length. Timings depend on shapes and the schedule, not
weights: fresh scorers with the embedding recipe's schedule unless a trained run is given.
"""

from __future__ import annotations

import argparse
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

RECIPES = Path(__file__).resolve().parents[1] / "models" / "recipes"
# The product's selection settings in a one-path graph (fresh scorers, no copy): the frozen retrofit's
# recipe, which the two-path product extends unchanged. A two-path graph, which runs at the one-path
# graph's speed, is timed from a trained run (benchmarks.frontier --pruned-branch-run).
DEFAULT_RECIPE = RECIPES / "minilm-embed-frozen.yaml"
PRODUCT_RECIPE = RECIPES / "minilm-embed.yaml"  # the embedding product: the two-path retrofit
MIN_WORD_LENGTH = 3


@dataclass(frozen=True)
class Graphs:
    """What the variants run, built once: ONNX files, their fusion counts, and where the peer comes
    from (a checkpoint directory sentence-transformers can load too)."""

    model: Any  # training.engine.model.RetentionModel
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

    from training.engine.encoders import load_tokenizer
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
    ``recipe`` (a recipe file); ``schedule``: settings that replace its own
    (``training.fitting.fit.with_schedule``; None values keep its own)."""
    import torch

    from training.engine.encoders import load_backbone
    from training.fitting.fit import build_model, load_run, with_schedule
    from training.recipes.recipe import load_recipe

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
    from training.engine.encoders import resolve_backbone_path
    from training.fitting.fit import RECIPE_FILE
    from training.recipes.recipe import Recipe

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

    from training.export.graph import export_onnx
    from training.export.optimize import build_dense_peer, fused_attention_count
    from training.export.two_path import all_nodes

    checkpoint = peer_checkpoint(args.quick, args.run_dir, args.backbone, workdir)
    peer = build_dense_peer(checkpoint, workdir)  # raises unless attention fused (where ORT can fuse it)
    model = our_model(args.run_dir, args.recipe, checkpoint, schedule)
    ours = workdir / "ours.onnx"
    export_onnx(model, ours, model.backbone.info_vocab_size)  # fused at export: Attention, SkipLayerNorm
    files = {"peer-onnx": peer.unfused, "peer-fused": peer.fused, "ours-onnx": ours}
    if args.int8:
        files.update(int8_graphs(files, workdir))
    # per branch: the unpruned and the pruned one hold one each
    ours_operators = Counter(node.op_type for node in all_nodes(onnx.load(str(ours)).graph))
    fusion = {
        "num_layers": model.backbone.info.num_layers,
        "peer_fused_operators": peer.counts,
        "peer_attention_fused": fused_attention_count(peer.counts),
        "ours_fused_operators": {
            name: ours_operators[name] for name in ("Attention", "SkipLayerNormalization")
        },
        "ours_attention_fused": fused_attention_count(ours_operators),
    }
    return Graphs(model=model, checkpoint=checkpoint, files=files, fusion=fusion)


def int8_graphs(files: dict[str, Path], workdir: Path) -> dict[str, Path]:
    """Dynamic int8 weights of the fused peer and of our graphs (``<name>-int8``)."""
    from training.export.int8 import quantize_int8

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
