"""The machine a number was measured on: CPU model, cores, library versions and the git commit.

Torch-free (versions come from package metadata), so the load client and the serving install can
record it too.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

LIBRARIES = ("onnxruntime", "torch", "transformers", "tokenizers")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def library_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def git_commit() -> str:
    """The checkout's short commit; ``GIT_COMMIT`` where the tree travelled without its .git."""
    try:
        result = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    except OSError:  # no git on this machine
        return os.environ.get("GIT_COMMIT", "")
    return result.stdout.strip() or os.environ.get("GIT_COMMIT", "")


def describe() -> dict[str, object]:
    versions = {name: version for name in LIBRARIES if (version := library_version(name))}
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        **versions,
        "commit": git_commit(),
    }


def write_result(out: Path, payload: dict[str, Any], table: str) -> None:
    """Raw JSON at ``out`` and its markdown table beside it (``out`` with ``.md``)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    out.with_suffix(".md").write_text(table, encoding="utf-8")
