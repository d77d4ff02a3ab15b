"""The batch axis: break-even acceptance a*(k, B) against batch size, and the measured grid's throughput speedups
against the profile's prediction (rows as ``specbench.bench.batch_run`` writes them: batch_break_even.csv and
batch_grid.csv)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import matplotlib.pyplot as plt

from specbench.report.figures.checks import mark_coinciding

#: The draft lengths whose a*(k, B) the left panel draws.
SHOWN_K = (1, 2, 4)


def batch_break_even(break_even: Sequence[dict[str, Any]], grid: Sequence[dict[str, Any]], k_grid: int):
    """Two panels per shape (``model``): a*(k, B) for k in ``SHOWN_K``, and the grid's measured (points) and
    predicted (lines) throughput speedups at ``k_grid`` per acceptance. Returns the Figure."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    for label in dict.fromkeys(r["model"] for r in [*break_even, *grid]):
        rows = [r for r in break_even if r["model"] == label]
        for k in sorted({r["k"] for r in rows} & set(SHOWN_K)):
            points = sorted((r["batch_size"], r["a_star"]) for r in rows if r["k"] == k)
            axes[0].plot(*zip(*points), marker="o", label=f"{label} k={k}")
        cells = [r for r in grid if r["model"] == label and r["k"] == k_grid]
        for a in sorted({r["acceptance"] for r in cells}):
            points = sorted((r["batch_size"], r["measured"], r["predicted"]) for r in cells if r["acceptance"] == a)
            sizes, measured, predicted = zip(*points)
            line = axes[1].plot(sizes, predicted, label=f"{label} a={a} predicted")[0]
            axes[1].scatter(sizes, measured, color=line.get_color(), label=f"{label} a={a} measured")
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
