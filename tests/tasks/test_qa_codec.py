"""QACodec: windows, segment ids, protection, span decoding and character offsets."""

from __future__ import annotations

import numpy as np
import pytest
from tokenizers import Tokenizer

from retention_core.codecs.base import Encoded, pad_rows
from retention_tasks.qa.codec import NO_ANSWER, QACodec

CONTEXT = (
    "The Normans were the people who in the 10th and 11th centuries gave their name to Normandy, "
    "a region in France. They were descended from Norse raiders and pirates from Denmark, Iceland "
    "and Norway who, under their leader Rollo, agreed to swear fealty to King Charles III of West Francia."
)


def plain(tokenizer: Tokenizer) -> Tokenizer:
    """A copy without the padding / truncation the packaged tokenizer.json enables."""
    copy = Tokenizer.from_str(tokenizer.to_str())
    copy.no_padding()
    copy.no_truncation()
    return copy


def span_logits(
    codec: QACodec, encoded: Encoded, window: int, start: int, end: int, value: float = 8.0
) -> list[np.ndarray]:
    """Zero logits everywhere except a start at token ``start`` and an end at token ``end`` of one window."""
    outputs = [np.zeros((len(row), 2), dtype=np.float32) for row in encoded.rows]
    outputs[window][start, 0] = value
    outputs[window][end, 1] = value
    return outputs


def token_of(encoded: Encoded, window: int, char: int) -> int:
    """The context token of a window whose character span holds ``char``."""
    state = encoded.context.windows[window]
    for i, ((s, e), flag) in enumerate(zip(state.offsets, state.context_mask, strict=True)):
        if flag and s <= char < e:
            return i
    raise AssertionError(f"char {char} not in window {window}")


def test_rows_segments_and_protection(tokenizer: Tokenizer) -> None:
    codec = QACodec(tokenizer, max_length=32, stride=8)
    encoded = codec.encode("Who was Rollo?", CONTEXT)
    assert len(encoded.rows) > 1 and not encoded.truncated
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    question = plain(tokenizer).encode("Who was Rollo?", add_special_tokens=False).ids
    for row, window in zip(encoded.rows, encoded.context.windows, strict=True):
        assert len(row) <= 32
        q = len(question)
        assert list(row.input_ids[: q + 2]) == [cls, *question, sep] and row.input_ids[-1] == sep
        assert row.token_type_ids == tuple([0] * (q + 2) + [1] * (len(row) - q - 2))
        assert row.protected == tuple([1] * (q + 2) + [0] * (len(row) - q - 3) + [1])
        assert window.context_mask == tuple(p == 0 for p in row.protected)
    # Consecutive windows overlap by the stride (8 context tokens).
    first, second = encoded.context.windows[:2]
    tail = [o for o, f in zip(first.offsets, first.context_mask, strict=True) if f][-8:]
    head = [o for o, f in zip(second.offsets, second.context_mask, strict=True) if f][:8]
    assert tail == head
    feeds = pad_rows(encoded.rows, 0)
    assert set(feeds) == {"input_ids", "attention_mask", "token_type_ids", "protected_mask"}
    assert encoded.input_tokens == len(plain(tokenizer).encode("Who was Rollo?", CONTEXT).ids)


def test_single_window_when_it_fits(tokenizer: Tokenizer) -> None:
    codec = QACodec(tokenizer, max_length=384)
    encoded = codec.encode("Who?", CONTEXT)
    assert len(encoded.rows) == 1
    assert encoded.input_tokens == len(encoded.rows[0])


def test_decode_maps_back_to_characters(tokenizer: Tokenizer) -> None:
    codec = QACodec(tokenizer, max_length=384)
    encoded = codec.encode("Who was their leader?", CONTEXT)
    start_char = CONTEXT.index("Rollo")
    outputs = span_logits(
        codec, encoded, 0, token_of(encoded, 0, start_char), token_of(encoded, 0, start_char + 4)
    )
    answer = codec.decode(encoded, outputs)
    assert answer["answer"] == "Rollo"
    assert (answer["start"], answer["end"]) == (start_char, start_char + 5)
    assert 0.0 < answer["score"] <= 1.0


