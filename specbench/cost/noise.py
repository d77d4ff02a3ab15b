"""How far a measured c(w) can be trusted: its interval over timing rounds, and the checks that mark a profile noisy.

Each timing round (``specbench.cost.measure``) gives one ratio per width, its seconds over the round's plain step;
c(w)'s interval is the distribution-free interval of the median of those ratios, at the level the number of rounds
allows (``median_interval``). A profile whose speculative step costs below 1 at a width above 1, or whose c(w) steps
down between widths by more than the two intervals allow, is *noisy* (``noise``): pages that plan with it say so,
and the report's cost model measures it again, pooled (``specbench.cost.model``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

#: The level an interval aims at; with few rounds the widest interval (the range) may reach less (``level``).
LEVEL = 0.95


def _binomial_tail(n: int, j: int) -> float:
    """P(B <= j) for B ~ Binomial(n, 1/2)."""
    return sum(math.comb(n, i) for i in range(j + 1)) / 2**n


def level(rounds: int) -> float:
    """The coverage of ``median_interval`` over ``rounds`` rounds: the most that reaches ``LEVEL`` no higher than
    needed, or the range's coverage (1 - 2 / 2^n) where no interval reaches it (0 under 2 rounds)."""
    if rounds < 2:
        return 0.0
    return 1.0 - 2.0 * _binomial_tail(rounds, _order(rounds) - 1)


def _order(rounds: int) -> int:
    """The 1-based order statistic j of the interval [x_(j), x_(n+1-j)]: the largest j whose coverage is >= LEVEL,
    else 1 (the range)."""
    j = 1
    while j + 1 <= rounds // 2 and 1.0 - 2.0 * _binomial_tail(rounds, j) >= LEVEL:
        j += 1
    return j


def median_interval(values: Sequence[float]) -> tuple[float, float]:
    """The distribution-free interval of the median of ``values`` (order statistics) at ``level(len(values))``:
    the range for fewer than 9 values; one value gives a point."""
    if not values:
        raise ValueError("an interval needs at least one value")
    ordered = sorted(float(v) for v in values)
    j = _order(len(ordered))
    return ordered[j - 1], ordered[len(ordered) - j]


def noise(
    widths: Sequence[int], costs: Sequence[float], intervals: Sequence[Sequence[float]], overhead: float = 0.0
) -> list[str]:
    """Why a profile's c(w) of one verify mode cannot be taken at face value, one sentence each: a speculative step
    above width 1 (its forward and the engine's ``overhead``, as a step pays them) cheaper than one plain step, or a
    wider verification cheaper than a narrower one beyond both intervals (a kernel that changes with the rows can
    make that real: measured again, it holds). Empty: no sign of noise."""
    reasons = []
    for w, c, (low, high) in zip(widths, costs, intervals):
        if w > 1 and c + overhead < 1.0:
            reasons.append(
                f"c({w}) = {c + overhead:.3g} is below 1 [{low + overhead:.3g}-{high + overhead:.3g}]: "
                f"a {w}-row speculative step cheaper than a plain step"
            )
    for (w0, c0, (low0, _)), (w1, c1, (_, high1)) in zip(
        zip(widths, costs, intervals), list(zip(widths, costs, intervals))[1:]
    ):
        if high1 < low0:
            reasons.append(f"c({w1}) = {c1:.3g} steps down from c({w0}) = {c0:.3g} beyond both intervals")
    return reasons
