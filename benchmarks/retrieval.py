"""Retrieval quality of learned retention on text the scorers never trained on (issue 20).

``python -m benchmarks.retrieval <run_dir> --out results/<run>-retrieval/ [--limit-queries N]``

SQuAD v1.1 dev, question → paragraph: every question (10,570) searches the 2,067 distinct dev paragraphs
(the embedding recipes train on the train-subset paragraphs, other articles); its relevant paragraph is
its own row's context. Documents are encoded at each ρ by each method, queries dense (ρ = 1); the learned
method is also measured with the queries pruned at the same ρ. Scores: cosine on L2-normalised vectors,
exact search (one matrix product); ties go to the lower paragraph index, so a ranking is deterministic.

Methods (all through torch ``forward_pruned``, ``training.evaluation.predict_rows``, so they share one
code path): ``learned`` (the run's scorers), ``random`` (random-k, seeded with ``EVAL_SEED`` per pass),
``attention`` (attention-received top-k) — these three keep the same number of tokens per layer — and
``truncation``: the dense model on the first tokens of each paragraph, as many as give the *same
encoder token-work* as the pruned methods' schedule at that ρ (pruning keeps more tokens in early layers
than at the last one, so cutting to ρ · n would do less work than the pruned pass). At ρ = 1 every
method is the dense model (all tokens kept), so ρ = 1 is measured once, as ``dense``.

``--cache-dir`` keeps every (method, ρ, side) embedding matrix under a fingerprint of the weights that
made it (the backbone's for the baselines, the whole model's for learned), the texts and the settings:
a retrofit freezes the backbone, so the baselines of two runs of one backbone are the same matrices.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.machine import describe, write_result

MODULE = "benchmarks.retrieval"
RHOS = (1.0, 0.7, 0.5, 0.3, 0.2)
METHODS = ("learned", "random", "attention", "truncation")
DENSE = "dense"
LEARNED = "learned"
TRUNCATION = "truncation"
CUTOFF = 10
BATCH_SIZE = 32
DATA_FILE = Path("squad") / "validation.jsonl.gz"
ENCODER = "torch forward_pruned (training.evaluation.predict_rows), fp32, CPU"
COSINE_QUANTILES = (5, 50, 95)
DECIMALS = 4

# Settled before the first measurement (issue 20): nDCG@10 of learned retention (documents pruned,
# queries dense) within these many points of dense at each ρ, and above every baseline at ρ ≤ 0.5.
NDCG_GAP_TARGETS = {0.5: 1.0, 0.3: 3.0}
BEATS_BASELINES_AT_OR_BELOW = 0.5


# ---------------------------------------------------------------------- metrics
def gold_ranks(scores: np.ndarray, gold: np.ndarray) -> np.ndarray:
    """1-based rank of each query's gold document. scores (Q, D), gold (Q,) → (Q,) int.

    Ties are broken by document index (lower first), as a stable descending sort would."""
    gold_scores = scores[np.arange(len(gold)), gold][:, None]  # (Q, 1)
    above = (scores > gold_scores).sum(1)  # (Q,)
    before = np.arange(scores.shape[1])[None, :] < gold[:, None]  # (Q, D)
    tied_before = ((scores == gold_scores) & before).sum(1)  # (Q,)
    return (above + tied_before + 1).astype(np.int64)


def ranking_metrics(ranks: np.ndarray, cutoff: int = CUTOFF) -> dict[str, float]:
    """nDCG@k, MRR@k, recall@1 and recall@k (percent) from the gold ranks of one-relevant-document
    queries: the ideal DCG is 1, so nDCG@k is 1 / log2(rank + 1) inside the cut-off, else 0."""
    ranks = np.asarray(ranks, dtype=np.float64)
    inside = ranks <= cutoff
    return {
        f"ndcg@{cutoff}": 100.0 * float(np.mean(np.where(inside, 1.0 / np.log2(ranks + 1.0), 0.0))),
        f"mrr@{cutoff}": 100.0 * float(np.mean(np.where(inside, 1.0 / ranks, 0.0))),
        "recall@1": 100.0 * float(np.mean(ranks <= 1)),
        f"recall@{cutoff}": 100.0 * float(np.mean(inside)),
    }


def l2_rows(matrix: np.ndarray) -> np.ndarray:
    """Each row divided by its norm (a zero row stays zero). (N, d) → (N, d) float32"""
    norms = np.linalg.norm(matrix.astype(np.float64), axis=1, keepdims=True)  # (N, 1)
    return (matrix / np.maximum(norms, 1e-12)).astype(np.float32)


def search(queries: np.ndarray, documents: np.ndarray, gold: np.ndarray) -> np.ndarray:
    """Exact cosine search: ranks of the gold documents. queries (Q, d), documents (D, d), gold (Q,)."""
    scores = l2_rows(queries) @ l2_rows(documents).T  # (Q, D)
    return gold_ranks(scores, gold)


def cosine_distribution(pruned: np.ndarray, dense: np.ndarray) -> dict[str, float]:
    """Row-wise cosine between two encodings of the same texts: mean, min and percentiles."""
    cosines = np.sum(l2_rows(pruned).astype(np.float64) * l2_rows(dense), axis=1)  # (N,)
    summary = {"mean": float(cosines.mean()), "min": float(cosines.min())}
    summary.update({f"p{q}": float(np.percentile(cosines, q)) for q in COSINE_QUANTILES})
    return {key: round(value, DECIMALS) for key, value in summary.items()}


# ---------------------------------------------------------------------- data
@dataclass(frozen=True)
class RetrievalSet:
    questions: list[str]
    paragraphs: list[str]  # distinct contexts, in file order
    gold: np.ndarray  # (Q,) index into paragraphs


def read_retrieval_set(path: Path, limit_queries: int | None = None) -> RetrievalSet:
    """Rows with ``question`` and ``context`` → every distinct context once; the first
    ``limit_queries`` questions after a seeded shuffle (all paragraphs are always searched)."""
    from training.data import EVAL_SEED, read_jsonl_gz, shuffled

    rows = read_jsonl_gz(path)
    index = {context: i for i, context in enumerate(dict.fromkeys(str(row["context"]) for row in rows))}
    chosen = rows if limit_queries is None else shuffled(rows, EVAL_SEED, limit_queries)
    return RetrievalSet(
        questions=[str(row["question"]) for row in chosen],
        paragraphs=list(index),
        gold=np.array([index[str(row["context"])] for row in chosen], dtype=np.int64),
    )


# ---------------------------------------------------------------------- encoding
@dataclass
class Encoder:
    """A run's model and codec; ``encode`` gives (N, d) unnormalised pooled vectors."""

    model: Any
    tokenizer: Any
    max_length: int
    batch_size: int = BATCH_SIZE

    def rows(self, texts: Sequence[str]) -> list[Any]:
        from training.evaluation import evaluation_codec

        codec = evaluation_codec("embedding", self.tokenizer, self.max_length)
        return [codec.encode(text).rows[0] for text in texts]

    def pad_id(self) -> int:
        from retention_core.text import pad_token_id
        from training.evaluation import evaluation_codec

        return pad_token_id(evaluation_codec("embedding", self.tokenizer, self.max_length).tokenizer)

    def schedule_work(self, lengths: Sequence[int], rho: float) -> np.ndarray:
        """Encoder token-work fraction of the pruned pass at ρ for rows of these lengths (N,): the keep
        schedule alone fixes it (every selector keeps the same counts; [CLS] is protected)."""
        import torch

        from training import retention as R

        num_real = torch.tensor(list(lengths), dtype=torch.long)  # (N,)
        counts = R.keep_counts(
            torch.full((len(lengths),), float(rho)),
            num_real,
            torch.ones_like(num_real),
            self.model.num_points,
            self.model.config.schedule_power,
        )  # (N, P)
        return R.encoder_token_work(counts, num_real, self.model.last_layer_queries).numpy()

    def encode(self, texts: Sequence[str], method: str, rho: float) -> tuple[np.ndarray, float]:
        """Vectors (N, d) and the mean encoder token-work fraction of the pass."""
        from training.evaluation import make_selector, predict_rows

        rows = self.rows(texts)
        if method == TRUNCATION:
            work = self.schedule_work([len(row) for row in rows], rho)
            cut = [truncated_to_work(row, fraction) for row, fraction in zip(rows, work, strict=True)]
            predictions = predict_rows(self.model, cut, 1.0, self.pad_id(), None, self.batch_size)
            token_work = float(np.mean([len(short) / len(row) for short, row in zip(cut, rows, strict=True)]))
        else:
            selector = make_selector(LEARNED if method == DENSE else method)
            rho = 1.0 if method == DENSE else rho
            predictions = predict_rows(self.model, rows, rho, self.pad_id(), selector, self.batch_size)
            token_work = float(np.mean([prediction.token_work for prediction in predictions]))
        return np.stack([prediction.logits for prediction in predictions]).astype(np.float32), token_work


