"""Benchmark results on disk: raw JSON and its markdown table, with the machine they ran on.

``describe`` (the machine) lives in ``retention_core.machine`` so training results record it too; it is
imported here for the benchmark modules that record it beside their results.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from retention_core.machine import describe

__all__ = ["describe", "write_result"]


def write_result(out: Path, payload: dict[str, Any], table: str) -> None:
    """Raw JSON at ``out`` and its markdown table beside it (``out`` with ``.md``)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    out.with_suffix(".md").write_text(table, encoding="utf-8")
