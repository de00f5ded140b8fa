"""SummarizationCodec: sentence mapping, windows, scoring and selection in document order."""

from __future__ import annotations

import numpy as np
import pytest
from tokenizers import Tokenizer

from retention_core.codecs.base import Encoded
from retention_tasks.summarization.codec import SummarizationCodec, selection_size
from retention_tasks.summarization.sentences import split_sentences

SENTENCES = [
    "Mixed precision training is fast.",
    "It needs loss scaling to avoid underflow.",
    "",
    "We propose adaptive loss scaling per layer — café 😀 東京.",
    "Experiments show faster convergence.",
]


def logits_for(encoded: Encoded, per_sentence: dict[int, float]) -> list[np.ndarray]:
    outputs = []
    for mapping in encoded.context.token_sentences:
        values = np.array([per_sentence.get(i, 0.0) if i >= 0 else 100.0 for i in mapping], dtype=np.float32)
        outputs.append(values[:, None])
    return outputs


def test_tokens_map_to_their_sentence(tokenizer: Tokenizer) -> None:
    codec = SummarizationCodec(tokenizer, max_length=256)
    encoded = codec.encode(SENTENCES)
    assert len(encoded.rows) == 1 and not encoded.truncated
    mapping = encoded.context.token_sentences[0]
    assert mapping[0] == -1 and mapping[-1] == -1  # [CLS], [SEP]
    assert 2 not in mapping  # the empty sentence has no tokens
    assert list(mapping[1:-1]) == sorted(mapping[1:-1])
    plain = Tokenizer.from_str(tokenizer.to_str())
    plain.no_padding()
    plain.no_truncation()
    for index, sentence in enumerate(SENTENCES):
        expected = len(plain.encode(sentence, add_special_tokens=False).ids)
        assert mapping.count(index) == expected


def test_windows_cover_every_token_once(tokenizer: Tokenizer) -> None:
    codec = SummarizationCodec(tokenizer, max_length=16)
    encoded = codec.encode(SENTENCES)
    assert len(encoded.rows) > 1
    assert all(len(row) <= 16 for row in encoded.rows)
    counts = [sum(m.count(i) for m in encoded.context.token_sentences) for i in range(len(SENTENCES))]
    single = SummarizationCodec(tokenizer, max_length=256).encode(SENTENCES).context.token_sentences[0]
    assert counts == [single.count(i) for i in range(len(SENTENCES))]
    assert encoded.input_tokens == len(single)


def test_overlapping_windows(tokenizer: Tokenizer) -> None:
    codec = SummarizationCodec(tokenizer, max_length=16, stride=4)
    encoded = codec.encode(SENTENCES)
    total = sum(len(m) - 2 for m in encoded.context.token_sentences)
    assert total == encoded.input_tokens - 2 + 4 * (len(encoded.rows) - 1)


def test_decode_selects_in_document_order(tokenizer: Tokenizer) -> None:
    codec = SummarizationCodec(tokenizer, max_length=16)
    encoded = codec.encode(SENTENCES)
    outputs = logits_for(encoded, {0: -1.0, 1: 0.5, 3: 2.0, 4: 1.0})
    result = codec.decode(encoded, outputs, max_sentences=2)
    assert [s["index"] for s in result["sentences"]] == [3, 4]
    assert result["sentences"][0]["text"] == SENTENCES[3]
    assert result["sentences"][0]["score"] == pytest.approx(2.0)
    everything = codec.decode(encoded, outputs, max_sentences=10)
    assert [s["index"] for s in everything["sentences"]] == [0, 1, 3, 4]  # the empty one is unscorable
    assert [s["index"] for s in codec.decode(encoded, outputs, ratio=0.5)["sentences"]] == [3, 4]
    assert len(codec.decode(encoded, outputs)["sentences"]) == 3  # default


def test_sentence_score_is_the_mean_over_windows(tokenizer: Tokenizer) -> None:
    codec = SummarizationCodec(tokenizer, max_length=12, stride=3)
    encoded = codec.encode(SENTENCES)
    outputs = []
    for w, mapping in enumerate(encoded.context.token_sentences):
        outputs.append(np.array([[float(w)] for _ in mapping], dtype=np.float32))
    scores = codec.sentence_scores(encoded, outputs)
    expected_total: dict[int, list[float]] = {}
    for w, mapping in enumerate(encoded.context.token_sentences):
        for index in mapping:
            if index >= 0:
                expected_total.setdefault(index, []).append(float(w))
    for index, values in expected_total.items():
        assert scores[index] == pytest.approx(np.mean(values))
    assert np.isnan(scores[2])


def test_selection_size() -> None:
    assert selection_size(10, None, None) == 3
    assert selection_size(10, 2, None) == 2
    assert selection_size(10, None, 0.3) == 3
    assert selection_size(10, 5, 0.3) == 3
    assert selection_size(2, 5, None) == 2
    assert selection_size(10, None, 0.01) == 1
    with pytest.raises(ValueError):
        selection_size(10, None, 1.5)


def test_split_then_encode_round_trip(tokenizer: Tokenizer) -> None:
    text = "Dr. Smith arrived. He was late! Was he tired? Nobody knows."
    sentences = split_sentences(text)
    assert sentences == ["Dr. Smith arrived.", "He was late!", "Was he tired?", "Nobody knows."]
    codec = SummarizationCodec(tokenizer, max_length=64)
    encoded = codec.encode(sentences)
    result = codec.decode(encoded, logits_for(encoded, {2: 3.0, 0: 1.0}), max_sentences=2)
    assert [s["text"] for s in result["sentences"]] == ["Dr. Smith arrived.", "Was he tired?"]


def test_empty_document(tokenizer: Tokenizer) -> None:
    codec = SummarizationCodec(tokenizer, max_length=64)
    encoded = codec.encode([])
    assert len(encoded.rows) == 1
    outputs = [np.zeros((len(encoded.rows[0]), 1), dtype=np.float32)]
    assert codec.decode(encoded, outputs) == {"sentences": []}
