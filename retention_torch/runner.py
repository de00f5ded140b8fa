"""Running the GPU-shaped forward: shape buckets, plans and one CUDA graph per plan.

A batch is padded to a batch bucket (1, 2, 4, … rows) and a length bucket, and each pruning point's
slots are its rows' largest keep count rounded up to a slot quantum (an eighth of the length bucket), so
the traffic of one model at one ρ meets a handful of plans. On a CUDA device each plan is captured as
one CUDA graph (``CompiledPlan``): static input buffers are filled and the graph replayed, so a forward
costs one launch whatever its kernel count. The plans a server's runs meet (``load_plans``) are
captured when the model loads (``Runner.capture_at_load``, bounded by a count and the device's free
memory), any other the first time a request meets it; a plan whose capture fails runs eagerly and is
never captured again. Graphs share one memory pool and at most ``max_graphs`` are kept (least recently
used leaves first). On the CPU, or with graphs off, the very same static-buffer path runs the forward
eagerly: that is how the tests check it (and, with ``torch.cuda``'s capture API mocked, the capture
path: ``retention_torch.capture``).
"""

from __future__ import annotations

import logging
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
from retention_torch.capture import Capturer, Placement
from retention_torch.forward import TOKEN_INPUTS, Head, Inputs, Outputs, Plan, decay_matrix, forward
from retention_torch.weights import ModelWeights

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
LENGTH_BUCKETS = (16, 32, 64, 128, 192, 256, 320, 384, 448, 512)
SLOT_QUANTUM_SHARE = 8  # slots are rounded up to a multiple of length bucket / 8 (at least 8)
MIN_SLOT_QUANTUM = 8
# Captures at load stop while less than this share of the device's memory is free: eager fallbacks,
# activations of the runs and the other models' graphs need it.
MIN_FREE_MEMORY_SHARE = 0.25

log = logging.getLogger(__name__)


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


def load_plans(
    schedule: Schedule,
    rhos: Sequence[float],
    batch_buckets: Sequence[int],
    length_buckets: Sequence[int],
    max_tokens: int,
) -> list[Plan]:
    """The plans the server's runs meet, in the order ``Runner.capture_at_load`` captures them: every
    batch × length bucket a run of at most ``max_tokens`` padded tokens is padded to (the scheduler's
    cut, ``service.scheduling.planner``), whose longest row falls anywhere in that length bucket, at
    each of ``rhos`` (a run's slots follow its longest row). Fewest padded tokens first: light traffic
    meets them, and a capture on the request path costs most against a short run. Runs of mixed ρ
    (``rho=auto``) meet plans beyond these: the cache keeps room for them."""
    plans: dict[Plan, None] = {}  # ordered, without repeats
    for index, length in enumerate(length_buckets):
        batches = [batch for batch in batch_buckets if batch * length <= max_tokens]
        shorter = length_buckets[index - 1] if index > 0 else 0
        longest = np.arange(shorter + 1, length + 1)  # (N,) every longest row the bucket holds
        for rho in rhos:
            rows = np.full(len(longest), rho, dtype=np.float32)
            counts = keep_counts(schedule, rows, longest, np.ones_like(longest))  # (N, P)
            for batch in batches:
                # One row stands for the run: its slots are the longest row's.
                for row in range(len(longest)):
                    plan = make_plan(schedule, counts[row : row + 1], longest[row : row + 1], batch, length)
                    plans.setdefault(plan, None)
                # Every row filling the bucket: the run whose attention may go without a mask.
                full = make_plan(
                    schedule, np.repeat(counts[-1:], batch, 0), np.full(batch, length), batch, length
                )
                plans.setdefault(full, None)
    return sorted(plans, key=lambda plan: plan.batch * plan.length)  # stable: ρ order within a size


class CompiledPlan:
    """One plan's static input buffers and, on a CUDA device with graphs on, its captured CUDA graph.

    A capture that fails leaves ``graph`` None and ``capture_error`` set: the plan runs eagerly through
    the same static buffers (the answers are the same, slower)."""

    def __init__(
        self,
        run: Callable[[Inputs], Outputs],
        plan: Plan,
        num_points: int,
        device: torch.device,
        capturer: Capturer | None,
    ) -> None:
        self.inputs = Inputs(
            tokens=torch.zeros((len(TOKEN_INPUTS), plan.batch, plan.length), dtype=torch.long, device=device),
            counts=torch.zeros((plan.batch, num_points), dtype=torch.long, device=device),
        )
        self.run = run
        self.graph: Any = None  # torch.cuda.CUDAGraph once captured
        self.outputs: Outputs | None = None
        self.capture_error: str | None = None
        if capturer is not None:
            self._capture(capturer)

    def _capture(self, capturer: Capturer) -> None:
        self.inputs.attention_mask.fill_(1)  # a well-formed batch while warming up and capturing
        self.inputs.counts.fill_(1)
        try:
            self.graph, self.outputs = capturer.capture(lambda: self.run(self.inputs))
        except Exception as exc:  # any capture failure: this plan runs eagerly from now on
            self.graph, self.outputs = None, None
            self.capture_error = f"{type(exc).__name__}: {exc}"

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


@dataclass
class GraphStats:
    """What a runner did with CUDA graphs since it was made (its backend publishes them as metrics)."""

    captured_at_load: int = 0  # graphs captured by ``capture_at_load``
    captured_on_request: int = 0  # graphs captured the first time a request met their plan
    capture_failures: int = 0  # captures that failed: their plans run eagerly, never captured again
    eager_runs: int = 0  # runs of such plans (each answered eagerly)
    evictions: int = 0  # graphs dropped from the cache (least recently used first)
    planned_at_load: int = 0  # plans the load wanted (``capture_at_load``'s list, before its bounds)
    load_stopped: str | None = None  # why the load captured fewer than planned, if it did

    @property
    def captured(self) -> int:
        return self.captured_at_load + self.captured_on_request


