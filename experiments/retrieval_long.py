"""Long documents: dense truncation at the configured max length against learned retention over more
tokens at equal encoder token-work (a question worth measuring; it has no target).

``python -m experiments.retrieval_long <run_dir> --out <dir> --dataset scitldr [--long-length 512]
[--short-length N] [--cache-dir DIR]`` → ``<dir>/long_context.json`` and ``.md`` (the retrieval sets and
encoders of ``benchmarks.retrieval``).

The documents longer than ``short`` tokens ([CLS] and [SEP] counted; ``short`` is the recipe's
max_length, 256 for MiniLM) are encoded five ways:

- ``dense@short`` (a): the dense model on their first ``short`` tokens — what the model does today;
- ``learned@long, equal work`` (b): learned retention over their first ``long`` tokens, each document at
  the largest ρ (on a grid of ``RHO_STEP``) whose encoder token-work is not above (a)'s for it;
- ``attention@long, equal work``: attention-received top-k at those same ρ (do the learned scorers
  matter, or only the extra tokens?);
- ``learned@long, ρ=0.5``: the question as first asked, its token-work reported beside it;
- ``dense@long`` (c): every token up to ``long``, the would-be ceiling at the full work.

Every other document (≤ ``short`` tokens: nothing is cut, and equal work is the whole dense pass) is
its dense vector in every configuration. The queries are dense and are those whose relevant document
is long; they search the whole corpus, short documents included.

Token-work is the encoder's Σ over layers of tokens processed (``retention_core.usage``), as a fraction
of ``dense@long``'s for the same document. It leaves out attention's quadratic term — at equal
token-work the pruned pass's early layers are longer than the truncated pass's, so it does somewhat
more attention work — and the scorers' own cost.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import cli, describe, publish
from benchmarks.retrieval_parts import (
    DATASETS,
    DECIMALS,
    DEFAULT_DATASET,
    DENSE,
    ENCODER,
    LEARNED,
    METRICS,
    Dataset,
    EmbeddingStore,
    Encoder,
    RetrievalSet,
    cosine_distribution,
    data_file,
    dataset_cache,
    load_embedding_run,
    payload_dataset,
    query_fields,
    ranking_metrics,
    read_retrieval_set,
    run_fields,
    search,
    search_description,
)

MODULE = "experiments.retrieval_long"
RHO_STEP = 0.005
FIXED_RHO = 0.5
ATTENTION = "attention"
RESULT_FILE = "long_context.json"


@dataclass(frozen=True)
class LongDocuments:
    """The documents a cut at ``short`` tokens shortens, and the queries that look for them."""

    ids: np.ndarray  # (L,) indices into the corpus
    long_lengths: np.ndarray  # (L,) tokens of each at the long cut
    short_lengths: np.ndarray  # (L,) tokens of each at the short cut
    over_long: int  # documents that even the long cut shortens
    query_mask: np.ndarray  # (Q,) bool: the query's relevant document is long


def input_tokens(encoder: Encoder, texts: list[str]) -> list[int]:
    """Each text's token count with [CLS] and [SEP], before any cut to the encoder's ``max_length``."""
    codec = encoder.codec()
    return [codec.encode(text).input_tokens for text in texts]


def long_documents(short: Encoder, long: Encoder, data: RetrievalSet) -> LongDocuments:
    tokens = np.array(input_tokens(long, data.paragraphs))  # (D,) before any cut
    ids = np.flatnonzero(tokens > short.max_length)  # (L,)
    return LongDocuments(
        ids=ids,
        long_lengths=np.minimum(tokens[ids], long.max_length),
        short_lengths=np.minimum(tokens[ids], short.max_length),
        over_long=int(np.sum(tokens > long.max_length)),
        query_mask=np.isin(data.gold, ids),
    )


def equal_work_rhos(
    encoder: Encoder, lengths: np.ndarray, targets: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the largest ρ on the grid (RHO_STEP … 1) whose schedule does at most ``targets`` of the
    row's dense token-work (the smallest grid ρ where none does), and the work it does.
    lengths, targets (N,) → ρ (N,), work (N,)."""
    grid = np.round(np.arange(1, round(1 / RHO_STEP) + 1) * RHO_STEP, 6)  # (G,) ascending
    works = np.stack([encoder.schedule_work(lengths.tolist(), float(rho)) for rho in grid])  # (G, N)
    fits = works <= targets[None, :] + 1e-9  # (G, N)
    last_fit = len(grid) - 1 - np.argmax(fits[::-1], axis=0)  # (N,) the work grows with ρ
    chosen = np.where(fits.any(axis=0), last_fit, 0)  # (N,)
    return grid[chosen], works[chosen, np.arange(len(lengths))]


@dataclass(frozen=True)
class Configuration:
    """How the long documents are encoded: their vectors (L, d) and token-work per document (L,)."""

    name: str
    rho: str  # for the table: "1", "0.5" or "per document"
    vectors: np.ndarray
    work: np.ndarray  # fraction of dense@long's token-work, per long document


