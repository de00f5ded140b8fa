"""Recipes, data loading, schedules, evaluation helpers and the FLOP model."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

from benchmarks.flops import EncoderShape, dense_macs, flop_ratio, pruned_macs
from retention_core.contract import Schedule
from retention_tasks.classification.learn import truncate, truncated_lengths
from tests.tiny import write_rows
from training.fitting.fit import lr_multiplier
from training.recipes.data import load_split
from training.recipes.recipe import DatasetSpec, Recipe, load_recipe, recipe_chain

RECIPES = sorted(Path(__file__).resolve().parents[2].joinpath("models", "recipes").rglob("*.yaml"))


@pytest.mark.parametrize("path", RECIPES, ids=[p.stem for p in RECIPES])
def test_every_committed_recipe_validates_with_its_profiles(path: Path) -> None:
    full = load_recipe(path)
    assert full.profile == "full" and full.steps > 0
    quick = load_recipe(path, "quick")
    assert quick.profile == "quick" and quick.steps <= full.steps


def test_recipe_chain_lists_the_runs_a_profile_starts_from_first() -> None:
    squad = Path(__file__).resolve().parents[2] / "models" / "recipes" / "squad.yaml"
    assert [r.profile for r in recipe_chain(squad, "quick")] == ["quick-dense", "quick"]
    study = squad.parents[2] / "experiments" / "recipes" / "squad-teacher.yaml"
    assert [r.profile for r in recipe_chain(study, "stage-frozen")] == ["teacher", "stage-frozen"]
    assert [r.profile for r in recipe_chain(squad, "calibrated")] == [
        "full",
        "continued",
        "continued3",
        "calibrated",
    ]
    assert [r.profile for r in recipe_chain(study, "teacher")] == ["teacher"]
    dense, stage = recipe_chain(squad, "quick")
    assert stage.init_from == f"{dense.name}-{dense.profile}" and stage.frozen_backbone
    assert dense.objective.soft_loss_weight == 0.0 and dense.rho.low == dense.rho.high == 1.0


def test_recipe_chain_refuses_a_run_it_cannot_build(tmp_path: Path) -> None:
    """``build`` fits the chain itself, so ``init_from`` must name a profile of the same file."""
    head = "name: x\ntask: classification\ndataset: {name: sst2}\n"
    foreign = tmp_path / "foreign.yaml"
    foreign.write_text(head + "profiles:\n  quick: {init_from: other-run}\n")
    with pytest.raises(ValueError, match="not a run of this recipe"):
        recipe_chain(foreign, "quick")
    cycle = tmp_path / "cycle.yaml"
    cycle.write_text(head + "profiles:\n  a: {init_from: x-b}\n  b: {init_from: x-a}\n")
    with pytest.raises(ValueError, match="cycle"):
        recipe_chain(cycle, "a")


def test_unknown_profile_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no profile"):
        load_recipe(RECIPES[0], "nope")


def test_recipe_rejects_unknown_fields(tmp_path: Path) -> None:
    recipe = tmp_path / "bad.yaml"
    recipe.write_text("name: x\ndataset: {name: sst2}\nlearning_rate: 1\n")
    with pytest.raises(ValueError):
        load_recipe(recipe)


def test_lr_multiplier_warms_up_then_decays_linearly() -> None:
    values = [lr_multiplier(step, total_steps=10, warmup_steps=2) for step in range(10)]
    assert values[0] == 0.5 and values[1] == 1.0
    assert all(a >= b for a, b in itertools.pairwise(values[1:]))
    assert values[-1] == pytest.approx(1 / 8)
    assert lr_multiplier(0, 10, 0) == 1.0


def test_local_data_root_and_deterministic_holdout(tmp_path: Path) -> None:
    rows = [{"text": f"review {i} é", "label": i % 2} for i in range(400)]
    write_rows(tmp_path / "imdb" / "train.jsonl.gz", rows)
    spec = DatasetSpec(name="imdb", root=str(tmp_path))
    train, validation = load_split(spec, "train"), load_split(spec, "validation")
    assert len(train) + len(validation) == 400
    assert 0 < len(validation) < 60
    assert not {r["text"] for r in train} & {r["text"] for r in validation}
    assert load_split(spec, "validation") == validation  # same rows every time


def test_unknown_dataset_or_split_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown dataset"):
        load_split(DatasetSpec(name="nope", root=str(tmp_path)), "train")
    with pytest.raises(ValueError, match="no split"):
        load_split(DatasetSpec(name="sst2", root=str(tmp_path)), "dev")


def test_truncation_baselines_keep_special_tokens() -> None:
    ids = [101, *range(1, 11), 102]
    assert truncate(ids, 5, None) == [101, 1, 2, 3, 102]
    assert truncate(ids, 6, 0.25) == [101, 1, 8, 9, 10, 102]
    assert truncate(ids, 50, None) == ids


def test_equal_work_truncation_is_longer_than_final_budget() -> None:
    from tests.tiny import tiny_model

    model, _ = tiny_model()
    num_real = torch.tensor([100, 40])
    final = truncated_lengths(num_real, 0.3, model, equal_work=False)
    work = truncated_lengths(num_real, 0.3, model, equal_work=True)
    assert final.tolist() == [30, 12]
    assert torch.all(work > final)


def test_flop_model_is_dense_at_rho_one_and_shrinks_with_rho() -> None:
    shape = EncoderShape()
    layers = shape.layers
    # ρ=1 without the [CLS]-only last layer costs the dense encoder plus the scorers.
    assert pruned_macs(512, 1.0, shape, Schedule(num_points=layers)) > dense_macs(512, shape)
    front_loaded = Schedule(power=0.5, num_points=layers, last_layer_queries=1)
    ratios = [flop_ratio(512, rho, shape, front_loaded) for rho in (1.0, 0.5, 0.3, 0.2)]
    assert ratios == sorted(ratios)
    geometric = front_loaded.model_copy(update={"power": 1.0})
    assert flop_ratio(512, 0.3, shape, front_loaded) > flop_ratio(512, 0.3, shape, geometric)


def test_flop_model_reads_the_whole_schedule() -> None:
    """The graph's counts (the kept-token floor and the pruning interval included) and its scorers only at
    the points that select: a floor keeps a short row dense, an interval of 2 halves the scorers' cost."""
    shape = EncoderShape()
    plain = Schedule(num_points=shape.layers)
    floored = plain.model_copy(update={"min_kept_tokens": 32})
    assert flop_ratio(512, 0.3, shape, floored) == flop_ratio(512, 0.3, shape, plain)  # long: above the floor
    assert flop_ratio(24, 0.3, shape, floored) < 1.0 < flop_ratio(24, 0.3, shape, plain)  # short: dense
    every_other = plain.model_copy(update={"pruning_interval": 2})
    dense_with_scorers = pruned_macs(512, 1.0, shape, plain) - dense_macs(512, shape)
    assert pruned_macs(512, 1.0, shape, every_other) - dense_macs(512, shape) == dense_with_scorers // 2


