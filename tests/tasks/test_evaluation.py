"""The shared evaluation: every task refuses unknown methods, and long inputs are evaluated on the rows
the service would run (its cap on windows per input included)."""

from __future__ import annotations

from typing import Any

import pytest

from retention_tasks.qa import learn as qa
from retention_tasks.summarization import learn as summarization
from service.runtime import load_model
from tests.service.conftest import settings_for
from tests.tasks.rows import NORMANS
from tests.tiny import build_tiny_model_dir, tiny_model, tiny_recipe
from training.tasks.registry import TRAINING_TASKS, EvaluationRun, training_task


@pytest.mark.parametrize("task", sorted(TRAINING_TASKS))
def test_every_task_refuses_a_misspelt_method(task: str) -> None:
    model, tokenizer = tiny_model(task)
    evaluation = training_task(task).evaluation
    with pytest.raises(ValueError, match="lerned"):
        evaluation.report(EvaluationRun(model, tokenizer, tiny_recipe(task), []), [0.5], ["lerned"])
    evaluation.check_methods(evaluation.default_methods)  # what the CLI runs by default is known


@pytest.fixture(scope="module")
def served_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The service's own loaded QA and summarization models (tiny, max_length 64)."""
    root = tmp_path_factory.mktemp("models")
    settings = settings_for(root)
    loaded = {}
    for task in ("qa", "summarization"):
        build_tiny_model_dir(root / task, task)
        loaded[task] = load_model(root / task, settings)
    return {"settings": settings, **loaded}


def test_long_question_context_is_evaluated_on_the_served_windows(
    served_models: dict[str, Any], hf_tokenizer: Any
) -> None:
    served = served_models["qa"]
    max_windows = served_models["settings"].max_windows
    question, context = "Who led the raiders?", " ".join([NORMANS] * 12)
    from_service = served.codec.encode(question, context)
    assert from_service.truncated and len(from_service.rows) == max_windows  # longer than the cap
    evaluated = qa.codec_loop(hf_tokenizer, served.manifest.max_length).encode(
        {"question": question, "context": context}
    )
    assert evaluated.rows == from_service.rows
    assert evaluated.truncated


def test_long_document_is_evaluated_on_the_served_windows(
    served_models: dict[str, Any], hf_tokenizer: Any
) -> None:
    served = served_models["summarization"]
    max_windows = served_models["settings"].max_windows
    sentences = [f"Sentence number {i} says something about the Normans and Rollo." for i in range(120)]
    from_service = served.codec.encode(sentences)
    assert from_service.truncated and len(from_service.rows) == max_windows
    loop = summarization.codec_loop(hf_tokenizer, served.manifest.max_length, {"max_sentences": 3})
    evaluated = loop.encode({"document": sentences})
    assert evaluated.rows == from_service.rows
