"""The kept-token floor (issue 20, short inputs): recipe defaults, the exported graph, evaluation, CLI.

The service side (``usage``) is in tests/service/test_kept_token_floor.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from retention_core.codecs.base import Row
from retention_core.contract import Manifest, Schedule
from retention_ort import open_session
from retention_tasks.classification.learn import evaluate_classification
from tests.tiny import tiny_model, tiny_recipe, write_rows
from training.__main__ import main as training_main
from training.engine import selection as S
from training.evaluation.codec_loop import truncation_keep
from training.evaluation.methods import CODEC_METHODS
from training.export.graph import graph_for
from training.fitting.fit import RECIPE_FILE, load_run, save_run, with_min_kept_tokens, with_schedule
from training.recipes.recipe import Recipe, load_recipe
from training.tasks.registry import EvaluationRun, training_task

REPO = Path(__file__).resolve().parents[2]
SHORT, LONG = 4, 40  # real tokens: "[CLS] great film [SEP]" and a 40-token sentence
ROWS = [{"text": f"{'great fun' if i % 2 else 'dull and slow'} film {i}", "label": i % 2} for i in range(8)]


def _legacy_run(tmp_path: Path) -> Path:
    """A run dir as saved before the floor existed: its recipe.json has no ``min_kept_tokens``."""
    model, tokenizer = tiny_model()
    run_dir = tmp_path / "run"
    save_run(model, tiny_recipe(), tokenizer, run_dir)
    saved = json.loads((run_dir / RECIPE_FILE).read_text(encoding="utf-8"))
    del saved["retention"]["min_kept_tokens"]
    (run_dir / RECIPE_FILE).write_text(json.dumps(saved), encoding="utf-8")
    return run_dir


def _short_and_long(vocab_size: int) -> dict[str, np.ndarray]:
    """One batch: a 4-token row and a 40-token row (right-padded), both at ρ = 0.2."""
    generator = np.random.default_rng(0)
    input_ids = generator.integers(5, vocab_size, size=(2, LONG)).astype(np.int64)  # (B, T)
    attention_mask = np.ones((2, LONG), dtype=np.int64)  # (B, T)
    attention_mask[0, SHORT:] = 0
    input_ids[0, SHORT:] = 0
    return {"input_ids": input_ids, "attention_mask": attention_mask, "rho": np.full(2, 0.2, np.float32)}


def test_the_floor_is_opt_in_and_saved_recipes_without_it_keep_none(tmp_path: Path) -> None:
    recipe = load_recipe(REPO / "models" / "recipes" / "sst2.yaml", "quick")
    assert recipe.retention.min_kept_tokens == 0  # opt-in (docs/experiments/2026-11-25-kept-token-floor.md)
    explicit = tmp_path / "explicit.yaml"
    explicit.write_text(
        "extends: " + str(REPO / "models" / "recipes" / "sst2.yaml") + "\nretention: {min_kept_tokens: 16}\n"
    )
    floored = load_recipe(explicit)
    assert floored.retention.min_kept_tokens == 16  # a YAML that asks for it gets it
    # recipe.json of a run trained before the floor: no key, so the run reproduces its numbers
    _, legacy, _ = load_run(_legacy_run(tmp_path))
    assert legacy.retention.min_kept_tokens == 0
    round_trip = Recipe.model_validate_json(floored.model_dump_json())
    assert round_trip.retention.min_kept_tokens == 16  # what a new run dir saves, it loads


def test_manifest_without_a_floor_loads_as_none() -> None:
    assert Schedule.model_validate({"power": 0.5, "num_points": 6}).min_kept_tokens == 0


def test_export_option_bakes_the_floor_into_the_graph(tmp_path: Path) -> None:
    run_dir = _legacy_run(tmp_path)
    training_main(["export", str(run_dir), "--out", str(tmp_path / "bare"), "--no-quality"])
    training_main(
        ["export", str(run_dir), "--out", str(tmp_path / "floor"), "--no-quality", "--min-kept-tokens", "16"]
    )
    assert Manifest.read(tmp_path / "bare").schedule.min_kept_tokens == 0
    manifest = Manifest.read(tmp_path / "floor")
    assert manifest.schedule.min_kept_tokens == 16
    assert manifest.training["recipe"]["retention"]["min_kept_tokens"] == 16  # type: ignore[index]

    model, recipe, _ = load_run(run_dir)
    feeds = _short_and_long(model.backbone.info_vocab_size)
    _, bare_counts, _ = open_session(tmp_path / "bare" / "model.onnx").run(None, feeds)
    assert bare_counts[0, -1] == 1  # the defect: one of the short row's four tokens reaches layer 2

    logits, counts, _ = open_session(tmp_path / "floor" / "model.onnx").run(None, feeds)
    assert counts[0].tolist() == [SHORT, SHORT]  # at or under the floor: dense at ρ = 0.2
    assert counts[1].tolist() == [18, 16]  # round(0.2^½·40) = 18, then round(0.2·40) = 8 → 16
    with_min_kept_tokens(model, recipe, 16)
    with torch.no_grad():
        expected = graph_for(model)(*(torch.from_numpy(feeds[name]) for name in feeds))
    assert np.array_equal(counts, expected[1].numpy())  # parity with torch
    np.testing.assert_allclose(logits, expected[0].numpy(), atol=1e-4, rtol=0.0)


def test_baselines_at_equal_work_see_the_same_floor() -> None:
    """A floor above every row's length makes every method dense at every ρ: learned, random, attention
    and the truncation baselines (whose lengths come from the same schedule) alike."""
    model, tokenizer = tiny_model()
    recipe = with_min_kept_tokens(model, tiny_recipe(), 64)
    methods = ["learned", "random", "attention", "first_k", "first_k_work", "head_tail_work"]
    results = evaluate_classification(EvaluationRun(model, tokenizer, recipe, ROWS), [0.2], methods, False)
    dense = evaluate_classification(EvaluationRun(model, tokenizer, recipe, ROWS), [1.0], ["learned"], False)
    assert {r.method for r in results} == set(methods)
    for result in results:
        assert result.token_work == pytest.approx(dense[0].token_work), result.method
        assert result.accuracy == dense[0].accuracy, result.method


def test_the_floor_override_changes_the_schedule_not_the_weights() -> None:
    model, _ = tiny_model()
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    recipe = with_min_kept_tokens(model, tiny_recipe(), 16)
    assert model.config.min_kept_tokens == 16
    assert recipe.retention.min_kept_tokens == 16
    assert all(torch.equal(before[name], tensor) for name, tensor in model.state_dict().items())
    assert with_min_kept_tokens(model, recipe, None) is recipe  # no option: the run's own floor


def test_schedule_overrides_reach_the_counts_and_the_recipe_and_refuse_weights() -> None:
    """``with_schedule`` (retrieval's --schedule-power / --leading-share, export's options): a setting
    lands in the model's config (so the keep counts change) and in the recipe the manifest records."""
    model, _ = tiny_model()
    rho, real, protected = torch.tensor([0.5]), torch.tensor([40]), torch.tensor([1])
    geometric = model.keep_counts(rho, real, protected)
    recipe = with_schedule(model, tiny_recipe(), schedule_power=0.5, leading_share=0.25)
    assert (model.config.schedule_power, model.config.leading_share) == (0.5, 0.25)
    assert (recipe.retention.schedule_power, recipe.retention.leading_share) == (0.5, 0.25)
    front_loaded = model.keep_counts(rho, real, protected)
    assert front_loaded[0, -1] == geometric[0, -1]  # the last point reaches ρ either way
    assert front_loaded.sum() < geometric.sum()  # power < 1 prunes earlier: less token-work
    with pytest.raises(ValueError, match="not schedule settings"):
        with_schedule(model, recipe, scorer_size=8)


