"""Retrieval quality of learned retention on text the scorers never trained on: every query of
``--dataset`` (squad: SQuAD dev question → paragraph; scitldr: SciTLDR-A test TLDR → abstract; bbc: BBC
News headline → article, run it with ``--max-length 512``) searches all its documents by exact cosine.
Documents are encoded at each ρ by each method, queries dense (learned also with pruned queries):
``learned``, ``random`` (seeded), ``attention``, ``leading`` keep the same counts per layer;
``truncation`` is the dense model on each document's first tokens at the same encoder token-work; ρ = 1
is measured once, as ``dense``. ``--cache-dir`` keeps each embedding matrix under a fingerprint of the
weights, texts and settings. Long documents against truncation: the study ``experiments.retrieval_long``.

    python -m benchmarks.retrieval <run_dir> --out results/<run>-retrieval/ [--dataset squad|scitldr|bbc]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import cli, describe, publish
from benchmarks.retrieval_parts import (
    CUTOFF,
    DATASETS,
    DECIMALS,
    DEFAULT_DATASET,
    DENSE,
    GRAPHS,
    INT8_GRAPHS,
    LAYER_EXIT,
    LEARNED,
    METRICS,
    ONNX_METHODS,
    ORIGINAL,
    TRUNCATION,
    Dataset,
    EmbeddingStore,
    Encoder,
    Pass,
    RetrievalSet,
    cosine_distribution,
    data_file,
    dataset_cache,
    encoder_description,
    load_embedding_run,
    onnx_encoder,
    paired_difference,
    payload_dataset,
    query_fields,
    ranking_metrics,
    read_retrieval_set,
    run_fields,
    search,
    search_description,
)

MODULE = "benchmarks.retrieval"
RHOS = (1.0, 0.7, 0.5, 0.3, 0.2)
# "leading": the pruned pass keeping each point's earliest tokens (truncation inside the schedule; with
# --merge the rest is folded into them). "layer-exit-k": the dense model stopped after layer k.
METHODS = ("learned", "random", "attention", "leading", "truncation")

# Settled before the first measurement (each result's "Targets" in docs/benchmarks.md): nDCG@10 of
# learned retention (documents pruned, queries dense) within these many points of dense at each ρ, and
# above every baseline at ρ ≤ 0.5.
NDCG_GAP_TARGETS = {0.5: 1.0, 0.3: 3.0}
BEATS_BASELINES_AT_OR_BELOW = 0.5
SE_MARGIN = 2.0  # the margin target: above every baseline by more than this many paired SE at ρ ≤ 0.5
WORK_TOLERANCE = 0.02  # token-work rounding when matching a layer exit to a ρ


def schedule_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The schedule settings the command line overrides (None: the run's own). The studies' other
    overrides (``--schedule-power``, ``--merge``) and ``--baselines-from``: ``git show
    91c46ac:benchmarks/retrieval.py``."""
    return {
        "min_kept_tokens": args.min_kept_tokens,
        "leading_share": args.leading_share,
        "pruning_interval": args.pruning_interval,
    }


def cell(
    ranks: np.ndarray,
    documents: Pass,
    queries: Pass,
    dense_documents: Pass,
    dense_queries: Pass,
    dense_ranks: np.ndarray | None = None,
) -> dict[str, Any]:
    """One (method, ρ, query side) result; with ``dense_ranks``, its nDCG@10 minus dense's on the same
    queries with the paired standard error."""
    paired = {} if dense_ranks is None else {"ndcg_vs_dense": paired_difference(ranks, dense_ranks)}
    return {
        **{key: round(value, 2) for key, value in ranking_metrics(ranks).items()},
        **paired,
        "document_token_work": round(documents.token_work, DECIMALS),
        "query_token_work": round(queries.token_work, DECIMALS),
        "document_cosine_to_dense": cosine_distribution(documents.vectors, dense_documents.vectors),
        "query_cosine_to_dense": cosine_distribution(queries.vectors, dense_queries.vectors),
        "document_seconds": round(documents.seconds, 1),
        "query_seconds": round(queries.seconds, 1),
        "document_cached": documents.cached,  # seconds measured by an earlier invocation (--cache-dir)
        "query_cached": queries.cached,
    }


