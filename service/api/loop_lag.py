"""Event-loop lag: how late the loop runs a timer it was asked to run ``PROBE_INTERVAL_S`` from now.

One event loop parses every request, runs admission, hands batches to the model's thread and sends every
answer; when it is saturated (a retry storm parsing thousands of requests a second on one core) every
one of those waits, and neither the batcher's queue time nor the request latency says why. The probe
is one timer per interval (no thread, no CPU worth counting) and feeds
``retention_event_loop_lag_seconds``.
"""

from __future__ import annotations

import asyncio

from prometheus_client import Histogram

PROBE_INTERVAL_S = 0.1


async def probe_loop_lag(histogram: Histogram, interval_s: float = PROBE_INTERVAL_S) -> None:
    """Forever (until cancelled): sleep ``interval_s`` and observe how much later than that it woke."""
    loop = asyncio.get_running_loop()
    while True:
        asked = loop.time() + interval_s
        await asyncio.sleep(interval_s)
        histogram.observe(max(0.0, loop.time() - asked))