def test_runs_from_before_the_gate_kind_moved_still_load() -> None:
    legacy = {"name": "old", "dataset": {"name": "sst2"}, "budget": {"use_gates": True}}
    assert Recipe.model_validate(legacy).retention.gates == "hard_concrete"
    with pytest.raises(ValueError, match="use_gates"):
        Recipe.model_validate({**legacy, "budget": {"use_gates": False}})


def test_score_shift_benchmark_shows_the_quantile_shift_over_keeping_at_the_schedule_rate() -> None:
    from experiments.score_shift import SCHEDULE_RATE, markdown, score_shift

    payload = score_shift(num_tokens=4_000)
    at_schedule = [cell for cell in payload["cells"] if cell["rate"] == SCHEDULE_RATE]  # type: ignore[attr-defined]
    assert at_schedule and all(cell["quantile"] > cell["rate"] + 0.02 for cell in at_schedule)
    assert all(abs(cell["calibrated"] - cell["rate"]) < 1e-3 for cell in payload["cells"])  # type: ignore[attr-defined]
    assert "vs 0.3" in markdown(payload)


def test_paired_difference_is_the_spread_of_per_example_differences() -> None:
    from training.evaluation.reporting import paired_difference

    stats = paired_difference([1.0, 0.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0])  # differences 0, -1, 1, 1
    assert stats["examples"] == 4 and stats["difference"] == pytest.approx(0.25)
    assert stats["standard_error"] == pytest.approx(((0.0625 + 1.5625 + 0.5625 * 2) / 3) ** 0.5 / 2)
    shifted = paired_difference([2.0, 3.0, 4.0], [1.0, 2.0, 3.0])  # the same shift everywhere: no spread
    assert shifted == {"examples": 3, "difference": 1.0, "standard_error": 0.0}
    with pytest.raises(ValueError, match="same examples"):
        paired_difference([1.0], [1.0, 2.0])
