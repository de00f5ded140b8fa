"""``torch.cuda``'s device and capture API on a machine without a GPU, for the torch backend's tests.

What a CUDA graph capture does cannot run on a CPU, so these tests replace the API it goes through
(``torch.cuda.device``, ``current_device``, ``Stream``, ``stream``, ``current_stream``,
``graph_pool_handle``, ``CUDAGraph``, ``graph``, ``mem_get_info``) and nothing of the project: the real
runner captures its real forward through it, on CPU tensors. The fake is faithful where the tests need
it to be:

- a capture records every aten op its thread runs inside ``torch.cuda.graph`` (a ``TorchDispatchMode``,
  thread-local as a capture in ``thread_local`` mode is) and a replay runs them again on the static
  buffers' current values, writing into the tensors the capture produced: a graph that recorded
  nothing, or outputs read before a replay, would answer stale values;
- a host read inside a capture (``.item()``, a data-dependent shape) fails it, as it fails on a GPU;
- it records, per capture, the current device, the capture stream's device and the capture mode, how
  many captures were in flight at once (each holds the capture a few milliseconds, so that two captures
  left unlocked overlap), and the device every stream and memory pool was made on.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

CAPTURE_HOLD_S = 0.005  # each capture lasts at least this long: unlocked concurrent captures overlap
CAPTURE_FAILURE = "CUDA error: operation not permitted when stream is capturing"
HOST_READS = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.nonzero.default}
GIB = 2**30
NO_OVERLAP = 0  # torch._debug_has_internal_overlap: 0 no, 1 yes, 2 too hard to tell
# what FakeCuda replaces in torch.cuda (and CUDAGraph, by FakeGraph)
FAKED = (
    "current_device",
    "device",
    "Stream",
    "current_stream",
    "stream",
    "graph_pool_handle",
    "mem_get_info",
    "graph",
)


@dataclass
class Recorded:
    func: Any
    args: Any
    kwargs: Any
    out: Any


class Recorder(TorchDispatchMode):
    """Every aten op this thread runs while the mode is on, in order; a host read fails the capture."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[Recorded] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in HOST_READS:
            raise RuntimeError(f"{CAPTURE_FAILURE} ({func} reads the device from the host)")
        out = func(*args, **kwargs)
        self.ops.append(Recorded(func, args, kwargs, out))
        return out


class FakeGraph:
    """``torch.cuda.CUDAGraph``: replays the recorded ops into the tensors the capture produced."""

    def __init__(self) -> None:
        self.ops: list[Recorded] | None = None
        self.replays = 0

    def replay(self) -> None:
        assert self.ops is not None, "replay of a graph never captured"
        produced: dict[int, torch.Tensor] = {}

        def fresh(value: Any) -> Any:
            return produced.get(id(value), value) if isinstance(value, torch.Tensor) else value

        pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        for op in self.ops:
            result = op.func(*tree_map(fresh, op.args), **tree_map(fresh, op.kwargs))
            outs = op.out if isinstance(op.out, tuple | list) else (op.out,)
            news = result if isinstance(result, tuple | list) else (result,)
            for old, new in zip(outs, news, strict=True):
                if isinstance(old, torch.Tensor):
                    produced[id(old)] = new
                    pairs.append((old, new))
        for old, new in pairs:
            # an expanded view (several elements, one location) gets its values from its base's copy
            if old.data_ptr() != new.data_ptr() and torch._debug_has_internal_overlap(old) == NO_OVERLAP:
                old.copy_(new)
        self.replays += 1


@dataclass
class FakeStream:
    device_index: int

    def wait_stream(self, other: FakeStream) -> None:
        assert other.device_index == self.device_index, "a stream waits on another device's stream"


@dataclass(frozen=True)
class Capture:
    device: int  # the current device when the capture began
    stream_device: int  # the device of the stream it captured on
    pool_device: int  # the device its memory pool was made on
    mode: str  # capture_error_mode
    stream: FakeStream
    thread: int


@dataclass
class FakeCuda:
    """Install with ``install(monkeypatch)``. ``fail``: every capture fails as a GPU's does."""

    fail: bool = False
    free_bytes: int = 60 * GIB
    total_bytes: int = 80 * GIB
    captures: list[Capture] = field(default_factory=list)
    failed: int = 0
    streams: list[FakeStream] = field(default_factory=list)
    pools: list[tuple[str, int]] = field(default_factory=list)
    most_at_once: dict[int, int] = field(default_factory=dict)  # device -> most captures in flight
    _in_flight: dict[int, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _local: threading.local = field(default_factory=threading.local)

    # ---------------------------------------------------------------- the device API
    def current_device(self) -> int:
        return int(getattr(self._local, "device", 0))

    @contextmanager
    def device(self, index: int) -> Iterator[None]:
        previous = self.current_device()
        self._local.device = index
        try:
            yield
        finally:
            self._local.device = previous

    def Stream(self, device: int | None = None) -> FakeStream:
        made = FakeStream(self.current_device() if device is None else device)
        with self._lock:
            self.streams.append(made)
        return made

    def current_stream(self, device: int | None = None) -> FakeStream:
        index = self.current_device() if device is None else device
        current = getattr(self._local, "stream", None)
        return current if current is not None and current.device_index == index else FakeStream(index)

    @contextmanager
    def stream(self, chosen: FakeStream) -> Iterator[None]:
        previous = getattr(self._local, "stream", None)
        self._local.stream = chosen
        try:
            yield
        finally:
            self._local.stream = previous

    def graph_pool_handle(self) -> tuple[str, int]:
        pool = ("pool", self.current_device())
        self.pools.append(pool)
        return pool

    def mem_get_info(self, device: int | None = None) -> tuple[int, int]:
        return self.free_bytes, self.total_bytes

    # ---------------------------------------------------------------- the capture API
    @contextmanager
    def graph(
        self,
        cuda_graph: FakeGraph,
        pool: tuple[str, int] | None = None,
        stream: FakeStream | None = None,
        capture_error_mode: str = "global",
    ) -> Iterator[None]:
        device = self.current_device()
        chosen = stream if stream is not None else FakeStream(device)
        with self._lock:
            self.captures.append(
                Capture(
                    device,
                    chosen.device_index,
                    -1 if pool is None else pool[1],
                    capture_error_mode,
                    chosen,
                    threading.get_ident(),
                )
            )
            self._in_flight[device] = self._in_flight.get(device, 0) + 1
            self.most_at_once[device] = max(self.most_at_once.get(device, 0), self._in_flight[device])
        recorder = Recorder()
        try:
            with recorder:
                yield
            time.sleep(CAPTURE_HOLD_S)
            if self.fail:
                raise RuntimeError(CAPTURE_FAILURE)
            cuda_graph.ops = recorder.ops
        except Exception:
            with self._lock:
                self.failed += 1
            raise
        finally:
            with self._lock:
                self._in_flight[device] -= 1

    def install(self, monkeypatch: pytest.MonkeyPatch) -> FakeCuda:
        for name in FAKED:
            monkeypatch.setattr(torch.cuda, name, getattr(self, name))
        monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeGraph)
        return self