def configurations(
    short_store: EmbeddingStore, long_store: EmbeddingStore, data: RetrievalSet, docs: LongDocuments
) -> list[Configuration]:
    """(a), (b), its attention baseline, learned at ρ = 0.5 and (c), in that order."""
    short, long = short_store.encoder.max_length, long_store.encoder.max_length
    texts = [data.paragraphs[i] for i in docs.ids]
    truncated = docs.short_lengths / docs.long_lengths  # (L,) token-work of (a)
    rhos, equal_work = equal_work_rhos(long_store.encoder, docs.long_lengths, truncated)  # (L,), (L,)
    per_row = tuple(float(rho) for rho in rhos)
    dense_short = short_store.get(data.paragraphs, DENSE, 1.0).vectors[docs.ids]
    return [
        Configuration(f"dense@{short}", "1", dense_short, truncated),
        Configuration(
            f"learned@{long}, equal work",
            "per document",
            long_store.get(texts, LEARNED, per_row).vectors,
            equal_work,
        ),
        Configuration(
            f"attention@{long}, equal work",
            "per document",
            long_store.get(texts, ATTENTION, per_row).vectors,
            equal_work,
        ),
        Configuration(
            f"learned@{long}, ρ={FIXED_RHO:g}",
            f"{FIXED_RHO:g}",
            long_store.get(texts, LEARNED, FIXED_RHO).vectors,
            long_store.encoder.schedule_work(docs.long_lengths.tolist(), FIXED_RHO),
        ),
        Configuration(f"dense@{long}", "1", long_store.get(texts, DENSE, 1.0).vectors, np.ones(len(texts))),
    ]


def long_cell(
    configuration: Configuration,
    data: RetrievalSet,
    docs: LongDocuments,
    corpus: np.ndarray,
    queries: np.ndarray,
    references: dict[str, np.ndarray],
) -> dict[str, Any]:
    """One configuration's result: the long documents' queries search the corpus with the long documents
    replaced by the configuration's vectors. corpus (D, d) dense@short, queries (Q, d) dense."""
    documents = corpus.copy()  # (D, d)
    documents[docs.ids] = configuration.vectors
    ranks = search(queries[docs.query_mask], documents, data.gold[docs.query_mask])
    cell: dict[str, Any] = {
        "rho": configuration.rho,
        **{key: round(value, 2) for key, value in ranking_metrics(ranks).items()},
        "document_token_work": round(float(configuration.work.mean()), DECIMALS),
        "document_tokens_per_layer": round(float(np.mean(configuration.work * docs.long_lengths)), 1),
    }
    for name, reference in references.items():
        cell[f"document_cosine_to_{name}"] = cosine_distribution(configuration.vectors, reference)
    return cell


def summary(values: np.ndarray, decimals: int = 1) -> dict[str, float]:
    return {
        "mean": round(float(values.mean()), decimals),
        "min": round(float(values.min()), decimals),
        "max": round(float(values.max()), decimals),
    }


def long_context_benchmark(
    run_dir: Path,
    dataset: Dataset,
    data_path: Path,
    limit_queries: int | None,
    cache_dir: Path | None,
    long_length: int,
    short_length: int | None = None,
) -> dict[str, Any]:
    import torch

    start = time.perf_counter()
    model, recipe, tokenizer = load_embedding_run(run_dir)
    short_length = recipe.max_length if short_length is None else short_length
    positions = model.backbone.info.max_positions
    if not 2 < short_length < long_length <= positions:
        raise SystemExit(f"need 2 < short ({short_length}) < long ({long_length}) ≤ positions ({positions})")
    data = read_retrieval_set(data_path, limit_queries, dataset)
    cache = dataset_cache(cache_dir, dataset)
    short_store = EmbeddingStore(Encoder(model, tokenizer, short_length), cache)
    long_store = EmbeddingStore(Encoder(model, tokenizer, long_length), cache)
    docs = long_documents(short_store.encoder, long_store.encoder, data)
    if not docs.query_mask.any():
        raise SystemExit(f"no {dataset.document_noun} longer than {short_length} tokens with a query")
    made = configurations(short_store, long_store, data, docs)
    corpus = short_store.get(data.paragraphs, DENSE, 1.0).vectors  # (D, d)
    queries = short_store.get(data.questions, DENSE, 1.0).vectors  # (Q, d) the grid's queries
    references = {f"dense_{long_length}": made[-1].vectors, f"dense_{short_length}": made[0].vectors}
    results = {c.name: long_cell(c, data, docs, corpus, queries, references) for c in made}
    rhos, _ = equal_work_rhos(long_store.encoder, docs.long_lengths, docs.short_lengths / docs.long_lengths)
    return {
        **run_fields(run_dir, recipe, dataset, data_path),
        **query_fields(data, limit_queries),
        "short_length": short_length,
        "long_length": long_length,
        "trained_max_length": recipe.max_length,
        "position_embeddings": positions,
        "long_documents": len(docs.ids),
        "documents_over_long_length": docs.over_long,
        "long_document_tokens": summary(docs.long_lengths.astype(np.float64)),
        "long_queries": int(docs.query_mask.sum()),
        "equal_work_rho": {**summary(rhos, 3), "grid_step": RHO_STEP},
        "encoder": ENCODER,
        "search": search_description(dataset),
        "results": results,
        "answer": answer(results, short_length, long_length),
        "machine": {**describe(), "torch_threads": torch.get_num_threads()},
        "wall_seconds": round(time.perf_counter() - start, 1),
    }


