"""Per-token survival depth mapped back to the request's text (``explain=true``, the explorer page).

The graph's optional ``survival_depth`` output (``retention_core.contract.SURVIVAL_DEPTH``) gives, per
row position, how many layers the token entered. A codec records where every row token comes from
(``Encoded.spans``: a segment of the input and character offsets into it). This module joins the two:
one entry per token of the input text, special tokens left out (they carry no text; [CLS] and QA's
question and [SEP] are protected and enter every layer anyway).

A token seen by several windows (a long QA context or document read in overlapping windows, QA's
question repeated in every window) is reported once, with the deepest it got in any window: the text
a client shades is the input's, not the windows'.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from retention_core.codecs.base import SPECIAL_SEGMENT, Encoded


@dataclass(frozen=True)
class TokenDepth:
    segment: str  # which input text the offsets index, as its codec names it (codecs.base.TokenSpan)
    start: int  # character offsets [start, end) into that text
    end: int
    depth: int  # layers the token entered: 0 (dropped before layer 1) … num_layers (never dropped)


def token_depths(encoded: Encoded, depths: list[np.ndarray]) -> list[TokenDepth]:
    """The survival depth of every text token of one encoded input, in input order (segments in the
    order they first appear, then by offset). ``depths[i]`` is row i's (T_i,) graph output, unpadded."""
    if encoded.spans is None:
        raise ValueError("this codec does not map its tokens back to the text")
    rows = encoded.spans()
    if len(depths) != len(rows):
        raise ValueError(f"expected survival depths of {len(rows)} rows, got {len(depths)}")
    deepest: dict[tuple[str, int, int], int] = {}
    segment_order: dict[str, int] = {}
    for spans, row_depths in zip(rows, depths, strict=True):
        if len(spans) != len(row_depths):
            raise ValueError(f"a row of {len(spans)} tokens got {len(row_depths)} survival depths")
        for span, depth in zip(spans, row_depths.tolist(), strict=True):
            if span.segment == SPECIAL_SEGMENT:
                continue
            segment_order.setdefault(span.segment, len(segment_order))
            key = (span.segment, span.start, span.end)
            deepest[key] = max(int(depth), deepest.get(key, 0))
    ordered = sorted(deepest.items(), key=lambda item: (segment_order[item[0][0]], item[0][1], item[0][2]))
    return [TokenDepth(segment, start, end, depth) for (segment, start, end), depth in ordered]
