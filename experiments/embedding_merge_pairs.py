"""Paired differences between retrieval cells of the embedding-merge study (docs/experiments/
2026-11-26-embedding-merge.md): the same documents encoded two ways, searched with the same dense
queries, per-question nDCG@10 differences with their paired standard error.

    python -m experiments.embedding_merge_pairs --cache-dir /root/rcache --out results/<dir>/pairs.json \
        --pair "<run>:<method>:<rho>:<merge|drop>[:<leading share>]" "<run>:<method>:<rho>:<merge|drop>" ...

Each ``--pair`` takes two cell specs (first minus second). Both runs must share their dense model (the
question vectors come from the first); with ``--cache-dir`` the vectors the retrieval benchmark already
encoded are reused, so a pair costs a search.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from benchmarks.harness import describe
from benchmarks.retrieval_parts import (
    DATASETS,
    DEFAULT_DATASET,
    DENSE,
    EmbeddingStore,
    Encoder,
    dataset_cache,
    load_embedding_run,
    paired_difference,
    read_retrieval_set,
    search,
)


@dataclass(frozen=True)
class CellSpec:
    run: Path
    method: str
    rho: float
    merge: bool
    leading_share: float = 0.0

    @classmethod
    def parse(cls, text: str) -> CellSpec:
        run, method, rho, mode, *share = text.split(":")
        if mode not in ("merge", "drop"):
            raise SystemExit(f"{text}: the fourth field is merge or drop")
        return cls(Path(run), method, float(rho), mode == "merge", float(share[0]) if share else 0.0)

    def label(self) -> str:
        lead = f", leading {self.leading_share:g}" if self.leading_share else ""
        return f"{self.run.name} {self.method} ρ={self.rho:g} {'merge' if self.merge else 'drop'}{lead}"


def store_for(spec: CellSpec, cache_dir: Path | None, dataset_name: str) -> EmbeddingStore:
    model, recipe, tokenizer = load_embedding_run(spec.run, {"merge_dropped": spec.merge})
    model.config = replace(model.config, leading_share=spec.leading_share)
    return EmbeddingStore(
        Encoder(model, tokenizer, recipe.max_length), dataset_cache(cache_dir, DATASETS[dataset_name])
    )


def main(argv: list[str] | None = None) -> None:
    from training.data import default_data_root

    parser = argparse.ArgumentParser(prog="python -m experiments.embedding_merge_pairs", description=__doc__)
    parser.add_argument("--pair", nargs=2, action="append", required=True, metavar="CELL")
    parser.add_argument("--cache-dir", type=Path, default=None)
    parser.add_argument("--dataset", choices=sorted(DATASETS), default=DEFAULT_DATASET)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    dataset = DATASETS[args.dataset]
    root = default_data_root()
    if root is None:
        raise SystemExit("no data root (../shared/data)")
    data = read_retrieval_set(root / dataset.file, None, dataset)
    pairs: list[dict[str, Any]] = []
    for first_text, second_text in args.pair:
        first, second = CellSpec.parse(first_text), CellSpec.parse(second_text)
        first_store = store_for(first, args.cache_dir, args.dataset)
        queries = first_store.get(data.questions, DENSE, 1.0).vectors
        ranks = [
            search(queries, store.get(data.paragraphs, spec.method, spec.rho).vectors, data.gold)
            for spec, store in (
                (first, first_store),
                (second, store_for(second, args.cache_dir, args.dataset)),
            )
        ]
        pairs.append({"first": first.label(), "second": second.label(), **paired_difference(*ranks)})
        print(f"{first.label()} − {second.label()}: {pairs[-1]['difference']:+.2f} ± {pairs[-1]['se']:.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    payload = {"dataset": args.dataset, "queries": len(data.questions), "pairs": pairs, "machine": describe()}
    args.out.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
