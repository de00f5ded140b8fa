"""Batch client: send every row of a JSONL, CSV or Parquet file to one of the service's task routes.

    retention-batch reviews.csv predictions.jsonl --url http://localhost:8000 \\
        --endpoint classify --rho 0.3 --concurrency 8 --field text=review --id-field id

* ``--endpoint`` names any route the server serves (/classify, /qa, /summarize, /embed, a task added
  later): the client asks ``GET /models`` for the routes served and each one's input fields, and reads
  each field from the input column of its name unless ``--field KEY=COLUMN`` says otherwise.
* Bounded concurrency (``--concurrency`` requests in flight, httpx async, one connection pool).
* 429/502/503/504 and connection errors are retried; a ``Retry-After`` header is honoured.
* Output is JSON Lines in input order, one record per input row::

      {"index": 0, "id": "r1", "ok": true, "status": 200, "attempts": 1, "response": {...}}
      {"index": 1, "id": "r2", "ok": false, "status": 422, "attempts": 1, "error": "..."}

* Resumable: rerun the same command after an interruption (Ctrl-C, SIGTERM, a crash, a kill) and
  finished rows are not sent again. Rows that finished out of order are kept in
  ``OUTPUT.pending.jsonl`` until they can be written in order; that file is removed at the end.
* Ends with a summary: rows, throughput, errors, retries and the token work saved, read from the
  ``usage`` object of every response.
* ``--engine ray --models-dir DIR``: no server; the rows go through the same app in a Ray Data actor
  pool (``clients.ray_batch``), with the same output records, usage and resume.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import email.utils
import json
import os
import random
import signal
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx
from tqdm import tqdm

from clients.records import (
    ERROR_BODY_CHARS,
    RETRY_STATUSES,
    BatchConfig,
    OrderedWriter,
    Summary,
    _UsageTotals,
    answered_record,
    failed_record,
    prepare_output,
    query_params,
    read_rows,
    served_routes,
    start_record,
    tally,
    with_served_fields,
)
from clients.records import (
    load_resume_state as load_resume_state,  # re-exported: resume state is read through this module too
)
from retention_core.rho import parse_rho

# ------------------------------------------------------------------------------------------------ HTTP


def retry_after_seconds(value: str | None) -> float | None:
    """Parse a Retry-After header: delta-seconds or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


