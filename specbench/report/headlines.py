"""The key results a notebook records for the report's index (``Outputs.summary``), from the
frames and profiles the library returns."""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from specbench.bench.sweep import best_per_group
from specbench.cost.bandwidth import achieved
from specbench.cost.breakeven import break_even_acceptance
from specbench.cost.profile import Profile


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
    """A trace run's summary (one row per method: ``TraceRun.overall()``): whether every method reproduced
    plain decoding, and each speculative method's speedup and tokens per verification."""
    speculative = summary.filter(pl.col("method") != "plain")
    methods = speculative["method"].to_list()
    return {
        "identical": bool(summary["identical"].all()),
        **{f"{m} speedup": s for m, s in zip(methods, speculative["speedup"].to_list())},
        **{f"{m} tokens/verify": t for m, t in zip(methods, speculative["tokens_per_verify"].to_list())},
    }


def profile_headline(profile: Profile, drafter_cost: float, widths: int, mode: str = "fast") -> dict[str, Any]:
    """A cost profile's c(2) and c(widths), engine overhead included (as the figures and the break-even math
    count it), the overhead itself, and the break-even acceptance a*(4) (None: never breaks even at k = 4)."""
    a_star = break_even_acceptance(profile, drafter_cost, widths - 1, mode)
    values = {f"{profile.name} c(2)": profile.c(2, mode), f"{profile.name} c({widths})": profile.c(widths, mode)}
    if mode in profile.overhead:
        values[f"{profile.name} overhead"] = profile.overhead[mode]
    if len(a_star) > 3:
        values[f"{profile.name} a*(4)"] = None if np.isnan(a_star[3]) else float(a_star[3])
    return values


def describe_profile(profile: Profile, mode: str = "fast", model: Any = None) -> str:
    """One line on a profile: plain step, c(w) (engine overhead included, and the overhead) and, given the
    model, the plain step's memory bandwidth against the device's measured peak."""
    curve = " ".join(f"{profile.c(w, mode):.2f}" for w in profile.widths[mode])
    text = (
        f"{profile.name}: plain step {1e3 * profile.plain_step_s:.1f} ms; c(w) {mode} for w = "
        f"{', '.join(map(str, profile.widths[mode]))}: {curve} plain steps "
        f"(engine overhead {profile.overhead.get(mode, 0.0):.2f} included)"
    )
    if model is not None:
        text += f"\n  plain decoding: {achieved(model, 1.0 / profile.plain_step_s).describe()}"
    return text