@pytest.mark.parametrize(
    ("context", "answer"),
    [
        ("Le café de Paris est célèbre pour ses crêpes sucrées.", "crêpes sucrées"),
        ("Party time 🎉🎉 at the Zürich Straße tonight!", "Zürich Straße"),
        ("首都は東京です。 Tokyo is the capital of Japan 日本.", "東京"),
        ("Emoji 😀 before the answer: naïve résumé works.", "naïve résumé"),
    ],
)
def test_unicode_offsets(tokenizer: Tokenizer, context: str, answer: str) -> None:
    codec = QACodec(tokenizer, max_length=128)
    encoded = codec.encode("What?", context)
    begin = context.index(answer)
    outputs = span_logits(
        codec, encoded, 0, token_of(encoded, 0, begin), token_of(encoded, 0, begin + len(answer) - 1)
    )
    result = codec.decode(encoded, outputs)
    assert result["answer"] == answer
    assert context[result["start"] : result["end"]] == answer


def test_no_valid_span(tokenizer: Tokenizer) -> None:
    codec = QACodec(tokenizer, max_length=64)
    encoded = codec.encode("Anything?", "")
    assert len(encoded.rows) == 1
    outputs = [np.random.default_rng(0).normal(size=(len(encoded.rows[0]), 2))]
    assert codec.decode(encoded, outputs) == NO_ANSWER
    assert ""[NO_ANSWER["start"] : NO_ANSWER["end"]] == ""


def test_invalid_spans_are_never_chosen(tokenizer: Tokenizer) -> None:
    """Highest logits on the question / [CLS] / reversed or too-long spans are ignored."""
    codec = QACodec(tokenizer, max_length=384, max_answer_tokens=3)
    encoded = codec.encode("Who was their leader?", CONTEXT)
    row = encoded.rows[0]
    window = encoded.context.windows[0]
    logits = np.zeros((len(row), 2))
    logits[0] = 50.0  # [CLS]
    logits[1:4] = 40.0  # question tokens
    context = [i for i, f in enumerate(window.context_mask) if f]
    logits[context[10], 1] = 30.0  # end before start
    logits[context[12], 0] = 30.0
    logits[context[20], 1] = 29.0  # too long (9 tokens)
    logits[context[13], 1] = 5.0  # the best valid span: 12..13
    result = codec.decode(encoded, [logits])
    s, e = window.offsets[context[12]][0], window.offsets[context[13]][1]
    assert (result["start"], result["end"]) == (s, e)
    assert result["answer"] == CONTEXT[s:e]


def test_answer_in_two_windows_picks_the_best_window(tokenizer: Tokenizer) -> None:
    codec = QACodec(tokenizer, max_length=40, stride=16)
    encoded = codec.encode("Who swore fealty?", CONTEXT)
    begin = CONTEXT.index("Norse raiders")
    holding = [
        w
        for w, window in enumerate(encoded.context.windows)
        if any(f and s <= begin < e for (s, e), f in zip(window.offsets, window.context_mask, strict=True))
        and any(
            f and s < begin + 13 <= e for (s, e), f in zip(window.offsets, window.context_mask, strict=True)
        )
    ]
    assert len(holding) >= 2, "the answer must lie in the overlap of two windows"
    weak, strong = holding[0], holding[1]
    outputs = [np.zeros((len(row), 2)) for row in encoded.rows]
    for window, value in ((weak, 3.0), (strong, 6.0)):
        outputs[window][token_of(encoded, window, begin), 0] = value
        outputs[window][token_of(encoded, window, begin + 12), 1] = value
    # A weaker distractor span elsewhere in the weak window.
    first_context = encoded.context.windows[weak].context_mask.index(True)
    outputs[weak][first_context] = 2.0
    result = codec.decode(encoded, outputs)
    assert result["answer"] == "Norse raiders"
    # The strong window's probability is reported.
    strong_only = codec.decode(
        encoded, [outputs[i] if i == strong else np.full_like(outputs[i], -50.0) for i in range(len(outputs))]
    )
    assert result["score"] == pytest.approx(strong_only["score"])


def test_long_question_is_cut(tokenizer: Tokenizer) -> None:
    codec = QACodec(tokenizer, max_length=32)
    encoded = codec.encode("why " * 40, CONTEXT)
    assert encoded.truncated
    assert all(len(row) <= 32 for row in encoded.rows)
    assert all(row.protected is not None and 0 in row.protected for row in encoded.rows)  # context left


def test_max_windows(tokenizer: Tokenizer) -> None:
    codec = QACodec(tokenizer, max_length=24, stride=4, max_windows=2)
    encoded = codec.encode("Who?", CONTEXT * 3)
    assert len(encoded.rows) == 2 and encoded.truncated
