"""Checkpoint / resume and second-stage training on a tiny random model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.tiny import tiny_model, tiny_recipe
from training.fitting.fit import CHECKPOINT_FILE, LOG_FILE, WEIGHTS_FILE, final_lambda, fit

ROWS = [{"text": f"a {'good' if i % 2 else 'bad'} movie number {i}", "label": i % 2} for i in range(16)]
STEPS = 4


def _recipe(**update):
    base = {"steps": STEPS, "batch_size": 4, "log_every": 1, "checkpoint_every": 2, "max_length": 32}
    return tiny_recipe("classification").model_copy(update=base | update)


def _fit(run_dir: Path, recipe=None, **kwargs):
    model, tokenizer = tiny_model("classification")
    return fit(
        recipe or _recipe(),
        run_dir,
        backbone=model.backbone,
        tokenizer=tokenizer,
        train_rows=ROWS,
        progress=False,
        **kwargs,
    )


def test_stopped_and_resumed_run_equals_an_uninterrupted_one(tmp_path: Path) -> None:
    _fit(tmp_path / "whole")
    assert not (tmp_path / "whole" / CHECKPOINT_FILE).exists()  # removed once the weights are final

    _fit(tmp_path / "split", stop_at=1)  # stops between checkpoints: step 1 is saved all the same
    assert (tmp_path / "split" / CHECKPOINT_FILE).is_file()
    assert not (tmp_path / "split" / WEIGHTS_FILE).exists()
    _fit(tmp_path / "split", resume=True)

    whole = load_file(str(tmp_path / "whole" / WEIGHTS_FILE))
    split = load_file(str(tmp_path / "split" / WEIGHTS_FILE))
    assert whole.keys() == split.keys()
    for name, tensor in whole.items():
        assert torch.equal(tensor, split[name]), name  # bit-for-bit on CPU
    logs = [(tmp_path / run / LOG_FILE).read_text().splitlines() for run in ("whole", "split")]
    steps = [[json.loads(line)["step"] for line in log] for log in logs]
    assert steps[0] == steps[1] == list(range(STEPS))
    assert [json.loads(line)["lam"] for line in logs[0]] == [json.loads(line)["lam"] for line in logs[1]]


def test_resume_refuses_a_missing_checkpoint_or_another_recipe(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nothing to resume"):
        _fit(tmp_path / "run", resume=True)
    _fit(tmp_path / "run", stop_at=2)
    with pytest.raises(ValueError, match="different recipe"):
        _fit(tmp_path / "run", recipe=_recipe(seed=3), resume=True)


def test_second_stage_starts_from_the_parent_weights_and_lambda(tmp_path: Path) -> None:
    parent = _fit(tmp_path / "parent")
    parent_lam = final_lambda(tmp_path / "parent")
    assert any(value != 0.0 for value in parent_lam)  # the dual ascent moved it
    frozen_dual = _recipe().budget.model_copy(update={"dual_lr": 0.0})
    child_recipe = _recipe(init_from="parent", steps=1, seed=1, budget=frozen_dual)
    with pytest.raises(ValueError, match="pass init_run"):
        _fit(tmp_path / "child", recipe=child_recipe)
    with pytest.raises(FileNotFoundError, match="train it first"):
        _fit(tmp_path / "child", recipe=child_recipe, init_run=tmp_path / "missing")

    untrained = _fit(tmp_path / "child0", recipe=child_recipe, init_run=tmp_path / "parent", stop_at=0)
    for (name, a), b in zip(parent.state_dict().items(), untrained.state_dict().values(), strict=True):
        assert torch.equal(a, b), name  # zero steps: exactly the parent's weights

    _fit(tmp_path / "child", recipe=child_recipe, init_run=tmp_path / "parent")
    assert final_lambda(tmp_path / "child") == parent_lam  # dual_lr 0: λ is the parent's, carried over


def test_second_stage_of_another_task_is_refused(tmp_path: Path) -> None:
    _fit(tmp_path / "parent")
    recipe = tiny_recipe("qa").model_copy(update={"init_from": "parent", "steps": 1, "max_length": 32})
    model, tokenizer = tiny_model("qa")
    with pytest.raises(ValueError, match="classification run, not qa"):
        fit(
            recipe,
            tmp_path / "child",
            backbone=model.backbone,
            tokenizer=tokenizer,
            train_rows=[],
            progress=False,
            init_run=tmp_path / "parent",
        )


def test_a_checkpoint_written_before_the_recipe_keys_were_renamed_still_resumes(tmp_path: Path) -> None:
    _fit(tmp_path / "whole")
    _fit(tmp_path / "old", stop_at=2)
    checkpoint = tmp_path / "old" / CHECKPOINT_FILE
    saved = torch.load(checkpoint, weights_only=False)
    # What fit dumped before issue 25: the deleted switches at their "off" values.
    saved["recipe"]["budget"] |= {"quadratic_weight": 0.0, "use_gates": True}
    del saved["recipe"]["retention"]["score_shift"]
    saved["recipe"]["retention"] |= {"normalize_scores": False, "score_shift": "quantile"}
    torch.save(saved, checkpoint)
    _fit(tmp_path / "old", resume=True)
    whole = load_file(str(tmp_path / "whole" / WEIGHTS_FILE))
    resumed = load_file(str(tmp_path / "old" / WEIGHTS_FILE))
    assert all(torch.equal(tensor, resumed[name]) for name, tensor in whole.items())


def test_runs_dir_defaults_to_the_environment_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Long chains keep checkpoints outside the work tree: RETENTION_RUNS_DIR is every command's
    default --runs-dir (read when the parser is built, so a restarted process finds the same runs)."""
    from training.__main__ import RUNS_DIR_VARIABLE, parser

    monkeypatch.setenv(RUNS_DIR_VARIABLE, str(tmp_path / "kept"))
    fit_args = parser().parse_args(["fit", "experiments/recipes/squad-teacher.yaml", "--profile", "teacher"])
    build_args = parser().parse_args(["build", "models/recipes/squad.yaml"])
    assert fit_args.runs_dir == build_args.runs_dir == tmp_path / "kept"
    monkeypatch.delenv(RUNS_DIR_VARIABLE)
    assert parser().parse_args(["fit", "models/recipes/squad.yaml"]).runs_dir == Path("runs")
