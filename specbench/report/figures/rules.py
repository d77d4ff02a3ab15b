"""Figures of the acceptance-rule comparison (``specbench.checks.acceptance_rules``): a rule keeps one
colour, a lossy rule a dashed line or hatched bar."""

from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import polars as pl

from specbench.report.figures.style import (
    WIDE,
    bar_offsets,
    finish,
    interval_bars,
    label_pair,
    line_pair,
    new_axes,
    no_data,
)
from specbench.report.figures.sweeps import per_position

RULE_COLOURS = {"token": "tab:blue", "exact-match": "tab:orange", "block": "tab:green", "typical (lossy)": "tab:red"}


def _colour(rule: str) -> str:
    return RULE_COLOURS.get(rule, "0.4")


def _lossy(rule: str) -> bool:
    return "lossy" in rule


def rules_vs_temperature(summary: pl.DataFrame, title: str = "Acceptance rules vs temperature"):
    """Two panels against temperature, a line per rule: tokens per verification and speedup over plain."""

    def style(key: tuple[str], _rows: pl.DataFrame) -> dict[str, Any]:
        return dict(color=_colour(key[0]), ls="--" if _lossy(key[0]) else "-", marker="o", ms=4, label=key[0])

    xy = ("tokens_per_verify", "speedup")
    fig, left, right, rows = line_pair(summary, ["acceptance"], "temperature", xy, style, WIDE)
    if rows is None:
        return fig
    tokens = (left, "tokens per verification (accepted + 1)", "Tokens per verification")
    label_pair(fig, "temperature", tokens, (right, "speedup over plain sampling (x)", "Speedup"), title)
    return fig


def rules_by_drafter(summary: pl.DataFrame, title: str = "Tokens per verification by drafter and draft length"):
    """A panel per temperature: grouped bars of tokens per verification per drafter and k, a bar per rule."""
    temperatures = summary["temperature"].unique().sort().to_list() if not summary.is_empty() else []
    fig, axes = plt.subplots(
        1, max(1, len(temperatures)), figsize=(4.2 * max(1, len(temperatures)), 4.2), constrained_layout=True
    )
    axes = np.atleast_1d(axes)
    if not temperatures:
        no_data(axes[0], "no speculative runs")
        return fig
    rules = summary["acceptance"].unique(maintain_order=True).to_list()
    for ax, t in zip(axes, temperatures):
        cell = summary.filter(pl.col("temperature") == t)
        groups = cell.select("drafter", "k").unique(maintain_order=True).rows()
        for j, rule in enumerate(rules):
            mine = cell.filter(pl.col("acceptance") == rule).select("drafter", "k", "tokens_per_verify")
            per_verify = {(d, k): t for d, k, t in mine.iter_rows()}
            x, width = bar_offsets(len(groups), j, len(rules))
            hatch = "//" if _lossy(rule) else None
            ax.bar(x, [per_verify.get(g) or 0.0 for g in groups], width, color=_colour(rule), hatch=hatch, label=rule)
        ax.set_xticks(np.arange(len(groups)), [f"{d}\nk={k}" for d, k in groups], fontsize=8)
        finish(ax, "drafter and draft length k", "tokens per verification", f"T = {t:g}", grid="y")
    axes[0].legend(fontsize=8)
    fig.suptitle(title)
    return fig


def rule_positions(positions: pl.DataFrame, title: str = "Per-position acceptance by rule", min_reached: int = 3):
    """a_i = P(draft token i accepted | 1..i-1 accepted) per rule (colour) and temperature (line style), with
    the 95% intervals of ``per_position_acceptance`` (``sweeps.per_position``). For block verification a_i is the
    conditional rate of its accepted prefix lengths (it accepts a prefix jointly, not token by token)."""
    return per_position(
        positions,
        title,
        min_reached=min_reached,
        unconditional=False,
        colour_of=lambda info: _colour(info["acceptance"]),
    )


def rule_shifts(table: pl.DataFrame, title: str = "Distribution shift against plain sampling", ax: Any = None):
    """A bar per rule: the total variation distance between its sampled tokens and plain sampling's, with
    its 95% bootstrap interval; a tick marks the noise level (the TVD two samples of one distribution show)."""
    fig, ax = new_axes(ax)
    if table.is_empty():
        no_data(ax, "no check run")
        return fig
    x = np.arange(len(table))
    tvd = table["tvd"].to_numpy()
    low, high = table["tvd_low"].to_numpy(), table["tvd_high"].to_numpy()
    rules = table["acceptance"].to_list()
    ax.bar(x, tvd, color=[_colour(r) for r in rules])
    interval_bars(ax, x, tvd, low, high, fmt="none", ecolor="k", capsize=3)
    ax.scatter(x, table["tvd_noise"].to_numpy(), marker="_", s=400, color="k", zorder=3, label="noise (95%)")
    ax.set_xticks(x, [f"{r}\n{v}" for r, v in zip(rules, table["verdict"].to_list())], fontsize=8)
    ylabel = "total variation distance (tokens)\n(bars: 95% bootstrap interval over samples)"
    finish(ax, "acceptance rule and its test's verdict", ylabel, title, dict(fontsize=8), "y")
    return fig