def truncated_to_work(row: Any, work: float) -> Any:
    """The first tokens of a [CLS] … [SEP] row, [SEP] re-appended: round(work · n) tokens in all (at
    least [CLS] and [SEP]), so the dense pass over them does ``work`` of the full row's token-work."""
    from training.evaluation import sub_row

    length = len(row)
    keep = min(length, max(2, math.floor(work * length + 0.5)))
    return sub_row(row, [*range(keep - 1), length - 1])


def weights_fingerprint(model: Any, method: str) -> str:
    """sha1 of the weights a method's vectors depend on: the backbone's for the baselines and dense
    (their token choice never reads the scorers), the whole model's for learned."""
    digest = hashlib.sha1()
    for name, tensor in sorted(model.state_dict().items()):
        if method == LEARNED or name.startswith("backbone."):
            digest.update(name.encode())
            digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def file_sha1(path: Path) -> str:
    digest = hashlib.sha1()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def texts_fingerprint(texts: Sequence[str]) -> str:
    return hashlib.sha1("\x00".join(texts).encode("utf-8")).hexdigest()


@dataclass
class Pass:
    vectors: np.ndarray  # (N, d)
    token_work: float
    seconds: float  # of the encoding, when it was measured
    cached: bool


class EmbeddingStore:
    """Encodes (method, ρ, texts) once; with a cache directory, once across invocations too."""

    def __init__(self, encoder: Encoder, cache_dir: Path | None) -> None:
        self.encoder = encoder
        self.cache_dir = cache_dir
        self._fingerprints: dict[str, str] = {}

    def key(self, texts: Sequence[str], method: str, rho: float) -> str:
        kind = LEARNED if method == LEARNED else "backbone"
        if kind not in self._fingerprints:
            self._fingerprints[kind] = weights_fingerprint(self.encoder.model, method)
        parts = [self._fingerprints[kind], texts_fingerprint(texts), method, f"{rho:g}"]
        parts += [str(self.encoder.max_length), str(self.encoder.batch_size), "EVAL_SEED=0"]
        if method != DENSE:  # the keep schedule fixes every pruned method's per-layer counts
            parts.append(
                f"schedule {self.encoder.model.num_points}^{self.encoder.model.config.schedule_power}"
            )
        return hashlib.sha1("|".join(parts).encode()).hexdigest()[:20]

    def get(self, texts: Sequence[str], method: str, rho: float) -> Pass:
        path = None if self.cache_dir is None else self.cache_dir / self.key(texts, method, rho)
        if path is not None and path.with_suffix(".json").is_file():
            meta = json.loads(path.with_suffix(".json").read_text(encoding="utf-8"))
            return Pass(np.load(path.with_suffix(".npy")), meta["token_work"], meta["seconds"], True)
        start = time.perf_counter()
        vectors, work = self.encoder.encode(texts, method, rho)
        seconds = time.perf_counter() - start
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            np.save(path.with_suffix(".npy"), vectors)
            meta = {"method": method, "rho": rho, "texts": len(texts), "token_work": work, "seconds": seconds}
            path.with_suffix(".json").write_text(json.dumps(meta), encoding="utf-8")
        return Pass(vectors, work, seconds, False)


