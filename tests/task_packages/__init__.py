"""Task packages of the tests, shaped as the shipped ones (``retention_tasks/<name>/``: ``spec.py``,
``training.py``, ``face.py``) and enabled the way any task is: by the one list of task packages, here
its ``$RETENTION_TASKS`` part (``retention_core.tasks.task_packages``). No test registers a task."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from retention_core.tasks import TASKS_VARIABLE

PARITY = "tests.task_packages.toy_parity"
RERANK = "tests.task_packages.toy_rerank"
RERANK_LABEL_FREE = "tests.task_packages.toy_rerank_label_free"


@contextmanager
def listed(*packages: str) -> Iterator[None]:
    """``packages`` on the list of tasks (``$RETENTION_TASKS``) meanwhile, and off it afterwards: every
    registry holds their tasks, then none does."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(TASKS_VARIABLE, ",".join(packages))
        yield
