"""``python -m training export`` measures a model (quality curves, speed) in its staging directory and
swaps it in once, with its final manifest: a service hot-reloading the live directory meanwhile reads
the old manifest or the final one, and a crash while measuring leaves the old model or nothing."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import training.__main__ as training_cli
import training.export.speed as speed_module
from retention_core.contract import MANIFEST_FILE, Manifest, choose_default_rho
from tests.tiny import tiny_model, tiny_recipe, write_rows
from tests.training.test_export_install import ExportCrash, snapshot
from training.__main__ import export_run
from training.fitting.fit import save_run

ROWS = [{"text": f"{'a fine' if i % 2 else 'a dull'} film, take {i}", "label": i % 2} for i in range(8)]


def tiny_run(root: Path, seed: int) -> Path:
    """A tiny random classifier's run directory whose dataset root holds a small validation split."""
    data_root = root / "data"
    write_rows(data_root / "sst2" / "validation.jsonl.gz", ROWS)
    model, tokenizer = tiny_model(seed=seed)
    recipe = tiny_recipe()
    recipe = recipe.model_copy(
        update={
            "dataset": recipe.dataset.model_copy(update={"root": str(data_root)}),
            "evaluation": recipe.evaluation.model_copy(update={"rhos": (0.3, 0.5, 1.0)}),
        }
    )
    run_dir = root / f"run-{seed}"
    save_run(model, recipe, tokenizer, run_dir)
    return run_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two runs (the live model's and its successor's) and the live model, exported without quality."""
    root = tmp_path_factory.mktemp("export-staging")
    old_run, new_run = tiny_run(root, seed=1), tiny_run(root, seed=2)
    export_run(old_run, root / "old-model", int8=False, quality=False)
    return {"old": old_run, "new": new_run, "old_model": root / "old-model"}


class ManifestReader(threading.Thread):
    """Polls ``model_dir`` as the service's reload does: reads and parses manifest.json over and over."""

    def __init__(self, model_dir: Path) -> None:
        super().__init__(name="manifest-reader", daemon=True)
        self.model_dir = model_dir
        self.seen: list[str] = []  # each distinct manifest, in the order first read
        self.failures: list[str] = []  # anything Manifest.read refused: a partial or broken manifest
        self.reads = 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            try:
                text = Manifest.read(self.model_dir).model_dump_json()
            except FileNotFoundError:  # only where renameat2 is missing: the fallback's gap between renames
                continue
            except Exception as exc:
                self.failures.append(repr(exc))
            else:
                if text not in self.seen:
                    self.seen.append(text)
            self.reads += 1

    def wait_for_reads(self, count: int) -> None:
        """Block until the reader has read ``count`` more times (synchronisation, not a timing check)."""
        target, end = self.reads + count, time.monotonic() + 30
        while self.reads < target:
            assert time.monotonic() < end, "the reader stopped reading"
            time.sleep(0.001)


def before(function: Callable[..., Any], step: Callable[[], None]) -> Callable[..., Any]:
    """``function`` that first runs ``step``."""

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        step()
        return function(*args, **kwargs)

    return wrapped


@pytest.fixture
def reader(tmp_path: Path, runs: dict[str, Path]) -> Iterator[ManifestReader]:
    """A live model directory (a copy of the old model) with a reader polling it."""
    live = tmp_path / "models" / "tiny"
    shutil.copytree(runs["old_model"], live)
    polling = ManifestReader(live)
    polling.start()
    yield polling
    polling.done.set()
    polling.join(timeout=30)


