"""Summarization's sentences (torch-free, no tokenizer): how ``/summarize`` splits a ``text`` and how
training splits a document and its reference summaries.

``split_sentences`` is a rule-based splitter (no pysbd / nltk at serving time). The rule:

1. Paragraph and line breaks (one or more newlines) always end a sentence.
2. Inside a line, a sentence ends after a run of ``.``, ``!``, ``?`` or ``…`` (optionally followed by
   closing quotes / brackets) when whitespace follows and the next non-space character can start a
   sentence: an uppercase letter, a digit, an opening quote or bracket, or any non-Latin letter
   (CJK, Cyrillic, … have no case).
3. A single period does **not** end a sentence when the word before it is a known abbreviation
   (``Mr.``, ``Dr.``, ``Inc.``, ``Fig.``, ``e.g.``, …, see ``ABBREVIATIONS``; an all-caps word such
   as ``CF.`` is an acronym, not ``cf.``) or a single letter
   (initials: ``J. R. R. Tolkien``). A dotted acronym (``U.S.``, ``Ph.D.``) ends a sentence unless
   the next word is one of a few nouns that usually continue it (``U.S. Army``, ``U.S. President``),
   so "… in the U.S. The next …" still splits.
4. CJK full-width terminators (``。！？``) end a sentence even without a following space.

Sentences are returned stripped, in order, without empty strings. ``sentence_spans`` returns the same
sentences as character spans of the input so callers can map back.
"""

from __future__ import annotations

import re

# Lowercased, without the trailing period. Dotted forms (e.g., U.S.) are handled in _is_abbreviation.
ABBREVIATIONS = frozenset(
    [
        "mr",
        "mrs",
        "ms",
        "dr",
        "prof",
        "rev",
        "hon",
        "st",
        "sr",
        "jr",
        "messrs",
        "mme",
        "mlle",
        "gen",
        "col",
        "lt",
        "sgt",
        "capt",
        "cmdr",
        "adm",
        "gov",
        "sen",
        "pres",
        "supt",
        "insp",
        "inc",
        "ltd",
        "co",
        "corp",
        "llc",
        "plc",
        "bros",
        "dept",
        "univ",
        "assn",
        "vs",
        "etc",
        "al",
        "cf",
        "viz",
        "approx",
        "ca",
        "ibid",
        "fig",
        "figs",
        "eq",
        "eqs",
        "secs",
        "chap",
        "vol",
        "vols",
        "nos",
        "pp",
        "pg",
        "eds",
        "jan",
        "feb",
        "apr",
        "jun",
        "jul",
        "aug",
        "sep",
        "sept",
        "oct",
        "nov",
        "dec",
        "mt",
        "ft",
        "ave",
        "blvd",
        "hwy",
    ]
)
# After a dotted acronym ("U.S.") these words continue the sentence ("U.S. Army"); others start one.
_CONTINUATION_WORDS = frozenset({"army", "navy", "senate", "congress", "government", "president", "court"})

_TERMINATOR = re.compile(
    r"""(?P<end>(?:[.!?…]+|[。！？]+)["'”’»)\]]*)(?P<space>\s*)""",
)
_WORD_BEFORE = re.compile(r"([\w.'’-]+)$")
_NEWLINES = re.compile(r"\n+")


def _can_start_sentence(char: str) -> bool:
    if char.isdigit() or char in "\"'“‘«([{¿¡-–—*•":
        return True
    if char.isalpha():
        # Uppercase Latin/Greek/Cyrillic, or a script without case (CJK, Arabic, Hebrew, …).
        return char.isupper() or char.lower() == char.upper()
    return False


def _is_abbreviation(before: str, next_word: str) -> bool:
    """``before`` is the text up to (not including) the period run; ``next_word`` follows it."""
    match = _WORD_BEFORE.search(before)
    if not match:
        return False
    original = match.group(1).lstrip("'’-")
    word = original.lower()
    if not word:
        return False
    if word in ABBREVIATIONS and not (len(original) > 1 and original.isupper()):  # "CF." is an acronym
        return True
    if len(word) == 1 and word.isalpha():
        return True  # initials: "J. Smith"
    if "." in word:  # dotted acronym like u.s / ph.d / e.g
        if word in {"e.g", "i.e", "cf", "viz"}:
            return True
        return next_word.lower().strip(".,;:") in _CONTINUATION_WORDS
    return False


def _line_spans(text: str, start: int, end: int) -> list[tuple[int, int]]:
    """Sentence spans of text[start:end] (a single line)."""
    spans: list[tuple[int, int]] = []
    sentence_start = start
    for match in _TERMINATOR.finditer(text, start, end):
        stop = match.end("end")
        after = match.end()
        terminator = match.group("end")
        full_width = terminator[0] in "。！？"
        if after >= end:
            break  # end of line: the remainder is one sentence anyway
        if not match.group("space") and not full_width:
            continue  # "3.14", "e.g.x", "Yahoo!Inc": no whitespace, not a boundary
        next_char = text[after]
        if not full_width and not _can_start_sentence(next_char):
            continue
        if terminator.startswith(".") and terminator.rstrip("\"'”’»)]") == ".":
            next_word = text[after:end].split(maxsplit=1)[0] if text[after:end].strip() else ""
            if _is_abbreviation(text[sentence_start : match.start("end")], next_word):
                continue
        spans.append((sentence_start, stop))
        sentence_start = after
    spans.append((sentence_start, end))
    return spans


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """Character spans [start, end) of the sentences of ``text`` (stripped, non-empty), in order."""
    spans: list[tuple[int, int]] = []
    line_start = 0
    for newline in [*_NEWLINES.finditer(text), None]:
        line_end = newline.start() if newline else len(text)
        for start, end in _line_spans(text, line_start, line_end):
            # strip whitespace at both ends without losing the offsets
            while start < end and text[start].isspace():
                start += 1
            while end > start and text[end - 1].isspace():
                end -= 1
            if start < end:
                spans.append((start, end))
        if newline:
            line_start = newline.end()
    return spans


def split_sentences(text: str) -> list[str]:
    """Split ``text`` into sentences with the rule in the module docstring."""
    return [text[start:end] for start, end in sentence_spans(text)]