# ---------------------------------------------------------------------- the benchmark
def cell(
    ranks: np.ndarray, documents: Pass, queries: Pass, dense_documents: Pass, dense_queries: Pass
) -> dict[str, Any]:
    """One (method, ρ, query side) result."""
    return {
        **{key: round(value, 2) for key, value in ranking_metrics(ranks).items()},
        "document_token_work": round(documents.token_work, DECIMALS),
        "query_token_work": round(queries.token_work, DECIMALS),
        "document_cosine_to_dense": cosine_distribution(documents.vectors, dense_documents.vectors),
        "query_cosine_to_dense": cosine_distribution(queries.vectors, dense_queries.vectors),
        "document_seconds": round(documents.seconds, 1),
        "query_seconds": round(queries.seconds, 1),
        "document_cached": documents.cached,  # seconds measured by an earlier invocation (--cache-dir)
        "query_cached": queries.cached,
    }


def retrieval_grid(
    store: EmbeddingStore,
    data: RetrievalSet,
    methods: Sequence[str],
    rhos: Sequence[float],
    query_rhos: Sequence[float],
) -> dict[str, dict[str, dict[str, Any]]]:
    """``{"dense": {"1": cell}, "<method>": {"<ρ>": cell}, "learned+queries": {"<ρ>": cell}}``; the
    last at ``query_rhos`` only (queries pruned with the learned scorers too)."""
    dense_docs = store.get(data.paragraphs, DENSE, 1.0)
    dense_queries = store.get(data.questions, DENSE, 1.0)
    results: dict[str, dict[str, dict[str, Any]]] = {
        DENSE: {
            "1": cell(
                search(dense_queries.vectors, dense_docs.vectors, data.gold),
                dense_docs,
                dense_queries,
                dense_docs,
                dense_queries,
            )
        }
    }
    pruned_rhos = [rho for rho in rhos if rho < 1.0]
    for method in methods:
        for rho in pruned_rhos:
            docs = store.get(data.paragraphs, method, rho)
            ranks = search(dense_queries.vectors, docs.vectors, data.gold)
            results.setdefault(method, {})[f"{rho:g}"] = cell(
                ranks, docs, dense_queries, dense_docs, dense_queries
            )
            print(
                f"{method} ρ={rho:g}: nDCG@10 {results[method][f'{rho:g}'][f'ndcg@{CUTOFF}']:.2f}", flush=True
            )
    if LEARNED in methods:
        for rho in [rho for rho in query_rhos if rho < 1.0]:
            docs, queries = store.get(data.paragraphs, LEARNED, rho), store.get(data.questions, LEARNED, rho)
            ranks = search(queries.vectors, docs.vectors, data.gold)
            results.setdefault(f"{LEARNED}+queries", {})[f"{rho:g}"] = cell(
                ranks, docs, queries, dense_docs, dense_queries
            )
    return results