def answer(results: dict[str, dict[str, Any]], short: int, long: int) -> dict[str, Any]:
    """The question in numbers: nDCG@10 of each configuration against dense@short's."""
    metric = METRICS[0]
    base = results[f"dense@{short}"][metric]
    return {
        "metric": metric,
        "baseline": f"dense@{short}",
        "baseline_value": base,
        "points_over_baseline": {
            name: round(cell[metric] - base, 2) for name, cell in results.items() if name != f"dense@{short}"
        },
    }


# ---------------------------------------------------------------------- report
def markdown(payload: dict[str, Any]) -> str:
    dataset = payload_dataset(payload)
    short, long = payload["short_length"], payload["long_length"]
    tokens, rho, trained = (
        payload["long_document_tokens"],
        payload["equal_work_rho"],
        payload["trained_max_length"],
    )
    docs, queries = dataset.document_noun, dataset.query_noun
    unseen = f", positions past {trained} unseen in the retrofit" if long > trained else ""
    lines = [
        f"# Long documents: {payload['model']} ({payload['profile']}) — {dataset.title}: dense at {short} "
        f"tokens vs learned retention over {long} at equal token-work",
        "",
        f"{payload['long_documents']} of {payload['documents']} {docs} are longer than {short} tokens "
        f"([CLS] and [SEP] counted; {tokens['mean']:.0f} on average, {tokens['min']:.0f}–"
        f"{tokens['max']:.0f}, at the {long} cut; {payload['documents_over_long_length']} of them longer "
        f"than {long}, cut there too). Their {payload['long_queries']} {queries} (of {payload['queries']}, "
        f"{payload['query_subset']}), dense, search all {payload['documents']} {docs}; the other {docs} "
        f"are their dense vectors in every row. Encoder: {payload['encoder']}. Search: {payload['search']}.",
        "",
        f"The run was trained at max_length {trained}; the backbone has {payload['position_embeddings']} "
        f"position embeddings, so the model runs at {long} as it is{unseen}. Equal work: each "
        f"document at the largest ρ (grid {rho['grid_step']:g}) whose token-work is not above "
        f"dense@{short}'s for it — ρ {rho['mean']:.3f} on average, {rho['min']:.3f}–{rho['max']:.3f}. "
        f"Token-work: Σ over layers of tokens processed, as a fraction of dense@{long}'s; attention's "
        "quadratic term and the scorers are not counted.",
        "",
        f"| configuration | ρ | nDCG@10 | MRR@10 | R@1 | R@10 | token-work | tokens / layer | cos to "
        f"dense@{long}: mean / p5 / p50 / p95 / min | cos to dense@{short} mean |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, cell in payload["results"].items():
        to_long, to_short = (
            cell[f"document_cosine_to_dense_{long}"],
            cell[f"document_cosine_to_dense_{short}"],
        )
        distribution = " / ".join(f"{to_long[k]:.3f}" for k in ("mean", "p5", "p50", "p95", "min"))
        lines.append(
            f"| {name} | {cell['rho']} | "
            + " | ".join(f"{cell[m]:.2f}" for m in METRICS)
            + f" | {cell['document_token_work']:.3f} | {cell['document_tokens_per_layer']:.1f}"
            + f" | {distribution} | {to_short['mean']:.3f} |"
        )
    verdict = payload["answer"]
    lines += ["", f"nDCG@10 against dense@{short} ({verdict['baseline_value']:.2f}):", ""]
    lines += [f"- {name}: {points:+.2f} points" for name, points in verdict["points_over_baseline"].items()]
    lines += ["", f"Command: `{payload.get('command', '')}` ({payload['wall_seconds']} s)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = cli(MODULE, __doc__)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--out", type=Path, required=True, help=f"directory for {RESULT_FILE} / .md")
    parser.add_argument("--dataset", choices=sorted(DATASETS), default=DEFAULT_DATASET)
    parser.add_argument("--data", type=Path, default=None, help="default: the set's file under the data root")
    parser.add_argument("--limit-queries", type=int, default=None)
    parser.add_argument("--cache-dir", type=Path, default=None, help="reuse embeddings across invocations")
    parser.add_argument("--short-length", type=int, help="default: the recipe's max_length")
    parser.add_argument("--long-length", type=int, default=512)
    args = parser.parse_args(argv)
    dataset = DATASETS[args.dataset]
    payload = long_context_benchmark(
        args.run_dir,
        dataset,
        data_file(dataset, args.data),
        args.limit_queries,
        args.cache_dir,
        args.long_length,
        args.short_length,
    )
    publish(payload, markdown, args.out / RESULT_FILE, MODULE, argv)


if __name__ == "__main__":
    main()
