"""Acceptance per draft position from step logs: the conditional rate the break-even model uses, with an
interval that treats the drafts of one generation as the dependent trials they are."""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from specbench.bench.paired import rate_interval, wilson_interval

#: The columns of ``per_position_acceptance`` after its groups'.
COLUMNS = {
    "position": pl.Int64,
    "reached": pl.Int64,
    "accepted": pl.Int64,
    "rate": pl.Float64,
    "units": pl.Int64,
    "low": pl.Float64,
    "high": pl.Float64,
    "interval": pl.Utf8,
}


def per_position_acceptance(
    steps: pl.DataFrame, by: Sequence[str] = ("drafter", "policy"), unit: str = "prompt"
) -> pl.DataFrame:
    """Acceptance rate of draft position i (1-based) given positions 1..i-1 were accepted.

    ``reached``: verifications that drafted position i and accepted every earlier one; ``accepted``: those
    that accepted position i too; ``rate`` = accepted / reached. ``low``/``high``: its 95 % interval. The
    drafts of one generation are not independent trials, so where ``units`` (distinct ``unit`` values, e.g.
    prompts, that reached the position) number at least ``MIN_UNITS`` it is a bootstrap over them
    (``interval`` "over prompts"); with fewer, Wilson's interval for independent trials ("wilson")."""
    by = list(by)
    verifies = steps.filter(pl.col("kind") == "verify")
    if verifies.is_empty():
        return pl.DataFrame(schema={**{c: steps.schema.get(c, pl.Utf8) for c in by}, **COLUMNS})
    if unit not in verifies.columns:
        verifies = verifies.with_columns(pl.lit(0).alias(unit))
    longest = int(verifies["k_drafted"].max())
    frames = []
    for i in range(longest):
        frames.append(
            verifies.filter((pl.col("k_drafted") > i) & (pl.col("accepted") >= i))
            .group_by([*by, unit], maintain_order=True)
            .agg(pl.len().alias("reached"), (pl.col("accepted") > i).sum().alias("accepted"))
            .with_columns(pl.lit(i + 1).alias("position"))
        )
    per_unit = pl.concat(frames, how="vertical_relaxed")
    cells = per_unit.group_by([*by, "position"], maintain_order=True).agg(
        pl.col("reached").sum(),
        pl.col("accepted").sum(),
        pl.len().alias("units"),
        pl.col("accepted").alias("_hits"),
        pl.col("reached").alias("_tries"),
    )
    lows, highs, kinds = [], [], []
    wilson_low, wilson_high = wilson_interval(cells["accepted"].to_numpy(), cells["reached"].to_numpy())
    for k, (hits, tries) in enumerate(zip(cells["_hits"], cells["_tries"])):
        interval = rate_interval(hits.to_list(), tries.to_list())
        lows.append(interval[0] if interval else float(wilson_low[k]))
        highs.append(interval[1] if interval else float(wilson_high[k]))
        kinds.append(f"over {unit}s" if interval else "wilson")
    return (
        cells.with_columns(
            (pl.col("accepted") / pl.col("reached")).alias("rate"),
            pl.Series("low", lows, dtype=pl.Float64),
            pl.Series("high", highs, dtype=pl.Float64),
            pl.Series("interval", kinds, dtype=pl.Utf8),
        )
        .select(*by, *COLUMNS)
        .sort([*by, "position"])
    )
