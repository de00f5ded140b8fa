"""The machine a number was measured on: CPU model, cores, library versions and the git commit.

Torch-free (versions come from package metadata), so the load client and the serving install can
record it too.
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
    result = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return result.stdout.strip()


def describe() -> dict[str, object]:
    versions = {name: version for name in LIBRARIES if (version := library_version(name))}
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        **versions,
        "commit": git_commit(),
    }
