"""The selection methods and baselines of the codec loop, by the names reports and ``--methods`` use.

``learned`` (the trained scorers), ``random`` / ``attention`` (the same per-layer keep counts, other
token choices) and ``truncation`` (the task cuts each row to its first round(ρ · n) content tokens and the
dense model runs on what is left); ``layer_exit`` on request.
"""

from __future__ import annotations

LEARNED = "learned"
TRUNCATION = "truncation"
LAYER_EXIT = "layer_exit"
CODEC_METHODS = (LEARNED, "random", "attention", TRUNCATION)
# Accepted by --methods, not run by default: the dense model stopped after the layer count whose
# token-work is nearest the learned schedule's at each ρ, its head reading those states.
CODEC_EXTRA_METHODS = (LAYER_EXIT,)
