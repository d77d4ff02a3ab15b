"""The figures' colour scheme, line styles, labels and the one way to save a figure.

One colour per drafter (plain decoding grey) and per model family (dense, MoE, hybrid, hybrid
MoE), the same in every figure; one line style per policy family and per verify mode. Token
sources (accepted draft, bonus, plain step) take ``render.SOURCE_COLOURS``, shared with the
coloured HTML text.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import polars as pl

from specbench.common.files import write_figure_atomic
from specbench.report.figures.checks import mark_coinciding

DRAFTERS = ("none", "plain", "lookup", "suffix", "mtp", "draft-model", "oracle")
MODEL_FAMILIES = ("dense", "moe", "hybrid", "hybrid-moe")

#: One colour per drafter and per model family, in every figure.
COLOURS: dict[str, str] = {
    "none": "0.55",
    "plain": "0.55",
    "lookup": "tab:blue",
    "suffix": "tab:orange",
    "mtp": "tab:green",
    "draft-model": "tab:red",
    "oracle": "tab:purple",
    "dense": "tab:blue",
    "moe": "tab:orange",
    "hybrid": "tab:green",
    "hybrid-moe": "tab:red",
}
DRAFTER_COLOURS = {name: COLOURS[name] for name in DRAFTERS}
FAMILY_COLOURS = {name: COLOURS[name] for name in MODEL_FAMILIES}
SPARE_COLOURS = ("tab:brown", "tab:pink", "tab:olive", "tab:cyan", "#e6ab02")

POLICY_STYLES = {"fixed": "-", "adaptive": "--", "auto": ":", "none": "-"}
POLICY_MARKERS = {"fixed": "o", "adaptive": "s", "auto": "D", "none": "x"}
MODE_STYLES = {"fast": "-", "exact": "--"}
LINE_STYLES = ("-", "--", ":", "-.")  # one line style per trace or temperature, in order of appearance
SIZE = (7.2, 4.2)
WIDE = (9.0, 4.6)


def drafter_colour(name: str) -> str:
    """The drafter's colour: a fixed one for the project's drafters, a stable spare one otherwise."""
    if name in DRAFTER_COLOURS:
        return DRAFTER_COLOURS[name]
    return SPARE_COLOURS[sum(map(ord, name)) % len(SPARE_COLOURS)]


def drafter_order(names: list[str]) -> list[str]:
    """``names`` with the project's drafters first, in ``DRAFTERS`` order."""
    return sorted(names, key=lambda n: (DRAFTERS.index(n) if n in DRAFTERS else len(DRAFTERS), n))


def drafter_label(name: str) -> str:
    return "plain decoding" if name in ("none", "plain") else name


def model_family(name: str) -> str:
    """dense, moe, hybrid or hybrid-moe, from a model name (``-aNb`` or ``-Ne-`` (N experts) marks an MoE,
    ``qwen3.5``/``next`` a hybrid)."""
    text = name.lower()
    moe = any(tag in text for tag in ("moe", "-a3b", "-a10b", "-a17b", "-a22b", "-a14b"))
    moe = moe or re.search(r"-\d+e(-|$| )", text) is not None
    hybrid = any(tag in text for tag in ("qwen3.5", "qwen3_5", "qwen3-next", "qwen3_next"))
    if hybrid:
        return "hybrid-moe" if moe else "hybrid"
    return "moe" if moe else "dense"


def model_colours(names: Iterable[str]) -> dict[str, str]:
    """A colour per model: its family's colour, or (for a second model of a family) a spare one."""
    out: dict[str, str] = {}
    spare = iter(SPARE_COLOURS + tuple(f"C{i}" for i in range(10)))
    for name in names:
        colour = FAMILY_COLOURS[model_family(name)]
        while colour in out.values():
            colour = next(spare)
        out.setdefault(name, colour)
    return out


def model_label(name: str) -> str:
    return name.removeprefix("synthetic:")


def headless_pyplot() -> Any:
    """``matplotlib.pyplot`` drawing off screen (Agg), for the figures the command line writes."""
    import matplotlib

    if matplotlib.get_backend().lower() != "agg":
        matplotlib.use("Agg")
    return plt


def save_figure(fig: Any, path: str | os.PathLike, dpi: int = 130, svg: bool = False, close: bool = True) -> Path:
    """Write ``fig`` as a PNG at ``path`` (and, with ``svg``, an SVG beside it), each atomically;
    close it unless ``close`` is False. Returns the PNG's path."""
    path = Path(path)
    if not path.suffix:
        path = path.with_suffix(".png")
    try:
        written = write_figure_atomic(fig, path, dpi)
        if svg:
            write_figure_atomic(fig, path.with_suffix(".svg"), dpi)
        return written
    finally:
        if close:
            plt.close(fig)