def test_truncation_keeps_the_floor_in_all() -> None:
    row = Row(tuple(range(10)))  # [CLS] + 8 content + [SEP]
    content = np.array([0 < i < 9 for i in range(10)])
    assert truncation_keep(row, content, 0.25) == [0, 1, 2, 9]  # round(0.25·8) = 2 content tokens
    assert truncation_keep(row, content, 0.25, min_kept=6) == [0, 1, 2, 3, 4, 9]  # 6 in all
    assert truncation_keep(row, content, 0.25, min_kept=16) == list(range(10))  # under the floor: all


@pytest.mark.parametrize("task", ["embedding", "qa", "summarization"])
def test_codec_loop_methods_see_the_floor(task: str) -> None:
    """Learned, random, attention and truncation of the codec loop all run dense when the floor exceeds
    every row (QA, summarization and embedding evaluation share it)."""
    model, tokenizer = tiny_model(task)
    recipe = with_min_kept_tokens(model, tiny_recipe(task), 512)
    evaluation = training_task(task).evaluation
    rows = [evaluation_example(task, index) for index in range(2)]
    report = evaluation.report(EvaluationRun(model, tokenizer, recipe, rows), [0.2], list(CODEC_METHODS))
    for method in CODEC_METHODS:
        assert report["results"][method]["0.2"]["token_work"] == pytest.approx(1.0), method


