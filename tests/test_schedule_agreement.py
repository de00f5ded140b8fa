"""Every reader of the keep schedule agrees with the core's statement of it (``retention_core.schedule``):
the graph's torch arithmetic (``training.engine.selection``, traced into ``model.onnx``) and the model's
soft-pass targets, the core in numpy, the service's cost model, a request's token-work accounting, and what
``GET /models/{name}/schedule`` gives the explorer page, over a grid of schedules (power, kept-token floor,
leading share, merging, pruning interval 1/2/3, last-layer queries), ρ values and row lengths.
"""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import numpy as np
import pytest
import torch

from retention_core.contract import Backbone, Manifest, Schedule
from retention_core.schedule import (
    SCHEDULE_DEFAULTS,
    ScheduleSettings,
    keep_counts,
    keep_fractions,
    mean_kept_fraction,
    token_work,
    token_work_curve,
)
from retention_core.usage import token_work as request_token_work
from service.api.routers.models import SCHEDULE_GRID
from service.scheduling.cost import schedule_fraction
from tests.service.conftest import running, settings_for
from tests.tiny import TINY_LAYERS, build_tiny_model_dir, tiny_model
from training.engine import selection as S
from training.engine.model import SCHEDULE_FIELDS, RetentionConfig
from training.evaluation.running import exit_layers
from training.recipes.recipe import RetentionSpec

RHOS = np.array([0.01, 0.05, 0.1, 0.2, 0.25, 0.3, 0.33, 0.5, 0.6, 0.7, 0.75, 0.9, 0.99, 1.0], np.float32)
LENGTHS = (1, 2, 3, 5, 8, 16, 17, 40, 128, 333, 512)
SCHEDULES = [
    Schedule(
        power=power,
        num_points=points,
        min_kept_tokens=floor,
        leading_share=share,
        merge_dropped=share > 0,
        pruning_interval=interval,
        last_layer_queries=queries,
    )
    for power, points, floor, share, interval, queries in itertools.product(
        (0.5, 1.0, 2.0), (6, 12), (0, 16), (0.0, 0.5), (1, 2, 3), (None, 1)
    )
]


def served_manifest(schedule: Schedule) -> Manifest:
    """A manifest around ``schedule`` (what a request's accounting reads)."""
    backbone = Backbone(
        name_or_path="tiny",
        family="bert",
        num_layers=schedule.num_points,
        hidden_size=8,
        num_heads=2,
        intermediate_size=16,
    )
    return Manifest(
        name="schedule",
        task="classification",
        backbone=backbone,
        max_length=512,
        default_rho=0.5,
        schedule=schedule,
        variants={},
        inputs=[],
        outputs=[],
    )


