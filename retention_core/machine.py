"""The machine a number was measured on: CPU model, cores, library versions and the git commit.

Torch-free (versions come from package metadata), so training results, the benchmarks, the load
client and the serving install all record it the same way.
"""

from __future__ import annotations

import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

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
