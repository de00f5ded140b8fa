"""A classification run's per-example outcomes, and the paired difference of two runs on the same
examples (the retrofit comparison and the kept-token-floor study both compare this way)."""

from __future__ import annotations

from typing import Any

import numpy as np


def outcomes(
    model: Any,
    sequences: list[list[int]],
    labels: np.ndarray,
    method: str,
    rho: float,
    batch_size: int,
    pad: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Per example: correct (N,) bool and the fraction of dense encoder token-work done (N,)."""
    from retention_tasks.classification.learn import method_predictions

    correct = np.zeros(len(sequences), dtype=bool)
    work = np.zeros(len(sequences), dtype=np.float64)
    for batch in method_predictions(model, sequences, method, rho, batch_size, pad):
        correct[batch.indices] = np.asarray(batch.predictions) == labels[batch.indices]
        work[batch.indices] = batch.token_work.numpy()
    return correct, work


def paired(correct: np.ndarray, reference: np.ndarray) -> dict[str, float | int]:
    """Mean of correct − reference (percentage points) and its standard error over the same examples."""
    from training.evaluation.reporting import paired_difference

    stats = paired_difference(correct, reference)
    diff = correct.astype(np.int8) - reference.astype(np.int8)  # (N,) in {-1, 0, 1}
    return {
        "examples": stats["examples"],
        "accuracy_diff": 100.0 * stats["difference"],
        "standard_error": 100.0 * stats["standard_error"],
        "gained": int((diff > 0).sum()),
        "lost": int((diff < 0).sum()),
    }
