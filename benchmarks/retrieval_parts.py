"""What the retrieval grid (``benchmarks.retrieval``) and its long-document study
(``experiments.retrieval_long``) share: datasets, ranking metrics, exact search, the encoders (torch
``forward_pruned`` and the exported graph), the embedding cache and the run's fields."""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np

from retention_core.metrics import RANKING_CUTOFF, gold_ranks, query_ndcg
from retention_core.metrics import ranking_metrics as ranking_metrics  # re-exported for the grid and studies

LAYER_EXIT = "layer-exit"
ORIGINAL = "original"  # the user's original model's dense search (--baselines-from)
DENSE = "dense"
LEARNED = "learned"
TRUNCATION = "truncation"
CUTOFF = RANKING_CUTOFF
BATCH_SIZE = 32
ENCODER = "torch forward_pruned (training.evaluation.running.predict_rows), fp32, CPU"
METRICS = (f"ndcg@{CUTOFF}", f"mrr@{CUTOFF}", "recall@1", f"recall@{CUTOFF}")
COSINE_QUANTILES = (5, 50, 95)
DECIMALS = 4

Budget = float | tuple[float, ...]  # one ρ for every text, or one per text


# ---------------------------------------------------------------------- metrics
# gold_ranks, query_ndcg, ranking_metrics: retention_core.metrics (training's evaluation scores rankings
# with them too); CUTOFF is its RANKING_CUTOFF.


