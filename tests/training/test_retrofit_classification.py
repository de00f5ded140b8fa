"""Retrofit of a Hugging Face sequence classifier (issue 20): the student is the user's checkpoint plus
retention scorers, trained label-free with KL to the original logits. Frozen (the default), ρ = 1 is
bit-for-bit ``transformers``' own ``BertForSequenceClassification``; ``--backbone-lr`` tunes backbone and
head against a frozen copy. And the IMDb comparison's command sequence, on tiny models: fit dense →
to-hf → retrofit → export → evaluate."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from transformers import BertForSequenceClassification

from retention_core.contract import MODEL_FILE, Manifest
from retention_ort import open_session
from retention_tasks.classification.learn import AGREEMENT_METRIC, as_rows
from tests.tasks.test_embedding import write_sentence_transformer
from tests.tiny import write_rows
from training.__main__ import main as training_main
from training.engine.encoders import load_backbone, load_tokenizer
from training.evaluation.running import onnx_predict_rows
from training.fitting.fit import (
    LOG_FILE,
    RECIPE_FILE,
    WEIGHTS_FILE,
    StepSchedule,
    TrainState,
    initial_state,
    train_step,
)
from training.fitting.objective import Objective
from training.fitting.retrofit import retrofit_recipe
from training.recipes.data import read_jsonl_gz
from training.recipes.recipe import Recipe, load_recipe
from training.tasks.registry import training_task
from training.tiny import TINY_TOKENIZER, tiny_config

LABELS = ("NEG", "POS")
IMDB_RECIPE = Path(__file__).resolve().parents[2] / "models" / "recipes" / "imdb.yaml"
WORDS = ["great", "awful", "film", "plot", "actors", "boring", "superb", "the", "a", "was", "not", "very"]


def review(index: int) -> dict[str, object]:
    """A short deterministic 'review' with a label, in the layout of ../shared/data/imdb."""
    words = [WORDS[(index * 7 + k * 3) % len(WORDS)] for k in range(8 + index % 25)]
    return {"text": " ".join(words) + f" #{index}", "label": index % 2}


def write_imdb(root: Path, size: int = 240) -> Path:
    """An IMDb-shaped data root: imdb/train.jsonl.gz (validation = 1 in 20 by sha1) and test.jsonl.gz."""
    write_rows(root / "imdb" / "train.jsonl.gz", [review(i) for i in range(size)])
    write_rows(root / "imdb" / "test.jsonl.gz", [review(i) for i in range(size, size + 40)])
    return root


def write_hf_classifier(out: Path, seed: int = 3) -> Path:
    """A tiny random ``BertForSequenceClassification`` checkpoint (MiniLM's vocabulary), as a user has it:
    config.json with id2label, model.safetensors, tokenizer files. Initialised 10× wider than BERT's
    0.02 so that [CLS] depends on the text and the logits differ across texts (at 0.02 they barely do)."""
    tokenizer = load_tokenizer(TINY_TOKENIZER)
    config = tiny_config(tokenizer.vocab_size)
    config.initializer_range = 0.2
    config.id2label = dict(enumerate(LABELS))
    config.label2id = {label: i for i, label in enumerate(LABELS)}
    torch.manual_seed(seed)
    BertForSequenceClassification(config).save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out


def hf_logits(model_dir: Path, texts: list[str], max_length: int) -> torch.Tensor:
    """``transformers``' own forward of the checkpoint: (B, C)."""
    model = BertForSequenceClassification.from_pretrained(str(model_dir), attn_implementation="eager").eval()
    encoded = load_tokenizer(str(model_dir))(
        texts, truncation=True, max_length=max_length, padding=True, return_tensors="pt"
    )
    with torch.no_grad():
        return model(input_ids=encoded["input_ids"], attention_mask=encoded["attention_mask"]).logits


def texts_file(path: Path, count: int = 200) -> Path:
    path.write_text("".join(json.dumps({"body": review(i)["text"]}) + "\n" for i in range(count)))
    return path


def retrofit_state(recipe: Recipe) -> tuple[TrainState, Objective]:
    """Model, optimizer and teacher at step 0, as ``fit`` builds them, and the objective."""
    objective = Objective.from_recipe(recipe)
    torch.manual_seed(recipe.seed)
    state = initial_state(recipe, objective, load_backbone(recipe.backbone), "cpu", None)
    return state, objective


def run_steps(recipe: Recipe, count: int) -> TrainState:
    """``count`` training steps on the recipe's texts; returns the state."""
    state, objective = retrofit_state(recipe)
    tokenizer = load_tokenizer(recipe.backbone)
    texts = [{"text": review(i)["text"]} for i in range(recipe.batch_size)]
    state.model.train()
    for _ in range(count):
        batch = objective.task.make_batch(texts, tokenizer, recipe.max_length)
        train_step(state, objective, batch, StepSchedule(count + 1, 0, 1.0))
    return state


# ---------------------------------------------------------------------- the user's model, exactly
def test_recipe_reads_labels_and_length_from_the_checkpoint(tmp_path: Path) -> None:
    checkpoint = write_hf_classifier(tmp_path / "hf")
    texts = texts_file(tmp_path / "texts.jsonl")
    recipe = retrofit_recipe(str(checkpoint), "classification", texts, "body", profile="full")
    assert recipe.labels == LABELS and recipe.max_length == 512  # min(tokenizer 512, positions 512, cap)
    assert (recipe.batch_size, recipe.steps) == (8, 700)  # sized as imdb.yaml's full profile
    full = load_recipe(IMDB_RECIPE, "full")
    assert recipe.retention.schedule_power == full.retention.schedule_power
    assert recipe.optimizer.scorer_lr == full.optimizer.scorer_lr and recipe.rho == full.rho
    assert recipe.retrofit is not None and recipe.retrofit.freeze_backbone
    assert retrofit_recipe(str(checkpoint), "classification", texts, profile="quick").max_length == 256


def test_rho_1_is_the_checkpoint_bit_for_bit_in_training_mode_too(tmp_path: Path) -> None:
    """The student at ρ = 1 is transformers' BertForSequenceClassification, also in training mode (the
    teacher pass runs there: frozen backbone and head have no dropout)."""
    checkpoint = write_hf_classifier(tmp_path / "hf")
    recipe = retrofit_recipe(str(checkpoint), "classification", texts_file(tmp_path / "t.jsonl"), "body")
    state, _ = retrofit_state(recipe)
    texts = [str(review(i)["text"]) for i in range(6)]
    expected = hf_logits(checkpoint, texts, recipe.max_length)
    assert expected.std(0).min() > 0.1  # the logits differ across texts: a real comparison
    encoded = load_tokenizer(str(checkpoint))(texts, truncation=True, padding=True, return_tensors="pt")
    for training in (False, True):
        state.model.train(training)
        with torch.no_grad():
            out = state.model.forward_pruned(
                encoded["input_ids"], encoded["attention_mask"], rho=torch.ones(len(texts))
            )
        torch.testing.assert_close(out.logits, expected, atol=1e-6, rtol=0)


def test_a_checkpoint_without_a_classifier_is_refused(tmp_path: Path) -> None:
    texts = texts_file(tmp_path / "t.jsonl")
    encoder_only = write_sentence_transformer(tmp_path / "st")  # a BertModel: no classification head
    with pytest.raises(SystemExit, match="not a sequence classifier"):
        training_main(["retrofit", str(encoder_only), "--task", "classification", "--texts", str(texts)])
    with pytest.raises(ValueError, match="needs labels"):
        retrofit_recipe(str(encoder_only), "qa", texts)


# ---------------------------------------------------------------------- frozen vs tuned
def backbone_and_head(state: TrainState) -> dict[str, torch.Tensor]:
    return {
        name: value.detach().clone()
        for name, value in state.model.state_dict().items()
        if not name.startswith("scorers.")
    }


def scorer_weights(state: TrainState) -> dict[str, torch.Tensor]:
    return {n: v.detach().clone() for n, v in state.model.state_dict().items() if n.startswith("scorers.")}


@pytest.mark.parametrize("task", ["classification", "embedding"])
def test_frozen_stays_frozen_and_backbone_lr_tunes_against_a_frozen_teacher(
    tmp_path: Path, task: str
) -> None:
    if task == "classification":
        original = write_hf_classifier(tmp_path / "model")
    else:
        original = write_sentence_transformer(tmp_path / "model")
    texts = texts_file(tmp_path / "t.jsonl")
    # the frozen retrofit: one set of weights (an embedding's default two-path model: test_pruned_branch)
    frozen_recipe = retrofit_recipe(str(original), task, texts, "body", pruned_branch="shared")
    frozen_recipe = frozen_recipe.model_copy(update={"batch_size": 4})
    start = retrofit_state(frozen_recipe)[0]
    before, scorers_before = backbone_and_head(start), scorer_weights(start)

    frozen = run_steps(frozen_recipe, 3)
    assert frozen.teacher is None  # the model is its own teacher
    after = backbone_and_head(frozen)
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    assert any(not torch.equal(v, scorers_before[k]) for k, v in scorer_weights(frozen).items())

    tuned_recipe = retrofit_recipe(str(original), task, texts, "body", backbone_lr=1e-3)
    tuned_recipe = tuned_recipe.model_copy(update={"batch_size": 4})
    assert tuned_recipe.retrofit is not None and not tuned_recipe.retrofit.freeze_backbone
    assert tuned_recipe.optimizer.lr == 1e-3
    tuned = run_steps(tuned_recipe, 3)
    changed = backbone_and_head(tuned)
    assert any(not torch.equal(changed[k], before[k]) for k in before if k.startswith("backbone."))
    if task == "classification":
        assert not torch.equal(changed["head.out.weight"], before["head.out.weight"])
    assert tuned.teacher is not None  # a frozen copy of the original: untouched by the steps
    teacher = {n: v for n, v in tuned.teacher.state_dict().items() if not n.startswith("scorers.")}
    assert all(torch.equal(teacher[k], before[k]) for k in before)
    assert not tuned.teacher.training and not any(p.requires_grad for p in tuned.teacher.parameters())


# ---------------------------------------------------------------------- the CLI, end to end
def onnx_logits(model_dir: Path, texts: list[str], max_length: int, rho: float) -> np.ndarray:
    """The exported graph's logits (B, C) for texts encoded as evaluation encodes them."""
    tokenizer = load_tokenizer(TINY_TOKENIZER)
    ids = tokenizer(texts, truncation=True, max_length=max_length)["input_ids"]
    session = open_session(model_dir / MODEL_FILE)
    return np.array(onnx_predict_rows(session, as_rows(ids), rho, tokenizer.pad_token_id, 4))


def test_cli_retrofit_trains_only_the_scorers_and_serves_the_checkpoint_at_rho_1(tmp_path: Path) -> None:
    checkpoint = write_hf_classifier(tmp_path / "hf")
    texts = texts_file(tmp_path / "texts.jsonl")
    run_dir = tmp_path / "run"
    arguments = ["--task", "classification", "--texts", str(texts), "--field", "body", "--steps", "3"]
    training_main(["retrofit", str(checkpoint), *arguments, "--run-dir", str(run_dir), "--no-progress"])
    log = [json.loads(line) for line in (run_dir / LOG_FILE).read_text().splitlines()]
    assert log[-1]["step"] == 2 and log[0]["lr"] == pytest.approx(1e-3)  # the scorers' lr: all that trains
    assert log[0]["task_loss"] >= 0.0  # a KL divergence
    trained = load_file(str(run_dir / WEIGHTS_FILE))
    original = BertForSequenceClassification.from_pretrained(str(checkpoint)).state_dict()
    reference = load_backbone(str(checkpoint)).state_dict()
    assert all(torch.equal(trained[f"backbone.{name}"], value) for name, value in reference.items())
    assert torch.equal(trained["head.dense.weight"], original["bert.pooler.dense.weight"])
    assert torch.equal(trained["head.out.weight"], original["classifier.weight"])

    # Export with no labelled dataset: the manifest's curve is agreement with the dense model.
    out = tmp_path / "models" / "tiny-retrofit"
    training_main(["export", str(run_dir), "--out", str(out), "--min-kept-tokens", "0"])
    manifest = Manifest.read(out)
    assert manifest.task == "classification" and manifest.labels == list(LABELS)
    assert manifest.quality is not None and manifest.quality.metric == AGREEMENT_METRIC
    assert {p.rho: p.value for p in manifest.quality.points}[1.0] == 1.0
    served = [str(review(i)["text"]) for i in range(6)]
    np.testing.assert_allclose(
        onnx_logits(out, served, 512, 1.0), hf_logits(checkpoint, served, 512).numpy(), atol=1e-5
    )

    # Accuracy needs labels: evaluate refuses the unlabeled texts and takes a labelled dataset.
    with pytest.raises(SystemExit, match="needs labels"):
        training_main(["evaluate", str(run_dir)])
    root = write_imdb(tmp_path / "data")
    results = tmp_path / "results"
    training_main(
        ["evaluate", str(run_dir), "--dataset", "imdb", "--data-root", str(root), "--out", str(results)]
    )
    report = json.loads((results / "eval.json").read_text())
    assert report["meta"]["split"] == "imdb/test" and report["meta"]["num_examples"] == 40
    learned = {r["rho"]: r["accuracy"] for r in report["results"] if r["method"] == "learned"}
    test_rows = read_jsonl_gz(root / "imdb" / "test.jsonl.gz")
    dense = hf_logits(checkpoint, [str(r["text"]) for r in test_rows], 512).argmax(-1)
    labels = torch.tensor([int(str(r["label"])) for r in test_rows])
    assert learned[1.0] == pytest.approx((dense == labels).float().mean().item())


def test_imdb_comparison_sequence_on_tiny_models(tmp_path: Path) -> None:
    """The documented commands, tiny: fit imdb.yaml's dense profile → to-hf → retrofit on the IMDb train
    texts with --eval-dataset imdb → export (accuracy curve on imdb/validation) → evaluate imdb/test."""
    from training.fitting.fit import fit

    root = write_imdb(tmp_path / "data")
    dense = load_recipe(IMDB_RECIPE, "dense")
    dataset = dense.dataset.model_copy(update={"root": str(root)})
    evaluation = dense.evaluation.model_copy(update={"validation_size": 20})
    dense = dense.model_copy(
        update={"dataset": dataset, "evaluation": evaluation, "steps": 3, "batch_size": 4, "max_length": 64}
    )
    tokenizer = load_tokenizer(TINY_TOKENIZER)
    torch.manual_seed(0)
    from training.engine.encoders import backbone_from_config

    dense_run = tmp_path / "runs" / "imdb-minilm-dense"
    fit(dense, dense_run, backbone=backbone_from_config(tiny_config(tokenizer.vocab_size)), progress=False)
    assert json.loads((dense_run / RECIPE_FILE).read_text())["profile"] == "dense"

    hf_dir = tmp_path / "hf-imdb-minilm-dense"
    training_main(["to-hf", str(dense_run), "--out", str(hf_dir)])
    retro_run = tmp_path / "runs" / "imdb-retrofit"
    training_main(
        [
            "retrofit", str(hf_dir), "--task", "classification", "--profile", "full",
            "--texts", str(root / "imdb" / "train.jsonl.gz"), "--eval-dataset", "imdb",
            "--data-root", str(root), "--steps", "2", "--run-dir", str(retro_run), "--no-progress",
        ]
    )  # fmt: skip
    recipe = Recipe.model_validate_json((retro_run / RECIPE_FILE).read_text())
    assert recipe.labels == dense.labels and recipe.evaluation_dataset().name == "imdb"
    out = tmp_path / "models" / "imdb-retrofit"
    training_main(["export", str(retro_run), "--out", str(out)])
    manifest = Manifest.read(out)
    assert manifest.quality is not None and manifest.quality.metric == "accuracy"
    assert manifest.quality.split == "imdb/validation"
    results = tmp_path / "results"
    training_main(["evaluate", str(retro_run), "--split", "test", "--limit", "16", "--out", str(results)])
    report = json.loads((results / "eval.json").read_text())
    assert report["meta"]["split"] == "imdb/test" and report["meta"]["num_examples"] == 16
    assert {r["rho"] for r in report["results"] if r["method"] == "learned"} == set(recipe.evaluation.rhos)
    assert training_task("classification").retrofit is not None
