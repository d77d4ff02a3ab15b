"""Draft-length policies compared on the same recorded outputs (``specbench.simulate.policies.rank_policies``' table)
and the confirmed ones' measured speedup (``specbench.bench.policy_confirm.confirm_policies``' rows)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import polars as pl

from specbench.report.figures.style import bar_offsets, finish, no_data
from specbench.report.verdicts import Confirmed
from specbench.simulate.policies import best_predicted


def _ranking_panel(ax, table: pl.DataFrame, colours: dict[str, str]) -> None:
    """Grouped bars: per workload, each policy's predicted speedup; the best outlined in black (none where every
    policy ties)."""
    workloads = table["workload"].unique(maintain_order=True).to_list()
    for j, (policy, colour) in enumerate(colours.items()):
        values = dict(table.filter(pl.col("policy") == policy).select("workload", "predicted_speedup").iter_rows())
        x, width = bar_offsets(len(workloads), j, len(colours))
        heights = np.array([values.get(w, np.nan) for w in workloads], dtype=float)
        ax.bar(x, heights, width=width * 0.95, color=colour, label=policy)
        best = [i for i, w in enumerate(workloads) if policy in best_predicted(table, w)]
        if best:
            ax.bar(x[best], heights[best], width=width * 0.95, fill=False, edgecolor="k", linewidth=1.4)
    ax.axhline(1.0, color="0.3", lw=0.9)
    ax.set_xticks(np.arange(len(workloads)), workloads, rotation=25, ha="right", fontsize=8)
    top = np.nanmax(table["predicted_speedup"].to_numpy().astype(float))
    ax.set_ylim(0, 1.35 * max(1.0, top))  # room for the legend above the bars
    xlabel = "workload (outlined: the best predicted; none where all tie)"
    legend = dict(ncol=min(3, len(colours)), loc="upper center", fontsize=8)
    title = "Ranking per workload by predicted speedup"
    finish(ax, xlabel, "predicted speedup over plain decoding (x)", title, legend, "y", fontsize=10)


def _confirmed_panel(ax, confirmed: pl.DataFrame, colours: dict[str, str]) -> None:
    """Measured against predicted speedup per confirmed policy, with the measured 95 % interval, y = x dashed."""
    rows = Confirmed.rows(confirmed)
    values = [v for r in rows for v in (r.predicted_speedup, r.measured_speedup, r.measured_high) if v]
    low, high = 0.0, 1.15 * max([1.0, *values])
    ax.plot([low, high], [low, high], color="0.5", ls="--", lw=0.9, label="measured = predicted")
    for r in rows:
        err = None
        if r.measured_low is not None and r.measured_high is not None:
            err = [[r.measured_speedup - r.measured_low], [r.measured_high - r.measured_speedup]]
        label = f"{r.policy}: residual {r.residual:+.0%}" + ("" if err else " (no interval)")
        point = dict(fmt="o", ms=7, capsize=4, color=colours.get(r.policy, "0.3"), label=label)
        ax.errorbar([r.predicted_speedup], [r.measured_speedup], yerr=err, **point)
    ax.set_xlim(low, high)
    ax.set_ylim(low, high)
    title = f"Confirmed by real runs: {max(r.requests for r in rows)} request(s)"
    ylabel = "measured speedup (x), 95 % interval over requests"
    finish(ax, "predicted speedup (x)", ylabel, title, dict(loc="best", fontsize=8), fontsize=10)


def policy_ranking(table: pl.DataFrame, confirmed: pl.DataFrame | None = None, title: str = "Draft-length policies"):
    """Left: each workload's policies by predicted speedup; right (with ``confirmed``): the confirmed policies'
    measured speedup against their prediction."""
    panels = 2 if confirmed is not None else 1
    workloads = table["workload"].n_unique() if not table.is_empty() else 0
    size = (max(6.4, 0.9 * workloads + 3.5) + 4.6 * (panels - 1), 4.8)
    ratios = [max(1.5, 0.25 * workloads + 0.8), 1.0][:panels]
    fig, axes = plt.subplots(1, panels, figsize=size, squeeze=False, constrained_layout=True, width_ratios=ratios)
    fig.suptitle(title, fontsize=11)
    if table.is_empty():
        no_data(axes[0][0], "no policy was replayed")
        return fig
    cmap = plt.get_cmap("tab10")  # one colour per policy, in order of appearance
    colours = {name: cmap(i % 10) for i, name in enumerate(table["policy"].unique(maintain_order=True).to_list())}
    _ranking_panel(axes[0][0], table, colours)
    if confirmed is not None:
        if confirmed.is_empty():
            no_data(axes[0][1], "no policy was confirmed")
        else:
            _confirmed_panel(axes[0][1], confirmed, colours)
    return fig
