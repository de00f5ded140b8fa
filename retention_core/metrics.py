"""Quality metrics shared by evaluation and monitoring.

- SQuAD v1.1 exact match / F1 with the official normalisation (lowercase, strip punctuation, the
  articles a/an/the and extra whitespace), maximised over the gold answers, as the official
  ``evaluate-v1.1.py`` does.
- Ranking of one relevant document among many (retrieval, reranking): its 1-based rank, nDCG@k,
  MRR@k and recall@k, in percent. Pure numpy, so evaluation in ``training/``, the retrieval benchmarks
  and a reranking task's evaluation all score a ranking the same way.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence

import numpy as np

RANKING_CUTOFF = 10  # the k of nDCG@k, MRR@k and recall@k unless a caller names another
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    """Official SQuAD v1.1 normalisation."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def f1(prediction: str, gold: str) -> float:
    """Token-level F1 between normalised answers (official definition: 0 when no token overlaps)."""
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(gold).split()
    common = Counter(pred_tokens) & Counter(gold_tokens)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision = same / len(pred_tokens)
    recall = same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def squad_scores(prediction: str, golds: Sequence[str]) -> dict[str, float]:
    """{"exact_match", "f1"} in [0, 1], each the max over the gold answers."""
    if not golds:
        raise ValueError("SQuAD v1.1 scoring needs at least one gold answer")
    return {
        "exact_match": max(exact_match(prediction, gold) for gold in golds),
        "f1": max(f1(prediction, gold) for gold in golds),
    }


# ---------------------------------------------------------------------- ranking
def gold_ranks(scores: np.ndarray, gold: np.ndarray) -> np.ndarray:
    """1-based rank of each query's gold document. scores (Q, D), gold (Q,) → (Q,) int.

    Ties are broken by document index (lower first), as a stable descending sort would."""
    gold_scores = scores[np.arange(len(gold)), gold][:, None]  # (Q, 1)
    above = (scores > gold_scores).sum(1)  # (Q,)
    before = np.arange(scores.shape[1])[None, :] < gold[:, None]  # (Q, D)
    tied_before = ((scores == gold_scores) & before).sum(1)  # (Q,)
    return (above + tied_before + 1).astype(np.int64)


def query_ndcg(ranks: np.ndarray, cutoff: int = RANKING_CUTOFF) -> np.ndarray:
    """Per-query nDCG@k (percent) of one-relevant-document queries: the ideal DCG is 1, so it is
    1 / log2(rank + 1) inside the cut-off, else 0. (Q,) ranks → (Q,) float64."""
    ranks = np.asarray(ranks, dtype=np.float64)
    return 100.0 * np.where(ranks <= cutoff, 1.0 / np.log2(ranks + 1.0), 0.0)


def ranking_metrics(ranks: np.ndarray, cutoff: int = RANKING_CUTOFF) -> dict[str, float]:
    """nDCG@k, MRR@k, recall@1 and recall@k (percent) from the gold ranks of one-relevant-document
    queries (nDCG as in ``query_ndcg``)."""
    ranks = np.asarray(ranks, dtype=np.float64)
    inside = ranks <= cutoff
    return {
        f"ndcg@{cutoff}": float(np.mean(query_ndcg(ranks, cutoff))),
        f"mrr@{cutoff}": 100.0 * float(np.mean(np.where(inside, 1.0 / ranks, 0.0))),
        "recall@1": 100.0 * float(np.mean(ranks <= 1)),
        f"recall@{cutoff}": 100.0 * float(np.mean(inside)),
    }
