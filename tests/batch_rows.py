"""Rows of token ids as one padded run and its outputs back per row: the batch-invariance tests of the
graph (tests/training/test_batch_invariance.py) and of the backends (tests/service/
test_backend_batch_invariance.py) build the same feeds and cut the same way."""

from __future__ import annotations

import numpy as np

PROTECTED_TOKENS = 2  # a QA question's first tokens


def padded_feeds(rows: list[np.ndarray], rhos: list[float], width: int) -> dict[str, np.ndarray]:
    """Every input a task's graph may take, for ``rows`` padded to ``width``: (B, width) ids, mask,
    zero token types and the first tokens protected; (B,) rho."""
    ids = np.zeros((len(rows), width), np.int64)
    mask = np.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, : len(row)], mask[i, : len(row)] = row, 1
    protected = np.zeros_like(mask)
    protected[:, :PROTECTED_TOKENS] = mask[:, :PROTECTED_TOKENS]
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "rho": np.array(rhos, np.float32),
        "token_type_ids": np.zeros_like(mask),
        "protected_mask": protected,
    }


def per_row(outputs: list[np.ndarray], rows: list[np.ndarray], width: int) -> list[list[np.ndarray]]:
    """Each row's outputs of one run, cut to its own tokens where an output has a token axis."""
    return [
        [output[i][: len(row)] if output[i].shape[:1] == (width,) else output[i] for output in outputs]
        for i, row in enumerate(rows)
    ]
