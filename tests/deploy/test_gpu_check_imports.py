"""The GPU check's import check of what a device call carries (``scripts/gpu_check.sh imports``, the
installed phase ``run`` records): every top-level module of every distribution installed into the
carried site, and sentence-transformers (the image's) under whatever transformers then shadows the
image's. Real distributions laid out as pip installs them, the real script, this venv as the image."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_check.sh"
IMPORTS_TIMEOUT_S = 240  # the code path and sentence-transformers import torch and transformers


def install(site: Path, name: str, source: str) -> None:
    """A one-module distribution in ``site`` as ``pip install --target`` lays it out."""
    (site / name).mkdir(parents=True)
    (site / name / "__init__.py").write_text(source)
    info = site / f"{name}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: 1.0\n")
    (info / "top_level.txt").write_text(f"{name}\n")
    (info / "RECORD").write_text(f"{name}/__init__.py,,\n{info.name}/METADATA,,\n")


def check_imports(site: Path, report: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "GPU_CHECK_SITE": str(site),
        "GPU_CHECK_DIR": str(site.parent / "carried"),
        "GPU_CHECK_WHEELS": "good-pkg",
        "PYTHON": sys.executable,
        "OMP_NUM_THREADS": "1",
    }
    return subprocess.run(
        ["bash", str(SCRIPT), "imports", str(report)],
        env=env,
        capture_output=True,
        text=True,
        timeout=IMPORTS_TIMEOUT_S,
        check=False,
    )


def test_the_carried_sets_imports_and_sentence_transformers_are_checked(tmp_path: Path) -> None:
    site, report = tmp_path / "site", tmp_path / "image.json"
    install(site, "good_pkg", "VALUE = 1\n")
    passed = check_imports(site, report)
    assert passed.returncode == 0, (passed.stdout[-2000:], passed.stderr[-2000:])
    installed = json.loads(report.read_text())["installed"]
    assert installed["imports"] == "ok"
    assert installed["carried_imports"] == {
        "good-pkg": {"version": "1.0", "modules": {"good_pkg": {"ok": True, "from": "carried"}}}
    }
    peer = installed["sentence_transformers"]
    assert peer["ok"] and peer["version"] and peer["transformers"]
    assert peer["transformers_from"] == "image"  # nothing carried shadows it here

    # a carried module that cannot import on the image fails the check, by name
    install(site, "broken_pkg", "raise ImportError('libfoo.so.1: cannot open shared object file')\n")
    failed = check_imports(site, report)
    assert failed.returncode == 1
    installed = json.loads(report.read_text())["installed"]
    assert installed["imports"].startswith("failed: broken_pkg (broken-pkg): ImportError: libfoo.so.1")
    assert installed["carried_imports"]["broken-pkg"]["modules"]["broken_pkg"]["ok"] is False
    assert installed["carried_imports"]["good-pkg"]["modules"]["good_pkg"]["ok"] is True
