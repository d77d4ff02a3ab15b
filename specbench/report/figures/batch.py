"""The batch axis: break-even acceptance a*(k, B) against batch size, and the measured grid's throughput speedups
against the profile's prediction (rows as ``scripts.gpu.batch_run`` writes them: batch_break_even.csv and
batch_grid.csv), and this machine's a*(k, B) beside a shipped reference device's (``batch_beside_reference``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib.pyplot as plt
import polars as pl

from specbench.cost.batch import BatchProfile
from specbench.cost.reference import Reference
from specbench.report.figures.checks import mark_coinciding
from specbench.report.figures.style import model_label, no_data

#: The draft lengths whose a*(k, B) the left panel draws.
SHOWN_K = (1, 2, 4)
#: The columns of the rows ``batch_break_even`` reads: a*(k, B) rows, and the measured grid's.
A_STAR_SCHEMA = {"model": pl.Utf8, "batch_size": pl.Int64, "k": pl.Int64, "a_star": pl.Float64}
GRID_SCHEMA = {
    "model": pl.Utf8,
    "batch_size": pl.Int64,
    "k": pl.Int64,
    "acceptance": pl.Float64,
    "measured": pl.Float64,
    "predicted": pl.Float64,
}


def batch_break_even(break_even: Sequence[dict[str, Any]], grid: Sequence[dict[str, Any]], k_grid: int):
    """Two panels per shape (``model``): a*(k, B) for k in ``SHOWN_K``, and the grid's measured (points) and
    predicted (lines) throughput speedups at ``k_grid`` per acceptance. Returns the Figure."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    a_stars = pl.DataFrame(list(break_even), schema=A_STAR_SCHEMA).filter(pl.col("k").is_in(SHOWN_K))
    for (label,), rows in a_stars.group_by("model", maintain_order=True):
        for (k,), line in rows.sort("k", "batch_size").group_by("k", maintain_order=True):
            axes[0].plot(*line.select("batch_size", "a_star").to_numpy().T, marker="o", label=f"{label} k={k}")
    cells = pl.DataFrame(list(grid), schema=GRID_SCHEMA).filter(pl.col("k") == k_grid)
    for (label,), rows in cells.group_by("model", maintain_order=True):
        for (a,), line in rows.sort("acceptance", "batch_size").group_by("acceptance", maintain_order=True):
            sizes, measured, predicted = line.select("batch_size", "measured", "predicted").to_numpy().T
            drawn = axes[1].plot(sizes, predicted, label=f"{label} a={a} predicted")[0]
            axes[1].scatter(sizes, measured, color=drawn.get_color(), label=f"{label} a={a} measured")
    axes[0].set(
        xscale="log", xlabel="batch size B", ylabel="break-even acceptance a*(k, B)", title="Break-even acceptance"
    )
    axes[1].set(
        xscale="log",
        xlabel="batch size B",
        ylabel=f"throughput speedup (k={k_grid})",
        title="Measured against predicted speedup",
    )
    axes[1].axhline(1.0, color="grey", lw=0.8)
    for ax in axes:
        mark_coinciding(ax)
        if ax.lines or ax.collections:
            ax.legend(fontsize=6)
    return fig


def batch_beside_reference(
    here: Mapping[str, BatchProfile], reference: Reference, d: float = 0.0, ks: Sequence[int] = (1, 4)
) -> plt.Figure:
    """a*(k, B) against batch size for the draft lengths ``ks``: this machine's batch profiles (left) beside the
    shipped reference device's dense and MoE ones (right), on a shared y axis; a k a profile is too narrow
    for is left out, and a break-even of NaN (no acceptance pays) leaves a gap."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 5), sharey=True, constrained_layout=True)
    panels = [(axes[0], here, "This machine"), (axes[1], reference.batch, reference.describe().replace(" (", "\n("))]
    for ax, profiles, title in panels:
        for (name, profile), style in zip(profiles.items(), ["-", "--", "-.", ":"]):
            kind = reference.kinds.get(name)
            label = model_label(name) + (f" ({kind})" if kind else "")
            top = min(len(profile.costs[b]) for b in profile.batch_sizes) - 1
            for k in [k for k in ks if k <= top]:
                a_star = [float(profile.break_even_acceptance(b, d, top)[k - 1]) for b in profile.batch_sizes]
                ax.plot(profile.batch_sizes, a_star, style, marker="o", ms=4, label=f"{label}, k = {k}")
        ax.set(xscale="log", xlabel="batch size B", title=f"{title}\nbreak-even acceptance a*(k, B)")
        sizes = sorted({b for profile in profiles.values() for b in profile.batch_sizes})
        ax.set_xticks(sizes, [str(b) for b in sizes], minor=False)
        ax.set_xticks([], minor=True)
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        mark_coinciding(ax)
        if ax.lines:
            ax.legend(fontsize=7)
        else:
            no_data(ax, "no batch profile measured")
        ax.set_ylabel("a*(k, B): acceptance needed to pay")
        ax.tick_params(labelleft=True)
    return fig
