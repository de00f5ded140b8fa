"""Every module of the command-line packages imports: a study or benchmark whose import broke when a module
it reads moved is found here, not by the next person who runs it (most of them run for minutes, on
data and models CI does not have, so no other test executes them)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = (
    "benchmarks",
    "experiments",
    "clients",
    "training",
    "service",
    "retention_core",
    "retention_ort",
    "retention_tasks",
)
# Locustfiles are not modules to import: locust runs them with their load's settings in the environment
# (and gevent patches the standard library as they load). Each is named by the benchmark that runs it
# under locust (``LOCUSTFILE``), and that benchmark's test runs it.
RUN_BY = {"benchmarks.overload_locust": "benchmarks.overload"}


def modules() -> list[str]:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return [module for module in found if module not in RUN_BY]


@pytest.mark.parametrize("module", modules())
def test_module_imports(module: str) -> None:
    assert importlib.import_module(module).__name__ == module


def test_each_locustfile_left_out_is_the_one_its_benchmark_runs() -> None:
    for module, runner in RUN_BY.items():
        assert ROOT / (module.replace(".", "/") + ".py") == importlib.import_module(runner).LOCUSTFILE
