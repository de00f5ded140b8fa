"""ρ = 1 is the user's model: our embedding model (torch, and the exported graph in onnxruntime) against
``SentenceTransformer.encode`` of the checkpoint it wraps, cosine per text.

    python -m experiments.source_parity --backbone all-mpnet-base-v2 --texts 300 \
        --out results/experiments/source-parity/source-parity-mpnet.json
    python -m experiments.source_parity --quick --family mpnet --out /tmp/parity.json   # tiny random, seconds

Texts: the distinct SQuAD dev paragraphs (``../shared/data``), or random words with ``--quick``. The
scorers are fresh (ρ = 1 never runs them), so no training run is needed.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.embedding_graphs import tiny_checkpoint
from benchmarks.retrieval_parts import DATASETS, read_retrieval_set
from retention_core.machine import describe
from training.tiny import TINY_MAX_LENGTH

PARITY_FLOOR = 0.9999  # the bar: ρ = 1 is the original model, not an approximation of it
# Its schedule for the fresh scorers (unused at ρ = 1); one path, as measured.
RECIPE = Path("models/recipes/minilm-embed-frozen.yaml")
BATCH = 16


def paragraphs(count: int, data_root: Path) -> list[str]:
    squad = DATASETS["squad"]
    return read_retrieval_set(data_root / squad.file, dataset=squad, limit_documents=count).paragraphs


def random_texts(tokenizer: Any, count: int, seed: int = 0) -> list[str]:
    words = [word for word in tokenizer.get_vocab() if word.isalpha()]
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(words, size=int(rng.integers(3, 60)))) for _ in range(count)]


def cosines(ours: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """Row-wise cosine of (N, d) and (N, d) → (N,)."""
    return (ours * reference).sum(1) / (np.linalg.norm(ours, axis=1) * np.linalg.norm(reference, axis=1))


def encode_ours(
    model: Any, tokenizer: Any, texts: list[str], max_length: int, session: Any = None
) -> np.ndarray:
    """ρ = 1 vectors (N, d): the torch model, or the exported graph when ``session`` is given."""
    import torch

    vectors = []
    for start in range(0, len(texts), BATCH):
        batch = tokenizer(
            texts[start : start + BATCH],
            padding=True,
            truncation=True,
            max_length=max_length,
            return_tensors="np",
        )
        rho = np.ones(len(batch["input_ids"]), dtype=np.float32)
        feeds = {
            "input_ids": batch["input_ids"].astype(np.int64),
            "attention_mask": batch["attention_mask"].astype(np.int64),
        }
        if session is not None:
            vectors.append(session.run(None, {**feeds, "rho": rho})[0])
            continue
        with torch.no_grad():
            tensors = {name: torch.from_numpy(value) for name, value in feeds.items()}
            vectors.append(model.forward_pruned(**tensors, rho=torch.from_numpy(rho)).logits.numpy())
    return np.concatenate(vectors)


def measure(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    from sentence_transformers import SentenceTransformer

    from benchmarks.embedding_graphs import our_model
    from retention_ort import open_session
    from training.engine.encoders import load_tokenizer, resolve_backbone_path
    from training.export.graph import export_onnx

    checkpoint = (
        tiny_checkpoint(workdir / "checkpoint", family=args.family)
        if args.quick
        else Path(resolve_backbone_path(args.backbone))
    )
    reference = SentenceTransformer(str(checkpoint), device="cpu")
    max_length = int(reference.max_seq_length or TINY_MAX_LENGTH)
    tokenizer = load_tokenizer(str(checkpoint))
    if args.quick:
        texts = random_texts(tokenizer, args.texts)
    else:
        from training.recipes.data import default_data_root

        data_root = args.data_root or default_data_root()
        if data_root is None:
            raise SystemExit("no data root (../shared/data); pass --data-root")
        texts = paragraphs(args.texts, data_root)
    expected = reference.encode(texts, batch_size=BATCH, normalize_embeddings=False)
    model = our_model(None, RECIPE, checkpoint)
    export_onnx(model, workdir / "model.onnx", model.backbone.info_vocab_size)
    found = {
        "torch": encode_ours(model, tokenizer, texts, max_length),
        "onnxruntime": encode_ours(model, tokenizer, texts, max_length, open_session(workdir / "model.onnx")),
    }
    rows = {}
    for runtime, vectors in found.items():
        cosine = cosines(vectors, expected)
        rows[runtime] = {"min_cosine": float(cosine.min()), "mean_cosine": float(cosine.mean())}
    return {
        "backbone": "tiny random " + args.family if args.quick else args.backbone,
        "family": model.backbone.info.family,
        "texts": len(texts),
        "max_length": max_length,
        "reference": "sentence_transformers.SentenceTransformer.encode (its own pooling, not normalised)",
        "floor": PARITY_FLOOR,
        "runtimes": rows,
        "met": all(row["min_cosine"] >= PARITY_FLOOR for row in rows.values()),
        "machine": describe(),
    }


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m experiments.source_parity", description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--backbone", default="all-mpnet-base-v2", help="an alias, fetched name or local dir")
    parser.add_argument("--texts", type=int, default=300)
    parser.add_argument("--data-root", type=Path, default=None, help="default: ../shared/data")
    parser.add_argument("--quick", action="store_true", help="a tiny random checkpoint of --family")
    parser.add_argument("--family", choices=("bert", "mpnet"), default="mpnet")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    with tempfile.TemporaryDirectory() as workdir:
        payload = measure(args, Path(workdir))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(payload["runtimes"], indent=2), "met:", payload["met"])


if __name__ == "__main__":
    main()
