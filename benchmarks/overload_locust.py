"""The locustfile of ``benchmarks/overload.py`` (run by it: ``locust -f benchmarks/overload_locust.py
--headless -u 1 ...``); not a module to import.

One locust user drives the whole load:

- ``OVERLOAD_MODE=open``: open-loop arrivals, ``OVERLOAD_RATE`` requests/s for ``OVERLOAD_SECONDS``
  regardless of responses (each arrival is its own greenlet, so a slow answer never delays the next
  send). Latency counts from the scheduled arrival, so a client-side delay is charged to the server
  (no coordinated omission).
- ``OVERLOAD_MODE=closed``: ``OVERLOAD_CONCURRENCY`` greenlets send back to back (capacity probe); with
  ``OVERLOAD_RETRY_DELAY_S`` a refused one retries its body after that delay (a retry storm).

Every request becomes one JSON line in ``OVERLOAD_OUT``: its offset, latency (from the scheduled
arrival), status, Retry-After, served rho and rho_reason. Bodies: ``OVERLOAD_BODIES`` (a JSON file: a list
of request bodies), sent in turn to ``OVERLOAD_PATH`` (path and query, e.g. ``/classify?rho=auto``).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import gevent
from locust import FastHttpUser, constant, task

MODE = os.environ.get("OVERLOAD_MODE", "open")
RATE = float(os.environ.get("OVERLOAD_RATE", "1"))
SECONDS = float(os.environ.get("OVERLOAD_SECONDS", "5"))
CONCURRENCY = int(os.environ.get("OVERLOAD_CONCURRENCY", "16"))
PATH = os.environ.get("OVERLOAD_PATH", "/classify?rho=1")
OUT = os.environ.get("OVERLOAD_OUT", "overload.jsonl")
BODIES: list[dict[str, Any]] = json.loads(open(os.environ["OVERLOAD_BODIES"]).read())  # noqa: SIM115
GRACE_S = float(os.environ.get("OVERLOAD_GRACE_S", "35"))  # wait this long for answers after the last send
# Closed loop: a client refused (429) sends the same body again after this many seconds, whatever the
# Retry-After (the retry storm of benchmarks/retry_storm.py); unset: it moves on to its next body.
RETRY_DELAY_TEXT = os.environ.get("OVERLOAD_RETRY_DELAY_S", "")
RETRY_DELAY_S = float(RETRY_DELAY_TEXT) if RETRY_DELAY_TEXT else None


class Driver(FastHttpUser):
    wait_time = constant(3600)
    concurrency = 4096  # connections the client may open: never the bottleneck of an open loop
    network_timeout = 60.0
    connection_timeout = 10.0

    def one(self, index: int, scheduled: float, origin: float, sink: list[dict[str, Any]]) -> dict[str, Any]:
        record: dict[str, Any] = {"at_s": scheduled - origin, "send_lag_s": time.monotonic() - scheduled}
        try:
            with self.client.post(
                PATH, json=BODIES[index % len(BODIES)], name=PATH, catch_response=True
            ) as response:
                record["status"] = response.status_code
                record["latency_s"] = time.monotonic() - scheduled
                record["retry_after"] = response.headers.get("retry-after")
                if response.status_code == 200:
                    usage = response.json().get("usage", {})
                    record["rho"] = usage.get("rho_effective")
                    record["rho_reason"] = usage.get("rho_reason")
                    # the batcher's share of the latency (the rest: HTTP, tokenizing, decoding, the client)
                    record["queue_s"] = float(response.headers.get("x-queue-time") or 0.0)
                    record["inference_s"] = float(response.headers.get("x-inference-time") or 0.0)
                response.success()  # 429s are an outcome here, not a locust failure
        except Exception as exc:  # connection refused / reset: recorded as status 0
            record.update(status=0, latency_s=time.monotonic() - scheduled, error=type(exc).__name__)
        sink.append(record)
        return record

    @task
    def drive(self) -> None:
        sink: list[dict[str, Any]] = []
        origin = time.monotonic()
        greenlets = []
        if MODE == "open":
            index = 0
            while True:
                scheduled = origin + index / RATE
                if scheduled - origin >= SECONDS:
                    break
                gevent.sleep(max(0.0, scheduled - time.monotonic()))
                greenlets.append(gevent.spawn(self.one, index, scheduled, origin, sink))
                index += 1
        else:
            greenlets = [
                gevent.spawn(self.closed_loop, worker, origin, sink) for worker in range(CONCURRENCY)
            ]
        gevent.joinall(greenlets, timeout=SECONDS + GRACE_S)
        with open(OUT, "w", encoding="utf-8") as out:
            for record in sink:
                out.write(json.dumps(record) + "\n")
        self.environment.runner.quit()

    def closed_loop(self, worker: int, origin: float, sink: list[dict[str, Any]]) -> None:
        index = worker
        while time.monotonic() - origin < SECONDS:
            record = self.one(index, time.monotonic(), origin, sink)
            if RETRY_DELAY_S is not None and record["status"] == 429:
                gevent.sleep(RETRY_DELAY_S)  # the same body again, Retry-After ignored
                continue
            index += CONCURRENCY
