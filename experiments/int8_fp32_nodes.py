"""Which weight GEMMs must stay fp32 for dynamic int8 to keep a model
(docs/experiments/2026-11-27-mpnet-int8.md).

The int8 shipped before this study (``training.export.quantize_int8``: per-channel int8 weights,
activations quantized per tensor at run time, scorers fp32) kept MiniLM at a cosine of 0.994 to fp32 but
all-mpnet-base-v2 at 0.897. Suspect: activations whose outliers a per-tensor scale cannot hold. Each
variant keeps one set of GEMMs fp32 and quantizes the rest as that scheme did (variant ``shipped``:
none fp32); its pooled vectors on real paragraphs are compared with the fp32 graph's, branch by branch
(the unpruned branch at ρ = 1, the pruned branch at ρ < 1), and each variant's share of weight-GEMM
FLOPs left fp32 is recorded (the int8 speed it gives up). ``outliers`` keeps fp32 the GEMMs whose input
on these paragraphs has max |x| above ``training.export.OUTLIER_RATIO`` times its 99.9th percentile;
the payload also says which GEMMs the export's rule (``training.export.outlying_matmuls``, random
token ids) keeps.

Roles, by the node names of the exported layer (``training.encoders.LayerView``): ``qkv`` the packed
projection (``…/Attention/MatMul`` after the split, else the whole ``Attention``), ``attn_out`` the
attention output projection (``…/MatMul``), ``ffn_in`` (``…/ffn_in/MatMul``), ``ffn_out``
(``…/MatMul_1``).

    python -m experiments.int8_fp32_nodes --model-dir /root/retention-models/mpnet-embed \
        --only shipped qkv attn_out ffn_in ffn_out --out results/experiments/mpnet-int8/roles.json
    python -m experiments.int8_fp32_nodes --model-dir /root/retention-models/mpnet-embed \
        --only outliers --out results/experiments/mpnet-int8/outliers.json
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from tokenizers import Tokenizer

from retention_core.machine import describe
from retention_core.onnx import open_session
from retention_core.text import pad_token_id
from training import export as E

MODULE = "experiments.int8_fp32_nodes"
DATA = Path("/work/shared/data/squad/validation.jsonl.gz")
PARAGRAPHS, BATCH, LENGTH = 64, 8, 256
RHOS = (1.0, 0.5, 0.3)
ROLE_PATTERNS = {
    "qkv": r"/layers\.(\d+)/Attention(/MatMul)?$",  # split (biased) or whole (QAttention-to-be)
    "attn_out": r"/layers\.(\d+)/MatMul$",
    "ffn_in": r"/layers\.(\d+)/ffn_in/MatMul$",
    "ffn_out": r"/layers\.(\d+)/MatMul_1$",
}
# FLOPs per token of each role, in units of d² (QKV 3, output 1, FFN 4 + 4 with intermediate 4d)
ROLE_WEIGHT = {"qkv": 3.0, "attn_out": 1.0, "ffn_in": 4.0, "ffn_out": 4.0}


def role_of(name: str) -> tuple[str, int] | None:
    for role, pattern in ROLE_PATTERNS.items():
        found = re.search(pattern, name)
        if found:
            return role, int(found.group(1))
    return None


Keep = Callable[[str, int], bool]  # (role, layer) → stays fp32
CALIBRATION_BATCHES = 2  # of BATCH paragraphs each


def outlier_ratios(unpruned: Any, batches: list[dict[str, np.ndarray]]) -> dict[tuple[str, int], float]:
    """``training.export.input_outlier_ratios`` of the first ``CALIBRATION_BATCHES`` batches, by (role,
    layer). A per-tensor int8 scale is set by the max, so a ratio of 40 leaves the bulk of the values a
    few int8 steps."""
    ratios = E.input_outlier_ratios(E.split_biased_attention(unpruned), batches[:CALIBRATION_BATCHES])
    placed = {name: role_of(name) for name in ratios}
    return {where: ratios[name] for name, where in placed.items() if where is not None}


def by_name(ratios: dict[tuple[str, int], float]) -> dict[str, float]:
    """``role@layer`` → ratio, by layer then role."""
    ordered = sorted(ratios.items(), key=lambda item: (item[0][1], item[0][0]))
    return {f"{role}@{layer}": round(ratio, 2) for (role, layer), ratio in ordered}


def in_layers(wanted: str, layers: range) -> Keep:
    """Keep ``wanted``'s GEMMs fp32 in ``layers``."""
    return lambda role, layer: role == wanted and layer in layers


