"""The one harness every benchmark (and every study script under ``experiments/``) measures and records
with: onnxruntime CPU sessions, interleaved repeat rounds and their paired ratios, percentiles, and the
end of a command line (the machine, the command, the JSON and its markdown table beside it).

``describe`` (the machine) lives in ``retention_core.machine`` so training results record it too.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from retention_core.machine import describe

__all__ = [
    "describe",
    "fmt",
    "ort_session",
    "paired_ratios",
    "percentile",
    "publish",
    "speedups",
    "timed_rounds",
    "write_result",
]

Payload = dict[str, Any]


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
) -> dict[str, float]:
    """One run's row of ``timed_rounds``: median seconds per call, ``count`` / that as ``rate``, and the
    median of its paired speed-ups over ``reference`` as ``speedup``, with their min and max."""
    paired = paired_ratios(rounds[reference], rounds[name])
    seconds = statistics.median(rounds[name])
    return {
        "seconds_per_batch": seconds,
        rate: count / seconds,
        speedup: statistics.median(paired),
        "speedup_min": min(paired),
        "speedup_max": max(paired),
    }


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank ``q`` quantile (0 ≤ q ≤ 1) of ``values``."""
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def fmt(value: float | None, digits: int = 1) -> str:
    """A table cell: ``value`` to ``digits`` decimals, ``-`` when there is none."""
    return "-" if value is None else f"{value:.{digits}f}"


def write_result(out: Path, payload: Payload, table: str) -> None:
    """Raw JSON at ``out`` and its markdown table beside it (``out`` with ``.md``)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    out.with_suffix(".md").write_text(table, encoding="utf-8")


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
