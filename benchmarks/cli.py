"""What every benchmark's command line ends with: record the command, write the JSON and its table,
print the table."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.machine import write_result

Payload = dict[str, Any]


def publish(
    payload: Payload, markdown: Callable[[Payload], str], out: Path, module: str, argv: list[str]
) -> None:
    """Record the command in the payload, write it and its table (``write_result``), print the table."""
    payload["command"] = f"python -m {module} " + " ".join(argv)
    table = markdown(payload)
    write_result(out, payload, table)
    print(table)
