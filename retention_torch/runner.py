"""Running the GPU-shaped forward: shape buckets, plans and one CUDA graph per plan.

A batch is padded to a batch bucket (1, 2, 4, … rows) and a length bucket, and each pruning point's
slots are its rows' largest keep count rounded up to a slot quantum (an eighth of the length bucket), so
the traffic of one model at one ρ meets a handful of plans. On a CUDA device each plan is captured as
one CUDA graph the first time it is met (``CompiledPlan``): static input buffers are filled and the
graph replayed, so a forward costs one launch whatever its kernel count. Graphs share one memory pool
and at most ``max_graphs`` are kept (least recently used leaves first). On the CPU, or with graphs off,
the very same static-buffer path runs the forward eagerly: that is how the tests check it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from retention_core.contract import Schedule
from retention_core.schedule import is_pruning_point, keep_counts
from retention_core.shapes import bucket
from retention_torch.forward import TOKEN_INPUTS, Head, Inputs, Outputs, Plan, decay_matrix, forward
from retention_torch.weights import ModelWeights

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
LENGTH_BUCKETS = (16, 32, 64, 128, 192, 256, 320, 384, 448, 512)
SLOT_QUANTUM_SHARE = 8  # slots are rounded up to a multiple of length bucket / 8 (at least 8)
MIN_SLOT_QUANTUM = 8
WARMUP_REPLAYS = 2  # eager runs on a side stream before capture (cuBLAS handles, allocator)


def round_up(value: int, quantum: int) -> int:
    return -(-value // quantum) * quantum


def make_plan(schedule: Schedule, counts: np.ndarray, num_real: np.ndarray, batch: int, length: int) -> Plan:
    """The plan of rows with keep counts (R, P) and real tokens (R,) padded to ``batch`` × ``length``.

    Dense when every row keeps every real token at every point (ρ = 1, or rows under the kept-token
    floor): no scorer runs, as in the graph's all-ρ = 1 branch. Otherwise each selecting point gets the
    largest count rounded up to the quantum (never more than the slots entering it), the points inside a
    group the slots of their group."""
    full_rows = bool(np.all(num_real == length)) and counts.shape[0] == batch
    if bool(np.all(counts == num_real[:, None])):
        return Plan(batch, length, (length,) * schedule.num_points, selecting=False, masked=not full_rows)
    quantum = max(MIN_SLOT_QUANTUM, length // SLOT_QUANTUM_SHARE)
    slots: list[int] = []
    entering = length
    for point in range(schedule.num_points):
        if is_pruning_point(point, schedule.pruning_interval):
            entering = min(entering, round_up(int(counts[:, point].max()), quantum))
        slots.append(entering)
    # Attention needs its mask unless every slot of every row is a real, single token.
    exact = full_rows and all(np.all(counts[:, p] == slots[p]) for p in range(schedule.num_points))
    return Plan(batch, length, tuple(slots), selecting=True, masked=schedule.merge_dropped or not exact)


class CompiledPlan:
    """One plan's static input buffers and, on a CUDA device with graphs on, its captured CUDA graph."""

    def __init__(
        self,
        run: Callable[[Inputs], Outputs],
        plan: Plan,
        num_points: int,
        device: torch.device,
        pool: Any,
    ) -> None:
        self.inputs = Inputs(
            tokens=torch.zeros((len(TOKEN_INPUTS), plan.batch, plan.length), dtype=torch.long, device=device),
            counts=torch.zeros((plan.batch, num_points), dtype=torch.long, device=device),
        )
        self.run = run
        self.graph: torch.cuda.CUDAGraph | None = None
        self.outputs: Outputs | None = None
        if pool is not None:
            self._capture(pool)

    def _capture(self, pool: Any) -> None:
        """Warm up on a side stream (as torch's CUDA graph notes ask), then capture one forward."""
        self.inputs.attention_mask.fill_(1)  # a well-formed batch while warming up and capturing
        self.inputs.counts.fill_(1)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUP_REPLAYS):
                self.run(self.inputs)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.outputs = self.run(self.inputs)

    def __call__(self, tokens: torch.Tensor, counts: torch.Tensor) -> Outputs:
        """Host (4, B, T) token inputs and (B, P) counts in, the plan's outputs (on the device) out."""
        self.inputs.tokens.copy_(tokens, non_blocking=True)
        self.inputs.counts.copy_(counts, non_blocking=True)
        if self.graph is None:
            return self.run(self.inputs)
        self.graph.replay()
        assert self.outputs is not None
        return self.outputs


@dataclass(frozen=True)
class RunResult:
    main: np.ndarray  # (R, …) the head's output of each row, fp32
    kept_counts: np.ndarray  # (R, P) int64
    survival_depth: np.ndarray  # (R, T) int64


