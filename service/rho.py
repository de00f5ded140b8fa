"""rho parsing shared by query parameters and bodies: one rule, one error message."""

from __future__ import annotations

import math


def parse_rho(value: object, name: str = "rho", allow_auto: bool = True) -> float | str | None:
    """None stays None; 'auto' (when allowed); else a finite number in (0, 1]. Raises ValueError."""
    expected = "a number in (0, 1]" + (" or 'auto'" if allow_auto else "")
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip()
        if allow_auto and text.lower() == "auto":
            return "auto"
        try:
            number = float(text)
        except ValueError:
            raise ValueError(f"{name} must be {expected}, got {value[:40]!r}") from None
    elif isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be {expected}")
    else:
        number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{name} must be {expected}, got {number}")
    if not 0.0 < number <= 1.0:
        raise ValueError(f"{name} must be {expected}, got {number:g}")
    return number
