"""``retention-batch --engine ray``: the batch client's rows through the app in a Ray Data actor pool.

No server: each actor builds ``create_app(settings)`` once (one set of ONNX Runtime sessions, its own
batcher), runs its lifespan, and sends every row of a ``map_batches`` call to it in-process, all at once,
so the app's batcher packs them by tokens as it packs concurrent HTTP requests. The records (schema,
``response`` bodies, ``usage``) are the HTTP client's; the output is written in input order and a rerun
skips the rows already written, as the HTTP client's resume does. The route's input fields come from the
app's face registry (``service.api.faces``, what the app's GET /models lists), read in the driver.

The driver reads the input file (JSONL/CSV/Parquet) and hands rows to Ray as JSON strings (no Arrow
schema guessing over heterogeneous rows); the inference, the expensive part, runs on the actors.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from contextlib import AsyncExitStack
from typing import Any

import numpy as np
import ray
from tqdm import tqdm

from clients.records import (
    ERROR_BODY_CHARS,
    BatchConfig,
    Summary,
    _UsageTotals,
    answered_record,
    failed_record,
    prepare_output,
    query_params,
    read_rows,
    start_record,
    tally,
    with_served_fields,
)
from service.api.faces import FACES

READY_WAIT_S = 300.0  # an actor's first model load (and warm-up) may take this long
# In-process requests: no admission refusal and no deadline shorter than a whole Ray batch's work (a
# bulk job wants every row answered, not a 429 to retry); the queue holds a whole batch.
ACTOR_REQUEST_TIMEOUT_S = 3600.0
MIN_QUEUE_REQUESTS = 256


class AppActor:
    """One Ray Data actor: the app with its lifespan on a private event loop thread."""

    def __init__(self, cfg: BatchConfig) -> None:
        from service.api.app import create_app  # in the actor: the driver needs no onnxruntime session
        from service.inprocess import started
        from service.ray_serve import with_actor_threads
        from service.settings import Settings

        self.cfg = cfg
        self.path = cfg.route
        self.params = query_params(cfg)
        settings = with_actor_threads(
            Settings(
                models_dir=cfg.models_dir,
                admission_control=False,
                request_timeout_s=ACTOR_REQUEST_TIMEOUT_S,
                max_queue_requests=max(MIN_QUEUE_REQUESTS, cfg.rows_per_batch),
            )
        )
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="app-loop", daemon=True)
        self.thread.start()
        self.stack = AsyncExitStack()
        self.local = self._run(self.stack.enter_async_context(started(create_app(settings), READY_WAIT_S)))

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    async def _one(self, index: int, row: dict[str, Any]) -> dict[str, Any]:
        record, body = start_record(self.cfg, index, row)
        if body is None:
            return record
        response = await self.local.request("POST", self.path, params=self.params, json=body)
        if response.status_code < 300:
            return answered_record(record, response.status_code, 1, response.json())
        return failed_record(record, response.status_code, 1, response.text[:ERROR_BODY_CHARS])

    async def _all(self, indices: list[int], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return list(await asyncio.gather(*(self._one(i, row) for i, row in zip(indices, rows, strict=True))))

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        indices = [int(i) for i in batch["index"]]
        rows = [json.loads(text) for text in batch["row"]]
        records = self._run(self._all(indices, rows))
        encoded = [json.dumps(r, ensure_ascii=False) for r in records]
        return {"index": np.asarray(indices, dtype=np.int64), "record": np.asarray(encoded, dtype=object)}

    def __del__(self) -> None:
        if self.loop.is_running():
            self._run(self.stack.aclose())
            self.loop.call_soon_threadsafe(self.loop.stop)


def face_routes() -> dict[str, tuple[str, ...]]:
    """Every task route the app serves and the body fields of one input at each: the face registry the
    app's GET /models reads, in-process (there is no server to ask)."""
    return {face.path: face.fields for face in FACES.values()}


def run_ray_batch(cfg: BatchConfig) -> Summary:
    """Process ``cfg.input_path`` into ``cfg.output_path`` on Ray; resumes from what is already there."""
    cfg = with_served_fields(cfg, face_routes())  # before any output is touched: an unknown route stops here
    # The HTTP engine's journal (rows it finished out of order) counts as written too.
    summary, done, recovered = prepare_output(cfg)
    items = [
        {"index": index, "row": json.dumps(row, ensure_ascii=False)}
        for index, row in enumerate(read_rows(cfg.input_path, cfg.input_format))
        if index >= done and index not in recovered
    ]
    usage = _UsageTotals()
    started = time.perf_counter()
    waiting = sorted(recovered.values(), key=lambda r: r["index"])  # merged back in index order
    bar = tqdm(total=summary.rows, initial=summary.resumed, unit="row", disable=not cfg.progress,
               dynamic_ncols=True, file=sys.stderr)  # fmt: skip
    owns_ray = not ray.is_initialized()
    if owns_ray:
        ray.init(address=cfg.ray_address, include_dashboard=False, log_to_driver=False)
    try:
        with cfg.output_path.open("a", encoding="utf-8") as out:
            try:
                for line in _records(cfg, items):
                    record = json.loads(line)
                    while waiting and waiting[0]["index"] < record["index"]:
                        out.write(json.dumps(waiting.pop(0), ensure_ascii=False) + "\n")
                    out.write(line + "\n")
                    tally(summary, usage, record)
                    bar.update(1)
                for record in waiting:
                    out.write(json.dumps(record, ensure_ascii=False) + "\n")
                out.flush()
                cfg.journal_path.unlink(missing_ok=True)
            except KeyboardInterrupt:
                summary.interrupted = True
    finally:
        bar.close()
        if owns_ray:
            ray.shutdown()
    summary.elapsed_s = time.perf_counter() - started
    summary.rows_per_s = summary.processed / summary.elapsed_s if summary.elapsed_s > 0 else 0.0
    usage.fill(summary)
    return summary


def _records(cfg: BatchConfig, items: list[dict[str, Any]]) -> Any:
    """The output lines (JSON records) in input order, one Ray batch at a time."""
    if not items:
        return
    context = ray.data.DataContext.get_current()
    context.execution_options.preserve_order = True  # the output is written in input order
    dataset = ray.data.from_items(items).map_batches(
        AppActor,
        fn_constructor_kwargs={"cfg": cfg},
        batch_size=cfg.rows_per_batch,
        batch_format="numpy",
        compute=ray.data.ActorPoolStrategy(size=cfg.actors),
        num_cpus=1,
    )
    for batch in dataset.iter_batches(batch_size=None, batch_format="numpy"):
        yield from (str(line) for line in batch["record"])
