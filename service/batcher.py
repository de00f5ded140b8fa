"""Dynamic micro-batching: one bounded queue and one worker per model.

Requests (jobs) carry one or more rows and one rho (rho is a per-row graph input, so requests with
different budgets share a batch; a job's rho is spread over its rows only where the feed is built).
The worker waits at most ``max_batch_wait_ms`` after the oldest job for the batch to fill up to
``max_batch_tokens``, sorts the rows of the taken jobs by length and cuts them into ONNX runs of at
most ``max_batch_tokens`` padded tokens where padding would cost more than another run (``plan_runs``,
with the learned per-run cost). onnxruntime runs in a dedicated worker thread so the event loop stays
free.

Under load (``service.admission``): a request is admitted only when the work queued ahead of it, at
the lowest rho each job may still get, leaves time for its own run before its due time (deadline, or
for rho=auto its latency target); else 429 with a Retry-After of the predicted drain time. rho=auto
jobs get their rho when their batch is formed, from the work then still queued. Every run teaches the
cost model. Rows are padded to a multiple of ``pad_multiple`` so ORT sees few shapes.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from retention_core.codecs.base import Row
from service.admission import (
    EXPORTED_RHOS,
    ArrivalRate,
    CostModel,
    KeptFraction,
    Pending,
    RhoReason,
    TailFactor,
    Verdict,
    admit,
    choose_batch_rho,
    reason_for,
    runs_for,
    schedule_fraction,
    sustainable_rho,
    tokens_through,
)
from service.errors import DeadlineExceeded, InferenceFailed, Overloaded, QueueFull, ShuttingDown
from service.metrics import Metrics
from service.runtime import LoadedModel
from service.settings import Settings

log = logging.getLogger("service")

PREDICTED_WAIT_HEADER = "x-predicted-wait"  # seconds, on a 429 from admission: Retry-After, unrounded
WARMUP_TOKENS = 32  # padded tokens of the warm-up run (2 short rows) that seeds the cost model
# After admission refuses a request, rho=auto batches formed within this many seconds run at their
# floor: while demand exceeds what the model serves, capacity goes to admitting, not to a higher rho.
SHED_MEMORY_S = 1.0
# rho=auto never runs a batch at a rho whose mean cost, at the recent arrival rate, would keep the model
# busy more than this share of the time: above it the queue grows whatever it holds now (the start of a
# flood, when the queue is still short, is where this matters).
SUSTAINABLE_BUSY = 1.0
# A batch holding rho=auto jobs is predicted (at their floors) to take at most this share of the tightest
# latency target among them (``Batcher._take``).
BATCH_TARGET_SHARE = 0.25


@dataclass(frozen=True)
class AutoBudget:
    """A rho=auto request: its rho is chosen in [floor, ceiling] when its batch is formed."""

    floor: float  # min_rho
    ceiling: float  # auto_max_rho (or the floor, when that is higher)
    due: float  # time.monotonic() by which it should be answered: arrival + its latency target


@dataclass
class JobResult:
    outputs: list[np.ndarray]  # first graph output per row, unpadded
    kept_counts: np.ndarray  # (R, L) int64
    queue_time: float  # enqueue -> start of the first run holding its rows
    inference_time: float  # that start -> end of the last run holding its rows
    rho: float  # the rho its rows were served at
    rho_reason: RhoReason | None = None  # rho=auto: why that rho
    predicted_wait: float = 0.0  # admission's predicted wait for the work queued ahead
    depths: list[np.ndarray] | None = None  # survival depth (T_i,) per row; None: the graph has none


# One row's results: its first graph output, its kept counts (L,), its survival depth (T,) if any.
RowResult = tuple[np.ndarray, np.ndarray, np.ndarray | None]


@dataclass
class Job:
    rows: list[Row]
    rho: float  # fixed: the request's; rho=auto: its ceiling until the batch it joins is formed
    future: asyncio.Future[JobResult]
    deadline: float  # time.monotonic()
    auto: AutoBudget | None = None
    tokens: int = 0  # padded tokens (shape lengths) of its rows
    length: int = 0  # real tokens of its mean row (the kept-token floor raises short rows' work)
    enqueued: float = field(default_factory=time.monotonic)
    cancelled: bool = False
    reason: RhoReason | None = None
    predicted_wait: float = 0.0

    @property
    def floor(self) -> float:
        """The lowest rho this job may still get."""
        return self.auto.floor if self.auto is not None else self.rho

    @property
    def due(self) -> float:
        return min(self.deadline, self.auto.due) if self.auto is not None else self.deadline

    def pending(self) -> Pending:
        if self.auto is not None:
            return Pending(self.tokens, self.auto.floor, self.auto.ceiling, self.due, True, self.length)
        return Pending(self.tokens, self.rho, self.rho, self.due, False, self.length)


@dataclass
class RunStats:
    rows: int
    padded_tokens: int
    seconds: float
    kept_work: float  # padded tokens x the schedule's kept fraction at each row's rho


# Rows a finished run answered, (row index in the batch, its result), and when it finished.
RunDone = Callable[[list[tuple[int, RowResult]], float], None]


class Delivery:
    """Answers each job of a batch as soon as every run holding one of its rows is done, instead of when
    the whole batch is: a batch is cut into several runs (``plan_runs``), and a short request in the first
    run should not wait for the long rows of the last one. Lives on the event loop (``add`` is called
    there, once per run, in run order)."""

    def __init__(self, jobs: list[Job], start: float) -> None:
        self.jobs = jobs
        self.start = start  # the batch's first run began
        self.owner = [j for j, job in enumerate(jobs) for _ in job.rows]  # row -> its job
        self.first_row = [0] * len(jobs)
        for j in range(1, len(jobs)):
            self.first_row[j] = self.first_row[j - 1] + len(jobs[j - 1].rows)
        self.missing = [len(job.rows) for job in jobs]
        self.results: list[RowResult | None] = [None] * len(self.owner)

    def add(self, done: list[tuple[int, RowResult]], end: float) -> None:
        for index, result in done:
            self.results[index] = result
            owner = self.owner[index]
            self.missing[owner] -= 1
            if self.missing[owner] == 0:
                self._answer(self.jobs[owner], self.first_row[owner], end)

    def _answer(self, job: Job, first: int, end: float) -> None:
        if job.future.done():
            return
        mine = [result for result in self.results[first : first + len(job.rows)] if result is not None]
        depths = [depth for _, _, depth in mine if depth is not None]
        job.future.set_result(
            JobResult(
                [output for output, _, _ in mine],
                np.stack([counts for _, counts, _ in mine]),  # (R, L)
                self.start - job.enqueued,
                end - self.start,
                rho=job.rho,
                rho_reason=job.reason,
                predicted_wait=job.predicted_wait,
                depths=depths if len(depths) == len(job.rows) else None,
            )
        )


def shape_length(length: int, multiple: int, max_length: int) -> int:
    """The padded length of a row: rounded up to ``multiple``, never past the model's ``max_length``
    (unless the row itself is longer), so ORT sees at most max_length / multiple distinct lengths."""
    rounded = -(-length // multiple) * multiple
    return max(length, min(rounded, max_length))


def plan_runs(lengths: list[int], max_tokens: int, run_overhead_tokens: float = 0.0) -> list[list[int]]:
    """Row indices sorted by length, cut into consecutive runs (each padded to its longest row, at most
    ``max_tokens`` padded tokens unless a single row is longer) so that padded tokens plus
    ``run_overhead_tokens`` per run (the fixed cost of one ONNX run, in token equivalents) are fewest.

    Why not one run per budget: rows of 30 and 400 tokens in one run pay 370 tokens of padding for the
    short one, more than a second run costs. Dynamic programming over the sorted lengths. Within the
    last run's own length group only its earliest allowed start can be best (dropping a run's last row
    saves at least that row's length, so best[b + 1] >= best[b] + length), which keeps hundreds of equal
    short rows (a batch of search queries) linear instead of quadratic."""
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
    runs: list[list[int]] = []
    end = count
    while end > 0:
        runs.append(order[cut[end] : end])
        end = cut[end]
    return runs[::-1]


class Batcher:
    def __init__(self, model: LoadedModel, settings: Settings, metrics: Metrics) -> None:
        self.model = model
        self.settings = settings
        self.metrics = metrics
        self.queue: deque[Job] = deque()
        self.queued_tokens = 0  # padded tokens of the queued jobs
        self.queued_floor_work = 0.0  # their kept token-work at the lowest rho each may get
        self.busy = False
        self.busy_until = 0.0  # predicted end of the running batch (time.monotonic()), tail-scaled
        self.batch_predicted = 0.0  # the cost model's (mean) seconds for the running batch
        self.recent_batch_tokens = 0.0  # EWMA of the padded tokens of the batches formed
        self.closing = False
        longest = model.manifest.max_length
        # keyed by (rho, real tokens capped at max_length): a few rho values x at most max_length lengths
        self.fraction: KeptFraction = functools.lru_cache(maxsize=8192)(
            lambda rho, length=0: schedule_fraction(model.manifest.schedule, rho, min(length, longest))
        )
        self.cost = CostModel(
            self.fraction, model.warmup_seconds, WARMUP_TOKENS, seed_rho=model.manifest.default_rho
        )
        self.tail = TailFactor()
        self.arrivals = ArrivalRate()
        self.last_shed = -math.inf  # time.monotonic() admission last refused a request (429)
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"ort-{model.name}")
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._depth = metrics.queue_depth.labels(model=model.name)
        self._drain = metrics.predicted_drain.labels(model=model.name)
        self._publish_cost_model()

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._worker(), name=f"batcher-{self.model.name}")

    async def close(self, timeout: float) -> None:
        """Stop taking jobs, finish the queued ones (up to ``timeout`` s), then stop the worker."""
        self.closing = True
        self._wakeup.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), timeout)
            except TimeoutError:
                log.warning(
                    "model %s: drain timed out, cancelling %d queued jobs", self.model.name, len(self.queue)
                )
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._task
        for job in self.queue:
            if not job.future.done() and not job.cancelled:
                job.future.set_exception(ShuttingDown())
        self.queue.clear()
        self.executor.shutdown(wait=False)

    @property
    def pending(self) -> int:
        return len(self.queue) + (1 if self.busy else 0)

    # ------------------------------------------------------------------ client side
    def shaped(self, rows: list[Row]) -> int:
        """Padded tokens of ``rows`` as ORT will see them (each row at its shape length)."""
        multiple, longest = self.settings.pad_multiple, self.model.manifest.max_length
        return sum(shape_length(len(row), multiple, longest) for row in rows)

    def drain_seconds(self, now: float) -> float:
        """Predicted seconds until the running batch and the queue (each job at the lowest rho it may get)
        are done."""
        running = max(0.0, self.busy_until - now) if self.busy else 0.0
        if not self.queued_tokens:
            return running
        budget = self.settings.max_batch_tokens
        runs = runs_for(self.queued_tokens, budget)
        return running + self.tail.value * self.cost.predict(runs, self.queued_tokens, self.queued_floor_work)

    def completion_seconds(self, now: float, tokens: int, floor: float, length: int = 0) -> float:
        """Predicted seconds until a job of ``tokens`` queued now is done at ``floor``: the work ahead, then
        its run, counted as full as recent batches (requests behind it join its run until it forms)."""
        running = max(0.0, self.busy_until - now) if self.busy else 0.0
        budget = self.settings.max_batch_tokens
        cumulative = self.queued_tokens + tokens
        through = tokens_through(cumulative, budget, self.recent_batch_tokens)
        work = (self.queued_floor_work + tokens * self.fraction(floor, length)) * through / cumulative
        return running + self.tail.value * self.cost.predict(runs_for(through, budget), through, work)

    async def submit(
        self, rows: list[Row], rho: float, deadline: float, auto: AutoBudget | None = None
    ) -> JobResult:
        """Queue one request (``rho``: all its rows'; with ``auto`` its ceiling, the rho then chosen when
        its batch is formed) and wait for its result. Raises ``Overloaded`` (429) when it is shed."""
        if self.closing:
            raise ShuttingDown()
        now = time.monotonic()
        self.arrivals.observe(now)
        if len(self.queue) >= self.settings.max_queue_requests:
            self.last_shed = now
            raise QueueFull(max(self.settings.retry_after_s, math.ceil(self.drain_seconds(now))))
        job = Job(rows, rho, asyncio.get_running_loop().create_future(), deadline, auto)
        job.tokens = self.shaped(rows)
        job.length = round(sum(len(row) for row in rows) / len(rows)) if rows else 0
        self._admit(job, now)
        self.queue.append(job)
        self._count(job, +1)
        self._wakeup.set()
        try:
            return await asyncio.wait_for(asyncio.shield(job.future), max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            job.cancelled = True
            self._forget(job)
            raise DeadlineExceeded() from None
        except asyncio.CancelledError:  # client went away
            job.cancelled = True
            self._forget(job)
            raise

    def shed_early(self, now: float, due: float, by_target: bool) -> None:
        """Before the request is even tokenized: refuse it (429) when the work already ahead of it ends
        after its due time. Cheap, and it spares an overloaded process the tokenizing of requests it would
        refuse anyway; ``_admit`` then checks the request's own run too."""
        if not self.settings.admission_control or (not self.busy and not self.queue):
            return
        wait = self.drain_seconds(now)
        if now + wait > due:
            raise self._overloaded(admit(now, due, wait, 0.0, idle=False), wait, by_target)

    def _overloaded(self, verdict: Verdict, wait: float, by_target: bool) -> Overloaded:
        self.last_shed = time.monotonic()
        error = Overloaded(
            "over_target" if by_target else "over_deadline",
            max(self.settings.retry_after_s, verdict.retry_after_s),
            "server overloaded: predicted completion misses the "
            + ("latency target" if by_target else "request deadline")
            + ", retry later",
        )
        error.headers[PREDICTED_WAIT_HEADER] = f"{wait:.6f}"
        return error

    def _admit(self, job: Job, now: float) -> None:
        """Refuse ``job`` (429) when the work ahead at its lowest rho leaves no time for its own run."""
        wait = self.drain_seconds(now)
        own = self.completion_seconds(now, job.tokens, job.floor, job.length) - wait
        job.predicted_wait = wait
        self.metrics.predicted_wait.labels(model=self.model.name, task=self.model.task).observe(wait)
        self._drain.set(wait + own)
        if not self.settings.admission_control:
            return
        idle = not self.busy and not self.queue
        verdict = admit(now, job.due, wait, own, idle)
        if verdict.admit:
            return
        raise self._overloaded(verdict, wait, by_target=job.auto is not None and job.auto.due < job.deadline)

    def _count(self, job: Job, sign: int) -> None:
        """Keep the queue's running sums (tokens, floor work, depth gauge) in step with its contents."""
        self.queued_tokens += sign * job.tokens
        self.queued_floor_work += sign * job.tokens * self.fraction(job.floor, job.length)
        if not self.queue:  # no float drift left behind by an emptied queue
            self.queued_tokens, self.queued_floor_work = 0, 0.0
        self._depth.set(len(self.queue))

    def _forget(self, job: Job) -> None:
        with contextlib.suppress(ValueError):
            self.queue.remove(job)
            self._count(job, -1)

    # ------------------------------------------------------------------ worker side
    async def _worker(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self.queue:
                if self.closing:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            wait = self.queue[0].enqueued + self.settings.max_batch_wait_ms / 1000.0 - time.monotonic()
            if wait > 0 and self.queued_tokens < self.settings.max_batch_tokens and not self.closing:
                await asyncio.sleep(wait)
            jobs = self._take()
            if not jobs:
                continue
            self._assign_rhos(jobs, time.monotonic())
            self.busy = True
            try:
                await self._run(loop, jobs)
            except Exception as exc:  # the worker must survive anything one batch does
                self._fail(jobs, exc)
            finally:
                self.busy = False

    def _fail(self, jobs: list[Job], exc: BaseException) -> None:
        log.error("model %s: inference failed", self.model.name, exc_info=exc)
        for job in jobs:
            if not job.future.done() and not job.cancelled:
                error = InferenceFailed()
                error.__cause__ = exc
                job.future.set_exception(error)

    def _take(self) -> list[Job]:
        """Pop jobs in arrival order up to the token budget (always at least one); drop expired ones.
        A batch holding rho=auto jobs also stops where its predicted time at their floors would pass
        ``BATCH_TARGET_SHARE`` of the tightest latency target among them: every job of a batch waits for
        its own run, and the batch's runs go shortest first, so one long batch at the floor (8,192 tokens
        of reviews: ~0.3 s on one core) would make its oldest requests late by itself."""
        jobs: list[Job] = []
        tokens, floor_work = 0, 0.0
        limit_s = math.inf
        now = time.monotonic()
        while self.queue:
            job = self.queue[0]
            if job.cancelled or job.future.done() or job.deadline <= now:
                self.queue.popleft()
                self._count(job, -1)
                continue
            if jobs and tokens + job.tokens > self.settings.max_batch_tokens:
                break
            work = job.tokens * self.fraction(job.floor, job.length)
            if job.auto is not None:
                limit_s = min(limit_s, BATCH_TARGET_SHARE * (job.auto.due - job.enqueued))
            if jobs and self._batch_seconds(tokens + job.tokens, floor_work + work) > limit_s:
                break
            self.queue.popleft()
            self._count(job, -1)
            jobs.append(job)
            tokens += job.tokens
            floor_work += work
        return jobs

    def _batch_seconds(self, tokens: int, kept: float) -> float:
        runs = runs_for(tokens, self.settings.max_batch_tokens)
        return self.tail.value * self.cost.predict(runs, tokens, kept)

    def _assign_rhos(self, jobs: list[Job], now: float) -> None:
        """rho of the batch's auto jobs, from the work still queued behind it (``choose_batch_rho``);
        then the batch's predicted end, which admission counts as work ahead."""
        batch = [job.pending() for job in jobs]
        if any(job.auto is not None for job in jobs):
            queued = [job.pending() for job in self.queue if not job.cancelled]
            shedding = now - self.last_shed < SHED_MEMORY_S
            budget, factor = self.settings.max_batch_tokens, self.tail.value
            ceiling = self._load_ceiling(jobs, now)
            choice = choose_batch_rho(now, batch, queued, self.cost, budget, factor, shedding, ceiling)
            for job, pending, rho in zip(jobs, batch, choice.rhos(batch), strict=True):
                if job.auto is not None:
                    job.rho = rho
                    job.reason = reason_for(pending, rho)
        tokens = sum(job.tokens for job in jobs)
        self.recent_batch_tokens = 0.7 * self.recent_batch_tokens + 0.3 * tokens
        work = sum(self.fraction(job.rho, job.length) * job.tokens for job in jobs)
        self.batch_predicted = self.cost.predict(
            runs_for(tokens, self.settings.max_batch_tokens), tokens, work
        )
        self.busy_until = now + self.tail.value * self.batch_predicted
        self._drain.set(self.drain_seconds(now))

    def _load_ceiling(self, jobs: list[Job], now: float) -> float:
        """The highest rho the recent arrival rate can be served at (``sustainable_rho``, the model busy at
        most all of the time), a request costed like this batch's mean one at the cost model's mean (a
        throughput condition, not a tail one; without the per-run cost a full batch shares)."""
        tokens = sum(job.tokens for job in jobs) / len(jobs)
        length = round(sum(job.length for job in jobs) / len(jobs))

        def seconds(rho: float) -> float:
            return self.cost.predict(0.0, tokens, tokens * self.fraction(rho, length))

        return sustainable_rho(self.arrivals.value(now), seconds, cap=SUSTAINABLE_BUSY)

    async def _run(self, loop: asyncio.AbstractEventLoop, jobs: list[Job]) -> None:
        rows = [row for job in jobs for row in job.rows]
        rhos = [job.rho for job in jobs for _ in job.rows]  # the graph's rho input is per row
        multiple, longest = self.settings.pad_multiple, self.model.manifest.max_length
        lengths = [shape_length(len(row), multiple, longest) for row in rows]
        runs = plan_runs(lengths, self.settings.max_batch_tokens, self.run_overhead_tokens(rhos))
        start = time.monotonic()
        name = self.model.name
        queue_duration = self.metrics.queue_duration.labels(model=name, task=self.model.task)
        for job in jobs:
            queue_duration.observe(start - job.enqueued)
        delivery = Delivery(jobs, start)

        def run_done(done: list[tuple[int, RowResult]], end: float) -> None:  # worker thread
            loop.call_soon_threadsafe(delivery.add, done, end)

        try:
            # Each run's answers reach the loop before this await returns (call_soon_threadsafe is FIFO).
            work = functools.partial(self._execute, rows, rhos, lengths, runs, run_done)
            stats = await loop.run_in_executor(self.executor, work)
        except Exception as exc:
            self._fail(jobs, exc)  # the jobs whose runs had not all finished
            return
        end = time.monotonic()
        self.tail.observe(self.batch_predicted, end - start)
        for run in stats:
            self.metrics.batch_size.labels(model=name).observe(run.rows)
            self.metrics.batch_tokens.labels(model=name).observe(run.padded_tokens)
            self.metrics.inference_duration.labels(model=name).observe(run.seconds)
            self.cost.observe(run.padded_tokens, run.kept_work, run.seconds)
        self._publish_cost_model()

    def run_overhead_tokens(self, rhos: list[float]) -> float:
        """The fixed cost of one ONNX run in padded-token equivalents at the batch's mean rho (learned: the
        cost model's per-run over per-token seconds), so ``plan_runs`` trades padding for runs."""
        per_token = self.cost.per_token(sum(rhos) / len(rhos)) if rhos else 0.0
        if per_token <= 0.0:
            return 0.0
        return min(self.cost.per_run / per_token, float(self.settings.max_batch_tokens))

    def _publish_cost_model(self) -> None:
        per_token = {rho: self.cost.per_token(rho) for rho in EXPORTED_RHOS}
        self.metrics.record_cost_model(self.model.name, self.cost.per_run, per_token, self.tail.value)

    def _execute(
        self,
        rows: list[Row],
        rhos: list[float],
        lengths: list[int],
        runs: list[list[int]],
        run_done: RunDone,
    ) -> list[RunStats]:
        """Worker thread: every planned run through onnxruntime, each padded to its longest shape length;
        each run's results (by row index in the batch) handed to ``run_done`` as soon as it finishes."""
        stats = []
        for run in runs:
            length = max(lengths[i] for i in run)
            begin = time.perf_counter()
            outputs, counts, depths = self.model.run([rows[i] for i in run], [rhos[i] for i in run], length)
            seconds = time.perf_counter() - begin
            run_done(
                [
                    (index, (outputs[slot], counts[slot], None if depths is None else depths[slot]))
                    for slot, index in enumerate(run)
                ],
                time.monotonic(),
            )
            kept = length * sum(self.fraction(rhos[i], len(rows[i])) for i in run)
            stats.append(RunStats(len(run), len(run) * length, seconds, kept))
        return stats