@dataclass(frozen=True)
class LoadBudget:
    """Bounds of ``Runner.capture_at_load``: at most ``plans`` graphs, and none once the device's free
    memory is under ``min_free_share`` of its total (what eager fallbacks and activations need)."""

    plans: int
    min_free_share: float = MIN_FREE_MEMORY_SHARE


class Runner:
    """One model on one device: ``run`` takes a task's graph feeds (``TaskSpec.feeds``) and answers what
    ``model.onnx`` would (main output, kept counts, survival depth).

    Everything it does on a CUDA device runs under that device's guard (``Placement.guard``); graphs are
    captured one at a time per device across runners (``retention_torch.capture``). The cache holds
    ``max_graphs`` graphs for the plans traffic meets, plus those captured at load."""

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
        placement: Placement | None = None,
    ) -> None:
        self.weights = weights
        self.schedule = schedule
        self.head = head
        self.placement = Placement.of(weights.device) if placement is None else placement
        self.device = self.placement.device
        self.length_buckets = tuple(sorted({*(b for b in length_buckets if b < max_length), max_length}))
        self.batch_buckets = tuple(batch_buckets)
        self.graphs = graphs and self.placement.cuda_index is not None
        self.traffic_graphs = max(1, max_graphs)
        self.capturer = Capturer(self.placement) if self.graphs else None
        self.compiled: OrderedDict[Plan, CompiledPlan] = OrderedDict()
        self.eager_plans: set[Plan] = set()  # plans whose capture failed: never captured again
        self.decays: dict[int, torch.Tensor] = {}
        self.lock = threading.Lock()  # one forward at a time: plans share static buffers
        self.stats = GraphStats()

    @property
    def max_graphs(self) -> int:
        """The cache's size: room for the plans traffic meets, and for those captured at load."""
        return self.traffic_graphs + self.stats.captured_at_load

    def _decays_for(self, plan: Plan) -> dict[int, torch.Tensor]:
        """The scorer's decay matrix of every slot count the plan's selecting points see."""
        ema = self.weights.architecture.ema_decay
        for length in {plan.length, *plan.slots}:
            if length not in self.decays:
                self.decays[length] = decay_matrix(length, ema, self.device)
        return self.decays

    def compiled_plan(self, plan: Plan, at_load: bool = False) -> CompiledPlan:
        """The plan's compiled form, captured on first use (never again once a capture failed); the
        least recently used one leaves when more than ``max_graphs`` are held. The caller holds
        ``lock`` and the placement's guard."""
        found = self.compiled.get(plan)
        if found is not None:
            self.compiled.move_to_end(plan)
            return found
        decays = self._decays_for(plan)

        def run(inputs: Inputs) -> Outputs:
            return forward(self.weights, self.schedule, self.head, plan, inputs, decays)

        capturer = None if plan in self.eager_plans else self.capturer
        compiled = CompiledPlan(run, plan, self.schedule.num_points, self.device, capturer)
        if compiled.capture_error is not None:
            self.eager_plans.add(plan)
            self.stats.capture_failures += 1
            log.warning("CUDA graph capture failed for %s; it runs eagerly: %s", plan, compiled.capture_error)
        elif compiled.graph is not None and at_load:
            self.stats.captured_at_load += 1  # before the eviction below: the cache grows with it
        elif compiled.graph is not None:
            self.stats.captured_on_request += 1
        self.compiled[plan] = compiled
        while len(self.compiled) > self.max_graphs:
            self.compiled.popitem(last=False)
            self.stats.evictions += 1
        return compiled

    def capture_at_load(self, plans: Sequence[Plan], budget: LoadBudget) -> int:
        """Capture ``plans`` in order before any request meets them, up to ``budget``; the number
        captured. Nothing on the CPU or with graphs off (the plans are listed in ``stats`` still)."""
        self.stats.planned_at_load = len(plans)
        self.stats.load_stopped = None
        if self.capturer is None:
            return 0
        with self.lock, self.placement.guard(), torch.inference_mode():
            for plan in plans:
                stop = self._load_stop(budget)
                if stop is not None:
                    self.stats.load_stopped = stop
                    break
                if plan not in self.compiled:
                    self.compiled_plan(plan, at_load=True)
        return self.stats.captured_at_load

    def _load_stop(self, budget: LoadBudget) -> str | None:
        """Why ``capture_at_load`` captures no more (None: it goes on)."""
        if self.stats.captured_at_load >= budget.plans:
            return f"the limit of {budget.plans} plans"
        assert self.placement.cuda_index is not None
        free, total = torch.cuda.mem_get_info(self.placement.cuda_index)
        if free < budget.min_free_share * total:
            return f"device memory: {free / 2**20:.0f} MiB free of {total / 2**20:.0f} MiB"
        return None

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
        with self.lock, self.placement.guard(), torch.inference_mode():
            compiled = self.compiled_plan(plan)
            if self.graphs and compiled.graph is None:
                self.stats.eager_runs += 1  # its capture failed: answered eagerly
            outputs = compiled(torch.from_numpy(tokens), torch.from_numpy(padded_counts))
            # Copies: a graph's outputs are its static buffers, which the plan's next replay overwrites
            # once the lock is released (.cpu() of a tensor already on the CPU would alias them).
            main = outputs.main[:rows].to("cpu", torch.float32, copy=True).numpy()
            depth = outputs.survival_depth[:rows, :length].to("cpu", copy=True).numpy()
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