def variants(num_layers: int, outlying: set[tuple[str, int]]) -> dict[str, Keep]:
    """The sets tried: nothing fp32 (as shipped), each role fp32 in every layer, each role fp32 in the
    first / last two layers, both FFN GEMMs of the last quarter, and the GEMMs whose inputs are outlying
    (``outlier_ratios`` above ``training.export.OUTLIER_RATIO``)."""
    tail = max(num_layers // 4, 1)
    found: dict[str, Keep] = {
        "shipped": lambda role, layer: False,
        "outliers": lambda role, layer: (role, layer) in outlying,
    }
    for wanted in ROLE_PATTERNS:
        found[wanted] = in_layers(wanted, range(num_layers))
        found[f"{wanted}@first2"] = in_layers(wanted, range(2))
        found[f"{wanted}@last2"] = in_layers(wanted, range(num_layers - 2, num_layers))
    found["ffn@lastquarter"] = lambda role, layer: role.startswith("ffn") and layer >= num_layers - tail
    return found


def fp32_nodes(model: Any, keep: Keep) -> list[str]:
    names = []
    for node in model.graph.node:
        placed = role_of(node.name)
        if node.op_type in E.INT8_OPERATORS and placed is not None and keep(*placed):
            names.append(node.name)
    return names


def fp32_share(model: Any, keep: Keep) -> float:
    """Share of the layers' weight-GEMM FLOPs a variant leaves fp32 (``model`` split: QKV a MatMul)."""
    total = kept = 0.0
    for node in model.graph.node:
        placed = role_of(node.name)
        if node.op_type in E.INT8_OPERATORS and placed is not None:
            total += ROLE_WEIGHT[placed[0]]
            kept += ROLE_WEIGHT[placed[0]] if keep(*placed) else 0.0
    return kept / total if total else 0.0


def quantize(model: Any, keep: Keep) -> Any:
    """The export's int8 (``training.export.int8_weights`` after the attention split) with the variant's
    GEMMs kept fp32 instead of the export's own outlier rule."""
    split = E.split_biased_attention(model)
    return E.int8_weights(split, E.INT8_OPERATORS, keep_fp32=fp32_nodes(split, keep))


def paragraph_batches(tokenizer_path: Path) -> list[dict[str, np.ndarray]]:
    """The first ``PARAGRAPHS`` distinct SQuAD paragraphs, cut to ``LENGTH`` tokens, in batches."""
    seen: list[str] = []
    with gzip.open(DATA, "rt", encoding="utf-8") as handle:
        for line in handle:
            context = json.loads(line)["context"]
            if context not in seen:
                seen.append(context)
            if len(seen) == PARAGRAPHS:
                break
    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    tokenizer.enable_truncation(LENGTH)
    tokenizer.enable_padding(pad_id=pad_token_id(tokenizer))
    batches = []
    for start in range(0, len(seen), BATCH):
        encoded = tokenizer.encode_batch(seen[start : start + BATCH])
        ids = np.asarray([item.ids for item in encoded], dtype=np.int64)
        mask = np.asarray([item.attention_mask for item in encoded], dtype=np.int64)
        batches.append({"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})
    return batches


def vectors(path: Path, batches: list[dict[str, np.ndarray]], rho: float) -> np.ndarray:
    session = open_session(path)
    names = {graph_input.name for graph_input in session.get_inputs()}
    out = []
    for batch in batches:
        feeds = {**batch, "rho": np.full(len(batch["input_ids"]), rho, np.float32)}
        out.append(session.run(None, {k: v for k, v in feeds.items() if k in names})[0])
    return np.concatenate(out)


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sum(a * b, 1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m experiments.int8_fp32_nodes", description=__doc__)
    parser.add_argument("--model-dir", type=Path, required=True, help="an exported model directory")
    parser.add_argument("--only", nargs="*", default=None, help="variant names (default: all)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    manifest = json.loads((args.model_dir / "manifest.json").read_text())
    num_layers = int(manifest["backbone"]["num_layers"])
    batches = paragraph_batches(args.model_dir / "tokenizer.json")
    parts = E.unjoined(onnx.load(str(args.model_dir / "model.onnx")))
    assert parts is not None, "the export has no unpruned branch"
    workdir = Path(tempfile.mkdtemp(prefix="int8-nodes-"))
    branch = {"pruned": parts[0], "unpruned": parts[1]}
    fp32_paths = {}
    for name, graph in branch.items():
        fp32_paths[name] = workdir / f"fp32-{name}.onnx"
        onnx.save(graph, str(fp32_paths[name]))
    reference = {rho: vectors(fp32_paths["unpruned" if rho >= 1 else "pruned"], batches, rho) for rho in RHOS}
    ratios = outlier_ratios(onnx.load(str(fp32_paths["unpruned"])), batches)
    outlying = {placed for placed, ratio in ratios.items() if ratio > E.OUTLIER_RATIO}
    # What the export's own rule keeps fp32, calibrated on random token ids instead of these paragraphs,
    # and the ratios on such ids (``training.export.calibration_batches``).
    export_rule = E.outlying_matmuls(E.split_biased_attention(onnx.load(str(fp32_paths["unpruned"]))))
    random_ratios = outlier_ratios(
        onnx.load(str(fp32_paths["unpruned"])), E.calibration_batches(branch["unpruned"])
    )
    chosen = variants(num_layers, outlying)
    if args.only:
        chosen = {name: keep for name, keep in chosen.items() if name in args.only}
    results: dict[str, Any] = {}
    for variant, keep in chosen.items():
        split = E.split_biased_attention(onnx.load(str(fp32_paths["unpruned"]), load_external_data=False))
        cell: dict[str, Any] = {"fp32_gemm_share": round(fp32_share(split, keep), 4)}
        for name in ("unpruned", "pruned"):
            path = workdir / f"{variant}-{name}.onnx"
            onnx.save(quantize(onnx.load(str(fp32_paths[name])), keep), str(path))
            for rho in RHOS:
                if (rho >= 1) != (name == "unpruned"):
                    continue
                value = cosines(vectors(path, batches, rho), reference[rho])
                cell[f"{rho:g}"] = {"cosine_mean": float(value.mean()), "cosine_min": float(value.min())}
            path.unlink()
        results[variant] = cell
        print(variant, json.dumps(cell), flush=True)
    payload = {
        "model_dir": str(args.model_dir),
        "paragraphs": PARAGRAPHS,
        "tokens": LENGTH,
        "outlier_ratio": E.OUTLIER_RATIO,
        "input_outlier_ratios": by_name(ratios),
        "export_rule_keeps_fp32": export_rule,
        "input_outlier_ratios_random_ids": by_name(random_ratios),
        "results": results,
        "machine": describe(),
        "command": " ".join([f"python -m {MODULE}", *(sys.argv[1:] if argv is None else argv)]),
        "seconds": round(time.perf_counter() - started, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
