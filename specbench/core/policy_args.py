"""Checks of draft-policy arguments: one clear error naming the argument and what it must be."""

from __future__ import annotations

import math
from numbers import Integral


def check_k(n: int) -> int:
    """A draft length: an integer >= 1."""
    return at_least_one("draft length", n)


def at_least_one(name: str, n: object) -> int:
    """``n`` if it is an integer >= 1 (not a bool), else a TypeError/ValueError naming ``name``."""
    if not isinstance(n, Integral) or isinstance(n, bool):
        raise TypeError(f"{name} must be an integer >= 1, got {n!r} ({type(n).__name__})")
    if n < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {n!r}")
    return int(n)


def check_break_even(value: object, source: str) -> float:
    """A break-even (tokens a verification must yield): a number >= 0, not NaN (inf: never draft)."""
    try:
        if isinstance(value, (bool, str, bytes)):
            raise TypeError
        number = float(value)  # numbers, and scalar arrays
    except (TypeError, ValueError):
        raise TypeError(f"{source} must be a number of tokens >= 0, got {value!r} ({type(value).__name__})") from None
    if math.isnan(number) or number < 0:
        raise ValueError(f"{source} must be a number of tokens >= 0, got {value!r}")
    return number
