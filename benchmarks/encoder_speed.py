"""Encoder throughput: pruned ONNX (fp32, int8) at several ρ vs the dense ONNX model (as exported, and
fused by ``training.export.optimize``) vs Hugging Face transformers in PyTorch (SDPA); medians of paired
ratios over interleaved rounds. Graphs come from the pretrained backbone with fresh scorers (timings do
not depend on weights) unless ``--run-dir``.

    python -m benchmarks.encoder_speed --out results/bench/encoder_speed.json            # full
    python -m benchmarks.encoder_speed --quick --out /tmp/speed.json                     # CI smoke
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.flops import model_flop_ratio
from benchmarks.harness import (
    cli,
    grid_args,
    ort_session,
    publish,
    quick_grid,
    random_tokens,
    speedups,
    timed_rounds,
)

MODULE = "benchmarks.encoder_speed"
DEFAULT_RHOS = (1.0, 0.7, 0.5, 0.3, 0.2)
DENSE = "dense-onnx-fp32"
FUSED_DENSE = "dense-onnx-fp32-fused"
NUM_LABELS = 2  # the two-label classification head of the fresh model


def classifier(quick: bool, backbone: Any, schedule_power: float, run_dir: Path | None = None) -> Any:
    """Our classifier, eval mode: a trained run, or fresh scorers and head with the schedule of
    ``schedule_power`` on the tiny random encoder (``quick``) or ``backbone`` (a pretrained one's name,
    or an encoder already built)."""
    import torch

    from training.engine.encoders import load_backbone
    from training.engine.model import RetentionConfig, RetentionModel

    config = RetentionConfig(schedule_power=schedule_power)
    if quick:
        from training.tiny import tiny_model

        return tiny_model("classification", config=config)[0]
    if run_dir is not None:
        from training.fitting.fit import load_run

        return load_run(run_dir)[0].eval()
    torch.manual_seed(0)
    encoder = load_backbone(backbone) if isinstance(backbone, str) else backbone
    return RetentionModel(encoder, "classification", NUM_LABELS, config).eval()


def export_graphs(model: Any, workdir: Path) -> tuple[Path, Path]:
    """The pruned graph (ρ an input) and the dense graph of the same weights, exported into ``workdir``."""
    from training.export.dense_graph import export_dense_onnx
    from training.export.graph import export_onnx

    pruned, dense = workdir / "pruned.onnx", workdir / "dense.onnx"
    export_onnx(model, pruned, model.backbone.info_vocab_size)
    export_dense_onnx(model, dense)
    return pruned, dense


def build_graphs(args: argparse.Namespace, workdir: Path) -> tuple[Any, dict[str, Path]]:
    """Export pruned + dense (+ fused dense, + int8) graphs; return them with the torch model for the HF
    baseline. The fused dense graph is onnxruntime's transformer optimizer's (every layer's attention
    fused, or it raises)."""
    from training.export.int8 import quantize_int8
    from training.export.optimize import optimize_for_cpu, require_fused_attention

    model = classifier(args.quick, args.backbone, args.schedule_power, args.run_dir)
    pruned, dense = export_graphs(model, workdir)
    info = model.backbone.info
    counts = optimize_for_cpu(dense, workdir / "dense.fused.onnx", info.num_heads, info.hidden_size)
    require_fused_attention(counts, info.num_layers, "fused dense graph")
    graphs = {"fp32": pruned, "dense": dense, "fused-dense": workdir / "dense.fused.onnx"}
    if args.int8:
        quantize_int8(pruned, workdir / "pruned.int8.onnx")
        graphs["int8"] = workdir / "pruned.int8.onnx"
    return model, graphs


def hf_runner(model: Any, threads: int) -> Callable[[np.ndarray, np.ndarray], object]:
    """Plain transformers + PyTorch with SDPA attention: what users run today."""
    import torch
    from transformers import AutoModel

    torch.set_num_threads(threads)
    hf_model = AutoModel.from_config(model.backbone.config, attn_implementation="sdpa").eval()

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
        precisions: list[str] = [p for p in ("fp32", "int8") if p in sessions]  # the pruned graphs
        rng = np.random.default_rng(0)
        results: list[dict[str, Any]] = []
        for seq_len in args.seq_lens:
            for batch in args.batches:
                ids = random_tokens(batch, seq_len, int(model.backbone.info_vocab_size), rng)
                mask = np.ones_like(ids)
                dense_feeds = {"input_ids": ids, "attention_mask": mask}
                variants: dict[str, tuple[str, float | None, Callable[[], object]]] = {
                    name: ("fp32", None, partial(sessions[graph].run, None, dense_feeds))
                    for name, graph in ((DENSE, "dense"), (FUSED_DENSE, "fused-dense"))
                }
                for precision in precisions:
                    for rho in args.rhos:
                        feeds = {**dense_feeds, "rho": np.full(batch, rho, np.float32)}
                        run = partial(sessions[precision].run, None, feeds)
                        variants[f"pruned-onnx-{precision}@{rho:g}"] = (precision, rho, run)
                if hf is not None:
                    variants["hf-torch-sdpa"] = ("fp32", None, partial(hf, ids, mask))
                runs = {name: run for name, (_, _, run) in variants.items()}
                rounds = timed_rounds(runs, args.repeats, args.iterations, args.max_seconds_per_cell)
                for name, (precision, rho, _) in variants.items():
                    results.append(
                        {
                            "variant": name,
                            "precision": precision,
                            "rho": rho,
                            "seq_len": seq_len,
                            "batch": batch,
                            **speedups(rounds, name, DENSE, batch, speedup_vs_fused_dense=FUSED_DENSE),
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
    parser = cli(MODULE, __doc__)
    grid_args(parser, [512], [1, 8], list(DEFAULT_RHOS), iterations=3, max_seconds=240.0)
    parser.add_argument("--run-dir", type=Path, default=None)
    parser.add_argument("--schedule-power", type=float, default=0.5)
    parser.add_argument("--int8", action=argparse.BooleanOptionalAction, default=True)
    return quick_grid(parser.parse_args(argv))


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    started = time.perf_counter()
    publish(measure(args), markdown, args.out, MODULE, argv, machine=True, started=started)


if __name__ == "__main__":
    main()