@dataclass
class DenseSide:
    """One model's dense pass over a retrieval set: the store that encodes with it, its document and
    query vectors and the gold ranks they give."""

    store: EmbeddingStore
    documents: Pass
    queries: Pass
    ranks: np.ndarray

    @classmethod
    def of(cls, store: EmbeddingStore, data: RetrievalSet) -> DenseSide:
        documents, queries = store.get(data.paragraphs, DENSE, 1.0), store.get(data.questions, DENSE, 1.0)
        return cls(store, documents, queries, search(queries.vectors, documents.vectors, data.gold))

    def cell(
        self, method: str, budget: float, data: RetrievalSet, reference: np.ndarray
    ) -> tuple[dict[str, Any], np.ndarray]:
        """(cell, ranks) of a method's documents searched with this side's dense queries; nDCG paired
        with ``reference`` (the user's original dense model)."""
        documents = self.store.get(data.paragraphs, method, budget)
        ranks = search(self.queries.vectors, documents.vectors, data.gold)
        return cell(ranks, documents, self.queries, self.documents, self.queries, reference), ranks


def retrieval_grid(
    store: EmbeddingStore,
    data: RetrievalSet,
    methods: Sequence[str],
    rhos: Sequence[float],
    query_rhos: Sequence[float],
    layer_exits: Sequence[int] = (),
    baseline_store: EmbeddingStore | None = None,
    own_methods: Sequence[str] = (LEARNED,),
) -> dict[str, dict[str, dict[str, Any]]]:
    """``{"dense": {"1": cell}, "<method>": {"<ρ>": cell}, "learned+queries": {"<ρ>": cell},
    "layer-exit": {"<k>": cell}}``; learned+queries at ``query_rhos`` only (queries pruned with the
    learned scorers too); layer exit after each of ``layer_exits`` layers.

    ``baseline_store``: the user's original model (a retrofit that tuned its backbone is another model):
    every baseline runs on it, searched with its own dense queries, as the user would cut their text;
    every cell's ``ndcg_vs_dense`` is then against the original's dense search, and ``original`` holds
    that search (this run's dense cell pairs with it: the cost at ρ = 1). ``own_methods`` run on this
    run's store even then (an int8 graph's truncation is int8 too)."""
    own = DenseSide.of(store, data)
    base = own if baseline_store is None else DenseSide.of(baseline_store, data)
    results: dict[str, dict[str, dict[str, Any]]] = {DENSE: {"1": own.cell(DENSE, 1.0, data, base.ranks)[0]}}
    if baseline_store is not None:
        results[ORIGINAL] = {"1": base.cell(DENSE, 1.0, data, base.ranks)[0]}
    pruned_rhos = [rho for rho in rhos if rho < 1.0]
    # Truncation first: every other method's cell is paired with it at the same ρ (same token-work).
    ordered = sorted(methods, key=lambda method: method != TRUNCATION)
    all_ranks: dict[tuple[str, str], np.ndarray] = {}
    for method in ordered:
        side = own if method in own_methods else base
        for rho in pruned_rhos:
            key = f"{rho:g}"
            results.setdefault(method, {})[key], ranks = side.cell(method, rho, data, base.ranks)
            all_ranks[method, key] = ranks
            if method != TRUNCATION and (TRUNCATION, key) in all_ranks:
                truncation = all_ranks[TRUNCATION, key]
                results[method][key]["ndcg_vs_truncation"] = paired_difference(ranks, truncation)
            print(f"{method} ρ={rho:g}: nDCG@10 {results[method][key][f'ndcg@{CUTOFF}']:.2f}", flush=True)
    for num_layers in layer_exits:
        key = str(num_layers)
        results.setdefault(LAYER_EXIT, {})[key], ranks = base.cell(
            f"{LAYER_EXIT}-{key}", 1.0, data, base.ranks
        )
        all_ranks[LAYER_EXIT, key] = ranks
    pair_learned_with_baselines(results, all_ranks)
    if LEARNED in methods:
        for rho in [rho for rho in query_rhos if rho < 1.0]:
            docs, queries = store.get(data.paragraphs, LEARNED, rho), store.get(data.questions, LEARNED, rho)
            ranks = search(queries.vectors, docs.vectors, data.gold)
            results.setdefault(f"{LEARNED}+queries", {})[f"{rho:g}"] = cell(
                ranks, docs, queries, own.documents, own.queries, base.ranks
            )
    return results


