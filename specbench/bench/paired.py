"""Paired timing statistics: ratios over adjacent pairs of runs in alternating order (``paired_ratio``), bootstrap
intervals (expanded percentile), Student's t tail.

A speedup measured on a machine whose speed drifts between runs needs an interval, not a point: these are
the pieces the benchmarks share (``specbench bench``'s intervals over prompts; the GPU default-policy
benchmark's one-sided t-test over paired runs lives beside its script, ``scripts/gpu/default_policy_cells.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

#: Fewest resampled units (prompts, pairs) an interval is computed from: a bootstrap of fewer claims more
#: than it knows.
MIN_UNITS = 6


def expanded_tail(units: int, level: float = 0.95) -> float:
    """The tail probability at which an expanded percentile interval of ``units`` resampled units cuts
    each end: Phi(-sqrt(n / (n - 1)) t), t Student's two-sided ``level`` quantile with n - 1 degrees of
    freedom (Hesterberg's expanded percentile interval). A plain percentile bootstrap of few units is too
    narrow (of 6 prompts, a "95 %" interval covers about 85 % of the time); this widens it to about the
    level asked, and tends to (1 - level) / 2 as units grow."""
    if units < 2:
        raise ValueError(f"an interval needs at least 2 units, got {units}")
    dof, goal = units - 1, (1.0 - level) / 2
    low, high = 0.0, 1e3
    for _ in range(100):  # bisection: student_t_above falls as t grows
        middle = (low + high) / 2
        low, high = (middle, high) if student_t_above(middle, dof) > goal else (low, middle)
    z = math.sqrt(units / dof) * (low + high) / 2
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def _cut(sorted_stats: Sequence[float], tail: float) -> tuple[float, float]:
    """The values at ``tail`` and 1 - ``tail`` of sorted bootstrap statistics."""
    draws = len(sorted_stats)
    return float(sorted_stats[int(tail * draws)]), float(sorted_stats[draws - 1 - int(tail * draws)])


def bootstrap(values: Sequence[Any], statistic: Callable, draws: int = 5000, seed: int = 0) -> tuple[float, float]:
    """95 % expanded percentile bootstrap interval of ``statistic`` over ``values`` (each resampled whole;
    ``expanded_tail``)."""
    rng = np.random.default_rng(seed)
    stats = sorted(statistic([values[i] for i in rng.integers(0, len(values), len(values))]) for _ in range(draws))
    return _cut(stats, expanded_tail(len(values)))


def sums_interval(
    units: Sequence[Sequence[float]] | np.ndarray,
    statistic: Callable[[np.ndarray], np.ndarray],
    draws: int = 5000,
    seed: int = 0,
    level: float = 0.95,
    min_units: int = MIN_UNITS,
) -> tuple[float, float] | None:
    """``level`` (95 %) expanded percentile bootstrap interval (``expanded_tail``) of a statistic of column sums over
    units (a prompt, a turn, a trace), each unit's row resampled whole: ``statistic`` maps the column sums of every
    draw, [draws, columns], to one value per draw (a rate, a ratio of throughputs, a difference of two such between two
    runs over the same units). None under ``min_units`` units."""
    units = np.asarray(units, dtype=float)
    if len(units) < min_units:
        return None
    picks = np.random.default_rng(seed).integers(0, len(units), (draws, len(units)))
    return _cut(np.sort(statistic(units[picks].sum(axis=1))), expanded_tail(len(units), level))


def ratio_interval(
    base: Sequence[tuple[float, float]],
    mine: Sequence[tuple[float, float]],
    draws: int = 5000,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[float, float] | None:
    """``level`` (95 %) expanded percentile bootstrap interval (``expanded_tail``) of a throughput ratio over paired
    units (a prompt, a turn, a trace): each unit's (tokens, seconds) for the baseline and for the method, resampled
    together; the ratio is (tokens / seconds of the method) over (tokens / seconds of the baseline), summed
    over units. None under ``MIN_UNITS`` units."""
    if len(base) != len(mine):
        raise ValueError(f"ratio_interval needs the same units on both sides, got {len(base)} and {len(mine)}")
    if len(base) < MIN_UNITS:
        return None
    units = np.hstack([np.asarray(base, dtype=float), np.asarray(mine, dtype=float)])
    # columns: tokens, seconds; base first
    return sums_interval(units, lambda sums: (sums[:, 2] / sums[:, 3]) / (sums[:, 0] / sums[:, 1]), draws, seed, level)


def rate_interval(
    successes: Sequence[float], trials: Sequence[float], draws: int = 5000, seed: int = 0
) -> tuple[float, float] | None:
    """95 % expanded percentile bootstrap interval (``expanded_tail``) of a rate summed over units (a prompt's
    accepted drafts over its drafts): each unit's (successes, trials) resampled whole, so trials that share a
    unit (the drafts of one generation) count as the dependent trials they are. None under ``MIN_UNITS``
    units."""
    if len(successes) != len(trials):
        raise ValueError(f"rate_interval needs one trial count per unit, got {len(successes)} and {len(trials)}")
    if len(trials) < MIN_UNITS:
        return None
    units = np.column_stack([successes, trials])
    return sums_interval(units, lambda sums: sums[:, 0] / np.maximum(sums[:, 1], 1.0), draws, seed)


def wilson_interval(successes: np.ndarray, trials: np.ndarray, z: float = 1.96) -> tuple[np.ndarray, np.ndarray]:
    """95 % Wilson score interval (low, high) of a binomial proportion, elementwise: for independent trials
    (with trials clustered in units, ``rate_interval`` is the honest one)."""
    n = np.maximum(np.asarray(trials, dtype=float), 1.0)
    p = np.asarray(successes, dtype=float) / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def student_t_above(t: float, dof: int) -> float:
    """P(T >= t) for Student's t with ``dof`` (>= 1) degrees of freedom, by the finite sums of Abramowitz and
    Stegun 26.7.3-4 for whole degrees of freedom."""
    theta = math.atan(t / math.sqrt(dof))
    c2, term, total = math.cos(theta) ** 2, 1.0, 1.0
    if dof % 2:  # odd: A = (2 / pi) (theta + sin cos (1 + 2/3 c2 + 2*4/(3*5) c2^2 + ...))
        for j in range(1, (dof - 1) // 2):
            term *= c2 * (2 * j) / (2 * j + 1)
            total += term
        inside = 2.0 / math.pi * (theta + (math.sin(theta) * math.cos(theta) * total if dof > 1 else 0.0))
    else:  # even: A = sin (1 + 1/2 c2 + 1*3/(2*4) c2^2 + ...)
        for j in range(1, dof // 2):
            term *= c2 * (2 * j - 1) / (2 * j)
            total += term
        inside = math.sin(theta) * total
    return 0.5 * (1.0 - inside)  # inside = P(-|t| < T < |t|) signed with t


def seconds_ratio(pairs: Sequence[tuple[float, float]]) -> float:
    """Baseline seconds over the method's, summed over (baseline, method) pairs; a ValueError when there are
    no pairs or the method's runs took no time (there is no ratio to give)."""
    if not pairs:
        raise ValueError("no pairs of runs to take a ratio of seconds over")
    method = sum(a for _, a in pairs)
    if not method > 0:
        raise ValueError(f"the method's runs took {method} s over {len(pairs)} pairs: no ratio of seconds")
    return sum(p for p, _ in pairs) / method


# -- paired runs -------------------------------------------------------------------------------------------------


def sequential_level(looks: int, level: float = 0.95) -> float:
    """The level of each look's interval in a sequential rule that looks at most ``looks`` times (adding pairs
    until the interval excludes 1 or the looks run out) so that the whole rule errs at most 1 - ``level``
    (Bonferroni over the looks: conservative, valid whatever the looks' correlation)."""
    if looks < 1:
        raise ValueError(f"a sequential rule looks at least once, got {looks}")
    return 1.0 - (1.0 - level) / looks


def baseline_first(index: int) -> bool:
    """Whether the baseline runs first in pair ``index`` of a sequence of adjacent (baseline, method) pairs: the
    order alternates, so a machine whose speed drifts one way favours neither side."""
    return index % 2 == 0


@dataclass(frozen=True)
class PairedRatio:
    """A throughput ratio measured over adjacent (baseline, method) pairs of runs: the method's tokens / seconds
    over the baseline's, summed over every pair, with its 95 % expanded bootstrap interval (``ratio_interval``).

    The interval resamples whole units (prompts, traces) when there are ``MIN_UNITS`` of them, else single pairs
    when there are ``MIN_UNITS`` pairs (then it speaks of these units only), else there is none. ``resampled`` says
    which: "prompt", "trace", "pair" or "" (no interval)."""

    ratio: float
    low: float | None
    high: float | None
    pairs: int
    units: int
    resampled: str

    @property
    def has_interval(self) -> bool:
        return self.low is not None and self.high is not None


def paired_ratio(
    pairs: Sequence[tuple[Any, float, float, float, float]], unit: str = "prompt", level: float = 0.95
) -> PairedRatio:
    """``PairedRatio`` of ``pairs``: (unit key, baseline tokens, baseline seconds, method tokens, method seconds)
    per pair of adjacent runs; ``unit`` names what a key is ("prompt", "trace", "turn"); ``level``: the interval's
    (``sequential_level`` where pairs were added until it decided)."""
    if not pairs:
        raise ValueError("paired_ratio needs at least one pair of runs")
    by_unit: dict[Any, list[float]] = {}
    for key, base_tokens, base_s, tokens, seconds in pairs:
        sums = by_unit.setdefault(key, [0.0, 0.0, 0.0, 0.0])
        for i, value in enumerate((base_tokens, base_s, tokens, seconds)):
            sums[i] += float(value)
    totals = np.sum(list(by_unit.values()), axis=0)
    ratio = (totals[2] / totals[3]) / (totals[0] / totals[1]) if totals[1] > 0 and totals[3] > 0 else float("nan")
    if len(by_unit) >= MIN_UNITS:
        units, resampled = list(by_unit.values()), unit
    elif len(pairs) >= MIN_UNITS:
        units, resampled = [list(map(float, p[1:])) for p in pairs], "pair"
    else:
        return PairedRatio(float(ratio), None, None, len(pairs), len(by_unit), "")
    interval = ratio_interval([(u[0], u[1]) for u in units], [(u[2], u[3]) for u in units], level=level)
    assert interval is not None  # MIN_UNITS units or pairs
    return PairedRatio(float(ratio), interval[0], interval[1], len(pairs), len(by_unit), resampled)
