"""How a batch's rows become runs: each row's padded (shape) length, and the cut of the sorted rows into
runs that costs the fewest padded tokens plus per-run overhead, rows counted as the backend pads them
(a backend with shape buckets pads a run of 5 rows to 8). Pure."""

from __future__ import annotations

import math
from collections.abc import Sequence

from retention_core.shapes import bucket


def shape_length(length: int, multiple: int, max_length: int) -> int:
    """The padded length of a row: rounded up to ``multiple``, never past the model's ``max_length``
    (unless the row itself is longer), so the backend sees at most max_length / multiple distinct lengths."""
    rounded = -(-length // multiple) * multiple
    return max(length, min(rounded, max_length))


def plan_runs(
    lengths: list[int],
    max_tokens: int,
    run_overhead_tokens: float = 0.0,
    batch_buckets: Sequence[int] | None = None,
) -> list[list[int]]:
    """Row indices sorted by length, cut into consecutive runs (each padded to its longest row, at most
    ``max_tokens`` padded tokens unless a single row is longer) so that padded tokens plus
    ``run_overhead_tokens`` per run (the fixed cost of one run, in token equivalents) are fewest.

    Why not one run per budget: rows of 30 and 400 tokens in one run pay 370 tokens of padding for the
    short one, more than a second run costs. Dynamic programming over the sorted lengths. Within the
    last run's own length group only its earliest allowed start can be best (dropping a run's last row
    saves at least that row's length, so best[b + 1] >= best[b] + length), which keeps hundreds of equal
    short rows (a batch of search queries) linear instead of quadratic.

    ``batch_buckets`` (a backend that pads a run's rows up to a bucket, the torch backend's CUDA graphs):
    a run of r rows costs bucket(r) rows, so the candidates are runs of exactly a bucket's rows (more
    rows up to the bucket cost this run nothing and spare the runs before it) and the largest allowed."""
    if batch_buckets is not None:
        return _plan_bucketed(lengths, max_tokens, run_overhead_tokens, tuple(batch_buckets))
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    sizes = [lengths[i] for i in order]
    count = len(sizes)
    group_start = [0] * count  # first sorted index of each row's length
    for index in range(1, count):
        group_start[index] = group_start[index - 1] if sizes[index] == sizes[index - 1] else index
    best = [0.0] + [math.inf] * count  # best[j]: cost of the first j sorted rows
    cut = [0] * (count + 1)  # cut[j]: where the last run of that best plan begins
    for end in range(1, count + 1):
        longest = sizes[end - 1]  # sorted: the run's last row is its longest
        earliest = max(0, end - max(1, max_tokens // max(longest, 1)))  # the budget's (one row at least)
        own = max(group_start[end - 1], earliest)
        for begin in (own, *range(group_start[end - 1] - 1, earliest - 1, -1)):
            cost = best[begin] + run_overhead_tokens + (end - begin) * longest
            if cost < best[end]:
                best[end], cut[end] = cost, begin
    return runs_from_cuts(order, cut)


def plan_path_runs(
    lengths: list[int],
    dense_rows: list[bool],
    max_tokens: int,
    run_overhead_tokens: float = 0.0,
    batch_buckets: Sequence[int] | None = None,
) -> list[list[int]]:
    """``plan_runs`` with rows at ρ ≥ 1 (``dense_rows``) and rows below never in one run: a run that
    mixes them takes another branch of the graph than either kind alone (a one-path model runs its ρ = 1
    rows through the pruned pass, a two-path model both paths over every row, twice the work), whose
    kernels round differently, so a row's bits would depend on its neighbours' budgets (batch-invariant
    answers: tests/service/test_batch_invariance.py). Each side is planned on its own; the dense side's
    runs come first."""
    runs: list[list[int]] = []
    for side in (
        [i for i, dense in enumerate(dense_rows) if dense],
        [i for i, dense in enumerate(dense_rows) if not dense],
    ):
        planned = plan_runs([lengths[i] for i in side], max_tokens, run_overhead_tokens, batch_buckets)
        runs += [[side[j] for j in run] for run in planned]
    return runs


def _plan_bucketed(
    lengths: list[int], max_tokens: int, run_overhead_tokens: float, buckets: tuple[int, ...]
) -> list[list[int]]:
    """``plan_runs`` when a run of r rows is padded to bucket(r) rows: the same dynamic programming over
    the sorted lengths, each run ending at ``end`` starting a bucket's rows before it (or at the
    earliest row the token budget allows)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    sizes = [lengths[i] for i in order]
    count = len(sizes)
    best = [0.0] + [math.inf] * count
    cut = [0] * (count + 1)
    for end in range(1, count + 1):
        longest = sizes[end - 1]
        allowed = max(1, max_tokens // max(longest, 1))  # rows the budget admits at this length
        most = min(end, allowed)
        for rows in {*(size for size in buckets if size < most), most}:
            begin = end - rows
            cost = best[begin] + run_overhead_tokens + bucket(rows, buckets) * longest
            if cost < best[end]:
                best[end], cut[end] = cost, begin
    return runs_from_cuts(order, cut)


def runs_from_cuts(order: list[int], cut: list[int]) -> list[list[int]]:
    """The runs of a best plan: ``cut[j]`` is where the last run of the first j sorted rows begins."""
    runs: list[list[int]] = []
    end = len(order)
    while end > 0:
        runs.append(order[cut[end] : end])
        end = cut[end]
    return runs[::-1]
