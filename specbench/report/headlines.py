"""The key results a notebook records for the report's index (``Outputs.summary``), from the
frames and profiles the library returns."""

from __future__ import annotations

from typing import Any

import polars as pl

from specbench.cost.breakeven import break_even_acceptance
from specbench.cost.profile import Profile
from specbench.experiments.sweep import best_per_group


def sweep_headline(summary: pl.DataFrame) -> dict[str, Any]:
    """A sweep summary's best speculative drafter and policy, its speedup, and whether every greedy
    output equalled plain decoding's (None when no output was compared)."""
    best = best_per_group(summary.filter(pl.col("drafter") != "none"), [])
    equal = summary["all_equal_to_plain"].drop_nulls()
    return {
        "best": f"{best['drafter'][0]} {best['policy'][0]}" if len(best) else "none",
        "best_speedup": best["speedup"][0] if len(best) else None,
        "outputs_equal_to_plain": bool(equal.all()) if len(equal) else None,
    }


def trace_headline(summary: pl.DataFrame) -> dict[str, Any]:
    """A trace run's summary: whether every method reproduced plain decoding, and each speculative
    method's speedup and tokens per verification."""
    speculative = summary.filter(pl.col("method") != "plain")
    methods = speculative["method"].to_list()
    return {
        "identical": bool(summary["identical"].all()),
        **{f"{m} speedup": s for m, s in zip(methods, speculative["speedup"].to_list())},
        **{f"{m} tokens/verify": t for m, t in zip(methods, speculative["tokens_per_verify"].to_list())},
    }


def profile_headline(profile: Profile, drafter_cost: float, widths: int) -> dict[str, Any]:
    """A cost profile's c(2), c(widths) and break-even acceptance a*(4) (None when not measured)."""
    a_star = break_even_acceptance(profile, drafter_cost, widths - 1)
    return {
        f"{profile.name} c(2)": profile.c(2),
        f"{profile.name} c({widths})": profile.c(widths),
        f"{profile.name} a*(4)": float(a_star[3]) if len(a_star) > 3 else None,
    }