def evaluation_example(task: str, index: int) -> dict[str, object]:
    text = f"the film was a delight from start to finish, scene {index}. " * 4
    if task == "qa":
        answers = {"text": ["a delight"], "answer_start": [text.index("a delight")]}
        return {"question": "what was the film?", "context": text, "answers": answers}
    if task == "summarization":
        return {"document": text, "summary": "the film was a delight from start to finish, scene 0."}
    return {"text": text}


def test_floor_study_pairs_the_same_examples(tmp_path: Path) -> None:
    from experiments.kept_token_floor import main as study_main

    data_root = tmp_path / "data"
    rows = [{"text": f"{'a fine ' * (i % 9)}film {i}", "label": i % 2} for i in range(12)]
    write_rows(data_root / "sst2" / "validation.jsonl.gz", rows)
    model, tokenizer = tiny_model()
    recipe = tiny_recipe()
    recipe = recipe.model_copy(update={"dataset": recipe.dataset.model_copy(update={"root": str(data_root)})})
    save_run(model, recipe, tokenizer, tmp_path / "run")
    out = tmp_path / "floor.json"
    study_main(
        ["accuracy", str(tmp_path / "run"), "--floors", "0", "64", "--rhos", "0.2", "1.0", "--out", str(out)]
    )
    payload = json.loads(out.read_text())
    assert payload["num_examples"] == 12 and payload["machine"]["cores"] >= 1
    dense = next(
        r for r in payload["results"] if r["floor"] == 0 and r["method"] == "learned" and r["rho"] == 1
    )
    floored = [r for r in payload["results"] if r["floor"] == 64]
    assert all(r["token_work"] == pytest.approx(dense["token_work"]) for r in floored)  # all rows dense
    assert all(r["accuracy"] == dense["accuracy"] for r in floored)
    learned = next(e for e in payload["paired"] if e["method"] == "learned" and e["rho"] == 0.2)
    assert learned["at_or_under_floor"]["examples"] == 12 and learned["longer"]["examples"] == 0
    assert learned["all"]["gained"] - learned["all"]["lost"] == round(
        12 * learned["all"]["accuracy_diff"] / 100
    )
    assert "| learned | 0.2 | 0 → 64 |" in out.with_suffix(".md").read_text()


def test_soft_pass_targets_follow_the_floor_and_are_unchanged_without_one() -> None:
    model, _ = tiny_model()
    feeds = {
        name: torch.from_numpy(value)
        for name, value in _short_and_long(model.backbone.info_vocab_size).items()
    }
    with torch.no_grad():
        bare = model.forward_soft(feeds["input_ids"], feeds["attention_mask"], feeds["rho"])
        with_min_kept_tokens(model, tiny_recipe(), 16)
        floored = model.forward_soft(feeds["input_ids"], feeds["attention_mask"], feeds["rho"])
    reference = S.keep_fractions(feeds["rho"], 2, 1.0) * torch.tensor([[SHORT], [LONG]])  # tiny: 2 points
    assert torch.equal(bare.target_kept, reference)  # floor 0: the objective's targets as before, bit for bit
    torch.testing.assert_close(floored.target_kept, torch.tensor([[4.0, 4.0], [0.2**0.5 * LONG, 16.0]]))
