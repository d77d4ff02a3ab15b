"""Checks of draft-policy and drafter arguments: one clear error naming the argument and what it must be."""

from __future__ import annotations

import math
from numbers import Integral

#: The longest draft (tokens, or a tree's nodes) a policy may ask for: each width up to it is one forward
#: of that many rows, and in exact mode one calibration of a few seconds on a CPU, before the first token.
MAX_DRAFT_LENGTH = 128


def check_k(n: int, name: str = "draft length") -> int:
    """A draft length: an integer from 1 to ``MAX_DRAFT_LENGTH``."""
    k = whole(name, n, 1)
    if k > MAX_DRAFT_LENGTH:
        raise ValueError(f"{name} {k} is over the longest draft specbench verifies ({MAX_DRAFT_LENGTH} tokens)")
    return k


def whole(name: str, value: object, low: int, high: int | None = None, note: str = "") -> int:
    """``value`` if it is an integer in [low, high] (not a bool), else a TypeError/ValueError naming ``name`` (and
    ``note``, what else it may be)."""
    bounds = (f"from {low} to {high}" if high is not None else f">= {low}") + (f" {note}" if note else "")
    if not isinstance(value, Integral) or isinstance(value, bool):
        raise TypeError(f"{name} must be an integer {bounds}, got {value!r} ({type(value).__name__})")
    if value < low or (high is not None and value > high):
        raise ValueError(f"{name} must be an integer {bounds}, got {value!r}")
    return int(value)


def real(
    name: str,
    value: object,
    low: float | None = None,
    high: float | None = None,
    allowed: str = "",
    above: bool = False,
) -> float:
    """``value`` if it is a finite number in [low, high] (``above``: in (low, high]), else a TypeError/ValueError
    naming ``name`` and what it must be (``allowed``, where the bounds alone do not say it)."""
    bounds = {(True, True): f" in [{low}, {high}]", (True, False): f" >= {low}", (False, True): f" <= {high}"}
    allowed = allowed or "a finite number" + bounds.get((low is not None, high is not None), "")
    if (
        isinstance(value, (bool, str, bytes))
        or not isinstance(value, (Integral, float))
        and not hasattr(value, "__float__")
    ):
        raise TypeError(f"{name} must be {allowed}, got {value!r} ({type(value).__name__})")
    try:
        number = float(value)
    except OverflowError:  # an integer beyond float's range
        number = math.inf
    too_low = low is not None and (number <= low if above else number < low)
    if not math.isfinite(number) or too_low or (high is not None and number > high):
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
    return number


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