# -- building blocks of the figure modules -----------------------------------------------------


def new_axes(ax: Any = None, size: tuple[float, float] = SIZE) -> tuple[Any, Any]:
    """(figure, axes): ``ax`` and its figure, or a new figure of ``size``."""
    if ax is None:
        fig, ax = plt.subplots(figsize=size, constrained_layout=True)
        return fig, ax
    return ax.figure, ax


def no_data(ax: Any, text: str) -> None:
    """Mark an empty panel with ``text``."""
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="0.4")
    ax.set_xticks([])
    ax.set_yticks([])


def finish(
    ax: Any,
    xlabel: str,
    ylabel: str,
    title: str | None = None,
    legend: Any = None,
    grid: str = "both",
    **title_style: Any,
) -> None:
    """Label ``ax`` (``title_style``: the title's font), grid it, name lines hidden under others
    (``mark_coinciding``) and draw its legend with the options ``legend`` (True: matplotlib's; None: no legend)."""
    ax.set(xlabel=xlabel, ylabel=ylabel)
    if title is not None:
        ax.set_title(title, **title_style)
    ax.grid(alpha=0.3, axis=grid)
    mark_coinciding(ax)
    if legend is not None:
        ax.legend(**({} if legend is True else legend))


def interval_bars(ax: Any, x: Any, y: Any, low: Any, high: Any, **style: Any) -> None:
    """Error bars from ``low`` to ``high`` around ``y`` (rounding can put a bound a hair past its value:
    matplotlib rejects negative errors)."""
    y = np.asarray(y, dtype=float)
    yerr = [np.clip(y - np.asarray(low, dtype=float), 0.0, None), np.clip(np.asarray(high, dtype=float) - y, 0.0, None)]
    ax.errorbar(x, y, yerr=yerr, **style)


def count_labels(ax: Any, x: Any, y: Any, counts: Any, colour: Any) -> None:
    """Write each point's count beside it (how many observations it rests on)."""
    for xi, yi, n in zip(x, y, counts):
        ax.annotate(f"{n}", (xi, yi), textcoords="offset points", xytext=(4, 4), fontsize=7, color=colour)


def bar_offsets(groups: int, j: int, count: int) -> tuple[Any, float]:
    """(x, width) of the ``j``-th of ``count`` bars side by side in each of ``groups`` groups."""
    width = 0.8 / max(1, count)
    return np.arange(groups) + (j - (count - 1) / 2) * width, width


def line_pair(
    frame: pl.DataFrame,
    group: list[str],
    x: str,
    ys: tuple[str, str],
    style: Callable[[Any, pl.DataFrame], dict[str, Any]],
    size: tuple[float, float],
) -> tuple[Any, Any, Any, pl.DataFrame | None]:
    """Two panels plotting ``ys[0]`` (left) and ``ys[1]`` (right) against ``x``, a line per group of
    speculative rows (all, in a frame without drafters) styled by ``style(key, rows)``: (fig, left, right, rows;
    rows None when empty)."""
    fig, (left, right) = plt.subplots(1, 2, figsize=size, constrained_layout=True)
    rows = frame.filter(pl.col("drafter") != "none") if "drafter" in frame.columns else frame
    if rows.is_empty():
        no_data(left, "no speculative runs")
        return fig, left, right, None
    for key, cell in rows.group_by(group, maintain_order=True):
        cell = cell.sort(x)
        line = style(key, rows)
        left.plot(cell[x].to_numpy(), cell[ys[0]].to_numpy(), **line)
        right.plot(cell[x].to_numpy(), cell[ys[1]].to_numpy(), **line)
    return fig, left, right, rows


def label_pair(fig: Any, x: str, left: tuple[Any, str, str], right: tuple[Any, str, str], title: str) -> None:
    """Label two panels against ``x`` (each: axes, y label, title), a line at 1 on the right one (a speedup), and
    the legend on the left, lines hidden under others named (``mark_coinciding``)."""
    right[0].axhline(1.0, color="0.3", lw=0.9)
    for ax, ylabel, name in (left, right):
        finish(ax, x, ylabel, name)
    left[0].legend(fontsize=8)
    fig.suptitle(title)


def noted(title: str, frame: pl.DataFrame, what: str = "runs", sep: str = "\n") -> str:
    """``title`` with how many observations stand behind each point: "(n = 2 runs per point)" (a range when they
    differ); ``title`` alone when ``frame`` has no ``runs``."""
    if "runs" not in frame.columns or not len(counts := frame["runs"].drop_nulls()):
        return title
    low, high = int(counts.min()), int(counts.max())
    return f"{title}{sep}(n = {low if low == high else f'{low}-{high}'} {what} per point)"
