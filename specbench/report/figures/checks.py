"""What every report figure must be: titled, its axes labelled, nothing drawn outside its canvas, no series hidden
under another. ``figure_problems`` lists what a figure breaks (empty: none); ``Outputs.figure`` records the list in
the notebook's summary, and the report's tests require it empty for every figure of the quick profile.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: How far (pixels) an artist's tight bounding box may reach past the canvas before it counts as clipped.
CANVAS_SLACK_PX = 2.0


def _title(fig: Any, ax: Any) -> str:
    own = " ".join(ax.get_title(loc).strip() for loc in ("left", "center", "right")).strip()
    suptitle = fig._suptitle.get_text().strip() if getattr(fig, "_suptitle", None) is not None else ""
    return own or suptitle


def _drawn_axes(fig: Any) -> list[Any]:
    """The figure's axes that hold data (colour bars and emptied axes aside)."""
    return [
        ax
        for ax in fig.axes
        if ax.get_visible() and ax.axison and (ax.lines or ax.collections or ax.patches or ax.images)
    ]


def _series(ax: Any) -> list[tuple[str, np.ndarray]]:
    """(label, points) of every line and scatter of an axes that has more than one point."""
    out = []
    for line in ax.lines:
        if not line.get_visible():
            continue
        x, y = np.asarray(line.get_xdata(), dtype=float), np.asarray(line.get_ydata(), dtype=float)
        if x.size > 1 and x.shape == y.shape:
            out.append((line.get_label(), np.column_stack([x, y])))
    for collection in ax.collections:
        offsets = np.asarray(collection.get_offsets(), dtype=float)
        if collection.get_visible() and offsets.ndim == 2 and len(offsets) > 1:
            out.append((collection.get_label(), offsets))
    return out


def coinciding_series(ax: Any) -> list[tuple[str, str]]:
    """Pairs of series (by label) of ``ax`` drawn on exactly the same points: the later hides the earlier.
    Reference lines (one value across the axes, e.g. y = 1) are left out."""
    series = [
        (label, points)
        for label, points in _series(ax)
        if not (np.allclose(points[:, 1], points[0, 1]) and len(np.unique(points[:, 0])) <= 2)
    ]
    pairs = []
    for i, (first, a) in enumerate(series):
        for second, b in series[i + 1 :]:
            if a.shape == b.shape and np.allclose(a, b, equal_nan=True):
                pairs.append((first, second))
    return pairs


def figure_problems(fig: Any) -> list[str]:
    """What ``fig`` breaks of the report's rules, in words (empty when nothing): a title, both axis labels on every
    axes with data, every artist's tight bounding box inside the canvas, no two series on the same points."""
    problems = []
    axes = _drawn_axes(fig)
    if not axes:
        return ["no axes with data"]
    for number, ax in enumerate(axes, 1):
        name = f"axes {number}" + (f" ({ax.get_title()!r})" if ax.get_title() else "")
        if not _title(fig, ax):
            problems.append(f"{name}: no title")
        if not ax.get_xlabel().strip():
            problems.append(f"{name}: no x-axis label")
        if not ax.get_ylabel().strip():
            problems.append(f"{name}: no y-axis label")
        problems += [f"{name}: series {a!r} and {b!r} coincide (one hides the other)" for a, b in coinciding_series(ax)]
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    width, height = fig.canvas.get_width_height()
    for ax in axes:
        box = ax.get_tightbbox(renderer)
        if box is None:
            continue
        if (
            box.x0 < -CANVAS_SLACK_PX
            or box.y0 < -CANVAS_SLACK_PX
            or box.x1 > width + CANVAS_SLACK_PX
            or box.y1 > height + CANVAS_SLACK_PX
        ):
            problems.append(
                f"axes {_title(fig, ax)!r}: drawn outside the canvas (its box {box.x0:.0f}..{box.x1:.0f} x "
                f"{box.y0:.0f}..{box.y1:.0f} px, the canvas {width} x {height} px)"
            )
    for legend in fig.legends:
        box = legend.get_window_extent(renderer)
        if box.x0 < -CANVAS_SLACK_PX or box.x1 > width + CANVAS_SLACK_PX or box.y0 < -CANVAS_SLACK_PX:
            problems.append("the figure's legend reaches outside the canvas")
    return problems
