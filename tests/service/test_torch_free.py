"""The serving process never imports torch (nor training modules other than retention_core.contract)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CHECK = """
import sys
import service.__main__, service.api.app, service.server, service.scheduling.batcher, service.runtime
from service.api.app import create_app
create_app()
bad = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.") or m == "transformers"
             or (m.startswith("training.") and m != "retention_core.contract"))
print(bad)
sys.exit(1 if bad else 0)
"""


def test_service_imports_no_torch() -> None:
    result = subprocess.run(
        [sys.executable, "-c", CHECK], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
