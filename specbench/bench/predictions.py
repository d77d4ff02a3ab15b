"""Every measured speedup beside its prediction and the residual (``specbench.cost.predict``): each speculative
run of a benchmark or sweep gets the speedup the cost model predicts for its steps (``with_predictions``), and
``prediction_error`` is the mean absolute residual per group."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence

import polars as pl

from specbench.core.log import StepLog, StepRecord
from specbench.cost.predict import predicted_speedup, residual
from specbench.cost.profile import Profile

#: The columns a run gains.
COLUMNS = ("predicted_speedup", "residual", "d")


def drafting_cost(steps: Sequence[StepRecord], plain_s_per_token: float) -> float:
    """d in plain steps per drafted token, from a run's logged drafting (verified and unverified drafts)."""
    drafted = sum(r.k_drafted if r.kind == "verify" else len(r.draft_tokens or ()) for r in steps)
    seconds = sum(r.draft_s for r in steps if r.kind != "prefill")
    return seconds / drafted / plain_s_per_token if drafted and plain_s_per_token > 0 else 0.0


def with_predictions(
    runs: pl.DataFrame,
    steps: pl.DataFrame,
    profile: Profile | Mapping[str, Profile] | Callable[[str], Profile],
    measured: str = "speedup",
    plain: tuple[str, str] = ("plain_decode_s", "plain_decode_tokens"),
) -> pl.DataFrame:
    """``runs`` with ``predicted_speedup``, ``residual`` and ``d`` for each speculative run (null for plain
    runs). ``steps``: the runs' step logs with a ``run`` column; ``profile``: the cost profile, one per verify
    mode, or a function mode -> profile (runs name theirs in ``verify_mode``, else "fast"); ``measured``: the
    column of measured speedups; ``plain``: the columns of the run's plain baseline seconds and tokens."""
    by_run = steps.partition_by("run", as_dict=True) if len(steps) else {}

    @functools.cache
    def profile_of(mode: str) -> Profile:
        if isinstance(profile, Profile):
            return profile
        return profile[mode] if isinstance(profile, Mapping) else profile(mode)

    values: list[tuple[float | None, ...]] = []  # (predicted speedup, residual, d) per run
    for row in runs.iter_rows(named=True):
        frame = by_run.get((row["run"],))
        if row.get("drafter", "none") == "none" or frame is None:
            values.append((None, None, None))
            continue
        records = StepLog.from_rows(frame.sort("step").to_dicts()).records
        plain_s_per_token = row[plain[0]] / row[plain[1]] if row[plain[1]] else 0.0
        mode = row.get("verify_mode") or "fast"
        d = drafting_cost(records, plain_s_per_token)
        p = predicted_speedup(records, profile_of(mode), d, int(row.get("prompt_tokens") or 0), mode)
        values.append((p, residual(row[measured], p), d))
    columns = list(zip(*values)) or [(), (), ()]
    return runs.with_columns(pl.Series(name, column, dtype=pl.Float64) for name, column in zip(COLUMNS, columns))


def prediction_error(runs: pl.DataFrame, by: Sequence[str] = ()) -> pl.DataFrame:
    """Mean absolute residual (and the runs it covers) per group of ``by`` (all runs when empty)."""
    scored = runs.filter(pl.col("residual").is_not_null() & pl.col("residual").is_finite())
    aggregates = [pl.col("residual").abs().mean().alias("mean_abs_error"), pl.len().alias("predicted_runs")]
    if not by:
        return scored.select(aggregates)
    return scored.group_by(list(by), maintain_order=True).agg(aggregates)


def prediction_lines(
    runs: pl.DataFrame, label: Sequence[str] = ("prompt", "drafter", "policy"), measured: str = "speedup"
) -> list[str]:
    """One line per predicted run: its label, measured speedup, prediction and residual; then the mean
    absolute error."""
    scored = runs.filter(pl.col("residual").is_not_null())
    lines = [f"{'run':40s} {'measured':>9s} {'predicted':>10s} {'residual':>9s}"]
    labels = [c for c in label if c in scored.columns]
    for *names, value, predicted, off in scored.select(*labels, measured, "predicted_speedup", "residual").iter_rows():
        name = " ".join(map(str, names))
        lines.append(f"{name[:40]:40s} {value:8.2f}x {predicted:9.2f}x {off:+9.1%}")
    mae, n = prediction_error(runs).row(0)
    if n:
        lines.append(f"mean absolute prediction error: {mae:.1%} over {n} runs")
    return lines
