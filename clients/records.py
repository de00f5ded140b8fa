"""What a batch run reads and writes, whatever its engine (``clients.batch`` over HTTP, ``clients.ray_batch``
in Ray Data): its configuration, the input rows, the output records in input order, resume state and
the summary. Neither engine is imported here, so both import this and never each other."""

from __future__ import annotations

import asyncio
import csv
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

# route ("/classify") -> the request body fields of one input (("question", "context")). Neither engine
# keeps a table of its own: the HTTP engine reads it from the server's GET /models (``served_routes``),
# the Ray engine from the app's face registry, which /models lists.
Routes = Mapping[str, tuple[str, ...]]
RETRY_STATUSES = frozenset({429, 502, 503, 504})
ERROR_BODY_CHARS = 500


@dataclass
class BatchConfig:
    input_path: Path
    output_path: Path
    url: str = "http://127.0.0.1:8000"
    endpoint: str = "classify"  # any route the server serves: "classify" or "/classify"
    rho: float | str | None = None  # a float in (0, 1] or 'auto'
    model: str | None = None
    concurrency: int = 8
    api_key: str | None = None
    api_key_header: str = "Authorization"
    # request body key -> input column: ``--field KEY=COLUMN`` entries, then (``with_served_fields``)
    # the route's own input fields, each read from the column of its name
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

    @property
    def route(self) -> str:
        """The path every row is posted to: "classify" and "/classify" both name "/classify"."""
        return "/" + self.endpoint.strip("/")

    def body_fields(self) -> dict[str, str]:
        return dict(self.fields)


def served_routes(listing: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
    """The routes a server's ``GET /models`` answer lists (one per loaded model's task) and the body
    fields of one input at each."""
    models = listing.get("models") or []
    return {str(m["route"]): tuple(m.get("fields") or ()) for m in models if m.get("route")}


def with_served_fields(cfg: BatchConfig, routes: Routes) -> BatchConfig:
    """``cfg`` with the body fields of its route: each of the route's input fields read from the column
    of its name, unless ``--field`` maps it. A ValueError, before any row is sent, when nothing is
    served at the route: every row would fail the same way."""
    if cfg.route not in routes:
        served = ", ".join(sorted(routes)) or "none"
        raise ValueError(f"nothing is served at {cfg.route} (the routes served: {served})")
    return replace(cfg, fields={**{name: name for name in routes[cfg.route]}, **cfg.fields})


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


# ---------------------------------------------------------------------------------------------- resume


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
