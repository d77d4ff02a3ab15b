"""Aggregates of a sweep's runs (``specbench.bench.sweep``): totals and rates per group as Spec-Bench reports them,
each group's speedup interval over its paired runs, and acceptance per draft position from step logs (the
conditional rate the break-even model uses, with an interval that treats the drafts of one generation as the
dependent trials they are)."""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from specbench.bench import paired
from specbench.bench.paired import rate_interval, wilson_interval

# -- aggregates --------------------------------------------------------------------------------


def rate(numerator: pl.Expr, denominator: str, otherwise: float | None) -> pl.Expr:
    """``numerator`` / column ``denominator`` where that is positive, else ``otherwise``."""
    return pl.when(pl.col(denominator) > 0).then(numerator / pl.col(denominator)).otherwise(otherwise)


#: What a sweep's summary sums per group (and the verify seconds, where its runs have them).
_SUMMED = "decode_tokens decode_s plain_decode_tokens plain_decode_s steps verifies drafted accepted".split()


def summarize_sweep(runs: pl.DataFrame, by: Sequence[str] = ("drafter", "policy")) -> pl.DataFrame:
    """Totals per group and the rates derived from them (ratios of sums, as Spec-Bench's #MAT).

    ``speedup`` = (sum of decode tokens / sum of decode seconds) over the group's runs divided by
    the same for their plain baselines; ``mean_k``: tokens drafted per verification.
    """
    by = list(by)
    missing = [c for c in by if c not in runs.columns]
    if missing:
        raise ValueError(f"cannot group by {missing}: the runs have columns {runs.columns}")
    out = (
        runs.group_by(by, maintain_order=True)
        .agg(
            pl.len().alias("runs"),
            pl.col(
                *"decode_tokens decode_s plain_decode_tokens plain_decode_s steps verifies drafted accepted".split()
            ).sum(),
            *[pl.col(c).sum() for c in ("verify_s", "verification_s") if c in runs.columns],
            pl.col("equal_to_plain").drop_nulls().all().alias("all_equal_to_plain"),
            pl.col("equal_to_plain").drop_nulls().len().alias("checked"),
            *[pl.col(c).first() for c in ("policy_family", "k") if c in runs.columns and c not in by],
            *[pl.col(c).drop_nulls().first() for c in ("exact_divergence",) if c in runs.columns],
        )
        .with_columns(
            (pl.col("decode_tokens") / pl.col("decode_s")).alias("decode_tokens_per_s"),
            (
                (pl.col("decode_tokens") / pl.col("decode_s"))
                / (pl.col("plain_decode_tokens") / pl.col("plain_decode_s"))
            ).alias("speedup"),
            (pl.col("decode_tokens") / pl.col("steps")).alias("mean_accepted_tokens"),
            rate(pl.col("accepted") + pl.col("verifies"), "verifies", None).alias("tokens_per_verify"),
            rate(pl.col("accepted"), "drafted", None).alias("acceptance_rate"),
            rate(pl.col("drafted"), "verifies", None).alias("mean_k"),
            pl.when(pl.col("checked") > 0).then(pl.col("all_equal_to_plain")).alias("all_equal_to_plain"),
        )
    )
    return out.join(paired_intervals(runs, by), on=by, how="left", nulls_equal=True) if by else out


#: Columns ``paired_intervals`` adds to a sweep's summary.
PAIRED_COLUMNS = {
    "prompts": pl.Int64,
    "pairs": pl.Int64,
    "speedup_low": pl.Float64,
    "speedup_high": pl.Float64,
    "resampled": pl.String,
    "level": pl.Float64,
}


def paired_intervals(runs: pl.DataFrame, by: Sequence[str]) -> pl.DataFrame:
    """Per group: its prompts, and over the rows timed in adjacent pairs (``run_sweep(pairs=N)``) their number and
    the speedup's 95 % interval (``paired.paired_ratio``: over prompts from 6 prompts on, else over pairs from 6
    pairs, else none; ``resampled`` says which). Rows of a sweep that added pairs until each group decided
    (``run_sweep(max_pairs=M)``) carry the rule's ``looks``: their intervals are at ``paired.sequential_level``."""
    by = list(by)
    rows = []
    for key, group in runs.group_by(by, maintain_order=True):
        timed_pairs = group.filter(pl.col("pair").is_not_null()) if "pair" in group.columns else group.clear()
        prompts = group["prompt"].n_unique() if "prompt" in group.columns else None
        row = {**dict(zip(by, key)), "prompts": prompts, "pairs": timed_pairs.height}
        if timed_pairs.height:
            looks = int(timed_pairs.select(pl.col("looks").max()).item() or 1) if "looks" in timed_pairs.columns else 1
            columns = ("prompt", "temperature", "seed", "plain_decode_tokens", "plain_decode_s", "decode_tokens")
            pairs = [((p, t, s), *sums) for p, t, s, *sums in timed_pairs.select(*columns, "decode_s").iter_rows()]
            level = paired.sequential_level(looks)
            ratio = paired.paired_ratio(pairs, level=level)
            row.update(speedup_low=ratio.low, speedup_high=ratio.high, resampled=ratio.resampled, level=level)
        rows.append(row)
    schema = {c: runs.schema[c] for c in by} | PAIRED_COLUMNS
    return pl.DataFrame(rows, schema=schema)


def best_per_group(summary: pl.DataFrame, group: Sequence[str], metric: str = "speedup") -> pl.DataFrame:
    """The row with the highest ``metric`` in each ``group`` (e.g. each drafter's best policy)."""
    return summary.sort(metric, descending=True, nulls_last=True).group_by(list(group), maintain_order=True).first()


# -- per draft position ------------------------------------------------------------------------
#: The columns of ``per_position_acceptance`` after its groups'.
POSITION_COLUMNS = {
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
        return pl.DataFrame(schema={**{c: steps.schema.get(c, pl.Utf8) for c in by}, **POSITION_COLUMNS})
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
        .select(*by, *POSITION_COLUMNS)
        .sort([*by, "position"])
    )
