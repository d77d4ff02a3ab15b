"""The figure of a comparison of two runs (``specbench.bench.compare``): acceptance per draft position under A and
B, and every difference A - B with its 95 % interval beside 0 (a measure whose interval holds 0 is drawn hollow)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from specbench.bench.compare import A_HIGHER, B_HIGHER, Comparison, Difference
from specbench.report.figures.style import headless_pyplot, no_data, save_figure

COMPARE_FIGURE_FILE = "compare.png"
#: The colours of run A and run B.
SIDE_COLOURS = ("#1f77b4", "#d62728")


def _forest(ax: Any, differences: list[Difference], title: str, xlabel: str) -> None:
    """One row per difference: its point, its interval as a bar, filled where the interval excludes 0."""
    if not differences:
        no_data(ax, "nothing to compare")
        ax.set_title(title)
        return
    for row, d in enumerate(reversed(differences)):
        resolved = d.verdict in (A_HIGHER, B_HIGHER)
        if d.low is not None and d.high is not None:
            ax.plot([d.low, d.high], [row, row], color="0.2", linewidth=1.6)
        face = "0.1" if resolved else "white"
        ax.plot([d.difference], [row], marker="o", linestyle="none", color="0.1", markerfacecolor=face, markersize=6)
    ax.axvline(0.0, color="0.5", linestyle="--", linewidth=1.0)
    ax.set_yticks(range(len(differences)))
    ax.set_yticklabels([f"{d.measure} (n={d.units})" for d in reversed(differences)], fontsize=8)
    ax.set(title=title, xlabel=xlabel, ylabel="measure (n: prompts or rounds)")


def compare_figure(comparison: Comparison, title: str | None = None):
    """Left: acceptance per draft position under A and under B (each with the verifications behind it). Middle:
    A - B of acceptance overall, per position and per prompt kind. Right: A - B of tokens per verification, speedup
    and c(w). Intervals are 95 %, over prompts (c(w): both profiles' own intervals)."""
    plt = headless_pyplot()

    fig, (left, middle, right) = plt.subplots(
        1, 3, figsize=(15.0, 4.8), constrained_layout=True, gridspec_kw={"width_ratios": [1.0, 1.2, 1.2]}
    )
    positions = comparison.section("position")
    if positions:
        x = list(range(1, len(positions) + 1))
        for side, colour in zip(("a", "b"), SIDE_COLOURS):
            name = comparison.a if side == "a" else comparison.b
            left.plot(
                x, [getattr(d, side) for d in positions], marker="o", color=colour, label=f"{side.upper()}: {name}"
            )
        left.set_xticks(x)
        left.set_ylim(0.0, 1.05)
        left.legend(fontsize=8, loc="lower left")
    else:
        no_data(left, "no verification drafted")
    xlabel = "draft position (given the earlier ones accepted)"
    left.set(title="acceptance per draft position", xlabel=xlabel, ylabel="acceptance rate")
    rates = [d for d in comparison.differences if d.section in ("position", "kind") or d.measure == "acceptance"]
    _forest(middle, rates, "acceptance: A - B, 95 % interval", "difference in acceptance rate")
    others = [d for d in comparison.differences if d not in rates]
    _forest(right, others, "tokens, speed, cost: A - B", "difference (filled: the interval excludes 0)")
    fig.suptitle(title or f"{comparison.method}: A = {comparison.a} against B = {comparison.b}")
    return fig


def save_compare_figure(comparison: Comparison, out: str | os.PathLike) -> Path:
    """Draw ``compare_figure`` into ``out/compare.png`` (and an SVG beside it)."""
    return save_figure(compare_figure(comparison), Path(out) / COMPARE_FIGURE_FILE, svg=True)