def paired_difference(first: np.ndarray, second: np.ndarray) -> dict[str, float]:
    """Mean of first − second over the same queries and its standard error sd / √Q (percent points)."""
    difference = query_ndcg(first) - query_ndcg(second)  # (Q,)
    se = float(difference.std(ddof=1) / np.sqrt(len(difference))) if len(difference) > 1 else 0.0
    return {"difference": round(float(difference.mean()), 2), "se": round(se, 2)}


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
def squad_pairs(rows: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """SQuAD rows → (question, its paragraph)."""
    return [(str(row["question"]), str(row["context"])) for row in rows]


def scitldr_abstract(row: dict[str, Any]) -> str:
    """A SciTLDR abstract: its sentences (some end in spaces or a newline) joined with single spaces."""
    return " ".join(sentence.strip() for sentence in row["document"] if sentence.strip())


def scitldr_pairs(rows: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """SciTLDR rows → (TLDR, its paper's abstract), one pair per reference TLDR of each paper."""
    return [
        (str(summary), scitldr_abstract(row))
        for row in rows
        for summary in row["all_summaries"]  # ``summary`` is the first of them
    ]


def bbc_pairs(rows: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """BBC News rows → (headline, its article): the articles run ~400 words, past 256 tokens."""
    return [(str(row["title"]), str(row["document"])) for row in rows]


@dataclass(frozen=True)
class Dataset:
    """A query → document set in ../shared/data and the words its report uses."""

    name: str
    file: Path  # under the data root
    title: str
    query_noun: str  # plural
    document_noun: str  # plural
    document_one: str  # singular
    pairs: Callable[[list[dict[str, Any]]], list[tuple[str, str]]]  # rows → (query, document)


DATASETS = {
    "squad": Dataset(
        "squad",
        Path("squad") / "validation.jsonl.gz",
        "SQuAD v1.1 dev question → paragraph",
        "questions",
        "paragraphs",
        "paragraph",
        squad_pairs,
    ),
    "scitldr": Dataset(
        "scitldr",
        Path("summarization") / "scitldr_a" / "test.jsonl.gz",
        "SciTLDR-A test TLDR → abstract",
        "TLDRs",
        "abstracts",
        "abstract",
        scitldr_pairs,
    ),
    "bbc": Dataset(
        "bbc",
        Path("summarization") / "bbc_news_summary" / "all.jsonl.gz",
        "BBC News headline → article",
        "headlines",
        "articles",
        "article",
        bbc_pairs,
    ),
}
DEFAULT_DATASET = "squad"


@dataclass(frozen=True)
class RetrievalSet:
    questions: list[str]  # the queries
    paragraphs: list[str]  # the distinct documents, in file order
    gold: np.ndarray  # (Q,) index into paragraphs


def read_retrieval_set(
    path: Path,
    limit_queries: int | None = None,
    dataset: Dataset = DATASETS[DEFAULT_DATASET],
    limit_documents: int | None = None,
) -> RetrievalSet:
    """The dataset's (query, document) pairs → every distinct document once; the first
    ``limit_queries`` queries after a seeded shuffle (all documents are always searched).
    ``limit_documents``: only the first N distinct documents, in file order, and their queries (a
    smaller search, for long documents on a small machine)."""
    from training.recipes.data import EVAL_SEED, read_jsonl_gz, shuffled

    pairs = dataset.pairs(read_jsonl_gz(path))
    if limit_documents is not None:
        kept = set(list(dict.fromkeys(document for _, document in pairs))[:limit_documents])
        pairs = [(query, document) for query, document in pairs if document in kept]
    index = {document: i for i, document in enumerate(dict.fromkeys(document for _, document in pairs))}
    # shuffled permutes any list by its length alone: the same queries as when it shuffled the rows
    chosen = pairs if limit_queries is None else shuffled(cast(Any, pairs), EVAL_SEED, limit_queries)
    return RetrievalSet(
        questions=[query for query, _ in chosen],
        paragraphs=list(index),
        gold=np.array([index[document] for _, document in chosen], dtype=np.int64),
    )


# ---------------------------------------------------------------------- encoding
@dataclass
class Encoder:
    """A run's model and codec; ``encode`` gives (N, d) unnormalised pooled vectors."""

    model: Any
    tokenizer: Any
    max_length: int
    batch_size: int = BATCH_SIZE

    def codec(self) -> Any:
        """The embedding codec at ``max_length`` (``training.tasks.codecs.evaluation_codec``)."""
        from training.tasks.codecs import evaluation_codec

        return evaluation_codec("embedding", self.tokenizer, self.max_length)

    def rows(self, texts: Sequence[str]) -> list[Any]:
        codec = self.codec()
        return [codec.encode(text).rows[0] for text in texts]

    def pad_id(self) -> int:
        from retention_core.text import pad_token_id

        return pad_token_id(self.codec().tokenizer)

    def schedule_work(self, lengths: Sequence[int], rho: float) -> np.ndarray:
        """Encoder token-work fraction of the pruned pass at ρ for rows of these lengths (N,): the keep
        schedule alone fixes it (every selector keeps the same counts; [CLS] is protected)."""
        import torch

        from training.engine import selection as R

        num_real = torch.tensor(list(lengths), dtype=torch.long)  # (N,)
        rhos = torch.full((len(lengths),), float(rho))  # (N,)
        counts = self.model.keep_counts(rhos, num_real, torch.ones_like(num_real))  # (N, P), floor included
        return R.encoder_token_work(counts, num_real, self.model.last_layer_queries).numpy()

    def truncated(self, rows: list[Any], rho: float) -> tuple[list[Any], float]:
        """The truncation baseline's rows: each row's first tokens at the pruned schedule's token-work at
        ρ, and the mean token-work they do."""
        work = self.schedule_work([len(row) for row in rows], rho)
        cut = [truncated_to_work(row, fraction) for row, fraction in zip(rows, work, strict=True)]
        return cut, float(np.mean([len(short) / len(row) for short, row in zip(cut, rows, strict=True)]))

    def encode(self, texts: Sequence[str], method: str, rho: Budget) -> tuple[np.ndarray, float]:
        """Vectors (N, d) and the mean encoder token-work fraction of the pass."""
        from training.evaluation.running import predict_rows

        rows = self.rows(texts)
        if method.startswith(LAYER_EXIT):
            return self.layer_exit(rows, int(method.rsplit("-", 1)[1]))
        if method == TRUNCATION:
            if isinstance(rho, tuple):
                raise ValueError("truncation takes one ρ for every text")
            cut, token_work = self.truncated(rows, rho)
            predictions = predict_rows(self.model, cut, 1.0, self.pad_id(), None, self.batch_size)
        else:
            predictions = self.pruned_predictions(rows, method, 1.0 if method == DENSE else rho)
            token_work = float(np.mean([prediction.token_work for prediction in predictions]))
        return np.stack([prediction.logits for prediction in predictions]).astype(np.float32), token_work

    def layer_exit(self, rows: list[Any], num_layers: int) -> tuple[np.ndarray, float]:
        """The dense model stopped after ``num_layers`` layers: vectors (N, d), token-work k / L."""
        from training.engine.baselines import layer_exit
        from training.evaluation.running import length_sorted_chunks
        from training.tasks.codecs import rows_to_tensors

        vectors: list[np.ndarray] = [np.empty(0)] * len(rows)
        for members in length_sorted_chunks([len(row) for row in rows], self.batch_size):
            feeds = rows_to_tensors([rows[i] for i in members], self.pad_id())
            pooled = layer_exit(self.model, feeds["input_ids"], feeds["attention_mask"], num_layers)
            for i, member in enumerate(members):
                vectors[member] = pooled[i].numpy()
        return np.stack(vectors).astype(np.float32), num_layers / self.model.num_points

    def pruned_predictions(self, rows: list[Any], method: str, rho: Budget) -> list[Any]:
        """``forward_pruned`` over the rows at one ρ, or at each row's own ρ (rows sharing a ρ run
        together: ``predict_rows`` takes one ρ per call). One ρ is one call over every row, in order."""
        from training.evaluation.running import make_selector, predict_rows

        per_row = [float(rho)] * len(rows) if not isinstance(rho, tuple) else list(rho)
        if len(per_row) != len(rows):
            raise ValueError(f"{len(per_row)} ρ values for {len(rows)} texts")
        predictions: list[Any] = [None] * len(rows)
        for value in sorted(set(per_row), reverse=True):
            members = [i for i, row_rho in enumerate(per_row) if row_rho == value]
            selector = make_selector(LEARNED if method == DENSE else method)
            chunk = predict_rows(
                self.model, [rows[i] for i in members], value, self.pad_id(), selector, self.batch_size
            )
            for member, prediction in zip(members, chunk, strict=True):
                predictions[member] = prediction
        return predictions


# --graph: what encodes the texts. int8 graphs: the product's (per-token activation scales) and the one
# shipped before (per-tensor, a scale per batch), kept to compare the two (docs/experiments/2026-11-29-
# batch-invariant-int8.md).
INT8_GRAPHS = {"onnx-int8": "token", "onnx-int8-per-tensor": "tensor"}
GRAPHS = ("torch", "onnx", *INT8_GRAPHS)
ONNX_METHODS = (DENSE, LEARNED, TRUNCATION)  # what the exported graph can run (its own scorers, ρ = 1)


@dataclass
class OnnxEncoder(Encoder):
    """The run's exported graph in onnxruntime (``training.export.graph.export_onnx``: what the service
    serves), fp32 or its int8 form (``training.export.int8.quantize_int8``): dense is the graph at ρ = 1,
    learned at ρ, truncation the graph at ρ = 1 on each document's first tokens. The torch encoder's other
    methods (random, attention, leading, layer exit) need a selector the graph does not have."""

    session: Any = None
    graph: str = "onnx"
    fp32_matmuls: tuple[
        str, ...
    ] = ()  # int8: the weight MatMuls left fp32 (training.export.int8.quantize_int8)

    def encode(self, texts: Sequence[str], method: str, rho: Budget) -> tuple[np.ndarray, float]:
        from training.evaluation.running import onnx_predict_rows

        if method not in ONNX_METHODS:
            raise ValueError(f"--graph {self.graph} runs {ONNX_METHODS}, not {method!r}")
        if isinstance(rho, tuple):
            raise ValueError(f"--graph {self.graph} takes one ρ for every text")
        rows = self.rows(texts)
        budget = 1.0 if method == DENSE else float(rho)
        if method == TRUNCATION:
            rows, token_work = self.truncated(rows, budget)
            budget = 1.0
        else:
            token_work = float(np.mean(self.schedule_work([len(row) for row in rows], budget)))
        vectors = onnx_predict_rows(self.session, rows, budget, self.pad_id(), self.batch_size)
        return np.stack(vectors).astype(np.float32), token_work


def onnx_encoder(model: Any, tokenizer: Any, max_length: int, graph: str, workdir: Path) -> OnnxEncoder:
    """Export the model (and quantize it for ``onnx-int8``) into ``workdir``; its session's encoder."""
    from retention_ort import open_session
    from training.export.graph import export_onnx
    from training.export.int8 import quantize_int8

    path = workdir / "model.onnx"
    export_onnx(model, path, model.backbone.info_vocab_size)
    kept: list[str] = []
    if graph in INT8_GRAPHS:
        kept = quantize_int8(path, workdir / "model.int8.onnx", activations=INT8_GRAPHS[graph])
        path = workdir / "model.int8.onnx"
    session = open_session(path)
    return OnnxEncoder(model, tokenizer, max_length, session=session, graph=graph, fp32_matmuls=tuple(kept))


def encoder_description(encoder: Encoder) -> str:
    if isinstance(encoder, OnnxEncoder):
        precision = (
            f"int8 weights, {INT8_GRAPHS[encoder.graph]} activation scales "
            "(training.export.int8.quantize_int8)"
            if encoder.graph in INT8_GRAPHS
            else "fp32"
        )
        return f"the exported graph in onnxruntime (training.export.graph.export_onnx), {precision}, CPU"
    return ENCODER


def budget_label(rho: Budget) -> str:
    """One ρ as ``0.5``; per-row ρ as a digest of the values (cache keys, cache metadata)."""
    if isinstance(rho, tuple):
        return "per-row " + hashlib.sha1(",".join(f"{value:g}" for value in rho).encode()).hexdigest()[:12]
    return f"{rho:g}"


def truncated_length(length: int, work: float) -> int:
    """How many tokens truncation keeps of a [CLS] … [SEP] row of ``length``: round(work · n), half up,
    at least [CLS] and [SEP]."""
    return min(length, max(2, math.floor(work * length + 0.5)))


def truncated_to_work(row: Any, work: float) -> Any:
    """The first tokens of a [CLS] … [SEP] row, [SEP] re-appended: ``truncated_length`` tokens in all,
    so the dense pass over them does ``work`` of the full row's token-work."""
    from training.evaluation.codec_loop import sub_row

    length = len(row)
    return sub_row(row, [*range(truncated_length(length, work) - 1), length - 1])


def runs_the_original(method: str) -> bool:
    """Dense, truncation and layer exit run the original backbone (the ρ = 1 path); the pruned methods
    run the pruned branch, which a retrofit may give weights of its own (``pruned_backbone``)."""
    return method in (DENSE, TRUNCATION) or method.startswith(LAYER_EXIT)


def weights_fingerprint(model: Any, method: str) -> str:
    """sha1 of the weights a method's vectors depend on: the backbone's for the baselines and dense
    (their token choice never reads the scorers), the whole model's for learned. A pruned baseline
    (random, attention, leading) also depends on the pruned branch's own weights, where the model has
    them (none: the same digest as dense's, so earlier caches stay valid)."""
    branch = not runs_the_original(method)
    digest = hashlib.sha1()
    for name, tensor in sorted(model.state_dict().items()):
        if (
            method == LEARNED
            or name.startswith("backbone.")
            or (branch and name.startswith("pruned_backbone."))
        ):
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

    def key(self, texts: Sequence[str], method: str, rho: Budget) -> str:
        kind = LEARNED if method == LEARNED else "backbone" if runs_the_original(method) else "pruned"
        if kind not in self._fingerprints:
            self._fingerprints[kind] = weights_fingerprint(self.encoder.model, method)
        parts = [self._fingerprints[kind], texts_fingerprint(texts), method, budget_label(rho)]
        parts += [str(self.encoder.max_length), str(self.encoder.batch_size), "EVAL_SEED=0"]
        if isinstance(self.encoder, OnnxEncoder):  # torch keys stay those of the runs made before
            parts.append(self.encoder.graph)
            if self.encoder.fp32_matmuls:  # int8 that keeps outlying GEMMs fp32 is another graph
                parts.append("fp32 " + ",".join(self.encoder.fp32_matmuls))
        if method != DENSE:  # the keep schedule fixes every pruned method's per-layer counts
            config = self.encoder.model.config
            parts.append(f"schedule {self.encoder.model.num_points}^{config.schedule_power}")
            if config.pruning_interval > 1:  # keys of every-point runs stay those made before it
                parts.append(f"interval {config.pruning_interval}")
            if config.min_kept_tokens:  # keys without a floor stay those of the runs made before it
                parts.append(f"floor {config.min_kept_tokens}")
            if method != TRUNCATION and not method.startswith(LAYER_EXIT):  # these run the dense pass
                parts += ["merge"] if config.merge_dropped else []
                parts += [f"leading {config.leading_share:g}"] if config.leading_share else []
        return hashlib.sha1("|".join(parts).encode()).hexdigest()[:20]

    def get(self, texts: Sequence[str], method: str, rho: Budget) -> Pass:
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
            meta = {
                "method": method,
                "rho": rho if not isinstance(rho, tuple) else budget_label(rho),
                "texts": len(texts),
                "token_work": work,
                "seconds": seconds,
            }
            path.with_suffix(".json").write_text(json.dumps(meta), encoding="utf-8")
        return Pass(vectors, work, seconds, False)


# ---------------------------------------------------------------------- the benchmark
def load_embedding_run(run_dir: Path, schedule: dict[str, Any] | None = None) -> tuple[Any, Any, Any]:
    """The run's model (eval mode, CPU), recipe and tokenizer; an embedding run or exit.
    ``schedule``: evaluate with these schedule settings instead of the run's own (``--min-kept-tokens``,
    ``--leading-share``, ``--pruning-interval``;
    ``training.fitting.fit.with_schedule``)."""
    from training.fitting.fit import load_run, with_schedule

    model, recipe, tokenizer = load_run(run_dir)
    if recipe.task != "embedding":
        raise SystemExit(f"retrieval needs an embedding run; {run_dir} is task {recipe.task!r}")
    return model, with_schedule(model, recipe, **(schedule or {})), tokenizer


def dataset_cache(cache_dir: Path | None, dataset: Dataset) -> Path | None:
    """Each dataset's encodings in their own subdirectory of ``--cache-dir``."""
    return None if cache_dir is None else cache_dir / dataset.name


def data_file(dataset: Dataset, path: Path | None = None) -> Path:
    """``path`` (``--data``), else the set's file under the data root; exit without either."""
    from training.recipes.data import default_data_root

    root = default_data_root() if path is None else None
    if path is None and root is None:
        raise SystemExit("no data root (../shared/data); pass --data")
    return path if path is not None else root / dataset.file  # type: ignore[operator]


def run_fields(run_dir: Path, recipe: Any, dataset: Dataset, data_path: Path) -> dict[str, Any]:
    """What every retrieval result says about the run and the data it searched."""
    from training.fitting.fit import WEIGHTS_FILE

    return {
        "run": str(run_dir),
        "run_weights_sha1": file_sha1(run_dir / WEIGHTS_FILE),
        "model": recipe.name,
        "profile": recipe.profile,
        "dataset": dataset.name,
        "data": str(data_path),
    }


def query_fields(data: RetrievalSet, limit_queries: int | None) -> dict[str, Any]:
    return {
        "queries": len(data.questions),
        "query_subset": "all" if limit_queries is None else f"first {limit_queries} after a seeded shuffle",
        "documents": len(data.paragraphs),
    }


def search_description(dataset: Dataset) -> str:
    return (
        "cosine on L2-normalised vectors, exact (numpy matmul); "
        f"ties to the lower {dataset.document_one} index"
    )


def payload_dataset(payload: dict[str, Any]) -> Dataset:
    """The dataset a result searched (results written before ``--dataset`` existed are SQuAD's)."""
    return DATASETS[payload.get("dataset", DEFAULT_DATASET)]
