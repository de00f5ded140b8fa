"""What a load cell of ``benchmarks.gpu_service`` (``benchmarks.load.Cell``) may hold on any machine, loaded
or not: shared by its own dry-run tests and the device script's (scripts/gpu_check.sh)."""

from __future__ import annotations

import json
from typing import Any

from benchmarks.gpu_service import OURS

OK = "200"
SHED = "429"  # the service's overload answer: admission refused the request before computing it
AUTO = "auto"


def assert_answered_or_shed(cell: dict[str, Any]) -> None:
    """Requests were answered, and the only ones that were not are our server's rho=auto refusals (429).
    rho=auto sheds what it predicts it cannot serve within its latency target, so how many depends on the
    machine's load: the count is not asserted, only its kind. A fixed ρ is shed only past the 30 s request
    deadline and the peer has no admission, so neither may refuse; a 5xx or a connection error never."""
    shed = cell["status"].get(SHED, 0) if cell["target"] == OURS and cell["rho"] == AUTO else 0
    assert cell["ok"] > 0 and cell["ok"] + shed == cell["sent"], json.dumps(cell)
    assert cell["errors"] == shed and set(cell["status"]) <= {OK, SHED}, json.dumps(cell)
