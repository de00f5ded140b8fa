"""docs/benchmarks.md names each figure's CPU class beside its CPU, and says "unrecorded" for results
measured before machine records held it (the committed JSON is not rewritten)."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import report
from retention_core.machine import CLASS_UNRECORDED, describe

OLD_RECORD = {"cpu": "AMD EPYC", "cores": 2, "onnxruntime": "1.31.1", "commit": "8af64ad"}


def section_source(tmp_path: Path, machine: dict[str, object]) -> str:
    """The Source line of a benchmark's section whose JSON records ``machine``."""
    md_path = tmp_path / "bench.md"
    md_path.write_text("# Title\n\n| a |\n|---|\n| 1 |\n", encoding="utf-8")
    md_path.with_suffix(".json").write_text(json.dumps({"machine": machine}), encoding="utf-8")
    lines = report.markdown_section(md_path, "Bench", None, tmp_path)
    return next(line for line in lines if line.startswith("Source:"))


def test_an_older_record_shows_its_class_as_unrecorded(tmp_path: Path) -> None:
    assert f"cpu: AMD EPYC, cpu class: {CLASS_UNRECORDED}, cores: 2, onnxruntime: 1.31.1" in section_source(
        tmp_path, OLD_RECORD
    )


def test_a_new_record_shows_the_class_it_measured(tmp_path: Path) -> None:
    record = describe()
    assert f"cpu: {record['cpu']}, cpu class: {record['cpu_class']}, cores: " in section_source(
        tmp_path, record
    )
