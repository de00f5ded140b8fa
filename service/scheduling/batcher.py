"""Dynamic micro-batching: one bounded queue and one worker per model, and the admission glue.

Requests (jobs, ``service.scheduling.jobs``) carry one or more rows and one rho (rho is a per-row graph
input, so requests with different budgets share a batch; a job's rho is spread over its rows only where
the feed is built). The worker waits at most ``max_batch_wait_ms`` after the oldest job for the batch to
fill up to ``max_batch_tokens``, then has its rows cut into runs (``service.scheduling.planner``),
executed on the model's inference thread (``execution``) and each job answered as soon as its own rows
are done (``delivery``).

Under load (``service.scheduling.admission``): a request is admitted only when the work queued ahead of
it, at the lowest rho each job may still get, leaves time for its own run before its due time (deadline,
or for rho=auto its latency target); else 429 with a Retry-After of the predicted drain time. rho=auto
jobs get their rho when their batch is formed, from the work then still queued. Every batch teaches the
cost model (``learning``). Rows are padded to a multiple of ``pad_multiple`` so the backend sees few
shapes (or to the backend's own length buckets, when it has them).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import time
from collections import deque

from retention_core.codecs.base import Row
from retention_core.contract import DENSE_RHO
from retention_core.shapes import bucket
from service.errors import (
    DeadlineExceeded,
    DeviceMemoryExhausted,
    InferenceFailed,
    Overloaded,
    QueueFull,
    ShuttingDown,
)
from service.metrics import Metrics
from service.runtime import LoadedModel
from service.scheduling.admission import Verdict, admit, choose_batch_rho, reason_for, sustainable_rho
from service.scheduling.cost import tokens_through
from service.scheduling.delivery import Delivery
from service.scheduling.execution import RowsOutOfMemory, RunStats, execute, inference_thread
from service.scheduling.jobs import Job, RowResult, Slice
from service.scheduling.learning import ModelCosts
from service.scheduling.planner import plan_path_runs, shape_length
from service.serving import AutoBudget, InferenceResult
from service.settings import Settings

log = logging.getLogger("service")

# After admission refuses a request, rho=auto batches formed within this many seconds run at their
# min_rho: while demand exceeds what the model serves, capacity goes to admitting, not to a higher rho.
SHED_MEMORY_S = 1.0
# rho=auto never runs a batch at a rho whose mean cost, at the recent arrival rate, would keep the model
# busy more than this share of the time: above it the queue grows whatever it holds now (the start of a
# flood, when the queue is still short, is where this matters).
SUSTAINABLE_BUSY = 1.0
# A batch holding rho=auto jobs is predicted (at their min_rho) to take at most this share of the
# tightest latency target among them (``Batcher._take``).
BATCH_TARGET_SHARE = 0.25


class Batcher:
    def __init__(self, model: LoadedModel, settings: Settings, metrics: Metrics) -> None:
        self.model = model
        self.settings = settings
        self.metrics = metrics
        self.queue: deque[Job] = deque()
        self.queued_tokens = 0  # padded tokens of the queued jobs
        self.queued_min_work = 0.0  # their kept token-work at the lowest rho each may get
        self.busy = False
        self.delivery: Delivery | None = None  # the running batch's, while it runs
        self.busy_until = 0.0  # predicted end of the running batch (time.monotonic()), tail-scaled
        self.batch_predicted = 0.0  # the cost model's (mean) seconds for the running batch
        self.recent_batch_tokens = 0.0  # EWMA of the padded tokens of the batches formed
        self.closing = False
        self.costs = ModelCosts(model, metrics, settings.max_batch_tokens, settings.auto_tail_quantile)
        self.last_shed = -math.inf  # time.monotonic() admission last refused a request (429)
        self.executor = inference_thread(model.name)
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._depth = metrics.queue_depth.labels(model=model.name)
        self._drain = metrics.predicted_drain.labels(model=model.name)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._worker(), name=f"batcher-{self.model.name}")

    async def close(self, timeout: float) -> None:
        """Stop taking jobs, finish the queued ones (up to ``timeout`` s), then stop the worker. Returns
        once no run of the model is in flight on its thread (a run already started is not interrupted,
        drain timeout or not): its backend may be closed then (``service.server``)."""
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
        await asyncio.get_running_loop().run_in_executor(
            None, functools.partial(self.executor.shutdown, wait=True)
        )

    @property
    def pending(self) -> int:
        return len(self.queue) + (1 if self.busy else 0)

    # ------------------------------------------------------------------ client side
    def shaped(self, rows: list[Row]) -> int:
        """Padded tokens of ``rows`` as the backend will see them (each row at its shape length)."""
        return sum(self.shape_of(len(row)) for row in rows)

    def shape_of(self, length: int) -> int:
        """A row's padded length: the backend's length bucket when it pads to fixed shapes (the torch
        backend's CUDA graphs), else rounded up to ``pad_multiple`` (few shapes: onnxruntime's arena)."""
        buckets = self.model.backend.buckets
        if buckets is not None:
            return bucket(length, buckets.length)
        return shape_length(length, self.settings.pad_multiple, self.model.manifest.max_length)

    def drain_seconds(self, now: float) -> float:
        """Predicted seconds until the running batch and the queue (each job at the lowest rho it may get)
        are done."""
        running = max(0.0, self.busy_until - now) if self.busy else 0.0
        if not self.queued_tokens:
            return running
        return running + self.costs.tail_seconds(self.queued_tokens, self.queued_min_work)

    def completion_seconds(self, now: float, tokens: int, min_rho: float, length: int = 0) -> float:
        """Predicted seconds until a job of ``tokens`` queued now is done at ``min_rho``: the work ahead,
        then its run, counted as full as recent batches (requests behind it join its run until it forms)."""
        running = max(0.0, self.busy_until - now) if self.busy else 0.0
        cumulative = self.queued_tokens + tokens
        through = tokens_through(cumulative, self.settings.max_batch_tokens, self.recent_batch_tokens)
        own = tokens * self.costs.fraction(min_rho, length)
        work = (self.queued_min_work + own) * through / cumulative
        return running + self.costs.tail_seconds(through, work)

    async def submit(
        self, rows: list[Row], rho: float, deadline: float, auto: AutoBudget | None = None
    ) -> InferenceResult:
        """Queue one request (``rho``: all its rows'; with ``auto`` its max_rho, the rho then chosen when
        its batch is formed) and wait for its result. Raises ``Overloaded`` (429) when it is shed."""
        if self.closing:
            raise ShuttingDown()
        now = time.monotonic()
        self.costs.arrivals.observe(now)
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
            if job.started is None:  # never reached the model: shed late (429), not a failure (5xx)
                raise self._expired(time.monotonic()) from None
            raise DeadlineExceeded() from None
        except asyncio.CancelledError:  # client went away
            job.cancelled = True
            self._forget(job)
            raise

    @property
    def idle(self) -> bool:
        """Nothing queued and nothing unanswered: a batch whose every job has its answer counts as done,
        though its worker may still be closing it, so a client that sends its next request the moment
        it gets an answer finds the model idle."""
        running = self.busy and not (self.delivery is not None and self.delivery.answered)
        return not running and not self.queue

    def shed_early(self, now: float, due: float, by_target: bool) -> None:
        """Before the request is even tokenized: refuse it (429) when the work already ahead of it ends
        after its due time. Cheap, and it spares an overloaded process the tokenizing of requests it would
        refuse anyway; ``_admit`` then checks the request's own run too."""
        if not self.settings.admission_control or self.idle:
            return
        wait = self.drain_seconds(now)
        if now + wait > due:
            raise self._overloaded(admit(now, due, wait, 0.0, idle=False), wait, by_target)

    def _overloaded(self, verdict: Verdict, wait: float, by_target: bool) -> Overloaded:
        self.last_shed = time.monotonic()
        return Overloaded(
            "over_target" if by_target else "over_deadline",
            max(self.settings.retry_after_s, verdict.retry_after_s),
            "server overloaded: predicted completion misses the "
            + ("latency target" if by_target else "request deadline")
            + ", retry later",
            predicted_wait_s=wait,
        )

    def _expired(self, now: float, late: bool = False) -> Overloaded:
        """A job admitted on a prediction the queue then failed to keep, its deadline (``late``: its
        rho=auto late time, ``_late_at``) passed before any of it ran: a refusal like admission's (429 +
        Retry-After, safe to retry), since nothing was computed; 504 stays for a request whose run had
        started."""
        self.last_shed = now
        wait = self.drain_seconds(now)
        return Overloaded(
            "late_queued" if late else "expired_queued",
            max(self.settings.retry_after_s, math.ceil(wait)),
            "server overloaded: the request "
            + ("waited past its latency target" if late else "deadline passed")
            + " while it was queued, retry later",
            predicted_wait_s=wait,
        )

    def _admit(self, job: Job, now: float) -> None:
        """Refuse ``job`` (429) when the work ahead at its lowest rho leaves no time for its own run."""
        wait = self.drain_seconds(now)
        own = self.completion_seconds(now, job.tokens, job.min_rho, job.length) - wait
        job.predicted_wait = wait
        self.metrics.predicted_wait.labels(model=self.model.name, task=self.model.task).observe(wait)
        self._drain.set(wait + own)
        if not self.settings.admission_control:
            return
        verdict = admit(now, job.due, wait, own, self.idle)
        if verdict.admit:
            return
        raise self._overloaded(verdict, wait, job.by_target)

    def _count(self, job: Job, sign: int) -> None:
        """Keep the queue's running sums (tokens, min_rho work, depth gauge) in step with its contents."""
        self.queued_tokens += sign * job.tokens
        self.queued_min_work += sign * job.tokens * self.costs.fraction(job.min_rho, job.length)
        if not self.queue:  # no float drift left behind by an emptied queue
            self.queued_tokens, self.queued_min_work = 0, 0.0
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
            slices = self._take()
            if not slices:
                continue
            self._assign_rhos(slices, time.monotonic())
            self.busy = True
            try:
                await self._run(loop, slices)
            except Exception as exc:  # the worker must survive anything one batch does
                self._fail([piece.job for piece in slices], exc)
            finally:
                self.busy, self.delivery = False, None

    def _fail(self, jobs: list[Job], exc: BaseException) -> None:
        log.error("model %s: inference failed", self.model.name, exc_info=exc)
        for job in jobs:
            if not job.future.done() and not job.cancelled:
                error = InferenceFailed()
                error.__cause__ = exc
                job.future.set_exception(error)

    def _out_of_memory(self, jobs: list[Job], exc: RowsOutOfMemory) -> None:
        """The jobs not answered yet hold a row the device cannot hold alone: 503 with Retry-After."""
        log.warning("model %s: %s", self.model.name, exc)
        self.metrics.device_oom.labels(model=self.model.name, outcome="refused").inc(len(exc.rows))
        self._record_runs(exc.stats)
        for job in jobs:
            if not job.future.done() and not job.cancelled:
                job.future.set_exception(DeviceMemoryExhausted(self.settings.retry_after_s))

    def _late_at(self, job: Job) -> float:
        """When a queued rho=auto job is no longer worth running: ``auto_late_after_targets`` latency
        targets after it arrived (inf when that is off or the job is not rho=auto)."""
        factor = self.settings.auto_late_after_targets
        if factor <= 0 or job.auto is None:
            return math.inf
        return job.enqueued + factor * max(job.auto.due - job.enqueued, 0.0)

    def _shed_late(self, now: float) -> None:
        """Refuse (429 ``late_queued``) every queued rho=auto job none of which has run by its late time.
        Under a storm the runs take longer than admission predicted, and a client that asked for a
        latency is better served by a refusal with a Retry-After than by an answer several targets late."""
        if self.settings.auto_late_after_targets <= 0:
            return
        late = [
            job for job in self.queue if job.open_auto and job.started is None and self._late_at(job) <= now
        ]
        for job in late:
            self.queue.remove(job)
            self._count(job, -1)
            if not job.future.done() and not job.cancelled:
                job.future.set_exception(self._expired(now, late=True))

    def _take(self) -> list[Slice]:
        """Take jobs in arrival order up to the token budget (always at least one row); drop expired ones.
        A batch holding rho=auto jobs also stops where its predicted time at their min_rho would pass
        ``BATCH_TARGET_SHARE`` of the tightest latency target among them: every job of a batch waits for
        its own run, and the batch's runs go shortest first, so one long batch at min_rho (8,192 tokens
        of reviews: ~0.3 s on one core) would make its oldest requests late by itself.

        A job larger than the budget (an OpenAI-sized embeddings request: hundreds of inputs) is served
        a slice at a time, as many rows as the batch has room for; it stays queued, and the next batch
        takes the jobs that arrived meanwhile first (``resumed``): a one-input request is never held
        behind it for more than the batch that was running when it arrived."""
        budget = self.settings.max_batch_tokens
        if self.queue and self.queue[0].resumed:  # round robin: behind whatever arrived meanwhile
            job = self.queue.popleft()
            job.resumed = False
            self.queue.append(job)
        slices: list[Slice] = []
        tokens, min_work = 0, 0.0
        limit_s = math.inf
        now = time.monotonic()
        self._shed_late(now)
        while self.queue:
            job = self.queue[0]
            if job.cancelled or job.future.done() or job.deadline <= now:
                self.queue.popleft()
                self._count(job, -1)
                continue
            piece = self._slice(job, budget - tokens, first=not slices)
            if piece is None:
                break
            work = piece.tokens * self.costs.fraction(job.min_rho, job.length)
            if job.open_auto and job.auto is not None:
                limit_s = min(limit_s, BATCH_TARGET_SHARE * (job.auto.due - job.enqueued))
            if slices and self.costs.tail_seconds(tokens + piece.tokens, min_work + work) > limit_s:
                break
            if piece.end < len(job.rows):  # stays queued for its next slice, counted for its rest
                self._count(job, -1)
                job.taken, job.tokens, job.resumed = piece.end, job.tokens - piece.tokens, True
                self._count(job, +1)
            else:
                self.queue.popleft()
                self._count(job, -1)
                job.taken = piece.end
            slices.append(piece)
            tokens += piece.tokens
            min_work += work
            if job.resumed:
                break  # the budget is full
        return slices

    def _slice(self, job: Job, room: int, first: bool) -> Slice | None:
        """The rows of ``job`` the batch takes with ``room`` padded tokens left: all of them when they
        fit; a job larger than a whole batch: as many as fit (at least one in an empty batch); else
        None (it waits, whole, for the next batch)."""
        if job.tokens <= room or (first and job.tokens <= self.settings.max_batch_tokens):
            return Slice.whole(job)
        if job.tokens <= self.settings.max_batch_tokens:
            return None
        end, size = job.taken, 0
        while end < len(job.rows):
            row = self.shape_of(len(job.rows[end]))
            if size + row > room and (size or not first):
                break
            end, size = end + 1, size + row
        return Slice(job, job.taken, end, size) if end > job.taken else None

    def _assign_rhos(self, slices: list[Slice], now: float) -> None:
        """rho of the batch's auto jobs, from the work still queued behind it (``choose_batch_rho``);
        then the batch's predicted end, which admission counts as work ahead. A job served across batches
        gets its rho with its first slice and keeps it."""
        jobs = [piece.job for piece in slices]
        batch = [piece.job.pending(piece.tokens) for piece in slices]
        costs = self.costs
        if any(job.open_auto for job in jobs):
            queued = [job.pending() for job in self.queue if not job.cancelled]
            shedding = now - self.last_shed < SHED_MEMORY_S
            budget, factor = self.settings.max_batch_tokens, costs.tail.value
            load_max_rho = self._load_max_rho(slices, now)
            choice = choose_batch_rho(now, batch, queued, costs.cost, budget, factor, shedding, load_max_rho)
            for job, pending, rho in zip(jobs, batch, choice.rhos(batch), strict=True):
                if job.open_auto:
                    queued_still = job.resumed  # its rest is counted in the queue's sums at min_rho
                    if queued_still:
                        self._count(job, -1)
                    job.rho, job.rho_chosen = rho, True
                    job.reason = reason_for(pending, rho)
                    if queued_still:
                        self._count(job, +1)
        tokens = sum(piece.tokens for piece in slices)
        self.recent_batch_tokens = 0.7 * self.recent_batch_tokens + 0.3 * tokens
        work = sum(costs.fraction(piece.job.rho, piece.job.length) * piece.tokens for piece in slices)
        self.batch_predicted = costs.mean_seconds(tokens, work)
        self.busy_until = now + costs.tail.value * self.batch_predicted
        self._drain.set(self.drain_seconds(now))

    def _load_max_rho(self, slices: list[Slice], now: float) -> float:
        """The highest rho the recent arrival rate can be served at (``sustainable_rho``, the model busy at
        most all of the time), a request costed like this batch's mean one at the cost model's mean (a
        throughput condition, not a tail one; without the per-run cost a full batch shares)."""
        tokens = sum(piece.tokens for piece in slices) / len(slices)
        length = round(sum(piece.job.length for piece in slices) / len(slices))
        cost, fraction = self.costs.cost, self.costs.fraction

        def seconds(rho: float) -> float:
            return cost.predict(0.0, tokens, tokens * fraction(rho, length))

        return sustainable_rho(self.costs.arrivals.value(now), seconds, cap=SUSTAINABLE_BUSY)

    async def _run(self, loop: asyncio.AbstractEventLoop, slices: list[Slice]) -> None:
        rows = [row for piece in slices for row in piece.rows]
        rhos = [piece.job.rho for piece in slices for _ in piece.rows]  # the graph's rho input is per row
        jobs = [piece.job for piece in slices]
        lengths = [self.shape_of(len(row)) for row in rows]
        buckets = self.model.backend.buckets
        runs = plan_path_runs(
            lengths,
            dense_rows=[rho >= DENSE_RHO for rho in rhos],
            max_tokens=self.settings.max_batch_tokens,
            run_overhead_tokens=self.costs.run_overhead_tokens(rhos),
            batch_buckets=None if buckets is None else buckets.batch,
        )
        start = time.monotonic()
        name = self.model.name
        queue_duration = self.metrics.queue_duration.labels(model=name, task=self.model.task)
        for job in jobs:
            if job.started is None:  # a job served across batches waited in the queue once
                queue_duration.observe(start - job.enqueued)
        delivery = self.delivery = Delivery(slices, start)

        def run_done(done: list[tuple[int, RowResult]], end: float) -> None:  # worker thread
            loop.call_soon_threadsafe(delivery.add, done, end)

        try:
            # Each run's answers reach the loop before this await returns (call_soon_threadsafe is FIFO).
            fraction = self.costs.fraction
            work = functools.partial(execute, self.model, fraction, rows, rhos, lengths, runs, run_done)
            stats = await loop.run_in_executor(self.executor, work)
        except RowsOutOfMemory as exc:  # every other run answered
            self._out_of_memory(jobs, exc)
            return
        except Exception as exc:
            self._fail(jobs, exc)  # the jobs whose runs had not all finished
            return
        end = time.monotonic()
        self._record_runs(stats)
        self.costs.learn(self.batch_predicted, end - start, stats)

    def _record_runs(self, stats: list[RunStats]) -> None:
        name = self.model.name
        for run in stats:
            self.metrics.record_run(name, run.rows, run.padded_tokens, run.seconds)
            if run.splits:
                self.metrics.device_oom.labels(model=name, outcome="split").inc(run.splits)
