"""Pilot: prune at every other layer instead of every layer, at equal token-work (quality only).

The selection's kernels cost about the same at every ρ < 1 (~20 ms of a 226 ms batch of 8 × 256,
results/bench/op_profile.md): pruning at every ``INTERVAL``-th point would divide that cost by
``INTERVAL``. Does quality per token-work hold? The trained minilm-embed is evaluated with its keep
schedule spread over ⌈P / INTERVAL⌉ groups of layers (ρ^((g+1)/G) entering group g) instead of one per
layer. Inside a group every point after the first keeps the count it was given, so it keeps every
token and merges nothing: the same vectors a graph that skips those points would compute, with the
trained scorers of the points that remain.

    INTERVAL=1 python -m experiments.pruning_interval <run dir> \
        --out results/experiments/pruning-interval/interval1 --limit-documents 600 --methods learned \
        --rhos 1 0.8 0.7 0.6 0.5 0.4 0.3 --query-rhos --leading-share 0.25 --min-kept-tokens 32 \
        --cache-dir <this interval's own directory>

(arguments: ``benchmarks.retrieval``'s; give each interval its own ``--cache-dir``: the cache key did
not know the schedule was spread.) The pilot patched the schedule; the product now has it as
``RetentionConfig.pruning_interval`` (``--pruning-interval`` of ``benchmarks.retrieval``, ``frontier``
and ``training export``), which skips the points inside a group instead of selecting every token there
(the same vectors: tests/training/test_pruning_interval.py). This module now passes that option.
"""

from __future__ import annotations

import os
import sys

from benchmarks.retrieval import main as retrieval_main

INTERVAL = int(os.environ.get("INTERVAL", "2"))

if __name__ == "__main__":
    retrieval_main([*sys.argv[1:], "--pruning-interval", str(INTERVAL)])
