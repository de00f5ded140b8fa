"""Text helpers shared by the task codecs (torch-free, numpy + tokenizers only): the tokenizer copies a
codec windows and encodes with, the pad id, whitespace normalisation. (Summarization's sentence splitter
is its own: ``retention_tasks/summarization/sentences.py``.)
"""

from __future__ import annotations

from tokenizers import Tokenizer


def normalize_whitespace(text: str) -> str:
    """Collapse every whitespace run to one space and strip."""
    return " ".join(text.split())


def pad_token_id(tokenizer: Tokenizer) -> int:
    """The id the tokenizer pads with ([PAD] for BERT, <pad> for RoBERTa), else 0."""
    padding = tokenizer.padding
    if padding and padding.get("pad_id") is not None:
        return int(padding["pad_id"])
    for token in ("[PAD]", "<pad>"):
        token_id = tokenizer.token_to_id(token)
        if token_id is not None:
            return int(token_id)
    return 0


def plain_copy(tokenizer: Tokenizer) -> Tokenizer:
    """A private copy of ``tokenizer`` that neither truncates nor pads.

    A codec cuts inputs itself (to ``max_length``, or into windows), so it must not inherit the settings
    the given tokenizer carries: a transformers tokenizer's backend (training, evaluation) keeps whatever
    truncation its last call set (MiniLM's file says 128). The shared tokenizer is never mutated, so
    codecs can be used from several threads.
    """
    copy = Tokenizer.from_str(tokenizer.to_str())
    copy.no_truncation()
    copy.no_padding()
    return copy


def windowing_tokenizer(tokenizer: Tokenizer, max_length: int, stride: int, pair: bool) -> Tokenizer:
    """A private copy of ``tokenizer`` that cuts long inputs into overlapping windows.

    Every window is a complete model input (special tokens included, at most ``max_length`` tokens);
    consecutive windows share ``stride`` tokens of the (second) sequence. The shared tokenizer is
    never mutated, so codecs can be used from several threads.
    """
    copy = plain_copy(tokenizer)
    copy.enable_truncation(
        max_length, stride=stride, strategy="only_second" if pair else "longest_first", direction="right"
    )
    return copy


def backend_tokenizer(tokenizer: object) -> Tokenizer:
    """A ``tokenizers.Tokenizer`` from either itself or a transformers fast tokenizer."""
    if isinstance(tokenizer, Tokenizer):
        return tokenizer
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if isinstance(backend, Tokenizer):
        return backend
    raise TypeError(f"expected a tokenizers.Tokenizer or a fast tokenizer, got {type(tokenizer).__name__}")
