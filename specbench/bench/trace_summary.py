"""Tables of a trace benchmark (``specbench.bench.trace_bench``): per turn and cumulatively, per trace
and method, and per method over every trace with its interval over traces."""

from __future__ import annotations

import re
from string import Formatter

import polars as pl

from specbench.bench.paired import ratio_interval
from specbench.bench.sweep_summary import rate

#: The baseline method of every trace benchmark: plain decoding.
PLAIN = "plain"


def with_cumulative(turns: pl.DataFrame) -> pl.DataFrame:
    """Add running totals per method and their rates."""

    frame = turns.with_columns(
        pl.col(name).cum_sum().over("method", order_by=pl.col("turn")).alias(f"cum_{name}")
        for name in ("drafted", "accepted", "verifies", "decode_tokens", "decode_s")
    )
    frame = frame.with_columns(
        rate(pl.col("cum_accepted") + pl.col("cum_verifies"), "cum_verifies", 0.0).alias("cum_tokens_per_verify"),
        (pl.col("cum_decode_tokens") / pl.col("cum_decode_s")).alias("cum_tokens_per_s"),
    )
    return _with_speedup(frame, "turn", "cum_decode_s", "cum_speedup")


def _with_speedup(frame: pl.DataFrame, on: str, seconds: str, name: str) -> pl.DataFrame:
    """Add column ``name``: plain decoding's ``seconds`` over each row's, plain's row matched on ``on``."""
    plain = frame.filter(pl.col("method") == PLAIN).select(on, pl.col(seconds).alias("_plain_s"))
    return (
        frame.join(plain, on=on, how="left")
        .with_columns((pl.col("_plain_s") / pl.col(seconds)).alias(name))
        .drop("_plain_s")
    )


def summarize_trace_bench(turns: pl.DataFrame) -> pl.DataFrame:
    """One row per (trace, method) of a trace benchmark's turns: totals over the turns and the rates
    derived from them."""
    frame = turns.group_by("trace", "method", maintain_order=True).agg(
        pl.len().alias("turns"),
        pl.col("prompt_tokens").mean().round(0).cast(pl.Int64).alias("mean_prompt_tokens"),
        pl.col("tokens", "drafted", "accepted", "verifies", "steps", "decode_tokens", "decode_s").sum(),
        pl.col("identical").all(),
    )
    frame = frame.with_columns(
        rate(pl.col("accepted") + pl.col("verifies"), "verifies", 0.0).alias("tokens_per_verify"),
        rate(pl.col("accepted"), "drafted", 0.0).alias("acceptance_rate"),
        (pl.col("decode_tokens") / pl.col("steps")).alias("mean_accepted_tokens"),
        (pl.col("decode_tokens") / pl.col("decode_s")).alias("tokens_per_s"),
    )
    return _with_speedup(frame, "trace", "decode_s", "speedup")


def _text_table(frame: pl.DataFrame, titles: str, row: str) -> str:
    """``frame`` as fixed-width text: one line per row formatted by ``row`` (``str.format`` fields such as
    ``{tokens:7d}``) under a header of ``titles`` (comma-separated, one per field), each as wide as its
    field and aligned like its values (text left, numbers and ``>`` fields right)."""
    header = []
    names = iter(titles.split(", "))
    for literal, field, spec, _ in Formatter().parse(row):
        header.append(literal)
        if field is not None:
            align, width = re.match(r"([<>]?)(\d+)", spec).groups()
            header.append(format(next(names), f"{align or ('<' if spec.endswith('s') else '>')}{width}s"))
    return "\n".join(["".join(header), *(row.format(**r) for r in frame.iter_rows(named=True))])


def format_summary(summary: pl.DataFrame) -> str:
    """A compact text table of ``summarize_trace_bench``'s rows."""
    return _text_table(
        summary,
        "trace, method, turns, tokens, drafted, accepted, tok/verify, MAT, tok/s, speedup, identical",
        "{trace:18.18s} {method:8.8s} {turns:5d} {tokens:7d} {drafted:8d} {accepted:8d} {tokens_per_verify:10.2f} "
        "{mean_accepted_tokens:5.2f} {tokens_per_s:8.1f} {speedup:7.2f} {identical!s:>9s}",
    )


