"""Cost figures: verify cost c(w), break-even acceptance a*(k), measured against predicted speedups.

Each function draws on a given Axes (or a new figure) and returns the Figure; a model keeps its
family's colour (``model_colours``), a verify mode its line style.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import matplotlib.pyplot as plt
import numpy as np

from specbench.cost.breakeven import break_even_acceptance, break_even_band, speedup
from specbench.cost.profile import Profile
from specbench.report.figures.style import MODE_STYLES, WIDE, finish, model_colours, model_label, new_axes


def _overhead_note(profiles: Sequence[Profile]) -> str:
    """What "engine overhead" means, with each profile's value, for a figure's footnote."""
    values = ", ".join(
        f"{model_label(p.name)} {mode} {p.overhead[mode]:.2f}"
        for p in profiles
        for mode in p.costs
        if mode in p.overhead
    )
    if not values:
        return ""
    return (
        "c(w) = verify forward + engine overhead (the engine's own time per speculative step: bookkeeping, rollback, "
        f"reading targets back), in plain steps; overhead: {values}"
    )


def _curves(profiles: Sequence[Profile], modes: Iterable[str] | None) -> list[tuple[Profile, str, str]]:
    """(profile, mode, its model's colour) of every mode of ``modes`` (default: all) a profile measured."""
    palette = model_colours(p.name for p in profiles)
    return [(p, mode, palette[p.name]) for p in profiles for mode in modes or p.costs if mode in p.costs]


def verify_costs(
    profiles: Sequence[Profile], modes: Iterable[str] | None = None, ax: Any = None, title: str | None = None
):
    """c(w) against width w for each profile (and verify mode), as the break-even math counts it: the forward
    plus the engine's per-step overhead (the forward alone thin and faint), with c = 1 and c = w for reference."""
    fig, ax = new_axes(ax, WIDE)
    wmax, cmax = 1, 2.0
    for p, mode, colour in _curves(profiles, modes):
        widths = p.widths[mode]
        overhead = p.overhead.get(mode, 0.0)
        total = [c + overhead for c in p.costs[mode]]
        label = f"{model_label(p.name)} ({mode}; step {1e3 * p.plain_step_s:.1f} ms; c(2) = {p.c(2, mode):.2f})"
        ax.plot(widths, total, MODE_STYLES.get(mode, ":"), marker="o", ms=3.5, color=colour, label=label)
        if overhead:
            ax.plot(widths, p.costs[mode], MODE_STYLES.get(mode, ":"), lw=0.8, alpha=0.45, color=colour)
        wmax, cmax = max(wmax, max(widths)), max(cmax, max(total))
    w = np.arange(1, wmax + 1)
    ax.plot(w, w, color="0.6", lw=0.8, ls=":", label="c = w (no batching gain)")
    ax.plot([], [], color="0.5", lw=0.8, alpha=0.45, label="forward alone (overhead left out)")
    ax.axhline(1.0, color="0.6", lw=0.8)
    ax.set_xlim(0.5, wmax + 0.5)
    ax.set_ylim(0, 1.15 * cmax)
    device = profiles[0].device.split(":", 1)[-1] if profiles else ""
    note = _overhead_note(profiles)
    if note:  # what "engine overhead" is, in the legend beside the curves that include it
        ax.plot([], [], ls="", label=textwrap.fill(note, 52))
    legend = dict(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    xlabel, ylabel = "verification width w (tokens in one forward)", "c(w): verify step time / plain step time"
    finish(ax, xlabel, ylabel, title or f"Verify cost, dense vs MoE ({device})", legend)
    return fig


def break_even(
    profiles: Sequence[Profile],
    d: float = 0.0,
    max_k: int = 15,
    modes: Iterable[str] | None = None,
    ax: Any = None,
    title: str | None = None,
):
    """a*(k): the constant per-position acceptance at which drafting k tokens breaks even (verify
    cost plus the engine's per-step overhead, plus k d). Where no acceptance breaks even (even a fully
    accepted draft costs more than it yields) the model is drawn in the "never breaks even" band above 1,
    with its c(k+1) in the legend."""
    fig, ax = new_axes(ax, WIDE)
    never_band = False
    for p, mode, colour in _curves(profiles, modes):
        kk = min(max_k, max(p.widths[mode]) - 1)
        a = break_even_acceptance(p, d, kk, mode)
        k = np.arange(1, kk + 1)
        never = np.isnan(a)
        label = f"{model_label(p.name)} ({mode})"
        if never.all():
            label += f": never breaks even, c(k+1) > k+1 for k <= {kk} (c(2) = {p.c(2, mode):.2f})"
        elif never.any():
            label += f": never breaks even at k = {', '.join(str(int(x)) for x in k[never])}"
        if not never.all():
            ax.plot(k, a, MODE_STYLES.get(mode, ":"), label=label, color=colour, marker="o", ms=3.5)
            label = None
        if never.any():
            never_band = True
            ax.plot(k[never], np.full(never.sum(), 1.06), label=label, ls="", marker="x", ms=7, mew=2, color=colour)
    if never_band:
        ax.axhspan(1.0, 1.12, color="0.88", zorder=0)
        words = dict(transform=ax.get_yaxis_transform(), ha="right", va="center", fontsize=8, color="0.25")
        ax.text(0.99, 1.095, "never breaks even (no acceptance <= 1 pays)", **words)
    ax.set_ylim(0, 1.12 if never_band else 1)
    ax.xaxis.get_major_locator().set_params(integer=True)
    cost = f"drafter cost d = {d:g} steps/token" if d else "free drafter"
    ylabel = "break-even acceptance a*(k), per position\n(P(token i accepted | 1..i-1 accepted))"
    # e.g. a*(k) = 0 for two models (both pay even when every draft is rejected): the legend names the hidden one
    title = title or f"Break-even acceptance a*(k) ({cost}; c with engine overhead)"
    finish(ax, "draft length k (tokens)", ylabel, title, _UNDER)
    return fig


#: A legend under the axes: the plot keeps the figure's width, and the legend's long entries hide no curve.
_UNDER = dict(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), frameon=False)


def break_even_map(
    profiles: Sequence[Profile],
    cells: Sequence[Any],
    mode: str,
    d: float = 0.0,
    max_k: int = 8,
    title: str | None = None,
):
    """The answer's figure: acceptance against draft length. Each cost model's break-even a*(k) (``break_even``)
    with its band over c(w)'s interval shaded, and each measured cell (``specbench.report.answer.Cell``) at its
    realized acceptance and mean draft length, marked by its verdict: above its model's curve a draft pays."""
    fig = break_even(profiles, d, max_k, [mode], title=title or f"Break-even map ({mode} verification)")
    ax = fig.axes[0]
    palette = model_colours(p.name for p in profiles)
    for p in profiles:
        bounds = break_even_band(p, d, min(max_k, max(p.widths.get(mode, [1])) - 1), mode)
        if bounds is not None:
            k = np.arange(1, len(bounds[0]) + 1)
            low, high = np.fmin(bounds[0], bounds[1]), np.fmax(bounds[0], bounds[1])
            ax.fill_between(
                k, np.nan_to_num(low, nan=1.0), np.nan_to_num(high, nan=1.0), color=palette[p.name], alpha=0.15
            )
    markers = {"pays": ("^", "tab:green"), "loses": ("v", "tab:red"), "no difference resolvable": ("o", "0.45")}
    hollow = ("o", "0.45")  # no interval yet: too few pairs
    for cell in cells:
        if cell.k is None or cell.acceptance is None:
            continue
        marker, colour = markers.get(cell.verdict, hollow)
        face = colour if cell.verdict in markers else "none"
        ax.plot(cell.k, cell.acceptance, marker=marker, color=colour, mfc=face, ms=7, ls="", alpha=0.85)
        label = f"{cell.drafter}/{cell.kind}/{cell.policy}"
        ax.annotate(label, (cell.k, cell.acceptance), fontsize=6.5, xytext=(4, 2), textcoords="offset points")
    for verdict, (marker, colour) in markers.items():
        ax.plot([], [], marker=marker, color=colour, ls="", label=f"measured: {verdict}")
    ax.plot([], [], marker=hollow[0], color=hollow[1], mfc="none", ls="", label="measured: too few pairs for a verdict")
    ax.set_xlabel("draft length k (tokens; a measured run at its mean draft per verification)")
    ax.legend(**_UNDER)
    return fig


@dataclass(frozen=True)
class _GridRun:
    """A run of ``cost.speedup_grid`` as ``measured_vs_predicted`` reads it."""

    name: str
    mode: str
    k: int
    a: float
    d: float
    speedup: float
    error_nominal: float
    acceptance_measured: float | None = None
    spec_s_per_token: float | None = None
    predicted_spec_s_per_token: float | None = None

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> _GridRun:
        return cls(**{f.name: row[f.name] for f in fields(cls) if f.name in row})


def measured_vs_predicted(
    rows: Sequence[dict[str, Any]],
    profiles: dict[str, Profile],
    modes: Sequence[str] | None = None,
    title: str | None = None,
):
    """Measured speedups (points) over predicted S(k) curves against acceptance, one panel per model (columns) and
    verify mode (rows), from ``cost.speedup_grid`` records (``profiles``: each row's ``name`` -> its profile); where
    the rows hold the seconds per speculative token the profile predicts (``predicted_spec_s_per_token``), a last
    column plots them against the measured ones (the cost model's error, free of the plain runs' own variation)."""
    runs = [_GridRun.of(r) for r in rows]
    modes = list(modes or dict.fromkeys(r.mode for r in runs))
    runs = [r for r in runs if r.mode in modes]
    names = list(dict.fromkeys(r.name for r in runs))
    if not names:
        raise ValueError(f"no grid rows in verify mode(s) {modes} to plot")
    timed = all(r.predicted_spec_s_per_token for r in runs)
    columns = len(names) + int(timed)
    fig, axes = plt.subplots(
        len(modes), columns, figsize=(5.4 * columns, 4.2 * len(modes)), squeeze=False, constrained_layout=True
    )
    ks = sorted({r.k for r in runs})
    cmap = plt.get_cmap("viridis")
    k_colour = {k: cmap(i / max(1, len(ks) - 1) * 0.9) for i, k in enumerate(ks)}
    a = np.linspace(0.0, 1.0, 101)
    for row_axes, mode in zip(axes, modes):
        for ax, name in zip(row_axes, names):
            p = profiles[name]
            mine = [r for r in runs if r.name == name and r.mode == mode]
            if not mine:
                ax.set_axis_off()
                continue
            for k in ks:
                cell = [r for r in mine if r.k == k]
                if not cell:
                    continue
                d = float(np.mean([r.d for r in cell]))
                ax.plot(a, [speedup(x, k, p, d, mode) for x in a], color=k_colour[k], lw=1.2, label=f"k = {k}")
                # each run at the acceptance it realized (the drafter's nominal one in grey: a drafter corrupting
                # positions at 1 - a realizes more than a where a corrupted token happens to be the model's)
                realized = [r.a if r.acceptance_measured is None else r.acceptance_measured for r in cell]
                measured = [r.speedup for r in cell]
                ax.scatter([r.a for r in cell], measured, color="0.7", marker="|", s=30)
                ax.scatter(realized, measured, color=k_colour[k], edgecolor="k", lw=0.5, s=28, zorder=3)
            ax.axhline(1.0, color="0.4", lw=0.8)
            err = np.abs([r.error_nominal for r in mine])
            error = f"|error| mean {100 * err.mean():.1f}%, max {100 * err.max():.1f}%"
            ax.set_xlim(0, 1.02)
            ax.set_ylim(0, None)
            xlabel = "per-position acceptance a, as each run realized it (grey ticks: the nominal a)"
            title = f"{model_label(name)}, {mode} verify\n{error}"
            finish(ax, xlabel, "speedup over plain decoding (x)", title, fontsize=10)
            handles, labels = ax.get_legend_handles_labels()
            handles.append(plt.Line2D([], [], ls="", marker="o", mfc="0.7", mec="k"))
            labels.append("measured")
            ax.legend(handles, labels, fontsize=8, loc="upper left", title="predicted S(k)", title_fontsize=8)
        if timed:
            _time_panel(row_axes[-1], [r for r in runs if r.mode == mode], names, mode)
    fig.suptitle(title or "Measured speedup (points) vs break-even model (lines)")
    return fig


def _time_panel(ax, runs: Sequence[_GridRun], names: Sequence[str], mode: str) -> None:
    """Measured against predicted milliseconds per speculative token, a marker per model."""
    markers = "osD^v"
    predicted = 1e3 * np.array([r.predicted_spec_s_per_token for r in runs], dtype=float)
    measured = 1e3 * np.array([r.spec_s_per_token for r in runs], dtype=float)
    points = dict(color="tab:blue", edgecolor="k", lw=0.5, s=28, zorder=3)
    for i, name in enumerate(names):
        mine = [j for j, r in enumerate(runs) if r.name == name]
        ax.scatter(predicted[mine], measured[mine], marker=markers[i % len(markers)], label=model_label(name), **points)
    top = 1.1 * max(predicted.max(), measured.max())
    line = np.array([0.0, top])
    ax.plot(line, line, color="0.3", lw=0.9, label="measured = predicted")
    ax.fill_between(line, 0.9 * line, 1.1 * line, color="0.85", label="within 10%")
    err = np.abs(measured / predicted - 1)
    title = f"Seconds per token, {mode} verify\n|error| mean {100 * err.mean():.1f}%, max {100 * err.max():.1f}%"
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    xlabel = "predicted from the profile, for the steps taken (ms/token)"
    finish(ax, xlabel, "measured (ms/token)", title, dict(fontsize=8, loc="upper left"), fontsize=10)
