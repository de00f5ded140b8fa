"""Shape buckets: a run padded up to one of a few sizes, so a backend that captures one CUDA graph per
shape (the torch backend, ``retention_torch.runner``) meets few of them, and the scheduler that plans the
runs (``service.scheduling.planner``) counts a run as the backend pads it."""

from __future__ import annotations

from collections.abc import Sequence


def bucket(value: int, buckets: Sequence[int]) -> int:
    """The smallest bucket holding ``value`` (``value`` itself past the largest)."""
    return next((size for size in buckets if size >= value), value)
