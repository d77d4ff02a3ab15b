"""Break-even math on a cost profile: nothing here measures.

With per-position acceptance a_i (the probability draft token i is accepted given the earlier
ones were), c(w) the cost of a width-w verification in plain steps (including the engine's step
overhead) and d a drafter's cost per draft token:

    E(k) = 1 + sum_{j<=k} prod_{i<=j} a_i        tokens per verification
    S(k) = E(k) / (c(k+1) + k d)                  speedup over plain decoding

Plain steps are timed through the engine, pipelined as mlx-lm decodes (the next step queued
before the current token is read), so c(1) is usually above 1: a verification cannot be
pipelined that way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from specbench.core.draft import Drafter
from specbench.cost.profile import Profile, cost_at

#: A profile, or a cost curve c(1..W) (index w-1).
Costs = Profile | Sequence[float] | np.ndarray


def _curve(costs: Costs, mode: str = "fast") -> np.ndarray:
    """c(1..W) of a profile in ``mode``, or the given curve as an array."""
    if isinstance(costs, Profile):
        return costs.curve(mode)
    try:
        curve = np.asarray(costs, dtype=float)
    except (TypeError, ValueError):
        curve = None
    if curve is None or curve.ndim != 1 or not len(curve):
        raise TypeError(
            f"expected a cost Profile or a cost curve c(1..W), got {type(costs).__name__}: "
            "for a model, take specbench.cost.profile_for(model)"
        )
    return curve


def expected_tokens(acceptance: float | Sequence[float], k: int) -> float:
    """E(k) = 1 + sum_{j<=k} prod_{i<=j} a_i; a scalar means every a_i equals it."""
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    if np.ndim(acceptance) == 0:
        a = np.full(k, float(acceptance))
    else:
        a = np.asarray(acceptance, dtype=float)
        if len(a) < k:
            raise ValueError(f"acceptance has {len(a)} positions, fewer than k={k}")
        a = a[:k]
    if np.any((a < 0) | (a > 1)):
        raise ValueError("acceptance probabilities must lie in [0, 1]")
    return float(1.0 + np.cumprod(a).sum())


def speedup(acceptance: float | Sequence[float], k: int, costs: Costs, d: float = 0.0, mode: str = "fast") -> float:
    """S(k) = E(k) / (c(k+1) + k d); S(0) = 1 (plain decoding)."""
    if k == 0:
        return 1.0
    return expected_tokens(acceptance, k) / (cost_at(_curve(costs, mode), k + 1) + k * d)


def break_even_acceptance(costs: Costs, d: float = 0.0, max_k: int | None = None, mode: str = "fast") -> np.ndarray:
    """a*(k) for k = 1..max_k: the constant acceptance at which S(k) = 1.

    0 where drafting k tokens pays even if all are rejected; NaN where it never pays (even with
    every draft accepted)."""
    c = _curve(costs, mode)
    max_k = max_k or len(c) - 1
    out = np.empty(max_k)
    for k in range(1, max_k + 1):
        target = cost_at(c, k + 1) + k * d
        if target <= 1.0:
            out[k - 1] = 0.0
        elif target > k + 1:
            out[k - 1] = np.nan
        else:
            lo, hi = 0.0, 1.0
            for _ in range(60):
                mid = (lo + hi) / 2
                lo, hi = (mid, hi) if expected_tokens(mid, k) < target else (lo, mid)
            out[k - 1] = (lo + hi) / 2
    return out


def break_even_band(
    profile: Profile, d: float = 0.0, max_k: int | None = None, mode: str = "fast"
) -> tuple[np.ndarray, np.ndarray] | None:
    """a*(k) for k = 1..max_k at the low and at the high end of c(w)'s interval over the timing rounds
    (``Profile.intervals``; the engine's overhead added to both): the band the break-even lies in as far as the
    cost model's noise allows. None for a profile without intervals in ``mode``."""
    bounds = profile.intervals.get(mode)
    if not bounds or len(bounds) != len(profile.widths.get(mode, [])):
        return None
    low, high = (replace(profile, costs={mode: [b[end] for b in bounds]}) for end in (0, 1))
    max_k = max_k or max(profile.widths[mode]) - 1
    return break_even_acceptance(low, d, max_k, mode), break_even_acceptance(high, d, max_k, mode)


def best_k(
    acceptance: float | Sequence[float], costs: Costs, d: float = 0.0, max_k: int | None = None, mode: str = "fast"
) -> tuple[int, float]:
    """(k, S(k)) maximising the predicted speedup over k = 0..max_k (k = 0: plain decoding)."""
    c = _curve(costs, mode)
    max_k = max_k or len(c) - 1
    if np.ndim(acceptance) > 0:
        max_k = min(max_k, len(acceptance))
    best = (0, 1.0)
    for k in range(1, max_k + 1):
        s = speedup(acceptance, k, c, d)
        if s > best[1]:
            best = (k, s)
    return best


def drafter_cost(drafter: Drafter | None, profile: Profile | None = None) -> float:
    """A drafter's cost per draft token in plain steps: the profile's measurement of it if there
    is one, else the drafter's own ``cost_per_token``."""
    if drafter is None:
        return 0.0
    measured = profile.drafter_cost(drafter) if profile is not None else None
    return measured if measured is not None else float(getattr(drafter, "cost_per_token", 0.0) or 0.0)


def break_even_tokens(
    profile: Costs, k: int, drafter: Drafter | None = None, d: float | None = None, verify: str = "fast"
) -> float:
    """Tokens a verification of ``k`` drafts must yield on average to match plain decoding:
    c(k+1) + k d, with d the drafter's (see ``drafter_cost``) unless given."""
    if d is None:
        d = drafter_cost(drafter, profile if isinstance(profile, Profile) else None)
    return cost_at(_curve(profile, verify), k + 1) + k * d


class BreakEven:
    """k -> tokens a verification of k drafts must yield to match plain decoding (``break_even_tokens``)
    from a profile at one context length: what a policy is handed. ``at_length(L)`` is the break-even at
    the profile's measured length nearest L (``Profile.at_length``): the same object for the same length,
    so a policy sees when it changes."""

    def __init__(self, profile: Profile, drafter: Drafter | None = None, verify: str = "fast"):
        self.profile, self.drafter, self.verify = profile, drafter, verify
        self.length = profile.offset
        self._at: dict[int, BreakEven] = {profile.offset: self}
        self._base = self
        #: Context lengths at which the nearest measured length changes (geometric means of neighbours, as
        #: ``Profile.nearest_length`` measures on a log scale): a policy asks ``at_length`` only when its
        #: context crosses one.
        measured = sorted(profile.context_lengths)
        self.boundaries = tuple(float(np.sqrt(a * b)) for a, b in zip(measured, measured[1:]))

    def __call__(self, k: int) -> float:
        return break_even_tokens(self.profile, k, self.drafter, verify=self.verify)

    def at_length(self, length: int) -> BreakEven:
        base = self._base
        nearest = base.profile.nearest_length(length)
        if nearest not in base._at:
            at = base.profile.at_length(nearest)
            if self.verify not in at.costs:  # not measured in this mode at that length: the base's
                base._at[nearest] = base
            else:
                base._at[nearest] = BreakEven(at, self.drafter, self.verify)
                base._at[nearest]._base = base
                base._at[nearest].boundaries = base.boundaries
        return base._at[nearest]


def preferred_k(
    profile: Costs,
    acceptance: float | Sequence[float],
    drafter: Drafter | None = None,
    max_k: int = 8,
    verify: str = "fast",
) -> int:
    """The draft length with the best predicted speedup at ``acceptance`` (0: do not draft)."""
    d = drafter_cost(drafter, profile if isinstance(profile, Profile) else None)
    return best_k(acceptance, _curve(profile, verify), d, max_k)[0]
