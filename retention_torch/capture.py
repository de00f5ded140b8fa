"""Where a runner's work goes and how its CUDA graphs are captured, with several models in one process.

Three things go wrong at first contact with a GPU when a server holds more than one model (``make
serve`` loads several) or serves from ``cuda:N``, N > 0:

- Capturing with torch's defaults (``capture_error_mode="global"``, its one shared capture stream) lets
  any other thread's unsafe CUDA call during the capture (another model's eager forward allocating, a
  host copy's synchronisation) invalidate it, and two models capturing at once share that stream. Here a
  capture runs in ``thread_local`` mode (only the capturing thread's own calls are checked) on a stream of
  its runner's own, and one capture at a time per device whichever model asks (``capture_lock``).
- Streams, the memory pool and the capture stream are made on the calling thread's current device,
  which is device 0 on a worker thread: on ``cuda:1`` the graph would record nothing of the forward and
  its replays would never update the outputs. ``Placement.guard`` makes the runner's device the current
  one around everything it does.
- A capture that fails had no fallback, so every request of that plan failed again; the runner now
  runs such a plan eagerly (``retention_torch.runner``) and never tries to capture it again.

Which of the two remedies for the first point suffices (the lock alone, or thread-local mode with a
stream per runner) is unmeasured until a device is lent; both are applied.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

WARMUP_REPLAYS = 2  # eager runs on a side stream before capture (cuBLAS handles, allocator)
# Only the capturing thread's unsafe calls invalidate its capture: other models keep serving meanwhile.
CAPTURE_ERROR_MODE = "thread_local"

_capture_locks: dict[int, threading.Lock] = {}
_capture_locks_guard = threading.Lock()

Result = TypeVar("Result")


def capture_lock(index: int) -> threading.Lock:
    """The process-wide lock of CUDA device ``index``: one graph capture at a time on it, whichever
    runner (model) captures."""
    with _capture_locks_guard:
        return _capture_locks.setdefault(index, threading.Lock())


@dataclass(frozen=True)
class Placement:
    """Where a runner's tensors live (``device``) and the CUDA device whose context its streams,
    captures and replays run in (``cuda_index``; None on the CPU: no graphs, no guard).

    ``Placement.of(device)`` is the one production form (the two agree). The tests build
    ``Placement(cpu, 1)``: tensors on the CPU with ``torch.cuda``'s capture API mocked, so that what the
    runner does on ``cuda:1`` (guard, lock, streams) is checked without a GPU."""

    device: torch.device
    cuda_index: int | None

    @classmethod
    def of(cls, device: torch.device) -> Placement:
        """A CUDA device without an index (``cuda``) is the current one, named: ``cuda:<index>``."""
        if device.type != "cuda":
            return cls(device, None)
        index = torch.cuda.current_device() if device.index is None else device.index
        return cls(torch.device("cuda", index), index)

    def guard(self) -> AbstractContextManager[Any]:
        """Makes this placement's CUDA device the current one (torch.cuda.device); nothing on the CPU."""
        return nullcontext() if self.cuda_index is None else torch.cuda.device(self.cuda_index)


@dataclass
class Capturer:
    """What one runner captures with: its placement, the memory pool its graphs share and a capture
    stream of its own, made on its device."""

    placement: Placement
    pool: Any = field(init=False)
    stream: Any = field(init=False)

    def __post_init__(self) -> None:
        index = self.placement.cuda_index
        if index is None:
            raise ValueError("CUDA graphs need a CUDA placement")
        with self.placement.guard():
            self.pool = torch.cuda.graph_pool_handle()
            self.stream = torch.cuda.Stream(device=index)

    def capture(self, run: Callable[[], Result]) -> tuple[Any, Result]:
        """Warm ``run`` up on a side stream (as torch's CUDA graph notes ask), then capture one call of it
        under the device's capture lock. The caller holds the placement's guard. Raises whatever the
        capture raised: the caller falls back to running eagerly."""
        index = self.placement.cuda_index
        assert index is not None
        side = torch.cuda.Stream(device=index)
        side.wait_stream(torch.cuda.current_stream(index))
        with torch.cuda.stream(side):
            for _ in range(WARMUP_REPLAYS):
                run()
        torch.cuda.current_stream(index).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with (
            capture_lock(index),
            torch.cuda.graph(
                graph, pool=self.pool, stream=self.stream, capture_error_mode=CAPTURE_ERROR_MODE
            ),
        ):
            outputs = run()
        return graph, outputs