def test_a_reader_of_the_live_directory_sees_the_old_manifest_then_the_final_one(
    reader: ManifestReader, runs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    old = Manifest.read(reader.model_dir)
    # Every measurement waits until the reader has looked at the live directory while it runs, so the
    # reader sees whatever the export leaves there meanwhile (in place: a manifest without its curves).
    look = lambda: reader.wait_for_reads(3)  # noqa: E731
    monkeypatch.setattr(training_cli, "manifest_quality", before(training_cli.manifest_quality, look))
    monkeypatch.setattr(speed_module, "measure_speed", before(speed_module.measure_speed, look))

    export_run(runs["new"], reader.model_dir, int8=True, quality=True)
    reader.wait_for_reads(3)
    reader.done.set()
    reader.join(timeout=30)

    final = Manifest.read(reader.model_dir)
    assert reader.failures == []  # never a partial manifest
    assert reader.seen == [old.model_dump_json(), final.model_dump_json()]  # nothing in between
    assert final.quality is not None and final.speed is not None
    assert final.variants["int8"].quality is not None
    # default_rho follows the rule on the measured curve; the old model, without a curve, is dense.
    assert (final.default_rho, final.default_rho_rule) == choose_default_rho(final.quality)
    assert final.default_rho_rule is not None and "accuracy on sst2/validation" in final.default_rho_rule
    assert (old.default_rho, old.default_rho_rule) == (1.0, "no quality curve: dense (rho=1)")
    assert sorted(p.name for p in reader.model_dir.parent.iterdir()) == ["tiny"]  # no staging left


def crash(_: Any = None, *__: Any, **___: Any) -> Any:
    raise ExportCrash("measurement crashed")


def crash_on_call(number: int, function: Callable[..., Any]) -> Callable[..., Any]:
    """``function``, except that its ``number``-th call raises."""
    calls = 0

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        return crash() if calls == number else function(*args, **kwargs)

    return wrapped


@pytest.mark.parametrize("crash_at", ["fp32 quality", "speed", "int8 quality"])
def test_a_crash_while_measuring_leaves_the_old_model_or_nothing(
    crash_at: str, tmp_path: Path, runs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "models"
    live = root / "live"
    shutil.copytree(runs["old_model"], live)
    old = snapshot(live)
    quality = training_cli.manifest_quality

    for target in (root / "fresh", live):  # a first export, and one replacing a model
        if crash_at == "speed":
            monkeypatch.setattr(speed_module, "measure_speed", crash)
        else:  # manifest_quality measures fp32 first, then int8
            call = 1 if crash_at == "fp32 quality" else 2
            monkeypatch.setattr(training_cli, "manifest_quality", crash_on_call(call, quality))
        with pytest.raises(ExportCrash):
            export_run(runs["new"], target, int8=True, quality=True)

    assert not (root / "fresh").exists()  # no model rather than one without its quality curve
    assert snapshot(live) == old  # the old model, byte for byte
    assert sorted(p.name for p in root.iterdir()) == ["live"]  # no staging directory left behind


def test_manifest_write_replaces_the_file_whole(tmp_path: Path, runs: dict[str, Path]) -> None:
    """A reader that opened manifest.json before a rewrite reads the old manifest to its end."""
    live = tmp_path / "tiny"
    shutil.copytree(runs["old_model"], live)
    old = Manifest.read(live)
    with (live / MANIFEST_FILE).open(encoding="utf-8") as opened:
        old.model_copy(update={"name": "renamed"}).write(live)
        assert Manifest.model_validate_json(opened.read()) == old  # not truncated, not the new one
    assert Manifest.read(live).name == "renamed"
    assert sorted(p.name for p in live.iterdir()) == sorted(p.name for p in runs["old_model"].iterdir())


def test_the_schedule_settings_are_mapped_once_recipe_to_model_to_manifest() -> None:
    """``training.engine.model.SCHEDULE_FIELDS`` names every setting of the manifest's schedule that is not
    the graph's shape, each a field of the recipe's ``retention`` and of ``RetentionConfig``; a recipe's
    values reach the manifest through it unchanged."""
    import dataclasses

    from retention_core.contract import Schedule
    from training.engine.model import SCHEDULE_FIELDS, RetentionConfig, manifest_schedule
    from training.fitting.fit import retention_config
    from training.recipes.recipe import RetentionSpec

    shape = {"kind", "num_points", "last_layer_queries"}
    assert set(SCHEDULE_FIELDS.values()) == set(Schedule.model_fields) - shape
    assert set(SCHEDULE_FIELDS) <= set(RetentionSpec.model_fields)
    assert set(SCHEDULE_FIELDS) <= {field.name for field in dataclasses.fields(RetentionConfig)}

    values = {
        "schedule_power": 0.5,
        "min_kept_tokens": 7,
        "merge_dropped": True,
        "leading_share": 0.25,
        "pruning_interval": 2,
    }
    assert set(values) == set(SCHEDULE_FIELDS)
    recipe = tiny_recipe()
    recipe = recipe.model_copy(update={"retention": recipe.retention.model_copy(update=values)})
    model, _ = tiny_model(seed=0)
    model.config = retention_config(recipe)
    schedule = manifest_schedule(model)
    assert {SCHEDULE_FIELDS[name]: value for name, value in values.items()} == {
        field: getattr(schedule, field) for field in SCHEDULE_FIELDS.values()
    }
    assert (schedule.num_points, schedule.last_layer_queries) == (model.num_points, model.last_layer_queries)
