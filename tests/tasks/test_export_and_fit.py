"""ONNX == torch on codec-encoded inputs, and a tiny train → export → serve round trip per task."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import torch
from tokenizers import Tokenizer

from retention_core import contract as C
from retention_core.codecs.base import Encoded, pad_rows
from retention_core.tasks import task_spec
from retention_core.text import pad_token_id
from retention_tasks.qa.codec import QACodec
from retention_tasks.summarization.codec import SummarizationCodec
from tests.tasks.rows import BBC_ROWS, SCITLDR_ROWS, SQUAD_ROWS
from tests.tiny import build_tiny_model_dir, tiny_model

PARITY_ATOL = 1e-4  # the exporter's own tolerance


def run_onnx(model_dir: Path, encoded: Encoded, rho: float, pad_id: int) -> list[np.ndarray]:
    """What the service does: pad the codec rows, add ρ, run the graph, unpad the first output."""
    session = ort.InferenceSession(str(model_dir / C.MODEL_FILE), providers=["CPUExecutionProvider"])
    feeds = pad_rows(encoded.rows, pad_id)
    feeds["rho"] = np.full(len(encoded.rows), rho, dtype=np.float32)
    names = {i.name for i in session.get_inputs()}
    first = session.run(None, {name: value for name, value in feeds.items() if name in names})[0]
    return [first[i, : len(row)] for i, row in enumerate(encoded.rows)]


def run_torch(model: Any, encoded: Encoded, rho: float, pad_id: int) -> list[np.ndarray]:
    feeds = {k: torch.from_numpy(v) for k, v in pad_rows(encoded.rows, pad_id).items()}
    with torch.no_grad():
        out = model.forward_pruned(
            feeds["input_ids"],
            feeds["attention_mask"],
            torch.full((len(encoded.rows),), rho),
            protected=feeds["protected_mask"].bool() if "protected_mask" in feeds else None,
            token_type_ids=feeds.get("token_type_ids"),
        )
    return [out.logits[i, : len(row)].numpy() for i, row in enumerate(encoded.rows)]


@pytest.fixture(scope="module")
def qa_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("models") / "tiny-qa"
    build_tiny_model_dir(out, "qa", seed=5)
    return out


@pytest.fixture(scope="module")
def summarization_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("models") / "tiny-sum"
    build_tiny_model_dir(out, "summarization", seed=6)
    return out


@pytest.mark.parametrize("rho", [0.2, 0.6, 1.0])
def test_qa_onnx_matches_torch(qa_dir: Path, rho: float) -> None:
    manifest = C.Manifest.read(qa_dir)
    assert manifest.task == "qa"
    assert [s.name for s in manifest.inputs] == [s.name for s in task_spec("qa").inputs]
    tokenizer = Tokenizer.from_file(str(qa_dir / C.TOKENIZER_FILE))
    model, _ = tiny_model("qa", seed=5)
    codec = QACodec(tokenizer, manifest.max_length, stride=16)
    for row in SQUAD_ROWS[:3]:
        encoded = codec.encode(str(row["question"]), str(row["context"]))
        onnx_out = run_onnx(qa_dir, encoded, rho, pad_token_id(tokenizer))
        torch_out = run_torch(model, encoded, rho, pad_token_id(tokenizer))
        for a, b in zip(onnx_out, torch_out, strict=True):
            assert a.shape == b.shape and a.shape[1] == 2
            np.testing.assert_allclose(a, b, atol=PARITY_ATOL)
        assert codec.decode(encoded, onnx_out)["answer"] == codec.decode(encoded, torch_out)["answer"]


@pytest.mark.parametrize("rho", [0.2, 1.0])
def test_summarization_onnx_matches_torch(summarization_dir: Path, rho: float) -> None:
    manifest = C.Manifest.read(summarization_dir)
    tokenizer = Tokenizer.from_file(str(summarization_dir / C.TOKENIZER_FILE))
    model, _ = tiny_model("summarization", seed=6)
    codec = SummarizationCodec(tokenizer, 32)  # several windows per document
    assert manifest.max_length >= 32
    for sentences in ([str(s) for s in SCITLDR_ROWS[2]["document"]], ["One sentence only."]):
        encoded = codec.encode(sentences)
        onnx_out = run_onnx(summarization_dir, encoded, rho, pad_token_id(tokenizer))
        torch_out = run_torch(model, encoded, rho, pad_token_id(tokenizer))
        for a, b in zip(onnx_out, torch_out, strict=True):
            assert a.shape == b.shape and a.shape[1] == 1
            np.testing.assert_allclose(a, b, atol=PARITY_ATOL)
        a_sum = codec.decode(encoded, onnx_out, max_sentences=2)
        b_sum = codec.decode(encoded, torch_out, max_sentences=2)
        assert [s["index"] for s in a_sum["sentences"]] == [s["index"] for s in b_sum["sentences"]]


def tiny_fit(
    task: str, rows: list[dict[str, object]], run_dir: Path, dataset: str | None = None
) -> tuple[Any, Any, Any]:
    from tests.tiny import tiny_recipe
    from training.fitting.fit import fit
    from training.recipes.recipe import DatasetSpec

    model, tokenizer = tiny_model(task, seed=7)
    recipe = tiny_recipe(task).model_copy(
        update={"steps": 4, "batch_size": 2, "log_every": 1, "max_length": 48}
        | ({"dataset": DatasetSpec(name=dataset)} if dataset else {})
    )
    trained = fit(
        recipe, run_dir, backbone=model.backbone, tokenizer=tokenizer, train_rows=rows, progress=False
    )
    return trained, recipe, tokenizer


def with_evaluation(recipe: Any, rhos: tuple[float, ...], batch_size: int) -> Any:
    evaluation = recipe.evaluation.model_copy(update={"rhos": rhos, "batch_size": batch_size})
    return recipe.model_copy(update={"evaluation": evaluation})


def test_qa_train_export_serve_round_trip(tmp_path: Path) -> None:
    from retention_tasks.qa.learn import evaluate, onnx_quality_curve
    from training.evaluation.reporting import markdown_table
    from training.evaluation.running import exit_layers
    from training.export.install import export_model
    from training.fitting.fit import LOG_FILE, load_run
    from training.tasks.registry import EvaluationRun

    model, recipe, tokenizer = tiny_fit("qa", SQUAD_ROWS, tmp_path / "run")
    log = (tmp_path / "run" / LOG_FILE).read_text().splitlines()
    assert len(log) == recipe.steps
    reloaded, reloaded_recipe, reloaded_tokenizer = load_run(tmp_path / "run")
    assert reloaded_recipe == recipe
    export_model(reloaded, reloaded_recipe, reloaded_tokenizer, tmp_path / "model")
    served = Tokenizer.from_file(str(tmp_path / "model" / C.TOKENIZER_FILE))
    codec = QACodec(served, C.Manifest.read(tmp_path / "model").max_length)
    row = SQUAD_ROWS[0]
    encoded = codec.encode(str(row["question"]), str(row["context"]))
    onnx_out = run_onnx(tmp_path / "model", encoded, 0.5, pad_token_id(served))
    torch_out = run_torch(model.eval(), encoded, 0.5, pad_token_id(served))
    for a, b in zip(onnx_out, torch_out, strict=True):
        np.testing.assert_allclose(a, b, atol=PARITY_ATOL)
    answer = codec.decode(encoded, onnx_out)
    assert str(row["context"])[answer["start"] : answer["end"]] == answer["answer"]

    report = evaluate(EvaluationRun(model, tokenizer, recipe, SQUAD_ROWS[:3]), rhos=(0.3, 1.0))
    assert set(report["results"]) == {"learned", "random", "attention", "truncation"}
    for method, by_rho in report["results"].items():
        assert set(by_rho) == {"0.3", "1"}
        for rho, values in by_rho.items():
            assert 0.0 <= values["exact_match"] <= values["f1"] <= 100.0
            assert 0.0 < values["kept_fraction"] <= 1.0
            if rho == "1":
                assert values["kept_fraction"] == pytest.approx(1.0)
            else:
                assert values["kept_fraction"] < 1.0, method
    # At ρ = 1 every method is the dense model.
    dense = {method: report["results"][method]["1"]["f1"] for method in report["results"]}
    assert len(set(dense.values())) == 1
    assert "| learned |" in markdown_table(report, ("exact_match", "f1"))

    # Layer exit (asked for, not a default): every layer at ρ = 1 is the dense model, per question;
    # at ρ 0.3 the layer count whose k / L is nearest the schedule's token-work there.
    exits = evaluate(
        EvaluationRun(model, tokenizer, recipe, SQUAD_ROWS[:3]), rhos=(0.3, 1.0), methods=("layer_exit",)
    )
    full, short = exits["results"]["layer_exit"]["1"], exits["results"]["layer_exit"]["0.3"]
    assert full["per_example"]["f1"] == pytest.approx(report["results"]["learned"]["1"]["per_example"]["f1"])
    assert full["token_work"] == pytest.approx(1.0)
    assert exit_layers(model, 0.3) < model.num_points
    assert short["token_work"] == pytest.approx(exit_layers(model, 0.3) / model.num_points)
    assert short["kept_fraction"] == pytest.approx(1.0)
    # The manifest curve (onnxruntime through the serving codec) agrees with torch evaluation.
    curve = onnx_quality_curve(
        tmp_path / "model" / C.MODEL_FILE, tokenizer, SQUAD_ROWS[:3], with_evaluation(recipe, (0.3, 1.0), 2)
    )
    for rho, value in curve:
        assert value == pytest.approx(report["results"]["learned"][f"{rho:g}"]["f1"] / 100.0, abs=1e-6)


@pytest.mark.parametrize(("rows", "dataset"), [(SCITLDR_ROWS, "scitldr_a"), (BBC_ROWS * 2, "bbc_news")])
def test_summarization_train_export_round_trip(
    tmp_path: Path, rows: list[dict[str, object]], dataset: str
) -> None:
    from retention_tasks.summarization.learn import evaluate, onnx_quality_curve
    from training.export.install import export_model
    from training.tasks.registry import EvaluationRun

    model, recipe, tokenizer = tiny_fit("summarization", rows, tmp_path / "run", dataset)
    export_model(model, recipe, tokenizer, tmp_path / "model")
    served = Tokenizer.from_file(str(tmp_path / "model" / C.TOKENIZER_FILE))
    codec = SummarizationCodec(served, recipe.max_length)
    encoded = codec.encode(["First sentence here.", "A second one follows.", "And a third."])
    onnx_out = run_onnx(tmp_path / "model", encoded, 0.5, pad_token_id(served))
    torch_out = run_torch(model.eval(), encoded, 0.5, pad_token_id(served))
    for a, b in zip(onnx_out, torch_out, strict=True):
        np.testing.assert_allclose(a, b, atol=PARITY_ATOL)
    assert len(codec.decode(encoded, onnx_out, max_sentences=1)["sentences"]) == 1

    run = EvaluationRun(model, tokenizer, recipe, rows[:3])
    report = evaluate(run, rhos=(0.5, 1.0), methods=("learned", "truncation"))
    assert report["reference_aggregate"] == "max"
    for by_rho in report["results"].values():
        for values in by_rho.values():
            assert 0.0 <= values["rougeL"] <= 100.0 and 0.0 <= values["rouge2"] <= values["rouge1"] <= 100.0
    learned_dense, truncated_dense = (dict(report["results"][m]["1"]) for m in ("learned", "truncation"))
    learned_examples, truncated_examples = (
        learned_dense.pop("per_example"),
        truncated_dense.pop("per_example"),
    )
    for metric, values in learned_examples.items():
        assert values == pytest.approx(truncated_examples[metric])
    assert learned_dense == pytest.approx(truncated_dense)  # at ρ = 1 truncation is the dense model
    assert set(report["baselines"]) == {"lead", "oracle"}
    curve = onnx_quality_curve(
        tmp_path / "model" / C.MODEL_FILE, tokenizer, rows[:3], with_evaluation(recipe, (0.5, 1.0), 2)
    )
    for rho, value in curve:
        metric = report["metric"]
        assert metric == ("rougeLsum" if dataset == "bbc_news" else "rougeL")
        assert value == pytest.approx(report["results"]["learned"][f"{rho:g}"][metric] / 100.0, abs=1e-6)
