"""Dynamic micro-batching: one bounded queue and one worker per model.

Requests (jobs) carry one or more rows, each with its own rho (rho is a per-row graph input, so
requests with different budgets share a batch). The worker waits at most ``max_batch_wait_ms`` after
the oldest job for the batch to fill up to ``max_batch_tokens``, sorts the rows of the taken jobs by
length and splits them into ONNX runs of at most ``max_batch_tokens`` padded tokens. onnxruntime runs
in a dedicated worker thread so the event loop stays free.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from retention_core.codecs.base import Row
from service.errors import DeadlineExceeded, InferenceFailed, QueueFull, ShuttingDown
from service.metrics import Metrics
from service.runtime import LoadedModel
from service.settings import Settings

log = logging.getLogger("service")


@dataclass
class JobResult:
    outputs: list[np.ndarray]  # first graph output per row, unpadded
    kept_counts: np.ndarray  # (R, L) int64
    queue_time: float  # enqueue -> start of the first run holding its rows
    inference_time: float  # that start -> end of the last run holding its rows


@dataclass
class Job:
    rows: list[Row]
    rhos: list[float]
    future: asyncio.Future[JobResult]
    deadline: float  # time.monotonic()
    enqueued: float = field(default_factory=time.monotonic)
    cancelled: bool = False

    @property
    def tokens(self) -> int:
        return sum(len(row) for row in self.rows)


@dataclass
class RunStats:
    rows: int
    padded_tokens: int
    seconds: float


def plan_runs(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Row indices sorted by length, cut into runs whose padded size (rows x longest) fits the budget."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    runs: list[list[int]] = []
    current: list[int] = []
    for index in order:
        if current and (len(current) + 1) * lengths[index] > max_tokens:
            runs.append(current)
            current = []
        current.append(index)
    if current:
        runs.append(current)
    return runs


class Batcher:
    def __init__(self, model: LoadedModel, settings: Settings, metrics: Metrics) -> None:
        self.model = model
        self.settings = settings
        self.metrics = metrics
        self.queue: deque[Job] = deque()
        self.queued_tokens = 0
        self.busy = False
        self.closing = False
        self.batch_latency = model.warmup_seconds  # EWMA of seconds per ONNX run
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"ort-{model.name}")
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._depth = metrics.queue_depth.labels(model=model.name)

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
    def estimated_latency(self, tokens: int) -> float:
        """Seconds a new job of ``tokens`` would take: runs ahead of it (and its own) x recent run latency."""
        budget = self.settings.max_batch_tokens
        runs = math.ceil((self.queued_tokens + tokens) / budget) + (1 if self.busy else 0)
        return runs * self.batch_latency

    async def submit(self, rows: list[Row], rhos: list[float], deadline: float) -> JobResult:
        if self.closing:
            raise ShuttingDown()
        if len(self.queue) >= self.settings.max_queue_requests:
            raise QueueFull(headers={"Retry-After": str(self.settings.retry_after_s)})
        job = Job(rows, rhos, asyncio.get_running_loop().create_future(), deadline)
        self.queue.append(job)
        self.queued_tokens += job.tokens
        self._depth.set(len(self.queue))
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

    def _forget(self, job: Job) -> None:
        with contextlib.suppress(ValueError):
            self.queue.remove(job)
            self.queued_tokens -= job.tokens
            self._depth.set(len(self.queue))

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
        """Pop jobs in arrival order up to the token budget (always at least one); drop expired ones."""
        jobs: list[Job] = []
        tokens = 0
        now = time.monotonic()
        while self.queue:
            job = self.queue[0]
            if job.cancelled or job.future.done() or job.deadline <= now:
                self.queue.popleft()
                self.queued_tokens -= job.tokens
                continue
            if jobs and tokens + job.tokens > self.settings.max_batch_tokens:
                break
            self.queue.popleft()
            self.queued_tokens -= job.tokens
            jobs.append(job)
            tokens += job.tokens
        self._depth.set(len(self.queue))
        return jobs

    async def _run(self, loop: asyncio.AbstractEventLoop, jobs: list[Job]) -> None:
        rows = [row for job in jobs for row in job.rows]
        rhos = [rho for job in jobs for rho in job.rhos]
        runs = plan_runs([len(row) for row in rows], self.settings.max_batch_tokens)
        start = time.monotonic()
        name = self.model.name
        for job in jobs:
            self.metrics.queue_duration.labels(model=name).observe(start - job.enqueued)
        try:
            results, stats = await loop.run_in_executor(self.executor, self._execute, rows, rhos, runs)
        except Exception as exc:
            self._fail(jobs, exc)
            return
        end = time.monotonic()
        for run in stats:
            self.metrics.batch_size.labels(model=name).observe(run.rows)
            self.metrics.batch_tokens.labels(model=name).observe(run.padded_tokens)
            self.metrics.inference_duration.labels(model=name).observe(run.seconds)
            alpha = 0.3 if self.batch_latency else 1.0
            self.batch_latency = (1 - alpha) * self.batch_latency + alpha * run.seconds
        offset = 0
        for job in jobs:
            count = len(job.rows)
            outputs = [results[i][0] for i in range(offset, offset + count)]
            counts = np.stack([results[i][1] for i in range(offset, offset + count)])  # (R, L)
            offset += count
            if not job.future.done():
                job.future.set_result(JobResult(outputs, counts, start - job.enqueued, end - start))

    def _execute(
        self, rows: list[Row], rhos: list[float], runs: list[list[int]]
    ) -> tuple[list[tuple[np.ndarray, np.ndarray]], list[RunStats]]:
        """Worker thread: every planned run through onnxruntime; results back in the original row order."""
        results: list[tuple[np.ndarray, np.ndarray]] = [None] * len(rows)  # type: ignore[list-item]
        stats = []
        for run in runs:
            begin = time.perf_counter()
            outputs, counts = self.model.run([rows[i] for i in run], [rhos[i] for i in run])
            seconds = time.perf_counter() - begin
            for slot, index in enumerate(run):
                results[index] = (outputs[slot], counts[slot])
            stats.append(RunStats(len(run), len(run) * max(len(rows[i]) for i in run), seconds))
        return results, stats
