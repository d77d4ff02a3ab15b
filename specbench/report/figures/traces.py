"""Agent trace figures: acceptance and speedup per turn, forward passes saved over a session."""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from specbench.report.figures.style import (
    LINE_STYLES,
    count_labels,
    drafter_colour,
    drafter_label,
    finish,
    label_pair,
    line_pair,
    new_axes,
    no_data,
)


def per_turn(turns: pl.DataFrame, title: str = "Per-turn results on agent traces"):
    """Two panels over turns: tokens per verification and speedup, a line per drafter (and trace)."""
    fig, left, right, rows = line_pair(
        turns, ["trace", "drafter"], "turn", ("tokens_per_verify", "speedup"), _trace_style, (10.0, 4.0)
    )
    if rows is None:
        return fig
    left.axhline(1.0, color="0.3", lw=0.9)
    if "verifies" in rows.columns:  # how many verifications each point averages
        for key, cell in rows.group_by(["trace", "drafter"], maintain_order=True):
            points = cell.sort("turn").drop_nulls("tokens_per_verify")
            count_labels(left, points["turn"], points["tokens_per_verify"], points["verifies"], drafter_colour(key[1]))
    for ax in (left, right):
        ax.xaxis.get_major_locator().set_params(integer=True)
    tokens = (left, "tokens per verification (accepted + 1)\n(numbers: verifications)", "Acceptance per turn")
    speed = (right, "speedup over plain decoding (x)", "Speedup per turn")
    label_pair(fig, "turn", tokens, speed, f"{title} (one generation per point, {rows['turn'].n_unique()} turns)")
    return fig


def _trace_style(key: tuple[str, str], rows: pl.DataFrame) -> dict[str, Any]:
    """A (trace, drafter) line: the drafter's colour, the trace's line style."""
    trace, drafter = key
    traces = rows["trace"].unique(maintain_order=True).to_list()
    return dict(
        color=drafter_colour(drafter),
        ls=LINE_STYLES[traces.index(trace) % len(LINE_STYLES)],
        marker="o",
        ms=4,
        label=f"{drafter_label(drafter)}" + (f" ({trace})" if len(traces) > 1 else ""),
    )


def cumulative_saved(turns: pl.DataFrame, title: str = "Model forward passes saved over a session"):
    """Cumulative tokens saved (tokens emitted minus decode forward passes) over turns, per drafter."""
    fig, ax = new_axes()
    rows = turns.filter(pl.col("drafter") != "none")
    if rows.is_empty():
        no_data(ax, "no speculative runs")
        return fig
    for key, cell in rows.group_by(["trace", "drafter"], maintain_order=True):
        cell = cell.sort("turn")
        ax.plot(cell["turn"].to_numpy(), np.cumsum(cell["saved"].to_numpy()), **_trace_style(key, rows))
    ax.set_ylim(bottom=min(0.0, ax.get_ylim()[0]), top=max(1.0, ax.get_ylim()[1]))
    ax.xaxis.get_major_locator().set_params(integer=True)
    finish(ax, "turn", "cumulative tokens saved (forward passes avoided)", title, dict(fontsize=8))
    return fig