class Runner:
    """One model on one device: ``run`` takes a task's graph feeds (``TaskSpec.feeds``) and answers what
    ``model.onnx`` would (main output, kept counts, survival depth)."""

    def __init__(
        self,
        weights: ModelWeights,
        schedule: Schedule,
        head: Head,
        max_length: int,
        graphs: bool = True,
        max_graphs: int = 64,
        length_buckets: Sequence[int] = LENGTH_BUCKETS,
        batch_buckets: Sequence[int] = BATCH_BUCKETS,
    ) -> None:
        self.weights = weights
        self.schedule = schedule
        self.head = head
        self.device = weights.device
        self.length_buckets = tuple(sorted({*(b for b in length_buckets if b < max_length), max_length}))
        self.batch_buckets = tuple(batch_buckets)
        self.graphs = graphs and self.device.type == "cuda"
        self.max_graphs = max(1, max_graphs)
        self.pool = torch.cuda.graph_pool_handle() if self.graphs else None
        self.compiled: OrderedDict[Plan, CompiledPlan] = OrderedDict()
        self.decays: dict[int, torch.Tensor] = {}
        self.lock = threading.Lock()  # one forward at a time: plans share static buffers
        self.captures = 0

    def _decays_for(self, plan: Plan) -> dict[int, torch.Tensor]:
        """The scorer's decay matrix of every slot count the plan's selecting points see."""
        ema = self.weights.architecture.ema_decay
        for length in {plan.length, *plan.slots}:
            if length not in self.decays:
                self.decays[length] = decay_matrix(length, ema, self.device)
        return self.decays

    def compiled_plan(self, plan: Plan) -> CompiledPlan:
        """The plan's compiled form, captured on first use; the least recently used one leaves when more
        than ``max_graphs`` are held."""
        found = self.compiled.get(plan)
        if found is not None:
            self.compiled.move_to_end(plan)
            return found
        decays = self._decays_for(plan)

        def run(inputs: Inputs) -> Outputs:
            return forward(self.weights, self.schedule, self.head, plan, inputs, decays)

        compiled = CompiledPlan(run, plan, self.schedule.num_points, self.device, self.pool)
        self.captures += compiled.graph is not None
        self.compiled[plan] = compiled
        while len(self.compiled) > self.max_graphs:
            self.compiled.popitem(last=False)
        return compiled

    def run(self, feeds: dict[str, np.ndarray]) -> RunResult:
        """Graph feeds (B, T) + rho (B,) → the outputs of every row, batch padding removed (token outputs
        and depth keep the feeds' length T)."""
        rows = feeds["input_ids"].shape[0]
        largest = self.batch_buckets[-1]
        parts = [
            self._run_chunk(feeds, start, min(rows, start + largest)) for start in range(0, rows, largest)
        ]
        if len(parts) == 1:
            return parts[0]
        return RunResult(
            np.concatenate([part.main for part in parts]),
            np.concatenate([part.kept_counts for part in parts]),
            np.concatenate([part.survival_depth for part in parts]),
        )

    def _run_chunk(self, feeds: dict[str, np.ndarray], start: int, end: int) -> RunResult:
        mask = feeds["attention_mask"][start:end]
        rows, length = mask.shape
        num_real = mask.sum(1).astype(np.int64)  # (R,)
        protected = feeds.get("protected_mask")
        protected = np.zeros_like(mask) if protected is None else protected[start:end].copy()
        protected[:, 0] = 1  # [CLS] is always protected (RetentionModel.default_protected)
        protected = protected * mask
        rho = feeds["rho"][start:end].astype(np.float32)
        counts = keep_counts(self.schedule, rho, num_real, protected.sum(1))  # (R, P)
        batch = bucket(rows, self.batch_buckets)
        padded_length = bucket(length, self.length_buckets)
        plan = make_plan(self.schedule, counts, num_real, batch, padded_length)

        tokens = np.zeros((len(TOKEN_INPUTS), batch, padded_length), dtype=np.int64)  # (4, B, T)
        tokens[0] = self.weights.architecture.padding_idx
        tokens[0, :rows, :length] = feeds["input_ids"][start:end]
        tokens[1, :rows, :length] = mask
        tokens[2, :rows, :length] = protected
        if "token_type_ids" in feeds:
            tokens[3, :rows, :length] = feeds["token_type_ids"][start:end]
        padded_counts = np.zeros((batch, counts.shape[1]), dtype=np.int64)
        padded_counts[:rows] = counts
        with self.lock, torch.inference_mode():
            compiled = self.compiled_plan(plan)
            outputs = compiled(torch.from_numpy(tokens), torch.from_numpy(padded_counts))
            main = outputs.main[:rows].float().cpu().numpy()
            depth = outputs.survival_depth[:rows, :length].cpu().numpy()
        if main.ndim == 3:
            main = main[:, :length]
        return RunResult(main, counts, depth)

    def device_memory(self) -> tuple[int, int] | None:
        """(bytes in use, allocator peak) on a CUDA device; None elsewhere."""
        if self.device.type != "cuda":
            return None
        return int(torch.cuda.memory_allocated(self.device)), int(
            torch.cuda.max_memory_allocated(self.device)
        )