class Sender:
    def __init__(self, cfg: BatchConfig, client: httpx.AsyncClient, summary: Summary) -> None:
        self.cfg = cfg
        self.client = client
        self.summary = summary
        self.path = cfg.route
        self.params = query_params(cfg)
        headers: dict[str, str] = {}
        if cfg.api_key:
            if cfg.api_key_header.lower() == "authorization":
                headers["Authorization"] = f"Bearer {cfg.api_key}"
            else:
                headers[cfg.api_key_header] = cfg.api_key
        self.headers = headers

    def _wait(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(retry_after, self.cfg.max_retry_wait)
        backoff = min(self.cfg.max_retry_wait, 0.25 * 2**attempt)
        return backoff * (0.5 + random.random() / 2)

    async def models(self) -> dict[str, Any]:
        """The server's ``GET /models`` answer, retried as a row is (429/5xx, connection errors: the
        server may still be starting); a ValueError when it never answers 200."""
        attempt = 0
        while True:
            attempt += 1
            retry_after: float | None = None
            try:
                response = await self.client.get("/models", headers=self.headers)
            except httpx.TransportError as exc:
                failure = f"{type(exc).__name__}: {exc}"
            else:
                if response.status_code == 200:
                    listing: dict[str, Any] = response.json()
                    return listing
                failure = f"{response.status_code} {response.text[:ERROR_BODY_CHARS]}"
                if response.status_code not in RETRY_STATUSES:
                    raise ValueError(f"GET {self.cfg.url}/models answered {failure}")
                retry_after = retry_after_seconds(response.headers.get("retry-after"))
            if attempt > self.cfg.max_retries:
                raise ValueError(f"GET {self.cfg.url}/models failed: {failure}")
            await asyncio.sleep(self._wait(attempt, retry_after))

    async def send(self, index: int, row: dict[str, Any]) -> dict[str, Any]:
        record, body = start_record(self.cfg, index, row)
        if body is None:
            return record
        attempt = 0
        while True:
            attempt += 1
            error: str
            status: int | None = None
            retry_after: float | None = None
            try:
                response = await self.client.post(
                    self.path, params=self.params, json=body, headers=self.headers
                )
            except httpx.TransportError as exc:
                error = f"{type(exc).__name__}: {exc}"
            else:
                status = response.status_code
                if status < 300:
                    try:
                        payload = response.json()
                    except ValueError:
                        payload = response.text
                    return answered_record(record, status, attempt, payload)
                error = response.text[:ERROR_BODY_CHARS]
                if status == 429:
                    self.summary.throttled += 1
                retry_after = retry_after_seconds(response.headers.get("retry-after"))
                if status not in RETRY_STATUSES:
                    return failed_record(record, status, attempt, error)
            if attempt > self.cfg.max_retries:
                return failed_record(record, status, attempt, error)
            self.summary.retries += 1
            await asyncio.sleep(self._wait(attempt, retry_after))


async def served_fields(cfg: BatchConfig) -> BatchConfig:
    """``cfg`` with its route's input fields, from the server's ``GET /models`` (``with_served_fields``):
    the client keeps no table of routes, so it sends rows to a task added after it was written."""
    async with httpx.AsyncClient(base_url=cfg.url, timeout=cfg.timeout) as client:
        listing = await Sender(cfg, client, Summary()).models()
    return with_served_fields(cfg, served_routes(listing))


async def run_batch(cfg: BatchConfig) -> Summary:
    """Process ``cfg.input_path`` into ``cfg.output_path``; resumes from what is already there. The
    route is checked and its fields learnt before any output is touched."""
    cfg = await served_fields(cfg)
    summary, done, recovered = prepare_output(cfg)
    usage = _UsageTotals()
    window = max(4 * cfg.concurrency, 64)  # bounds the reorder buffer behind a slow row
    queue: asyncio.Queue[tuple[int, dict[str, Any]] | None] = asyncio.Queue(maxsize=2 * cfg.concurrency)
    started = time.perf_counter()
    finished = False
    bar = tqdm(
        total=summary.rows,
        initial=summary.resumed,
        unit="row",
        disable=not cfg.progress,
        dynamic_ncols=True,
        file=sys.stderr,
    )
    limits = httpx.Limits(max_connections=cfg.concurrency, max_keepalive_connections=cfg.concurrency)
    with cfg.output_path.open("a", encoding="utf-8") as out:
        writer = OrderedWriter(out, cfg.journal_path, done, {})
        try:
            for record in sorted(recovered.values(), key=lambda r: r["index"]):
                await writer.add(record, journaled=True)
            async with httpx.AsyncClient(base_url=cfg.url, timeout=cfg.timeout, limits=limits) as client:
                sender = Sender(cfg, client, summary)

                async def worker() -> None:
                    while (item := await queue.get()) is not None:
                        record = await sender.send(*item)
                        tally(summary, usage, record)
                        if not record["ok"]:
                            bar.set_postfix(errors=summary.errors, refresh=False)
                        await writer.add(record)
                        bar.update(1)

                workers = [asyncio.create_task(worker()) for _ in range(cfg.concurrency)]
                try:
                    for index, row in enumerate(read_rows(cfg.input_path, cfg.input_format)):
                        if index < done or index in recovered:
                            continue
                        await writer.wait_for_room(index, window)
                        await queue.put((index, row))
                    for _ in workers:
                        await queue.put(None)
                    await asyncio.gather(*workers)
                finally:
                    for task in workers:
                        task.cancel()
                    await asyncio.gather(*workers, return_exceptions=True)
            finished = True
        except asyncio.CancelledError:
            summary.interrupted = True
        finally:
            writer.close(finished)
            bar.close()
    summary.elapsed_s = time.perf_counter() - started
    summary.rows_per_s = summary.processed / summary.elapsed_s if summary.elapsed_s > 0 else 0.0
    usage.fill(summary)
    return summary


async def _run_cancellable(cfg: BatchConfig) -> Summary:
    """Run with SIGINT/SIGTERM turned into a clean cancellation (files flushed, summary printed)."""
    loop = asyncio.get_running_loop()
    task = asyncio.create_task(run_batch(cfg))
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, task.cancel)
    try:
        return await task
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)


