"""What every report figure must be: titled, its axes labelled, nothing drawn outside its canvas, no series hidden
under another. ``figure_problems`` lists what a figure breaks (empty: none); ``Outputs.figure`` records the list in
the notebook's summary, and the report's tests require it empty for every figure of the quick profile.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

#: How far (pixels) an artist's tight bounding box may reach past the canvas before it counts as clipped.
CANVAS_SLACK_PX = 2.0


def _title(fig: Any, ax: Any) -> str:
    """The axes' title, else the figure's, else that of an axes sharing its x-axis (a panel stacked under it)."""
    own = " ".join(ax.get_title(loc).strip() for loc in ("left", "center", "right")).strip()
    suptitle = fig._suptitle.get_text().strip() if getattr(fig, "_suptitle", None) is not None else ""
    shared = [other.get_title().strip() for other in ax.get_shared_x_axes().get_siblings(ax) if other is not ax]
    return own or suptitle or next((t for t in shared if t), "")


def _xlabel(ax: Any) -> str:
    """The axes' x-axis label, else that of an axes sharing its x-axis (stacked panels label the bottom one)."""
    return next((o.get_xlabel().strip() for o in ax.get_shared_x_axes().get_siblings(ax) if o.get_xlabel().strip()), "")


def _drawn_axes(fig: Any) -> list[Any]:
    """The figure's axes that hold data (colour bars and emptied axes aside)."""
    return [
        ax
        for ax in fig.axes
        if ax.get_visible() and ax.axison and (ax.lines or ax.collections or ax.patches or ax.images)
    ]


def _series(ax: Any, collections: bool = True) -> list[tuple[Any, np.ndarray]]:
    """(artist, points) of every visible line (and, with ``collections``, scatter) of an axes with more than one
    point."""
    out = []
    for line in [line for line in ax.lines if line.get_visible()]:
        x, y = np.asarray(line.get_xdata(), dtype=float), np.asarray(line.get_ydata(), dtype=float)
        if x.size > 1 and x.shape == y.shape:
            out.append((line, np.column_stack([x, y])))
    for collection in ax.collections if collections else ():
        offsets = np.asarray(collection.get_offsets(), dtype=float)
        if collection.get_visible() and offsets.ndim == 2 and len(offsets) > 1:
            out.append((collection, offsets))
    return out


def _coinciding(series: list[tuple[Any, np.ndarray]]) -> Iterator[tuple[Any, Any]]:
    """(earlier, later) of every two series on exactly the same points, the later hiding the earlier; reference
    lines (one value across the axes, e.g. y = 1) are left out."""
    for i, (later, b) in enumerate(series):
        for earlier, a in series[:i]:
            flat = np.allclose(a[:, 1], a[0, 1]) and len(np.unique(a[:, 0])) <= 2
            if not flat and a.shape == b.shape and np.allclose(a, b, equal_nan=True):
                yield earlier, later


#: What a series' label says when it lies on another series' points (``mark_coinciding``).
SAME_AS = "same points as"


def coinciding_series(ax: Any) -> list[tuple[str, str]]:
    """Pairs of series (by label) of ``ax`` drawn on exactly the same points, the later hiding the earlier, that
    no label declares (``mark_coinciding``)."""
    # labels starting with "_": matplotlib's own parts (error bars, caps), drawn with their series
    series = [(s, points) for s, points in _series(ax) if not str(s.get_label()).startswith("_")]
    labels = [(str(a.get_label()), str(b.get_label())) for a, b in _coinciding(series)]
    return [(a, b) for a, b in labels if SAME_AS not in f"{a} {b}"]


def mark_coinciding(ax: Any) -> None:
    """Say in the label of every line of ``ax`` that lies on an earlier line's points which one it hides
    ("lookup (tool-agent), same points as lookup (chat-revision)"), so the legend names the series the
    figure cannot show apart; call it before drawing the legend."""
    marked = set()
    for earlier, line in _coinciding(_series(ax, collections=False)):
        if line not in marked:
            marked.add(line)
            line.set_label(f"{line.get_label()}, {SAME_AS} {earlier.get_label()}")


def figure_problems(fig: Any) -> list[str]:
    """What ``fig`` breaks of the report's rules, in words (empty when nothing): a title, both axis labels on every
    axes with data, every artist's tight bounding box inside the canvas, no two series on the same points."""
    problems = []
    axes = _drawn_axes(fig)
    if not axes:  # a panel that says why it is empty (``style.no_data``) is a figure of what was measured
        return [] if any(ax.texts for ax in fig.axes) else ["no axes with data, and no note saying why"]
    for number, ax in enumerate(axes, 1):
        name = f"axes {number}" + (f" ({ax.get_title()!r})" if ax.get_title() else "")
        if not _title(fig, ax):
            problems.append(f"{name}: no title")
        if not _xlabel(ax):
            problems.append(f"{name}: no x-axis label")
        if not ax.get_ylabel().strip():
            problems.append(f"{name}: no y-axis label")
        problems += [f"{name}: series {a!r} and {b!r} coincide (one hides the other)" for a, b in coinciding_series(ax)]
    if not hasattr(fig.canvas, "get_renderer"):  # a Figure built without pyplot: give it a raster canvas
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        FigureCanvasAgg(fig)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    width, height = fig.canvas.get_width_height()

    def outside(box: Any, top: float = height) -> bool:
        slack = CANVAS_SLACK_PX
        return box.x0 < -slack or box.y0 < -slack or box.x1 > width + slack or box.y1 > top + slack

    for ax in axes:
        box = ax.get_tightbbox(renderer)
        if box is not None and outside(box):
            problems.append(
                f"axes {_title(fig, ax)!r}: drawn outside the canvas (its box {box.x0:.0f}..{box.x1:.0f} x "
                f"{box.y0:.0f}..{box.y1:.0f} px, the canvas {width} x {height} px)"
            )
    if any(outside(legend.get_window_extent(renderer), float("inf")) for legend in fig.legends):
        problems.append("the figure's legend reaches outside the canvas")
    return problems