def target_checks(results: dict[str, dict[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """The targets settled in advance, each with the measured value and met / missed (None: not run)."""
    metric = f"ndcg@{CUTOFF}"
    dense = results[DENSE]["1"][metric]
    learned = results.get(LEARNED, {})
    checks: list[dict[str, Any]] = []
    for rho, gap in NDCG_GAP_TARGETS.items():
        value = learned.get(f"{rho:g}", {}).get(metric)
        checks.append(
            {
                "target": f"learned nDCG@{CUTOFF} within {gap:g} points of dense at ρ = {rho:g}",
                "measured": None
                if value is None
                else f"{value - dense:+.2f} points ({value:.2f} vs {dense:.2f})",
                "met": None if value is None else dense - value <= gap,
            }
        )
    for rho_key, by in sorted(learned.items(), key=lambda item: -float(item[0])):
        if float(rho_key) > BEATS_BASELINES_AT_OR_BELOW:
            continue
        rivals = {
            m: results[m][rho_key][metric] for m in results if m in METHODS[1:] and rho_key in results[m]
        }
        if not rivals:
            continue
        best = max(rivals, key=lambda m: rivals[m])
        checks.append(
            {
                "target": f"learned nDCG@{CUTOFF} above every baseline at ρ = {rho_key}",
                "measured": f"{by[metric]:.2f} vs best baseline {best} {rivals[best]:.2f}",
                "met": by[metric] > rivals[best],
            }
        )
    return checks


def retrieval_benchmark(
    run_dir: Path,
    data_path: Path,
    limit_queries: int | None,
    methods: Sequence[str],
    rhos: Sequence[float],
    cache_dir: Path | None,
    query_rhos: Sequence[float] | None = None,
) -> dict[str, Any]:
    import torch

    from training.data import EVAL_SEED
    from training.fit import WEIGHTS_FILE, load_run

    start = time.perf_counter()
    model, recipe, tokenizer = load_run(run_dir)
    if recipe.task != "embedding":
        raise SystemExit(f"retrieval needs an embedding run; {run_dir} is task {recipe.task!r}")
    data = read_retrieval_set(data_path, limit_queries)
    store = EmbeddingStore(Encoder(model, tokenizer, recipe.max_length), cache_dir)
    query_rhos = list(rhos) if query_rhos is None else list(query_rhos)
    results = retrieval_grid(store, data, methods, rhos, query_rhos)
    return {
        "run": str(run_dir),
        "run_weights_sha1": file_sha1(run_dir / WEIGHTS_FILE),
        "model": recipe.name,
        "profile": recipe.profile,
        "data": str(data_path),
        "queries": len(data.questions),
        "query_subset": "all" if limit_queries is None else f"first {limit_queries} after a seeded shuffle",
        "documents": len(data.paragraphs),
        "max_length": recipe.max_length,
        "encoder": ENCODER,
        "search": "cosine on L2-normalised vectors, exact (numpy matmul); ties to the lower paragraph index",
        "random_seed": EVAL_SEED,
        "methods": list(methods),
        "rhos": [float(rho) for rho in rhos],
        "pruned_query_rhos": [float(rho) for rho in query_rhos],
        "targets": target_checks(results),
        "results": results,
        "machine": {**describe(), "torch_threads": torch.get_num_threads()},
        "wall_seconds": round(time.perf_counter() - start, 1),
    }


# ---------------------------------------------------------------------- report
def _ordered_cells(results: dict[str, dict[str, dict[str, Any]]]) -> list[tuple[str, str, dict[str, Any]]]:
    rows = [(DENSE, "1", results[DENSE]["1"])]
    for method, by_rho in results.items():
        if method != DENSE:
            rows += [(method, rho, by_rho[rho]) for rho in sorted(by_rho, key=lambda r: -float(r))]
    return rows


def markdown(payload: dict[str, Any]) -> str:
    metrics = (f"ndcg@{CUTOFF}", f"mrr@{CUTOFF}", "recall@1", f"recall@{CUTOFF}")
    lines = [
        f"# Retrieval: {payload['model']} ({payload['profile']}) — SQuAD v1.1 dev question → paragraph",
        "",
        f"{payload['queries']} questions ({payload['query_subset']}) search "
        f"{payload['documents']} paragraphs. Encoder: {payload['encoder']}. Search: {payload['search']}.",
        "Documents pruned at ρ by each method, queries dense, unless the method says `+queries` "
        "(both pruned). Truncation keeps each paragraph's first tokens at the pruned schedule's token-work.",
        "",
        "| method | ρ | nDCG@10 | MRR@10 | R@1 | R@10 | doc token-work | doc cos to dense: mean / p5 / p50 / "
        "p95 / min | query cos mean | doc s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for method, rho, values in _ordered_cells(payload["results"]):
        docs, queries = values["document_cosine_to_dense"], values["query_cosine_to_dense"]
        distribution = " / ".join(f"{docs[k]:.3f}" for k in ("mean", "p5", "p50", "p95", "min"))
        seconds = f"{values['document_seconds']:.0f}" + (" (cached)" if values["document_cached"] else "")
        lines.append(
            f"| {method} | {rho} | "
            + " | ".join(f"{values[m]:.2f}" for m in metrics)
            + f" | {values['document_token_work']:.2f} | {distribution} | {queries['mean']:.3f} | {seconds} |"
        )
    lines += ["", "Targets (settled before measuring):", ""]
    for check in payload["targets"]:
        verdict = {True: "met", False: "**MISSED**", None: "not measured"}[check["met"]]
        lines.append(f"- {check['target']}: {check['measured'] or '—'} — {verdict}")
    lines += ["", f"Command: `{payload.get('command', '')}` ({payload['wall_seconds']} s)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    from training.data import default_data_root

    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--out", type=Path, required=True, help="directory for retrieval.json / .md")
    parser.add_argument(
        "--data", type=Path, default=None, help="default: <data root>/squad/validation.jsonl.gz"
    )
    parser.add_argument("--limit-queries", type=int, default=None)
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--rhos", type=float, nargs="+", default=list(RHOS))
    parser.add_argument(
        "--query-rhos", type=float, nargs="*", default=None, help="ρ for learned+queries (default: --rhos)"
    )
    parser.add_argument("--cache-dir", type=Path, default=None, help="reuse embeddings across invocations")
    args = parser.parse_args(argv)
    data_path = args.data
    if data_path is None:
        root = default_data_root()
        if root is None:
            raise SystemExit("no data root (../shared/data); pass --data")
        data_path = root / DATA_FILE
    payload = retrieval_benchmark(
        args.run_dir, data_path, args.limit_queries, args.methods, args.rhos, args.cache_dir, args.query_rhos
    )
    payload["command"] = f"python -m {MODULE} " + " ".join(argv)
    table = markdown(payload)
    write_result(args.out / "retrieval.json", payload, table)
    print(table)


if __name__ == "__main__":
    main()
