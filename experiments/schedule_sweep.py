"""Selection settings at evaluation, paired (docs/experiments/2026-11-27-schedule-and-floor.md): an
embedding run's learned documents under several (schedule power, leading share) settings, each ρ's
nDCG@10 and token-work, and every setting minus the reference setting at the same ρ on the same
queries (± paired SE). The settings are not weights (the scorers never train with the leading span), so
one trained run answers for all of them. Encodings come from ``benchmarks.retrieval``'s cache when a
sweep of that command made them (``--schedule-power`` / ``--leading-share``), else they are computed.

    python -m experiments.schedule_sweep /root/retention-runs/minilm-embed-full --dataset squad \
        --settings 1:0.5 1:0 1:0.125 1:0.25 1:0.75 0.5:0.5 2:0.5 --rhos 0.3 0.5 0.7 \
        --cache-dir ~/.cache/retention-retrieval --out results/experiments/schedule-and-floor/squad.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import publish
from benchmarks.retrieval_parts import (
    DATASETS,
    EmbeddingStore,
    Encoder,
    dataset_cache,
    load_embedding_run,
    paired_difference,
    query_ndcg,
    read_retrieval_set,
    search,
)

MODULE = "experiments.schedule_sweep"
LEARNED, DENSE = "learned", "dense"


def setting_label(power: float, share: float) -> str:
    return f"power {power:g}, leading share {share:g}"


def parse_setting(text: str) -> tuple[float, float]:
    power, share = text.split(":")
    return float(power), float(share)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from training.data import default_data_root

    dataset = DATASETS[args.dataset]
    root = default_data_root()
    data_path = args.data or (root / dataset.file if root else Path(dataset.file))
    data = read_retrieval_set(data_path, None, dataset, args.limit_documents)
    reference = parse_setting(args.settings[0])
    ranks: dict[tuple[float, float], dict[float, Any]] = {}
    cells: list[dict[str, Any]] = []
    dense_ndcg = None
    for power, share in map(parse_setting, args.settings):
        model, recipe, tokenizer = load_embedding_run(
            args.run_dir, {"schedule_power": power, "leading_share": share}
        )
        store = EmbeddingStore(
            Encoder(model, tokenizer, recipe.max_length), dataset_cache(args.cache_dir, dataset)
        )
        queries = store.get(data.questions, DENSE, 1.0)
        if dense_ndcg is None:
            dense = store.get(data.paragraphs, DENSE, 1.0)
            dense_ndcg = float(query_ndcg(search(queries.vectors, dense.vectors, data.gold)).mean())
        ranks[power, share] = {}
        for rho in args.rhos:
            documents = store.get(data.paragraphs, LEARNED, rho)
            found = search(queries.vectors, documents.vectors, data.gold)
            ranks[power, share][rho] = found
            cells.append(
                {
                    "setting": setting_label(power, share),
                    "schedule_power": power,
                    "leading_share": share,
                    "rho": rho,
                    "ndcg@10": float(query_ndcg(found).mean()),
                    "document_token_work": documents.token_work,
                }
            )
            print(f"{setting_label(power, share)} ρ={rho:g}: {cells[-1]['ndcg@10']:.2f}", flush=True)
    for cell in cells:
        setting, rho = (cell["schedule_power"], cell["leading_share"]), cell["rho"]
        cell["minus_reference"] = paired_difference(ranks[setting][rho], ranks[reference][rho])
    return {
        "run": str(args.run_dir),
        "dataset": args.dataset,
        "queries": len(data.questions),
        "documents": len(data.paragraphs),
        "reference": setting_label(*reference),
        "dense_ndcg@10": dense_ndcg,
        "cells": cells,
    }


def markdown(payload: dict[str, Any]) -> str:
    rhos = sorted({cell["rho"] for cell in payload["cells"]})
    lines = [
        f"{payload['dataset']}: {payload['queries']} queries, {payload['documents']} documents; dense "
        f"{payload['dense_ndcg@10']:.2f}. Cells: nDCG@10 (token-work), minus {payload['reference']} at the "
        "same ρ ± paired SE.",
        "",
        "| setting | " + " | ".join(f"ρ = {rho:g}" for rho in rhos) + " |",
        "|---|" + "---|" * len(rhos),
    ]
    by_setting: dict[str, dict[float, dict[str, Any]]] = {}
    for cell in payload["cells"]:
        by_setting.setdefault(cell["setting"], {})[cell["rho"]] = cell
    for setting, row in by_setting.items():
        parts = []
        for rho in rhos:
            cell, diff = row[rho], row[rho]["minus_reference"]
            parts.append(
                f"{cell['ndcg@10']:.2f} ({cell['document_token_work']:.2f}) "
                f"{diff['difference']:+.2f} ± {diff['se']:.2f}"
            )
        lines.append(f"| {setting} | " + " | ".join(parts) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--dataset", choices=sorted(DATASETS), default="squad")
    parser.add_argument("--data", type=Path, default=None)
    parser.add_argument(
        "--settings", nargs="+", required=True, help="power:share, the first is the reference"
    )
    parser.add_argument("--rhos", type=float, nargs="+", default=[0.3, 0.5, 0.7])
    parser.add_argument("--limit-documents", type=int, default=None)
    parser.add_argument("--cache-dir", type=Path, default=None)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    publish(measure(args), markdown, args.out, MODULE, argv, machine=True, started=started)


if __name__ == "__main__":
    main()
