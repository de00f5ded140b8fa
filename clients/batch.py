"""Batch client: send every row of a JSONL, CSV or Parquet file to /classify, /qa, /summarize or /embed.

    retention-batch reviews.csv predictions.jsonl --url http://localhost:8000 \\
        --endpoint classify --rho 0.3 --concurrency 8 --field text=review --id-field id

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
import csv
import email.utils
import json
import os
import random
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx
from tqdm import tqdm

from retention_core.rho import parse_rho

ENDPOINTS = ("classify", "qa", "summarize", "embed")
# request body key -> input column, per endpoint; ``--field KEY=COLUMN`` overrides one entry.
DEFAULT_FIELDS: dict[str, dict[str, str]] = {
    "classify": {"text": "text"},
    "qa": {"question": "question", "context": "context"},
    "summarize": {"text": "text"},
    "embed": {"text": "text"},
}
RETRY_STATUSES = frozenset({429, 502, 503, 504})
ERROR_BODY_CHARS = 500


@dataclass
class BatchConfig:
    input_path: Path
    output_path: Path
    url: str = "http://127.0.0.1:8000"
    endpoint: str = "classify"
    rho: float | str | None = None  # a float in (0, 1] or 'auto'
    model: str | None = None
    concurrency: int = 8
    api_key: str | None = None
    api_key_header: str = "Authorization"
    fields: dict[str, str] = field(default_factory=dict)
    constants: dict[str, Any] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)
    id_field: str | None = None
    input_format: str = "auto"
    max_retries: int = 8
    max_retry_wait: float = 60.0
    timeout: float = 60.0
    progress: bool = True
    overwrite: bool = False
    summary_json: Path | None = None
    engine: str = "http"  # 'ray': clients.ray_batch, the app in a Ray Data actor pool
    models_dir: Path = Path("models")  # engine ray: a path every Ray node sees
    ray_address: str | None = None  # engine ray: None starts a local Ray; 'auto' joins a running one
    actors: int = 2  # engine ray: actors in the pool, one ONNX Runtime session set each
    rows_per_batch: int = 256  # engine ray: rows per map_batches call (the app batches them by tokens)

    @property
    def journal_path(self) -> Path:
        return self.output_path.with_name(self.output_path.name + ".pending.jsonl")

    def body_fields(self) -> dict[str, str]:
        return {**DEFAULT_FIELDS[self.endpoint], **self.fields}


@dataclass
class Summary:
    rows: int = 0  # rows in the input
    resumed: int = 0  # finished in an earlier run, not sent again
    processed: int = 0  # finished in this run
    ok: int = 0
    errors: int = 0
    retries: int = 0
    throttled: int = 0  # 429 answers received (each one retried or counted as an error)
    elapsed_s: float = 0.0
    rows_per_s: float = 0.0
    input_tokens: int = 0  # summed over successful rows of this run that reported usage
    token_work_saved: float | None = None  # 1 - sum(fraction * processed) / sum(processed tokens)
    mean_rho_requested: float | None = None
    mean_rho_effective: float | None = None
    degraded: int = 0
    truncated: int = 0
    interrupted: bool = False
    error_statuses: dict[str, int] = field(default_factory=dict)

    def lines(self) -> list[str]:
        out = [
            f"rows: {self.rows} (finished this run {self.processed}, resumed {self.resumed}),"
            f" ok {self.ok}, errors {self.errors}",
            f"time: {self.elapsed_s:.1f} s, throughput {self.rows_per_s:.1f} rows/s,"
            f" retries {self.retries} (429: {self.throttled})",
        ]
        if self.error_statuses:
            statuses = ", ".join(f"{k}: {v}" for k, v in sorted(self.error_statuses.items()))
            out.append(f"errors by status: {statuses}")
        if self.token_work_saved is not None:
            out.append(
                f"token work saved: {100 * self.token_work_saved:.1f}% over {self.input_tokens} input tokens"
                f" (rho requested {_fmt(self.mean_rho_requested)}, effective {_fmt(self.mean_rho_effective)};"
                f" degraded {self.degraded}, truncated {self.truncated})"
            )
        elif self.processed == 0:
            out.append("nothing left to do: every row was finished by an earlier run")
        else:
            out.append("token work saved: n/a (no usage reported)")
        if self.interrupted:
            out.append("interrupted: rerun the same command to resume")
        return out


def tally(summary: Summary, usage: _UsageTotals, record: dict[str, Any]) -> None:
    """Count one finished record (either engine)."""
    if record["ok"]:
        summary.ok += 1
        usage.add(record["response"])
    else:
        summary.errors += 1
        key = str(record["status"]) if record["status"] is not None else "none"
        summary.error_statuses[key] = summary.error_statuses.get(key, 0) + 1
    summary.processed += 1


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


class _UsageTotals:
    def __init__(self) -> None:
        self.tokens = 0
        self.weight = 0.0
        self.work = 0.0
        self.rho_req: list[float] = []
        self.rho_eff: list[float] = []
        self.degraded = 0
        self.truncated = 0

    def add(self, response: Any) -> None:
        usage = response.get("usage") if isinstance(response, dict) else None
        if not isinstance(usage, dict):
            return
        tokens = usage.get("input_tokens")
        if isinstance(tokens, int | float):
            self.tokens += int(tokens)
        # token_work_fraction is relative to the dense work on the tokens that entered the encoder
        weight = usage.get("processed_tokens", tokens)
        fraction = usage.get("token_work_fraction")
        if isinstance(weight, int | float) and isinstance(fraction, int | float):
            self.weight += float(weight)
            self.work += float(fraction) * float(weight)
        if isinstance(usage.get("rho_requested"), int | float):
            self.rho_req.append(float(usage["rho_requested"]))
        if isinstance(usage.get("rho_effective"), int | float):
            self.rho_eff.append(float(usage["rho_effective"]))
        self.degraded += bool(usage.get("degraded"))
        self.truncated += bool(usage.get("truncated"))

    def fill(self, summary: Summary) -> None:
        summary.input_tokens = self.tokens
        summary.token_work_saved = 1.0 - self.work / self.weight if self.weight else None
        summary.mean_rho_requested = sum(self.rho_req) / len(self.rho_req) if self.rho_req else None
        summary.mean_rho_effective = sum(self.rho_eff) / len(self.rho_eff) if self.rho_eff else None
        summary.degraded = self.degraded
        summary.truncated = self.truncated


# ----------------------------------------------------------------------------------------------- input


def detect_format(path: Path, fmt: str) -> str:
    if fmt != "auto":
        return fmt
    suffixes = [s.lower() for s in path.suffixes]
    if ".parquet" in suffixes:
        return "parquet"
    if ".csv" in suffixes or ".tsv" in suffixes:
        return "tsv" if ".tsv" in suffixes else "csv"
    return "jsonl"


def read_rows(path: Path, fmt: str) -> Iterator[dict[str, Any]]:
    """Yield input rows as dicts (JSONL: one object a line, blank lines ignored; CSV/TSV: header row)."""
    fmt = detect_format(path, fmt)
    if fmt == "parquet":
        import pyarrow.parquet as pq  # the 'ray' extra brings pyarrow; only Parquet input needs it

        for batch in pq.ParquetFile(path).iter_batches():
            yield from batch.to_pylist()
        return
    with path.open(encoding="utf-8", newline="") as f:
        if fmt in ("csv", "tsv"):
            yield from csv.DictReader(f, delimiter="\t" if fmt == "tsv" else ",")
            return
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: not JSON: {exc}") from exc
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
            yield row


def count_rows(path: Path, fmt: str) -> int:
    if detect_format(path, fmt) == "parquet":
        import pyarrow.parquet as pq

        return int(pq.ParquetFile(path).metadata.num_rows)
    return sum(1 for _ in read_rows(path, fmt))


def query_params(cfg: BatchConfig) -> dict[str, str]:
    """The query string of every request: ``--param`` entries, then rho and model."""
    params: dict[str, str] = dict(cfg.params)
    if cfg.rho is not None:
        params["rho"] = str(cfg.rho)
    if cfg.model is not None:
        params["model"] = cfg.model
    return params


def start_record(cfg: BatchConfig, index: int, row: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """The record's index/id and the request body; the body is None when the row lacks a column (the
    record is then finished: an error with no status)."""
    record: dict[str, Any] = {"index": index}
    if cfg.id_field is not None:
        record["id"] = row.get(cfg.id_field)
    try:
        return record, build_body(row, cfg.body_fields(), cfg.constants)
    except KeyError as exc:
        record.update(ok=False, status=None, attempts=0, error=str(exc.args[0]))
        return record, None


def answered_record(record: dict[str, Any], status: int, attempts: int, payload: Any) -> dict[str, Any]:
    return {**record, "ok": True, "status": status, "attempts": attempts, "response": payload}


def failed_record(record: dict[str, Any], status: int | None, attempts: int, error: str) -> dict[str, Any]:
    return {**record, "ok": False, "status": status, "attempts": attempts, "error": error}


def build_body(row: dict[str, Any], fields: dict[str, str], constants: dict[str, Any]) -> dict[str, Any]:
    missing = [column for column in fields.values() if column not in row]
    if missing:
        raise KeyError(f"input row has no column {', '.join(map(repr, missing))}")
    return {**constants, **{key: row[column] for key, column in fields.items()}}


# ---------------------------------------------------------------------------------------------- resume


def load_resume_state(output: Path, journal: Path) -> tuple[int, dict[int, dict[str, Any]]]:
    """Rows already finished: the in-order prefix of ``output`` and the out-of-order journal.

    A torn last line (the process died while writing it) is cut off, so appending stays valid JSONL.
    """
    done = 0
    if output.exists():
        good_bytes = 0
        with output.open("rb") as f:
            for raw in f:
                try:
                    record = json.loads(raw)
                except (json.JSONDecodeError, UnicodeDecodeError):
                    break
                if not raw.endswith(b"\n") or not isinstance(record, dict) or record.get("index") != done:
                    break
                done += 1
                good_bytes += len(raw)
        if good_bytes != output.stat().st_size:
            with output.open("rb+") as f:
                f.truncate(good_bytes)
    recovered: dict[int, dict[str, Any]] = {}
    if journal.exists():
        with journal.open("rb") as f:
            for raw in f:
                try:
                    record = json.loads(raw)
                except (json.JSONDecodeError, UnicodeDecodeError):
                    continue
                index = record.get("index") if isinstance(record, dict) else None
                if isinstance(index, int) and index >= done:
                    recovered[index] = record
    return done, recovered


class OrderedWriter:
    """Writes records in index order; records that finish early wait in memory and in the journal."""

    def __init__(
        self, out: IO[str], journal_path: Path, next_index: int, recovered: dict[int, dict[str, Any]]
    ) -> None:
        self.out = out
        self.journal_path = journal_path
        self.journal: IO[str] | None = None
        self.next_index = next_index
        self.buffer: dict[int, dict[str, Any]] = dict(recovered)
        self.advanced = asyncio.Condition()

    async def add(self, record: dict[str, Any], journaled: bool = False) -> None:
        index = record["index"]
        if index != self.next_index:
            self.buffer[index] = record
            if not journaled:
                if self.journal is None:
                    self.journal = self.journal_path.open("a", encoding="utf-8")
                self.journal.write(json.dumps(record, ensure_ascii=False) + "\n")
                self.journal.flush()
            return
        self.out.write(json.dumps(record, ensure_ascii=False) + "\n")
        self.next_index += 1
        while self.next_index in self.buffer:
            self.out.write(json.dumps(self.buffer.pop(self.next_index), ensure_ascii=False) + "\n")
            self.next_index += 1
        self.out.flush()
        async with self.advanced:
            self.advanced.notify_all()

    async def wait_for_room(self, index: int, window: int) -> None:
        async with self.advanced:
            await self.advanced.wait_for(lambda: index < self.next_index + window)

    def close(self, finished: bool) -> None:
        if self.journal is not None:
            self.journal.close()
        if finished and not self.buffer:
            self.journal_path.unlink(missing_ok=True)


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
        self.path = "/" + cfg.endpoint.strip("/")
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


# ------------------------------------------------------------------------------------------------- run


def prepare_output(cfg: BatchConfig) -> tuple[Summary, int, dict[int, dict[str, Any]]]:
    """Start or resume a run, whatever its engine: the output (and journal) cleared with ``overwrite``,
    then what is already written — rows ``done`` in order, ``recovered`` out of order in the journal —
    counted into a new summary."""
    summary = Summary()
    if cfg.overwrite:
        cfg.output_path.unlink(missing_ok=True)
        cfg.journal_path.unlink(missing_ok=True)
    cfg.output_path.parent.mkdir(parents=True, exist_ok=True)
    done, recovered = load_resume_state(cfg.output_path, cfg.journal_path)
    summary.rows = count_rows(cfg.input_path, cfg.input_format)
    summary.resumed = min(done + len(recovered), summary.rows)
    return summary, done, recovered


async def run_batch(cfg: BatchConfig) -> Summary:
    """Process ``cfg.input_path`` into ``cfg.output_path``; resumes from what is already there."""
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
    """--rho, read by the server's own rule (``service.rho.parse_rho``: what its query parameter takes)."""
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
    p.add_argument("--endpoint", choices=ENDPOINTS, default="classify")
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
        help="request body KEY read from input COLUMN (defaults: classify/summarize text=text,"
        " qa question=question context=context); repeatable",
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