def equal_work_layer_exit(results: dict[str, dict[str, dict[str, Any]]], work: float) -> str | None:
    """The layer exit doing the most token-work that is still no more than ``work`` (+ rounding)."""
    exits = results.get(LAYER_EXIT, {})
    fitting = [k for k, values in exits.items() if values["document_token_work"] <= work + WORK_TOLERANCE]
    return max(fitting, key=lambda k: exits[k]["document_token_work"], default=None)


def pair_learned_with_baselines(
    results: dict[str, dict[str, dict[str, Any]]], ranks: dict[tuple[str, str], np.ndarray]
) -> None:
    """Add ``ndcg_vs_baselines`` to every learned cell: learned minus each baseline at the same ρ (the
    same token-work), and minus the layer exit of at most that token-work, paired over the queries."""
    for key, values in results.get(LEARNED, {}).items():
        rivals = [(method, key) for method in METHODS[1:] if (method, key) in ranks]
        layer_exit = equal_work_layer_exit(results, values["document_token_work"])
        if layer_exit is not None:
            rivals.append((LAYER_EXIT, layer_exit))
        values["ndcg_vs_baselines"] = {
            f"{method}" if method != LAYER_EXIT else f"{LAYER_EXIT}-{rival_key}": paired_difference(
                ranks[LEARNED, key], ranks[method, rival_key]
            )
            for method, rival_key in rivals
        }