def overall_by_method(summary: pl.DataFrame, independent: bool = True) -> pl.DataFrame:
    """One row per method over every trace of ``summarize_trace_bench``'s rows that plain decoding also ran:
    traces, verifications, accepted drafts, decode tokens and seconds summed, tokens per verification,
    tokens/s, whether every turn equalled plain decoding, and ``speedup``, its tokens/s over plain decoding's
    over the same traces. With ``independent`` traces (each replayed with fresh drafters) and at least
    ``MIN_UNITS`` of them, ``speedup_low``/``speedup_high`` give its 95 % bootstrap interval over traces (each
    resampled with its plain run); a trace's turns depend on each other, so turns are never resampled apart."""
    plain = summary.filter(pl.col("method") == PLAIN).select("trace", "decode_tokens", "decode_s")
    paired = summary.join(plain, on="trace", suffix="_plain")
    frame = paired.group_by("method", maintain_order=True).agg(
        pl.len().alias("traces"),
        pl.col("verifies", "accepted", "decode_tokens", "decode_s", "decode_tokens_plain", "decode_s_plain").sum(),
        pl.col("identical").all(),
    )
    frame = frame.with_columns(
        rate(pl.col("accepted") + pl.col("verifies"), "verifies", 0.0).alias("tokens_per_verify"),
        (pl.col("decode_tokens") / pl.col("decode_s")).alias("tokens_per_s"),
        (
            (pl.col("decode_tokens") / pl.col("decode_s")) / (pl.col("decode_tokens_plain") / pl.col("decode_s_plain"))
        ).alias("speedup"),
    ).drop("decode_tokens_plain", "decode_s_plain")
    intervals = []
    for (method,), mine in paired.group_by("method", maintain_order=True):
        units = mine.select("decode_tokens", "decode_s").rows()
        base = mine.select("decode_tokens_plain", "decode_s_plain").rows()
        usable = independent and method != PLAIN and all(s > 0 for _, s in units + base)
        intervals.append(ratio_interval(base, units) if usable else None)
    return frame.with_columns(
        pl.Series("speedup_low", [i[0] if i else None for i in intervals], dtype=pl.Float64),
        pl.Series("speedup_high", [i[1] if i else None for i in intervals], dtype=pl.Float64),
    )


def format_overall(overall: pl.DataFrame) -> str:
    """``overall_by_method``'s rows as text: speedup over plain with its interval over traces where it has one."""
    traces = overall.select(pl.col("traces").max()).item() if overall.height else 0
    lines = [f"overall, {traces} traces: method, decode tokens, tok/s, speedup [95 % over traces]"]
    columns = ("method", "decode_tokens", "tokens_per_s", "speedup", "speedup_low", "speedup_high")
    for method, tokens, tokens_per_s, speedup, low, high in overall.select(columns).iter_rows():
        shown = "" if speedup is None else f"{speedup:.2f}x"
        if low is not None:
            shown += f" [{low:.2f}-{high:.2f}]"
        rate_text = "" if tokens_per_s is None else f"{tokens_per_s:8.1f}"
        lines.append(f"  {method:18.18s} {tokens:8d} {rate_text:>8s} {shown}")
    return "\n".join(lines)


def format_turns(turns: pl.DataFrame) -> str:
    """Per-turn lines: tokens, accepted per verification and speedup, per turn and cumulatively."""
    return _text_table(
        turns,
        "trace, turn, method, prompt, tokens, drafted, accepted, tok/verify, tok/s, speedup, cum speedup, same",
        "{trace:18.18s} {turn:4d} {method:8.8s} {prompt_tokens:6d} {tokens:6d} {drafted:7d} {accepted:8d} "
        "{tokens_per_verify:10.2f} {tokens_per_s:8.1f} {speedup:7.2f} {cum_speedup:11.2f} {identical!s:>5s}",
    )
