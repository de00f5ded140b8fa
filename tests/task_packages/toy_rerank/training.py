"""The toy reranker, torch side: every passage a row, cross-entropy to the gold passage; evaluated by
ranking the passages (the core's MRR@10 and nDCG@10); and its dataset."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from retention_core.codecs.base import Encoded
from retention_core.metrics import RANKING_CUTOFF, gold_ranks, ranking_metrics
from retention_core.text import pad_token_id
from tests.task_packages.toy_rerank.spec import SPEC, TASK
from training.evaluation.codec_loop import (
    CodecLoop,
    codec_quality_curve,
    codec_results,
    codec_task_evaluation,
    sub_row,
    truncation_keep,
)
from training.recipes.data import Example, local_splits
from training.tasks.batch import Batch
from training.tasks.codecs import EVERY_WINDOW, evaluation_codec, rows_to_tensors, task_codec
from training.tasks.registry import Curve, EvaluationRun, Report, TrainingTask

__all__ = ["DATASETS", "SPEC", "TRAINING"]

DATASET = "toy_rerank_queries"
FOLDER = "toy_rerank"  # its splits under the data root
METRICS = (f"mrr@{RANKING_CUTOFF}", f"ndcg@{RANKING_CUTOFF}")
HEADLINE = METRICS[1]


def passages_of(example: Example) -> list[str]:
    passages = example["passages"]
    assert isinstance(passages, list)
    return [str(passage) for passage in passages]


def rerank_batch(examples: list[Example], tokenizer: Any, max_length: int) -> Batch:
    """Every passage of every example, a row each (B·P rows); targets (B,) the gold passage."""
    codec = task_codec(TASK, tokenizer, max_length, options=EVERY_WINDOW)
    rows = [row for ex in examples for row in codec.encode(str(ex["query"]), *passages_of(ex)).rows]
    feeds = rows_to_tensors(rows, pad_token_id(codec.tokenizer))
    return Batch(
        input_ids=feeds["input_ids"],
        attention_mask=feeds["attention_mask"],
        targets=torch.tensor([int(str(ex["gold"])) for ex in examples], dtype=torch.long),  # (B,)
        protected=feeds["protected_mask"].bool(),
        token_type_ids=feeds["token_type_ids"],
    )


def rerank_loss(logits: torch.Tensor, batch: Batch) -> torch.Tensor:
    """logits (B·P, 1) → each example's passages as classes, cross-entropy to the gold one."""
    return F.cross_entropy(logits.reshape(len(batch.targets), -1), batch.targets)  # (B, P)


def truncated_passages(encoded: Encoded, rho: float, min_kept: int = 0) -> tuple[Encoded, list[float]]:
    """The truncation baseline: each row keeps its query and the first round(ρ · n) passage tokens."""
    rows, kept = [], []
    for row in encoded.rows:
        assert row.protected is not None
        positions = truncation_keep(row, np.array([flag == 0 for flag in row.protected]), rho, min_kept)
        rows.append(sub_row(row, positions))
        kept.append(len(positions) / len(row))
    return Encoded(rows, encoded.input_tokens, encoded.truncated), kept


def codec_loop(tokenizer: Any, max_length: int) -> CodecLoop:
    codec = evaluation_codec(TASK, tokenizer, max_length)

    def encode(example: Example) -> Encoded:
        encoded: Encoded = codec.encode(str(example["query"]), *passages_of(example))
        return encoded

    def score(example: Example, encoded: Encoded, outputs: list[np.ndarray]) -> dict[str, float]:
        scores = np.asarray([codec.decode(encoded, outputs)["scores"]])  # (1, P)
        ranks = gold_ranks(scores, np.asarray([int(str(example["gold"]))]))  # (1,)
        return {name: value / 100 for name, value in ranking_metrics(ranks).items() if name in METRICS}

    return CodecLoop(encode, score, truncated_passages, pad_token_id(codec.tokenizer))


def rerank_report(run: EvaluationRun, rhos: Any, methods: Any) -> Report:
    EVALUATION.check_methods(methods)
    results = codec_results(run, codec_loop(run.tokenizer, run.recipe.max_length), rhos, methods)
    return {"task": TASK, "num_examples": len(run.examples), "metric": HEADLINE, "results": results}


def rerank_curve(onnx_path: Path, tokenizer: Any, examples: list[Example], recipe: Any) -> Curve:
    loop = codec_loop(tokenizer, recipe.max_length)
    return codec_quality_curve(onnx_path, loop, examples, HEADLINE, recipe.evaluation)


EVALUATION = codec_task_evaluation(rerank_report, METRICS, lambda dataset: HEADLINE, rerank_curve, HEADLINE)
TRAINING = TrainingTask(
    make_batch=rerank_batch, loss=rerank_loss, evaluation=EVALUATION, reference_dataset=DATASET
)
DATASETS = {DATASET: local_splits(FOLDER, DATASET)}
