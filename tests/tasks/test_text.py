from __future__ import annotations

import itertools

import pytest
from tokenizers import Tokenizer

from retention_core.text import plain_copy
from retention_tasks.summarization.sentences import sentence_spans, split_sentences


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("One. Two! Three? Four", ["One.", "Two!", "Three?", "Four"]),
        (
            "Mr. Smith met Dr. Jones at 3.30 p.m. on Monday.",
            ["Mr. Smith met Dr. Jones at 3.30 p.m. on Monday."],
        ),
        (
            "J. R. R. Tolkien wrote it, e.g. The Hobbit. It sold.",
            ["J. R. R. Tolkien wrote it, e.g. The Hobbit.", "It sold."],
        ),
        (
            "The U.S. Army grew. It moved to the U.S. The end.",
            ["The U.S. Army grew.", "It moved to the U.S.", "The end."],
        ),
        ('"Really?" she asked. He nodded.', ['"Really?" she asked.', "He nodded."]),
        ('He said: "Stop." Then he left.', ['He said: "Stop."', "Then he left."]),
        (
            "Sales rose 2.5% to $10.9bn.For the year, fine.",
            ["Sales rose 2.5% to $10.9bn.For the year, fine."],
        ),
        ("See Fig. 3 and Eq. 2. Results improved.", ["See Fig. 3 and Eq. 2.", "Results improved."]),
        ("Para one\n\nPara two.\nLine three", ["Para one", "Para two.", "Line three"]),
        ("東京は大きい。大阪も大きい。", ["東京は大きい。", "大阪も大きい。"]),
        (
            "Wait… What happened? (Nobody knew.) Then 2004 came.",
            ["Wait…", "What happened?", "(Nobody knew.)", "Then 2004 came."],
        ),
        ("lowercase after period. continues here", ["lowercase after period. continues here"]),
        (
            "Prior works on CF. Our results differ, cf. Smith.",
            ["Prior works on CF.", "Our results differ, cf. Smith."],
        ),
        ("", []),
        ("   \n  ", []),
    ],
)
def test_split_sentences(text: str, expected: list[str]) -> None:
    assert split_sentences(text) == expected


def test_spans_point_into_the_text_in_order() -> None:
    text = "  First one.  Second one!\n\nThird.  "
    spans = sentence_spans(text)
    assert [text[s:e] for s, e in spans] == ["First one.", "Second one!", "Third."]
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))


def test_plain_copy_neither_truncates_nor_pads_and_leaves_the_original(tokenizer: Tokenizer) -> None:
    configured = Tokenizer.from_str(tokenizer.to_str())
    configured.enable_truncation(8)
    configured.enable_padding(length=64)
    text = "The Normans gave their name to Normandy, a region in France, in the tenth century."
    copy = plain_copy(configured)
    assert copy.truncation is None and copy.padding is None
    assert 8 < len(copy.encode(text).ids) < 64  # whole, unpadded
    assert len(configured.encode(text).ids) == 64  # the original keeps its settings
    assert configured.truncation is not None and configured.truncation["max_length"] == 8
