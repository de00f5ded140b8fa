"""The documents a speed benchmark times, as the retrieval encodes them: the first documents of a retrieval
set, tokenized ([CLS] … [SEP], cut to the model's length) and padded into length-sorted batches. Shared by
``benchmarks.frontier`` and ``benchmarks.cpu_peers`` (which times its peers in the frontier's rounds)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

SEQ_LEN, BATCH = 256, 8  # 256 tokens: the MiniLM embedding model's own max_seq_length

Feeds = dict[str, np.ndarray]  # one padded batch: input_ids, attention_mask, token_type_ids (B, T)
Run = Callable[[], object]  # one timed call: a batch of documents embedded


def dataset_texts(dataset: str, count: int, path: Path | None = None) -> list[str]:
    """The first ``count`` distinct documents of a retrieval set (its file under the data root, or
    ``path``): the very documents whose quality the files measured."""
    from benchmarks.retrieval_parts import DATASETS, data_file, read_retrieval_set

    return read_retrieval_set(data_file(DATASETS[dataset], path), None, DATASETS[dataset]).paragraphs[:count]


def token_rows(tokenizer: Any, texts: Sequence[str], max_length: int = SEQ_LEN) -> list[list[int]]:
    """[CLS] … [SEP] ids of each text, cut to ``max_length`` (as the retrieval encodes them)."""
    return [list(ids) for ids in tokenizer(list(texts), truncation=True, max_length=max_length)["input_ids"]]


def dataset_rows(
    tokenizer: Any, dataset: str, count: int, max_length: int, path: Path | None = None
) -> list[list[int]]:
    """``dataset_texts`` tokenized as the retrieval encodes them."""
    return token_rows(tokenizer, dataset_texts(dataset, count, path), max_length)


def padded(rows: list[list[int]]) -> Feeds:
    """Token-id rows → right-padded feeds (pad id 0, as the peer and our graph mask it)."""
    length = max(len(row) for row in rows)
    input_ids = np.zeros((len(rows), length), dtype=np.int64)
    attention_mask = np.zeros_like(input_ids)
    for i, row in enumerate(rows):
        input_ids[i, : len(row)], attention_mask[i, : len(row)] = row, 1
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "token_type_ids": np.zeros_like(input_ids),
    }


def batched(rows: list[list[int]], batch: int) -> list[Feeds]:
    """Rows in length-sorted batches of ``batch`` (as ``retention-batch`` and the retrieval run them)."""
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
    return [padded([rows[i] for i in order[start : start + batch]]) for start in range(0, len(rows), batch)]
