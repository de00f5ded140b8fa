"""Small hand-written rows in the dataset layouts (SQuAD, SciTLDR-A, BBC News), so tests need no data."""

from __future__ import annotations

from typing import Any

NORMANS = (
    "The Normans were the people who in the 10th and 11th centuries gave their name to Normandy, "
    "a region in France. They were descended from Norse raiders and pirates from Denmark, Iceland "
    "and Norway who, under their leader Rollo, agreed to swear fealty to King Charles III of West "
    "Francia. Through generations of assimilation the descendants would gradually merge with the "
    "Carolingian-based cultures of West Francia."
)
CAFE = "Le café de Flore, à Paris, est célèbre. Il a ouvert en 1887 près de Saint-Germain 😀."


def squad_row(qid: str, question: str, context: str, answer: str, occurrence: int = 0) -> dict[str, object]:
    start = -1
    for _ in range(occurrence + 1):
        start = context.index(answer, start + 1)
    return {
        "id": qid,
        "title": "T",
        "context": context,
        "question": question,
        "answers": {"text": [answer], "answer_start": [start]},
    }


SQUAD_ROWS: list[dict[str, Any]] = [
    squad_row("q1", "Who was the leader of the Norse raiders?", NORMANS, "Rollo"),
    squad_row("q2", "Which region is named after the Normans?", NORMANS, "Normandy"),
    squad_row("q3", "Where is the café de Flore?", CAFE, "Paris"),
    squad_row("q4", "When did it open?", CAFE, "1887"),
    squad_row("q5", "With which cultures did they merge?", NORMANS, "Carolingian-based cultures"),
    squad_row("q6", "Which king did they swear fealty to?", NORMANS, "King Charles III"),
]

SCITLDR_ROWS: list[dict[str, Any]] = [
    {
        "id": f"s{i}",
        "title": "T",
        "document": [
            "Mixed precision training is fast on modern hardware.",
            "It needs loss scaling to avoid numerical underflow.",
            "We propose adaptive loss scaling that removes a hyperparameter.",
            "Experiments show faster convergence and better accuracy.",
        ][: 2 + i % 3],
        "summary": "Adaptive loss scaling removes a hyperparameter of mixed precision training.",
        "all_summaries": [
            "Adaptive loss scaling removes a hyperparameter of mixed precision training.",
            "Layer-wise loss scales for mixed precision.",
        ],
        "extractive_labels": [0, 1, 0, 0][: 2 + i % 3],
    }
    for i in range(6)
]

BBC_ROWS: list[dict[str, Any]] = [
    {
        "id": f"business/{i:03d}",
        "category": "business",
        "title": "T",
        "document": "Profits rose 76% to $1.13bn (£600m) at Time Warner.\n\nThe firm benefited from sales. "
        "TimeWarner said fourth quarter sales rose 2% to $11.1bn. Analysts were surprised.",
        "summary": "Profits rose 76% to $1.13bn (£600m) at Time Warner.TimeWarner said fourth quarter "
        "sales rose 2% to $11.1bn.",
    }
    for i in range(2)
]
