"""What the retrofit recipes of the task packages share: a profile's sizes and a model directory's JSON.

Each task that can retrofit names its builder, ``(model, profile) → Recipe``, in its ``training.py``
(``training.tasks.registry.TrainingTask.retrofit_recipe``; the shipped ones: the embedding's
``retention_tasks/embedding/retrofit.py``, a sentence-transformers model; the classification's
``retention_tasks/classification/retrofit.py``, a Hugging Face ``*ForSequenceClassification``
checkpoint); ``training.fitting.retrofit.retrofit_recipe`` looks it up, so ``python -m training retrofit
--task`` offers the tasks that have one and no list of task names lives anywhere else.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def profile_sizes(profiles: dict[str, dict[str, Any]], profile: str) -> dict[str, Any]:
    """The sizes of ``profile``; a ValueError naming the known ones (the CLI's --profile, a typo)."""
    if profile not in profiles:
        raise ValueError(f"unknown profile {profile!r}; known: {sorted(profiles)}")
    return profiles[profile]
