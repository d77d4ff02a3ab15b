"""Tables of a trace benchmark (``specbench.experiments.trace_bench``): per turn and cumulatively, per trace
and method, and per method over every trace with its interval over traces."""

from __future__ import annotations

import re
from string import Formatter

import polars as pl

from specbench.experiments.paired import ratio_interval
from specbench.experiments.sweep import rate

#: The baseline method of every trace benchmark: plain decoding.
PLAIN = "plain"


def with_cumulative(turns: pl.DataFrame) -> pl.DataFrame:
    """Add running totals per method and their rates."""

    def cum(name: str) -> pl.Expr:
        return pl.col(name).cum_sum().over("method", order_by=pl.col("turn"))

    frame = turns.with_columns(
        cum("drafted").alias("cum_drafted"),
        cum("accepted").alias("cum_accepted"),
        cum("verifies").alias("cum_verifies"),
        cum("decode_tokens").alias("cum_decode_tokens"),
        cum("decode_s").alias("cum_decode_s"),
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
    """One row per method over every trace of ``summarize_trace_bench``'s rows: traces, decode tokens and
    seconds summed, tokens/s, and ``speedup``, its tokens/s over plain decoding's, summed over the traces.
    With ``independent`` traces (each replayed with fresh drafters) and at least ``MIN_UNITS`` of them,
    ``speedup_low``/``speedup_high`` give its 95 % bootstrap interval over traces (each resampled with its
    plain run); a trace's turns depend on each other, so its turns are never resampled apart."""
    units = {
        method: {r["trace"]: (r["decode_tokens"], r["decode_s"]) for r in rows.iter_rows(named=True)}
        for (method,), rows in summary.group_by("method", maintain_order=True)
    }
    plain = units.get(PLAIN, {})
    rows = []
    for method, mine in units.items():
        traces = [t for t in mine if t in plain]
        tokens, seconds = sum(mine[t][0] for t in traces), sum(mine[t][1] for t in traces)
        base_tokens, base_seconds = sum(plain[t][0] for t in traces), sum(plain[t][1] for t in traces)
        speedup = (
            (tokens / seconds) / (base_tokens / base_seconds) if seconds and base_seconds and base_tokens else None
        )
        interval = None
        if independent and method != PLAIN and speedup is not None:
            interval = ratio_interval([plain[t] for t in traces], [mine[t] for t in traces])
        rows.append(
            {
                "method": method,
                "traces": len(traces),
                "decode_tokens": tokens,
                "decode_s": seconds,
                "tokens_per_s": tokens / seconds if seconds else None,
                "speedup": speedup,
                "speedup_low": interval[0] if interval else None,
                "speedup_high": interval[1] if interval else None,
            }
        )
    schema = {"method": pl.String, "traces": pl.Int64, "decode_tokens": pl.Int64, "decode_s": pl.Float64}
    schema |= dict.fromkeys(("tokens_per_s", "speedup", "speedup_low", "speedup_high"), pl.Float64)
    return pl.DataFrame(rows, schema=schema)


def format_overall(overall: pl.DataFrame) -> str:
    """``overall_by_method``'s rows as text: speedup over plain with its interval over traces where it has one."""
    traces = overall["traces"].max() if overall.height else 0
    lines = [f"overall, {traces} traces: method, decode tokens, tok/s, speedup [95 % over traces]"]
    for r in overall.iter_rows(named=True):
        speedup = "" if r["speedup"] is None else f"{r['speedup']:.2f}x"
        if r["speedup_low"] is not None:
            speedup += f" [{r['speedup_low']:.2f}-{r['speedup_high']:.2f}]"
        rate_text = "" if r["tokens_per_s"] is None else f"{r['tokens_per_s']:8.1f}"
        lines.append(f"  {r['method']:18.18s} {r['decode_tokens']:8d} {rate_text:>8s} {speedup}")
    return "\n".join(lines)


def format_turns(turns: pl.DataFrame) -> str:
    """Per-turn lines: tokens, accepted per verification and speedup, per turn and cumulatively."""
    return _text_table(
        turns,
        "trace, turn, method, prompt, tokens, drafted, accepted, tok/verify, tok/s, speedup, cum speedup, same",
        "{trace:18.18s} {turn:4d} {method:8.8s} {prompt_tokens:6d} {tokens:6d} {drafted:7d} {accepted:8d} "
        "{tokens_per_verify:10.2f} {tokens_per_s:8.1f} {speedup:7.2f} {cum_speedup:11.2f} {identical!s:>5s}",
    )
