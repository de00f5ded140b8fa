"""Summarization's quality metric: ROUGE-1/2/L F-measure via ``rouge-score`` (Porter stemming on, as in
the summarization literature).

``rouge-score`` is a *train* extra: it is imported lazily, only when ROUGE is asked for, so the serving
path never needs it. With several references the score of each ROUGE variant is the maximum over
references (``aggregate="max"``, the SciTLDR convention) or their mean (``"mean"``). ``rougeLsum`` is the
summary-level LCS: pass multi-sentence texts with one sentence per line (the other variants ignore line
breaks).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL", "rougeLsum")

_SCORERS: dict[tuple[str, ...], Any] = {}


def _rouge_scorer(rouge_types: tuple[str, ...]) -> Any:
    if rouge_types not in _SCORERS:
        from rouge_score import rouge_scorer  # train extra: imported only when ROUGE is computed

        _SCORERS[rouge_types] = rouge_scorer.RougeScorer(list(rouge_types), use_stemmer=True)
    return _SCORERS[rouge_types]


def rouge_scores(
    prediction: str,
    references: Sequence[str],
    aggregate: Literal["max", "mean"] = "max",
    rouge_types: tuple[str, ...] = ROUGE_TYPES,
) -> dict[str, float]:
    """ROUGE F-measures in [0, 1] of one prediction against one or more references."""
    if not references:
        raise ValueError("ROUGE needs at least one reference")
    scorer = _rouge_scorer(rouge_types)
    per_reference = [scorer.score(reference, prediction) for reference in references]
    result = {}
    for kind in rouge_types:
        values = [score[kind].fmeasure for score in per_reference]
        result[kind] = max(values) if aggregate == "max" else sum(values) / len(values)
    return result
