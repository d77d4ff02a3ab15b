"""Sweep figures: speedup and tokens per verification against draft length, per-position
acceptance, speedup per prompt category; sampling: acceptance against temperature, the
losslessness check's token histograms; and the acceptance rules compared at T > 0."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import polars as pl

from specbench.bench.paired import wilson_interval
from specbench.report.figures.checks import mark_coinciding
from specbench.report.figures.style import (
    LINE_STYLES,
    POLICY_MARKERS,
    POLICY_STYLES,
    WIDE,
    bar_offsets,
    count_labels,
    drafter_colour,
    drafter_label,
    drafter_order,
    finish,
    interval_bars,
    label_pair,
    line_pair,
    new_axes,
    no_data,
    noted,
)
from specbench.report.verdicts import SummaryRow


def _metric_vs_k(summary: pl.DataFrame, metric: str, ylabel: str, title: str, reference: float | None, ax: Any = None):
    fig, ax = new_axes(ax)
    rows = summary.filter(pl.col("drafter") != "none")
    if rows.is_empty():
        no_data(ax, "no speculative runs")
        return fig
    ks = rows["k"].drop_nulls().unique().sort().to_list()
    for (drafter,), mine in rows.group_by("drafter", maintain_order=True):
        for (family,), cell in mine.group_by("policy_family", maintain_order=True):
            colour, name = drafter_colour(drafter), f"{drafter_label(drafter)}, {family}"
            if cell["k"].null_count() < len(cell):
                cell, marker, style = cell.sort("k"), POLICY_MARKERS.get(family, "o"), POLICY_STYLES.get(family, "-.")
                x, y = cell["k"].to_numpy(), cell[metric].to_numpy()
                ax.plot(x, y, marker=marker, ms=5, color=colour, ls=style, lw=1.6, label=name)
                continue
            for row in SummaryRow.rows(cell):  # auto: it picks k itself; placed at its mean k
                point = dict(marker=POLICY_MARKERS.get(family, "D"), ms=8, mfc="white", mec=colour, mew=2)
                if not row.mean_k:  # it never drafted: said in the legend, no point to place
                    ax.plot([], [], ls="", marker="x", color=colour, label=f"{name}: drafted nothing")
                elif getattr(row, metric) is not None:
                    label = f"{name} (mean k {row.mean_k:.1f})"
                    ax.plot([row.mean_k], [getattr(row, metric)], ls="", label=label, **point)
    if reference is not None:
        ax.axhline(reference, color="0.3", lw=0.9, label="plain decoding")
    if ks:
        ax.set_xticks(ks)
    xlabel = "draft length k (tokens per draft; auto: mean drafted)"
    finish(ax, xlabel, ylabel, noted(title, rows, "prompt runs"), _BELOW)
    return fig


#: The legend under the axes, where it hides no point.
_BELOW = dict(ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.16), fontsize=8, frameon=False)


def speedup_vs_k(summary: pl.DataFrame, title: str = "Speedup over plain decoding vs draft length", ax: Any = None):
    """Decode speedup (x) against k, a line per drafter and policy family (auto: a point at its mean k)."""
    return _metric_vs_k(summary, "speedup", "speedup over plain decoding (x)", title, 1.0, ax)


def accepted_vs_k(summary: pl.DataFrame, title: str = "Tokens per verification vs draft length", ax: Any = None):
    """Mean tokens per verification (accepted + the bonus token) against k, under the k + 1 ceiling."""
    fig = _metric_vs_k(summary, "tokens_per_verify", "tokens per verification (accepted + 1)", title, 1.0, ax)
    axes = fig.axes[0] if ax is None else ax
    rows = summary.filter(pl.col("drafter") != "none")
    ks = rows["k"].drop_nulls().to_list() + rows["mean_k"].drop_nulls().to_list() if "mean_k" in rows.columns else []
    if ks:
        k = np.linspace(min(ks), max(ks), 2)
        axes.plot(k, k + 1, color="0.6", lw=0.8, ls=":", label="ceiling (k + 1)")
        mark_coinciding(axes)
        axes.legend(**_BELOW)
    return fig


def per_position(
    positions: pl.DataFrame,
    title: str = "Per-position acceptance",
    ax: Any = None,
    min_reached: int = 3,
    unconditional: bool = True,
    colour_of: Callable[[dict[str, Any]], str] | None = None,
):
    """Per-position acceptance a_i = P(draft token i accepted | tokens 1..i-1 accepted), the break-even
    model's definition, a line per drafter/policy with its 95% interval (``per_position_acceptance``'s: over
    prompts where 6 or more reached the position, else Wilson's) and the number of drafts that reached each
    position; with ``unconditional``, also (thin, dashed) verifications accepting token i / all
    verifications, the rate ``specbench bench`` prints. Positions reached fewer than ``min_reached`` times
    are left out: too few to estimate. A line per group of the frame's keys (drafter, acceptance rule, policy,
    temperature), coloured by its drafter unless ``colour_of`` (its keys -> a colour) says otherwise."""
    fig, ax = new_axes(ax)
    if not positions.is_empty():
        keys = [c for c in ("drafter", "acceptance", "policy", "temperature") if c in positions.columns]
        # verifications of each group: those that reached position 1
        first = positions.filter(pl.col("position") == 1).select(*keys, pl.col("reached").alias("verifications"))
        positions = positions.join(first, on=keys, how="left").filter(pl.col("reached") >= min_reached)
    if positions.is_empty():
        no_data(ax, "no verifications")
        return fig
    temperatures = positions["temperature"].unique().sort().to_list() if "temperature" in keys else []
    thin = dict(lw=0.8, ls="--", alpha=0.6)  # the unconditional rates
    for group, rows in positions.group_by(keys, maintain_order=True):
        info = dict(zip(keys, group))
        family = str(info.get("policy", "fixed")).split(":")[0]
        label = ", ".join(str(info[k]) if k != "temperature" else f"T={info[k]:g}" for k in keys)
        if temperatures:  # line style tells temperatures apart
            style = LINE_STYLES[temperatures.index(info["temperature"]) % len(LINE_STYLES)]
        else:
            style = POLICY_STYLES.get(family, "-")
        x = rows["position"].to_numpy()
        rate, reached = rows["rate"].to_numpy(), rows["reached"].to_numpy()
        if {"low", "high"} <= set(rows.columns):  # over prompts where enough reached the position, else Wilson
            low, high = rows["low"].to_numpy(), rows["high"].to_numpy()
        else:
            low, high = wilson_interval(rows["accepted"].to_numpy(), reached)
        colour = colour_of(info) if colour_of else drafter_colour(info.get("drafter", "?"))
        interval_bars(ax, x, rate, low, high, marker="o", ms=4, capsize=2, color=colour, ls=style, label=label)
        count_labels(ax, x, rate, reached, colour)
        if unconditional:
            ax.plot(x, rows["accepted"].to_numpy() / rows["verifications"].to_numpy(), color=colour, **thin)
    if unconditional:
        ax.plot([], [], color="0.4", label="unconditional: accepting i / all verifications", **thin)
    ax.set_ylim(0, 1.05)
    kinds = set(positions["interval"].to_list()) if "interval" in positions.columns else {"wilson"}
    bars = " and ".join(
        sorted("over prompts" if k.startswith("over") else "Wilson, drafts as independent" for k in kinds)
    )
    ax.xaxis.get_major_locator().set_params(integer=True)
    xlabel = f"draft position i (1 = first drafted token); numbers: drafts reaching i (>= {min_reached})"
    ylabel = f"a_i = P(i accepted | 1..i-1 accepted)\n(bars: 95% interval,\n{bars})"
    finish(ax, xlabel, ylabel, title, dict(ncol=2, fontsize=8))
    return fig


def category_speedups(best: pl.DataFrame, title: str = "Speedup by prompt category (best policy per drafter)"):
    """Grouped bars: speedup per category, a bar per drafter (label: the policy used)."""
    rows = best.filter(pl.col("drafter") != "none")
    categories = rows["category"].unique(maintain_order=True).to_list() if not rows.is_empty() else []
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(categories) + 3), 4.2), constrained_layout=True)
    if rows.is_empty():
        no_data(ax, "no speculative runs")
        return fig
    drafters = drafter_order(rows["drafter"].unique(maintain_order=True).to_list())
    for j, drafter in enumerate(drafters):
        mine = {r.category: r for r in SummaryRow.rows(rows.filter(pl.col("drafter") == drafter))}
        x, width = bar_offsets(len(categories), j, len(drafters))
        cells = [mine.get(c) for c in categories]
        values = [np.nan if r is None or r.speedup is None else r.speedup for r in cells]
        ax.bar(x, values, width=width * 0.95, color=drafter_colour(drafter), label=drafter_label(drafter))
        for xi, r, v in zip(x, cells, values):
            if r is not None and r.policy and np.isfinite(v):
                ax.text(xi, v, r.policy, ha="center", va="bottom", fontsize=7.5, color="0.25")
    ax.axhline(1.0, color="0.3", lw=0.9)
    ax.set_xticks(np.arange(len(categories)), [c.replace("_", " ") for c in categories], rotation=20, ha="right")
    top = np.nanmax(rows["speedup"].to_numpy().astype(float)) if len(rows) else 1.0
    ax.set_ylim(0, 1.3 * max(1.0, top))  # room for the legend above the bars
    legend = dict(ncol=len(drafters), loc="upper center")
    ylabel = "speedup over plain decoding (x)"
    finish(ax, "prompt category", ylabel, noted(title, rows, "prompt runs"), legend, "y", fontsize=10)
    return fig


# -- sampling ----------------------------------------------------------------------------------


def acceptance_vs_temperature(summary: pl.DataFrame, title: str = "Acceptance vs sampling temperature"):
    """Two panels: draft acceptance rate and speedup against temperature, a line per drafter/policy."""

    def style(key, rows):
        drafter, policy = key
        return dict(
            color=drafter_colour(drafter),
            ls=POLICY_STYLES.get(policy.split(":")[0], "-"),
            marker="o",
            ms=4,
            label=f"{drafter_label(drafter)}, {policy}",
        )

    fig, left, right, rows = line_pair(
        summary, ["drafter", "policy"], "temperature", ("acceptance_rate", "speedup"), style, (9.6, 4.0)
    )
    if rows is None:
        return fig
    if {"accepted", "drafted"} <= set(rows.columns):  # each rate's 95% interval and its drafted tokens
        for key, cell in rows.group_by(["drafter", "policy"], maintain_order=True):
            cell = cell.filter(pl.col("drafted") > 0).sort("temperature")
            if cell.is_empty():
                continue
            rate, drafted = cell["acceptance_rate"].to_numpy(), cell["drafted"].to_numpy()
            low, high = wilson_interval(cell["accepted"].to_numpy(), drafted)
            colour, x = drafter_colour(key[0]), cell["temperature"].to_numpy()
            interval_bars(left, x, rate, low, high, ls="", capsize=2, color=colour)
            count_labels(left, x, rate, drafted, colour)
    temps = rows["temperature"].unique().sort().to_list()
    pad = 0.05 * max(1.0, temps[-1] - temps[0])
    for ax in (left, right):
        ax.set_xlim(temps[0] - pad, temps[-1] + pad)
    left.set_ylim(0, 1.02)
    ylabel = (
        "draft tokens accepted / drafted\n(bars: 95% Wilson interval,\ndrafts as independent;\nnumbers: tokens drafted)"
    )
    rates = (left, ylabel, "Acceptance rate")
    speed = (right, "speedup over plain sampling (x)", "Speedup")
    label_pair(fig, "temperature (0 = greedy)", rates, speed, noted(title, rows, "runs (prompts x seeds)", " "))
    return fig


def token_histograms(check: Any, title: str | None = None):
    """Side-by-side counts of the most frequent sampled tokens, plain vs speculative."""
    counts = check.counts
    fig, ax = plt.subplots(figsize=(max(6.5, 0.55 * len(counts) + 2), 4.2), constrained_layout=True)
    x = np.arange(len(counts))
    ax.bar(x - 0.2, counts["plain"].to_numpy(), width=0.4, color=drafter_colour("none"), label="plain sampling")
    speculative = f"speculative ({check.drafter}, {check.policy})"
    ax.bar(x + 0.2, counts["speculative"].to_numpy(), width=0.4, color=drafter_colour(check.drafter), label=speculative)
    ax.set_xticks(x, counts["text"].to_list(), rotation=45, ha="right", fontsize=8)
    shown = counts.filter(pl.col("token") >= 0)
    repeats = bool(len(shown)) and int((shown["plain"] + shown["speculative"]).max()) > 1
    note = "a lossless sampler gives p ~ U(0, 1)" if repeats else "no token repeats: the test has no power here"
    title = title or (
        f"Losslessness check at T={check.temperature:g}: {check.verdict} "
        f"(permutation p = {check.p_value:.2f}, TVD = {check.tvd:.3f})\n"
        f"({check.accepted_drafts} draft tokens accepted, acceptance {100 * check.acceptance_rate:.0f}%; {note})"
    )
    xlabel = "sampled token (most frequent first; last bar: all others)"
    finish(ax, xlabel, f"count over {check.samples} samples x {check.max_tokens} tokens", title, True, "y")
    return fig


# -- acceptance rules --------------------------------------------------------------------------

#: One colour per rule (``specbench.checks.acceptance_rules``); a lossy rule draws a dashed line or a hatched bar.
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
    the 95% intervals of ``per_position_acceptance`` (``per_position``). For block verification a_i is the
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