def rows(length: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every ρ of the grid, one row each of ``length`` real tokens with [CLS] protected: (R,) × 3."""
    real = np.full(len(RHOS), length, dtype=np.int64)
    return RHOS, real, np.ones_like(real)


@pytest.mark.parametrize(
    "schedule",
    SCHEDULES,
    ids=lambda s: (
        f"p{s.power}-P{s.num_points}-f{s.min_kept_tokens}"
        f"-s{s.leading_share}-k{s.pruning_interval}-q{s.last_layer_queries}"
    ),
)
def test_every_reader_computes_the_same_schedule(schedule: Schedule) -> None:
    manifest_fields = {"num_points": schedule.num_points, "last_layer_queries": schedule.last_layer_queries}
    for length in LENGTHS:
        rho, real, protected = rows(length)
        counts = keep_counts(schedule, rho, real, protected)  # (R, P), the core
        graph = S.keep_counts(  # the graph's torch arithmetic, traced into model.onnx
            torch.from_numpy(rho),
            torch.from_numpy(real),
            torch.from_numpy(protected),
            schedule.num_points,
            schedule.power,
            schedule.min_kept_tokens,
            schedule.pruning_interval,
        )
        assert np.array_equal(graph.numpy(), counts), (length, manifest_fields)

        fractions = keep_fractions(schedule, rho, real)  # (R, P), floor included
        torch_fractions = S.keep_fractions(
            torch.from_numpy(rho), schedule.num_points, schedule.power, schedule.pruning_interval
        )
        assert np.allclose(torch_fractions.numpy(), keep_fractions(schedule, rho), rtol=1e-6, atol=0)
        # the counts are the floored fractions rounded, within the protected token and the row
        assert np.array_equal(
            counts, np.clip(np.floor(fractions * length + np.float32(0.5)).astype(np.int64), 1, length)
        )
        # the cost model's share of token-work: the mean fraction over the points, before rounding
        cost = [schedule_fraction(schedule, float(r), length) for r in rho]
        assert cost == [mean_kept_fraction(schedule, float(r), length) for r in rho]
        assert np.allclose(cost, fractions.astype(np.float64).mean(1), rtol=2e-6, atol=0)

        # token-work: the core, a request's accounting (usage) and training's per-row torch form
        work = token_work(counts, real, schedule.last_layer_queries)  # (R,)
        manifest = served_manifest(schedule)
        per_request = [
            request_token_work(manifest, [length], counts[i : i + 1]).fraction for i in range(len(rho))
        ]
        assert np.allclose(work, per_request, rtol=1e-12, atol=0)
        per_row = S.encoder_token_work(
            torch.from_numpy(counts), torch.from_numpy(real), schedule.last_layer_queries
        )
        assert np.allclose(work, per_row.numpy(), rtol=1e-6, atol=0)
        # what the explorer is given: the same counts, the same definition
        assert token_work_curve(schedule, length, [float(r) for r in rho]) == work.tolist()


def test_the_pruning_interval_groups_the_fractions_and_the_leading_share_changes_no_count() -> None:
    """Inside a group of k points the fraction holds; the last group reaches ρ; the leading share and
    merging decide which tokens, never how many."""
    for schedule in SCHEDULES:
        fractions = keep_fractions(schedule, RHOS)  # (R, P)
        k = schedule.pruning_interval
        starts = np.arange(0, schedule.num_points, k)
        for start in starts:
            group = fractions[:, start : start + k]
            assert (group == group[:, :1]).all()
        assert np.allclose(fractions[:, -1], RHOS, rtol=1e-6)
        plain = schedule.model_copy(update={"leading_share": 0.0, "merge_dropped": False})
        rho, real, protected = rows(40)
        assert np.array_equal(
            keep_counts(schedule, rho, real, protected), keep_counts(plain, rho, real, protected)
        )


@pytest.mark.parametrize("interval", [1, 2])
@pytest.mark.parametrize("floor", [0, 4])
def test_the_models_soft_targets_and_exit_layers_read_the_schedule_with_its_interval(
    interval: int, floor: int
) -> None:
    """``RetentionModel.keep_fractions`` (the soft pass's targets, the open-gate ablation) and
    ``running.exit_layers`` honour the pruning interval, as the graph's counts do."""
    config = RetentionConfig(schedule_power=0.5, min_kept_tokens=floor, pruning_interval=interval)
    model, _ = tiny_model("classification", config=config)
    schedule = Schedule(power=0.5, num_points=TINY_LAYERS, min_kept_tokens=floor, pruning_interval=interval)
    rho, real, _ = rows(9)
    soft = model.keep_fractions(torch.from_numpy(rho), torch.from_numpy(real))
    assert np.allclose(soft.numpy(), keep_fractions(schedule, rho, real), rtol=1e-6, atol=0)
    for value in RHOS:
        mean = float(keep_fractions(schedule, np.array([value])).mean())
        assert exit_layers(model, float(value)) == max(1, round(mean * TINY_LAYERS))


def test_the_schedule_settings_are_declared_once() -> None:
    """The recipe, the trained model's config and the manifest carry the core's settings with its
    defaults (and the manifest and the recipe its bounds)."""
    settings = {field.name: field.default for field in dataclasses.fields(ScheduleSettings)}
    assert set(SCHEDULE_FIELDS.values()) == set(settings)
    config = RetentionConfig()
    spec = RetentionSpec()
    schedule = Schedule(num_points=1)
    for name, field in SCHEDULE_FIELDS.items():
        assert getattr(config, name) == getattr(spec, name) == getattr(schedule, field) == settings[field]
        assert getattr(SCHEDULE_DEFAULTS, field) == settings[field]
        recipe_field, manifest_field = RetentionSpec.model_fields[name], Schedule.model_fields[field]
        assert recipe_field.metadata == manifest_field.metadata
        assert recipe_field.description == manifest_field.description
    recipe_name = {field: name for name, field in SCHEDULE_FIELDS.items()}
    for field, bad in (
        ("pruning_interval", 0),
        ("leading_share", 1.5),
        ("min_kept_tokens", -1),
        ("power", 0.0),
    ):
        with pytest.raises(ValueError):
            Schedule.model_validate({"num_points": 4, field: bad})
        with pytest.raises(ValueError):
            RetentionSpec.model_validate({recipe_name[field]: bad})


def test_the_server_gives_the_explorer_the_cores_curve(tmp_path: Path) -> None:
    """``GET /models/{name}/schedule``: the core's token-work curve of the served model's schedule, for any
    row length; the explorer page draws it and keeps no formula of its own."""
    root = tmp_path / "models"
    manifest = build_tiny_model_dir(root / "tiny-classification", "classification")
    with running(settings_for(root)) as (_, client):
        for length in (1, 7, 128, 4096):
            response = client.get(f"/models/tiny-classification/schedule?length={length}")
            assert response.status_code == 200, response.text
            body = response.json()
            assert body["rho"] == list(SCHEDULE_GRID)
            assert body["length"] == length
            assert body["token_work"] == token_work_curve(manifest.schedule, length, SCHEDULE_GRID)
        assert client.get("/models/tiny-classification/schedule?length=0").status_code == 422
        assert client.get("/models/no-such-model/schedule").status_code == 404
