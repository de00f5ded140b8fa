"""The Python floor that pyproject.toml declares is one the service's code actually runs correctly on.

``service/scheduling/batcher.py`` catches the builtin ``TimeoutError`` around ``asyncio.wait_for``.
Only from Python 3.11 on is ``asyncio.TimeoutError`` that builtin; on 3.10 a request past its deadline
would escape as a 500 instead of a 504. ``tests/service/test_batching.py``
(``test_deadline_is_504_once_running_and_a_late_shed_429_while_queued``) checks the 504 through the real
app, on this interpreter; these tests keep the declared floor (and the linters' targets) from drifting
below the version that test assumes.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FLOOR = (3, 11)


def declared() -> dict[str, object]:
    with (REPO / "pyproject.toml").open("rb") as handle:
        return tomllib.load(handle)


def minimum_python(requires: str) -> tuple[int, int]:
    """``">=3.11"`` → (3, 11); anything but a plain lower bound is rejected, so it cannot hide a 3.10."""
    match = re.fullmatch(r">=\s*(\d+)\.(\d+)", requires.strip())
    assert match, f"requires-python should be a plain '>=X.Y' floor, got {requires!r}"
    return int(match.group(1)), int(match.group(2))


def test_requires_python_is_at_least_the_floor_the_code_assumes() -> None:
    project = declared()["project"]
    assert isinstance(project, dict)
    assert minimum_python(str(project["requires-python"])) >= FLOOR


def test_linters_target_the_declared_floor() -> None:
    config = declared()
    project, tools = config["project"], config["tool"]
    assert isinstance(project, dict) and isinstance(tools, dict)
    major, minor = minimum_python(str(project["requires-python"]))
    assert tools["ruff"]["target-version"] == f"py{major}{minor}"
    assert tools["mypy"]["python_version"] == f"{major}.{minor}"
