"""The toy parity task, torch side: batches, loss, evaluation (accuracy), and its dataset."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from retention_core.codecs.base import Encoded
from retention_core.text import pad_token_id
from tests.task_packages.toy_parity.spec import LABELS, SPEC, TASK
from training.evaluation.codec_loop import (
    CodecLoop,
    codec_quality_curve,
    codec_results,
    codec_task_evaluation,
    truncated_text,
)
from training.recipes.data import Example, local_splits
from training.tasks.batch import Batch
from training.tasks.codecs import EVERY_WINDOW, evaluation_codec, rows_to_tensors, task_codec
from training.tasks.registry import Curve, EvaluationRun, Report, TrainingTask

__all__ = ["DATASETS", "SPEC", "TRAINING"]

DATASET = "toy_parity_words"
FOLDER = "toy"  # its splits under the data root: toy/validation.jsonl.gz, toy/test.jsonl.gz


def parity_batch(examples: list[Example], tokenizer: Any, max_length: int) -> Batch:
    codec = task_codec(TASK, tokenizer, max_length, LABELS, EVERY_WINDOW)
    rows = [row for example in examples for row in codec.encode(str(example["text"])).rows]
    feeds = rows_to_tensors(rows, pad_token_id(codec.tokenizer))
    targets = torch.tensor([int(str(example["label"])) for example in examples], dtype=torch.long)
    return Batch(feeds["input_ids"], feeds["attention_mask"], targets)


def parity_loss(logits: torch.Tensor, batch: Batch) -> torch.Tensor:
    return F.cross_entropy(logits, batch.targets)  # logits (B, 3)


def codec_loop(tokenizer: Any, max_length: int) -> CodecLoop:
    codec = evaluation_codec(TASK, tokenizer, max_length, LABELS)

    def score(example: Example, encoded: Encoded, outputs: list[np.ndarray]) -> dict[str, float]:
        correct = codec.decode(encoded, outputs)["label"] == LABELS[int(str(example["label"]))]
        return {"accuracy": float(correct)}

    def encode(example: Example) -> Encoded:
        encoded: Encoded = codec.encode(str(example["text"]))
        return encoded

    return CodecLoop(encode, score, truncated_text, pad_token_id(codec.tokenizer))


def parity_report(run: EvaluationRun, rhos: Sequence[float], methods: Sequence[str]) -> Report:
    EVALUATION.check_methods(methods)
    results = codec_results(run, codec_loop(run.tokenizer, run.recipe.max_length), rhos, methods)
    return {"task": TASK, "num_examples": len(run.examples), "metric": "accuracy", "results": results}


def parity_curve(onnx_path: Path, tokenizer: Any, examples: list[Example], recipe: Any) -> Curve:
    loop = codec_loop(tokenizer, recipe.max_length)
    return codec_quality_curve(onnx_path, loop, examples, "accuracy", recipe.evaluation)


EVALUATION = codec_task_evaluation(parity_report, ("accuracy",), lambda dataset: "accuracy", parity_curve)
TRAINING = TrainingTask(
    make_batch=parity_batch, loss=parity_loss, evaluation=EVALUATION, reference_dataset=DATASET
)
DATASETS = {DATASET: local_splits(FOLDER, DATASET)}