# ------------------------------------------------------------------------------------------------- CLI


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def _rho(text: str) -> float | str:
    """--rho, read by the server's own rule (``retention_core.rho.parse_rho``: what its query takes)."""
    try:
        value = parse_rho(text, "rho", allow_auto=True)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    assert value is not None
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be >= 1")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="retention-batch",
        description="Send every row of a JSONL/CSV file to the retention service; resumable.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("input", type=Path, help="input file (.jsonl, .csv, .tsv or .parquet)")
    p.add_argument("output", type=Path, help="output JSONL, one record per input row, in input order")
    p.add_argument("--url", default=os.environ.get("RETENTION_URL", "http://127.0.0.1:8000"))
    p.add_argument(
        "--endpoint",
        default="classify",
        help="the route rows are posted to (classify, qa, summarize, embed, or any other the server's "
        "GET /models lists)",
    )
    p.add_argument(
        "--rho", type=_rho, default=None, help="retention budget in (0, 1] or 'auto'; default: the model's"
    )
    p.add_argument("--model", default=None, help="model name; default: the endpoint's default model")
    p.add_argument("--concurrency", type=_positive_int, default=8, help="requests in flight")
    p.add_argument(
        "--api-key", default=os.environ.get("RETENTION_API_KEY"), help="default: $RETENTION_API_KEY"
    )
    p.add_argument(
        "--api-key-header",
        default="Authorization",
        help="header carrying the key ('Authorization' sends 'Bearer KEY', any other name the raw key)",
    )
    p.add_argument(
        "--field",
        action="append",
        type=_key_value,
        default=[],
        metavar="KEY=COLUMN",
        help="request body KEY read from input COLUMN (default: each input field the server lists for "
        "the route in GET /models, read from the column of its name: text=text; qa question=question "
        "context=context); repeatable",
    )
    p.add_argument(
        "--const",
        action="append",
        type=_key_value,
        default=[],
        metavar="KEY=JSON",
        help="constant request body field (value parsed as JSON, else a string); repeatable",
    )
    p.add_argument(
        "--param",
        action="append",
        type=_key_value,
        default=[],
        metavar="KEY=VALUE",
        help="extra query parameter; repeatable",
    )
    p.add_argument("--id-field", default=None, help="input column copied to each output record as 'id'")
    p.add_argument("--input-format", choices=("auto", "jsonl", "csv", "tsv", "parquet"), default="auto")
    p.add_argument("--max-retries", type=int, default=8, help="retries per row (429/5xx/connection)")
    p.add_argument("--max-retry-wait", type=float, default=60.0, help="cap on one wait, seconds")
    p.add_argument("--timeout", type=float, default=60.0, help="per-request timeout, seconds")
    p.add_argument("--overwrite", action="store_true", help="start over instead of resuming")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--summary-json", type=Path, default=None, help="also write the summary here")
    ray = p.add_argument_group("engine ray (no server: the app in a Ray Data actor pool; pip install .[ray])")
    ray.add_argument("--engine", choices=("http", "ray"), default="http")
    ray.add_argument(
        "--models-dir",
        type=Path,
        default=Path(os.environ.get("RETENTION_MODELS_DIR", "models")),
        help="models root, a path every Ray node sees (default: $RETENTION_MODELS_DIR or models)",
    )
    ray.add_argument(
        "--ray-address", default=None, help="Ray cluster ('auto': the running one); default local"
    )
    ray.add_argument("--actors", type=_positive_int, default=2, help="actors, one ONNX session set each")
    ray.add_argument("--rows-per-batch", type=_positive_int, default=256, help="rows per actor call")
    return p


def _json_or_str(value: str) -> Any:
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


def parse_args(argv: list[str] | None = None) -> BatchConfig:
    args = build_parser().parse_args(argv)
    return BatchConfig(
        input_path=args.input,
        output_path=args.output,
        url=args.url.rstrip("/"),
        endpoint=args.endpoint,
        rho=args.rho,
        model=args.model,
        concurrency=args.concurrency,
        api_key=args.api_key or None,
        api_key_header=args.api_key_header,
        fields=dict(args.field),
        constants={k: _json_or_str(v) for k, v in args.const},
        params=dict(args.param),
        id_field=args.id_field,
        input_format=args.input_format,
        max_retries=args.max_retries,
        max_retry_wait=args.max_retry_wait,
        timeout=args.timeout,
        progress=not args.no_progress,
        overwrite=args.overwrite,
        summary_json=args.summary_json,
        engine=args.engine,
        models_dir=args.models_dir,
        ray_address=args.ray_address,
        actors=args.actors,
        rows_per_batch=args.rows_per_batch,
    )


def main(argv: list[str] | None = None) -> int:
    """Console entry point ``retention-batch``. Exit 0: all rows ok; 1: some rows failed;
    2: bad input; 130: interrupted (rerun to resume)."""
    cfg = parse_args(argv)
    if not cfg.input_path.is_file():
        print(f"retention-batch: no such input file: {cfg.input_path}", file=sys.stderr)
        return 2
    try:
        if cfg.engine == "ray":
            from clients.ray_batch import run_ray_batch  # imports ray: only with the 'ray' extra

            summary = run_ray_batch(cfg)
        else:
            summary = asyncio.run(_run_cancellable(cfg))
    except ValueError as exc:
        print(f"retention-batch: {exc}", file=sys.stderr)
        return 2
    for line in summary.lines():
        print(line, file=sys.stderr)
    if cfg.summary_json is not None:
        cfg.summary_json.write_text(json.dumps(asdict(summary), indent=2) + "\n", encoding="utf-8")
    if summary.interrupted:
        return 130
    return 1 if summary.errors else 0


if __name__ == "__main__":
    sys.exit(main())