def target_checks(results: dict[str, dict[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """The targets settled in advance, each with the measured value and met / missed (None: not run)."""
    metric = f"ndcg@{CUTOFF}"
    dense = results.get(ORIGINAL, results[DENSE])["1"][metric]  # the user's original model
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
        paired = by.get("ndcg_vs_baselines", {})
        if not paired:
            continue
        # Above every baseline at equal token-work; at ρ ≤ 0.5 by more than 2 paired standard errors.
        margin = SE_MARGIN if float(rho_key) <= BEATS_BASELINES_AT_OR_BELOW else 0.0
        worst = min(paired, key=lambda rival: paired[rival]["difference"] - margin * paired[rival]["se"])
        difference, se = paired[worst]["difference"], paired[worst]["se"]
        checks.append(
            {
                "target": f"learned nDCG@{CUTOFF} above every baseline at ρ = {rho_key}"
                + (f" by > {margin:g} paired SE" if margin else ""),
                "measured": f"closest: {worst} {difference:+.2f} ± {se:.2f}",
                "met": difference > margin * se,
            }
        )
    return checks


def paired_with_run(
    store: EmbeddingStore,
    other: EmbeddingStore,
    data: RetrievalSet,
    rhos: Sequence[float],
) -> dict[str, dict[str, float]]:
    """Learned retention of this run minus another run's (e.g. an ablation against its reference, or a
    tuned backbone against the frozen one), documents pruned at each ρ (at ρ = 1: each run's dense
    model), each run searching with its own dense query vectors (runs with different backbones live in
    different spaces), per-query nDCG@10 on the same queries: mean and paired standard error."""
    ours_queries = store.get(data.questions, DENSE, 1.0).vectors
    theirs_queries = other.get(data.questions, DENSE, 1.0).vectors
    out: dict[str, dict[str, float]] = {}
    for rho in rhos:
        method, budget = (DENSE, 1.0) if rho >= 1.0 else (LEARNED, rho)
        ours = search(ours_queries, store.get(data.paragraphs, method, budget).vectors, data.gold)
        theirs = search(theirs_queries, other.get(data.paragraphs, method, budget).vectors, data.gold)
        out[f"{rho:g}"] = paired_difference(ours, theirs)
    return out


def retrieval_benchmark(
    args: argparse.Namespace, dataset: Dataset, data_path: Path, workdir: Path | None = None
) -> dict[str, Any]:
    """The ρ grid of ``main``'s options (``args``) on ``dataset``'s file at ``data_path``."""
    run_dir, limit_queries, methods, rhos = args.run_dir, args.limit_queries, args.methods, args.rhos
    cache_dir, paired_run, layer_exits, graph = args.cache_dir, args.paired_with, args.layer_exits, args.graph
    max_length, limit_documents = args.max_length, args.limit_documents
    schedule = schedule_overrides(args)
    import torch

    from training.recipes.data import EVAL_SEED

    start = time.perf_counter()
    model, recipe, tokenizer = load_embedding_run(run_dir, schedule)
    if max_length is not None:  # longer documents than the run was trained on (positions permitting)
        recipe = recipe.model_copy(update={"max_length": min(max_length, model.backbone.info.max_positions)})
    data = read_retrieval_set(data_path, limit_queries, dataset, limit_documents)

    def store_of(encoder: Encoder) -> EmbeddingStore:
        return EmbeddingStore(encoder, dataset_cache(cache_dir, dataset))

    def run_store(other_run: Path) -> EmbeddingStore:  # another run's torch encoder, same schedule
        other_model, other_recipe, other_tokenizer = load_embedding_run(other_run, schedule)
        return store_of(Encoder(other_model, other_tokenizer, other_recipe.max_length))

    if graph == "torch":
        encoder = Encoder(model, tokenizer, recipe.max_length)
    else:
        if workdir is None or paired_run is not None or layer_exits:
            raise ValueError(f"--graph {graph}: one run, no --paired-with / --layer-exits")
        encoder = onnx_encoder(model, tokenizer, recipe.max_length, graph, workdir)
    store = store_of(encoder)
    query_rhos = list(rhos) if args.query_rhos is None else list(args.query_rhos)
    baseline_store = None
    own_methods: tuple[str, ...] = (LEARNED,)
    if graph in INT8_GRAPHS:  # every int8 cell (queries int8 too) is paired with the fp32 model's search
        baseline_store, own_methods = store_of(Encoder(model, tokenizer, recipe.max_length)), ONNX_METHODS
    results = retrieval_grid(store, data, methods, rhos, query_rhos, layer_exits, baseline_store, own_methods)
    paired: dict[str, Any] = {}
    if paired_run is not None:
        learned_minus_other = paired_with_run(store, run_store(paired_run), data, rhos)
        paired = {"paired_with": {"run": str(paired_run), "learned_minus_other": learned_minus_other}}
    return {
        **run_fields(run_dir, recipe, dataset, data_path),
        **query_fields(data, limit_queries),
        "document_subset": "all" if limit_documents is None else f"the first {limit_documents} in file order",
        "max_length": recipe.max_length,
        "min_kept_tokens": recipe.retention.min_kept_tokens,
        "merge_dropped": bool(model.config.merge_dropped),
        "leading_share": model.config.leading_share,
        "pruning_interval": model.config.pruning_interval,
        "schedule_power": model.config.schedule_power,
        "encoder": encoder_description(encoder),
        "graph": graph,
        "search": search_description(dataset),
        "random_seed": EVAL_SEED,
        "methods": list(methods),
        "rhos": [float(rho) for rho in rhos],
        "pruned_query_rhos": [float(rho) for rho in query_rhos],
        "targets": target_checks(results),
        "results": results,
        **paired,
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
    dataset = payload_dataset(payload)
    lines = [
        f"# Retrieval: {payload['model']} ({payload['profile']}) — {dataset.title}",
        "",
        f"{payload['queries']} {dataset.query_noun} ({payload['query_subset']}) search "
        f"{payload['documents']} {dataset.document_noun}. Encoder: {payload['encoder']}. "
        f"Search: {payload['search']}.",
        "Documents pruned at ρ by each method, queries dense, unless the method says `+queries` "
        f"(both pruned). Truncation keeps each {dataset.document_one}'s first tokens at the pruned "
        "schedule's token-work.",
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
            + " | ".join(f"{values[m]:.2f}" for m in METRICS)
            + f" | {values['document_token_work']:.2f} | {distribution} | {queries['mean']:.3f} | {seconds} |"
        )
    learned = payload["results"].get(LEARNED, {})
    if any("ndcg_vs_dense" in values for values in learned.values()):
        lines += ["", "Learned minus dense nDCG@10, same queries (± paired standard error):", ""]
        for rho, values in learned.items():
            paired = values["ndcg_vs_dense"]
            lines.append(f"- ρ = {rho}: {paired['difference']:+.2f} ± {paired['se']:.2f}")
    if ORIGINAL in payload["results"] and payload.get("graph") in INT8_GRAPHS:
        paired = payload["results"][DENSE]["1"]["ndcg_vs_dense"]
        lines += [
            "",
            "Every cell is the int8 graph (documents and queries), paired with the fp32 model's dense search "
            "('original'); 'dense' is the int8 graph at ρ = 1. int8 at ρ = 1 minus fp32: "
            f"{paired['difference']:+.2f} ± {paired['se']:.2f}.",
        ]
    against = [
        (rho, rival, values)
        for rho, cell_values in payload["results"].get(LEARNED, {}).items()
        for rival, values in cell_values.get("ndcg_vs_baselines", {}).items()
    ]
    if against:
        lines += ["", "Learned minus each baseline at equal token-work, same queries (± paired SE):", ""]
        lines += [f"- ρ = {r} vs {rival}: {v['difference']:+.2f} ± {v['se']:.2f}" for r, rival, v in against]
    versus = [
        (method, rho, values["ndcg_vs_truncation"])
        for method, rho, values in _ordered_cells(payload["results"])
        if "ndcg_vs_truncation" in values
    ]
    if versus:
        lines += ["", "nDCG@10 minus first-k truncation at the same ρ (same token-work), same queries:", ""]
        lines += [f"- {m} ρ = {r}: {v['difference']:+.2f} ± {v['se']:.2f}" for m, r, v in versus]
    if "paired_with" in payload:
        lines += [
            "",
            f"Learned nDCG@10 of this run minus `{payload['paired_with']['run']}`'s, same queries, documents "
            "pruned, queries dense (± paired standard error):",
            "",
        ]
        for rho, values in payload["paired_with"]["learned_minus_other"].items():
            lines.append(f"- ρ = {rho}: {values['difference']:+.2f} ± {values['se']:.2f}")
    lines += ["", "Targets (settled before measuring):", ""]
    for check in payload["targets"]:
        verdict = {True: "met", False: "**MISSED**", None: "not measured"}[check["met"]]
        lines.append(f"- {check['target']}: {check['measured'] or '—'} — {verdict}")
    lines += ["", f"Command: `{payload.get('command', '')}` ({payload['wall_seconds']} s)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = cli(MODULE, __doc__)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--out", type=Path, required=True, help="directory for retrieval.json / .md")
    parser.add_argument("--dataset", choices=sorted(DATASETS), default=DEFAULT_DATASET)
    files = ", ".join(f"({name}: {spec.file})" for name, spec in DATASETS.items())
    parser.add_argument("--data", type=Path, default=None, help=f"default: under the data root {files}")
    parser.add_argument("--limit-queries", type=int, default=None)
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--rhos", type=float, nargs="+", default=list(RHOS))
    parser.add_argument("--query-rhos", type=float, nargs="*", help="ρ for learned+queries (default: --rhos)")
    parser.add_argument("--cache-dir", type=Path, default=None, help="reuse embeddings across invocations")
    # Schedule settings to evaluate with instead of the run's own (None: the run's)
    parser.add_argument("--min-kept-tokens", type=int, help="the kept-token floor (default: the run's)")
    parser.add_argument("--leading-share", type=float, help="share of each kept count on the first tokens")
    parser.add_argument("--pruning-interval", type=int, help="select at every k-th point (default: run's)")
    parser.add_argument("--paired-with", type=Path, help="another embedding run: learned minus its learned")
    parser.add_argument("--layer-exits", type=int, nargs="*", default=[], help="stop after k layers")
    parser.add_argument("--max-length", type=int, help="tokens per text (default: the run's max_length)")
    parser.add_argument("--limit-documents", type=int, help="the first N distinct documents, their queries")
    parser.add_argument(
        "--graph",
        choices=GRAPHS,
        default="torch",
        help=f"torch forward_pruned (every method), or the exported graph ({', '.join(ONNX_METHODS)} only)",
    )
    args = parser.parse_args(argv)
    dataset = DATASETS[args.dataset]
    data_path = data_file(dataset, args.data)
    if args.graph != "torch" and set(args.methods) - set(ONNX_METHODS):
        parser.error(f"--graph {args.graph} runs --methods {' '.join(ONNX_METHODS[1:])} only")
    with tempfile.TemporaryDirectory(prefix="retrieval-graph-") as workdir:
        payload = retrieval_benchmark(args, dataset, data_path, Path(workdir))
    publish(payload, markdown, args.out / "retrieval.json", MODULE, argv)


if __name__ == "__main__":
    main()
