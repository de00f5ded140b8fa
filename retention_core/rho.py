"""rho parsing shared by query parameters and bodies: one rule, one error message.

The rule is the one the OpenAPI document states, so the server accepts exactly what the document
promises: a number in (0, 1] or the string ``auto``. A query parameter is text, so there the number is
a decimal literal; a JSON body carries it as a JSON number.
"""

from __future__ import annotations

import math
import re

# A plain decimal literal ("0.3", ".5", "1", "3e-1"): no whitespace, no "inf"/"nan", no "1_0".
DECIMAL = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")


def parse_rho(
    value: object, name: str = "rho", allow_auto: bool = True, text_numbers: bool = True
) -> float | str | None:
    """None stays None; 'auto' (when allowed); else a finite number in (0, 1]. Raises ValueError.

    ``text_numbers``: a number may come as a decimal string (query parameters); False for JSON bodies,
    where the only string is 'auto'."""
    expected = "a number in (0, 1]" + (" or 'auto'" if allow_auto else "")
    if value is None:
        return None
    if isinstance(value, str):
        if allow_auto and value == "auto":
            return "auto"
        if not (text_numbers and DECIMAL.fullmatch(value)):
            raise ValueError(f"{name} must be {expected}, got {value[:40]!r}")
        number = float(value)
    elif isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be {expected}")
    else:
        number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{name} must be {expected}, got {number}")
    if not 0.0 < number <= 1.0:
        raise ValueError(f"{name} must be {expected}, got {number:g}")
    return number
