"""Figures of the notebooks and reports: sweeps, step logs, sampling, agent traces (matplotlib).

Drafters keep one colour in every figure (``DRAFTER_COLOURS``) and policies one line style
(``POLICY_STYLES``); token sources use ``render.SOURCE_COLOURS``. Each function takes polars
frames from ``specbench.sweep`` (or a step log) and returns a Figure. Cost figures (c(w),
a*(k), measured vs predicted) live in ``specbench.plots``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import polars as pl

from specbench.common.files import write_figure_atomic
from specbench.report.render import SOURCE_COLOURS, SOURCE_LABELS

#: One colour per drafter in every figure (plain decoding grey).
DRAFTER_COLOURS = {
    "none": "0.55",
    "plain": "0.55",
    "lookup": "tab:blue",
    "suffix": "tab:orange",
    "mtp": "tab:green",
    "draft-model": "tab:red",
    "oracle": "tab:purple",
}
_SPARE = ("tab:brown", "tab:pink", "tab:olive", "tab:cyan", "#e6ab02")
POLICY_STYLES = {"fixed": "-", "adaptive": "--", "auto": ":", "none": "-"}
POLICY_MARKERS = {"fixed": "o", "adaptive": "s", "auto": "D", "none": "x"}
TRACE_STYLES = ["-", "--", ":", "-."]  # one line style per trace, in order of appearance
SIZE = (7.2, 4.2)


def drafter_colour(name: str) -> str:
    """The drafter's colour: a fixed one for the project's drafters, a stable spare one otherwise."""
    if name in DRAFTER_COLOURS:
        return DRAFTER_COLOURS[name]
    return _SPARE[sum(map(ord, name)) % len(_SPARE)]


def drafter_order(names: list[str]) -> list[str]:
    """``names`` with the project's drafters first, in ``DRAFTER_COLOURS`` order."""
    known = list(DRAFTER_COLOURS)
    return sorted(names, key=lambda n: (known.index(n) if n in known else len(known), n))


def drafter_label(name: str) -> str:
    return "plain decoding" if name in ("none", "plain") else name


def save_figure(fig: Any, name: str, folder: str | os.PathLike, dpi: int = 110) -> list[Path]:
    """Write ``fig`` as ``folder/NAME.png`` and ``folder/NAME.svg`` (each atomically)."""
    return [write_figure_atomic(fig, Path(folder) / f"{name}{suffix}", dpi) for suffix in (".png", ".svg")]


def _frame(data: Any) -> pl.DataFrame:
    if isinstance(data, pl.DataFrame):
        return data
    if hasattr(data, "log"):  # a Generation
        data = data.log
    if hasattr(data, "to_polars"):
        return data.to_polars()
    return pl.DataFrame(list(data))


def _no_data(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="0.4")
    ax.set_xticks([])
    ax.set_yticks([])


# -- one generation ----------------------------------------------------------------------------


def step_timeline(log: Any, title: str = "Per-step view of one generation") -> Any:
    """Tokens emitted per decoding step, split by source, over the drafted tokens; step times below."""
    df = _frame(log).filter(pl.col("kind") != "prefill")
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7.6, 4.8), sharex=True, height_ratios=(2, 1),
                                      constrained_layout=True)
    if df.is_empty():
        _no_data(top, "no decoding steps")
        return fig
    x = df["step"].to_numpy()
    kind = df["kind"].to_numpy()
    emitted = df["emitted"].to_numpy()
    # a stop can cut a verification's accepted tokens short: show the emitted ones
    accepted = np.where(kind == "verify", np.minimum(df["accepted"].to_numpy(), emitted), 0)
    bonus = np.where(kind == "verify", emitted - accepted, 0)
    plain = np.where(kind == "verify", 0, emitted)
    drafted = df["k_drafted"].to_numpy()
    top.bar(x, accepted, color=SOURCE_COLOURS["draft"], label=SOURCE_LABELS["draft"], width=0.85)
    top.bar(x, bonus, bottom=accepted, color=SOURCE_COLOURS["bonus"], label=SOURCE_LABELS["bonus"], width=0.85)
    top.bar(x, plain, color=SOURCE_COLOURS["plain"], edgecolor="0.5", lw=0.5, label=SOURCE_LABELS["plain"], width=0.85)
    rejected = np.clip(drafted - df["accepted"].to_numpy(), 0, None)
    if rejected.any():
        top.bar(x, rejected, bottom=emitted, fill=False, edgecolor="#b2182b", hatch="///", lw=0.6, width=0.85,
                label="rejected draft tokens")
    top.set_ylabel("tokens per step")
    top.set_title(title)
    top.legend(loc="upper right", fontsize=7.5, ncol=2)
    top.set_ylim(0, max(1, int((emitted + rejected).max())) + 1.2)
    top.yaxis.get_major_locator().set_params(integer=True)
    top.grid(axis="y", alpha=0.3)
    ms = 1e3 * (df["draft_s"] + df["verify_s"] + df["other_s"]).to_numpy()
    colours = np.where(kind == "verify", SOURCE_COLOURS["bonus"], "0.55")
    bottom.bar(x, ms, color=colours, width=0.85)
    bottom.set_ylabel("step time (ms)")
    bottom.set_xlabel("decoding step (step 0 is the prefill)")
    bottom.grid(axis="y", alpha=0.3)
    return fig


# -- sweeps ------------------------------------------------------------------------------------


def _metric_vs_k(summary: pl.DataFrame, metric: str, ylabel: str, title: str, reference: float | None, ax: Any = None):
    if ax is None:
        fig, ax = plt.subplots(figsize=SIZE, constrained_layout=True)
    else:
        fig = ax.figure
    rows = summary.filter(pl.col("drafter") != "none")
    if rows.is_empty():
        _no_data(ax, "no speculative runs")
        return fig
    ks = rows["k"].drop_nulls().unique().sort().to_list()
    for drafter in rows["drafter"].unique(maintain_order=True).to_list():
        mine = rows.filter(pl.col("drafter") == drafter)
        for family in mine["policy_family"].unique(maintain_order=True).to_list():
            cell = mine.filter(pl.col("policy_family") == family)
            colour = drafter_colour(drafter)
            if cell["k"].null_count() == len(cell):  # auto: it picks k itself; placed at its mean k
                for row in cell.iter_rows(named=True):
                    if row[metric] is None or row.get("mean_k") is None:
                        continue
                    ax.plot([row["mean_k"]], [row[metric]], ls="", marker=POLICY_MARKERS.get(family, "D"), ms=8,
                            mfc="white", mec=colour, mew=2,
                            label=f"{drafter_label(drafter)}, {family} (mean k {row['mean_k']:.1f})")
                continue
            cell = cell.sort("k")
            ax.plot(cell["k"].to_numpy(), cell[metric].to_numpy(), marker=POLICY_MARKERS.get(family, "o"), ms=5,
                    color=colour, ls=POLICY_STYLES.get(family, "-."), lw=1.6, label=f"{drafter_label(drafter)}, {family}")
    if reference is not None:
        ax.axhline(reference, color="0.3", lw=0.9, label="plain decoding")
    if ks:
        ax.set_xticks(ks)
    ax.set_xlabel("draft length k (tokens per draft; auto: mean drafted)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(ncol=2, loc="best")
    return fig


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
        axes.legend(ncol=2, loc="best")
    return fig


def per_position(
    positions: pl.DataFrame, title: str = "Per-position acceptance rate", ax: Any = None, min_reached: int = 3
):
    """Acceptance of draft position i given the earlier ones were accepted, a line per drafter/policy
    (positions reached fewer than ``min_reached`` times are left out: too few to estimate)."""
    if ax is None:
        fig, ax = plt.subplots(figsize=SIZE, constrained_layout=True)
    else:
        fig = ax.figure
    if not positions.is_empty():
        positions = positions.filter(pl.col("reached") >= min_reached)
    if positions.is_empty():
        _no_data(ax, "no verifications")
        return fig
    keys = [c for c in ("drafter", "policy", "temperature") if c in positions.columns]
    temperatures = positions["temperature"].unique().sort().to_list() if "temperature" in keys else []
    by_temperature = ["-", "--", ":", "-."]
    for group, rows in positions.group_by(keys, maintain_order=True):
        info = dict(zip(keys, group))
        drafter = info.get("drafter", "?")
        family = str(info.get("policy", "fixed")).split(":")[0]
        label = ", ".join(str(info[k]) if k != "temperature" else f"T={info[k]:g}" for k in keys)
        if temperatures:  # line style tells temperatures apart
            style = by_temperature[temperatures.index(info["temperature"]) % len(by_temperature)]
        else:
            style = POLICY_STYLES.get(family, "-")
        ax.plot(rows["position"].to_numpy(), rows["rate"].to_numpy(), marker="o", ms=4,
                color=drafter_colour(drafter), ls=style, label=label)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel(f"draft position i (1 = first drafted token; reached >= {min_reached} times)")
    ax.set_ylabel("acceptance rate at i given 1..i-1 accepted")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(ncol=2)
    return fig


def category_speedups(best: pl.DataFrame, title: str = "Speedup by prompt category (best policy per drafter)"):
    """Grouped bars: speedup per category, a bar per drafter (label: the policy used)."""
    rows = best.filter(pl.col("drafter") != "none")
    categories = rows["category"].unique(maintain_order=True).to_list() if not rows.is_empty() else []
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(categories) + 3), 4.2), constrained_layout=True)
    if rows.is_empty():
        _no_data(ax, "no speculative runs")
        return fig
    drafters = drafter_order(rows["drafter"].unique(maintain_order=True).to_list())
    width = 0.8 / len(drafters)
    for j, drafter in enumerate(drafters):
        mine = rows.filter(pl.col("drafter") == drafter)
        lookup = dict(zip(mine["category"].to_list(), mine["speedup"].to_list()))
        x = np.arange(len(categories)) + (j - (len(drafters) - 1) / 2) * width
        policies = dict(zip(mine["category"].to_list(), mine["policy"].to_list())) if "policy" in mine.columns else {}
        values = [lookup.get(c, np.nan) for c in categories]
        ax.bar(x, values, width=width * 0.95, color=drafter_colour(drafter), label=drafter_label(drafter))
        for xi, c, v in zip(x, categories, values):
            if c in policies and np.isfinite(v):
                ax.text(xi, v, policies[c], ha="center", va="bottom", fontsize=7.5, color="0.25")
    ax.axhline(1.0, color="0.3", lw=0.9)
    ax.set_xticks(np.arange(len(categories)), [c.replace("_", " ") for c in categories], rotation=20, ha="right")
    ax.set_xlabel("prompt category")
    ax.set_ylabel("speedup over plain decoding (x)")
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    top = np.nanmax(rows["speedup"].to_numpy().astype(float)) if len(rows) else 1.0
    ax.set_ylim(0, 1.3 * max(1.0, top))  # room for the legend above the bars
    ax.legend(ncol=len(drafters), loc="upper center")
    return fig


def _line_pair(frame: pl.DataFrame, group: list[str], x: str, ys: tuple[str, str], style: Any, size: tuple):
    """Two panels plotting ``ys[0]`` (left) and ``ys[1]`` (right) against ``x``, a line per group of
    speculative rows styled by ``style(key, rows)``: (fig, left, right, rows; rows None when empty)."""
    fig, (left, right) = plt.subplots(1, 2, figsize=size, constrained_layout=True)
    rows = frame.filter(pl.col("drafter") != "none")
    if rows.is_empty():
        _no_data(left, "no speculative runs")
        return fig, left, right, None
    for key, cell in rows.group_by(group, maintain_order=True):
        cell = cell.sort(x)
        line = style(key, rows)
        left.plot(cell[x].to_numpy(), cell[ys[0]].to_numpy(), **line)
        right.plot(cell[x].to_numpy(), cell[ys[1]].to_numpy(), **line)
    return fig, left, right, rows


# -- sampling ----------------------------------------------------------------------------------


def acceptance_vs_temperature(summary: pl.DataFrame, title: str = "Acceptance vs sampling temperature"):
    """Two panels: draft acceptance rate and speedup against temperature, a line per drafter/policy."""
    def style(key, rows):
        drafter, policy = key
        return dict(color=drafter_colour(drafter), ls=POLICY_STYLES.get(policy.split(":")[0], "-"), marker="o", ms=4,
                    label=f"{drafter_label(drafter)}, {policy}")

    fig, left, right, rows = _line_pair(summary, ["drafter", "policy"], "temperature",
                                        ("acceptance_rate", "speedup"), style, (9.6, 4.0))
    if rows is None:
        return fig
    temps = rows["temperature"].unique().sort().to_list()
    pad = 0.05 * max(1.0, temps[-1] - temps[0])
    for ax in (left, right):
        ax.set_xlim(temps[0] - pad, temps[-1] + pad)
    left.set_ylim(0, 1.02)
    left.set_ylabel("draft tokens accepted / drafted")
    left.set_title("Acceptance rate")
    right.axhline(1.0, color="0.3", lw=0.9)
    right.set_ylabel("speedup over plain sampling (x)")
    right.set_title("Speedup")
    for ax in (left, right):
        ax.set_xlabel("temperature (0 = greedy)")
        ax.grid(alpha=0.3)
    left.legend()
    fig.suptitle(title)
    return fig


def token_histograms(check: Any, title: str | None = None):
    """Side-by-side counts of the most frequent sampled tokens, plain vs speculative."""
    counts = check.counts
    fig, ax = plt.subplots(figsize=(max(6.5, 0.55 * len(counts) + 2), 4.2), constrained_layout=True)
    x = np.arange(len(counts))
    ax.bar(x - 0.2, counts["plain"].to_numpy(), width=0.4, color=drafter_colour("none"), label="plain sampling")
    ax.bar(x + 0.2, counts["speculative"].to_numpy(), width=0.4, color=drafter_colour(check.drafter),
           label=f"speculative ({check.drafter}, {check.policy})")
    ax.set_xticks(x, counts["text"].to_list(), rotation=45, ha="right", fontsize=8)
    ax.set_xlabel("sampled token (most frequent first; last bar: all others)")
    ax.set_ylabel(f"count over {check.samples} samples x {check.max_tokens} tokens")
    shown = counts.filter(pl.col("token") >= 0)
    repeats = bool(len(shown)) and int((shown["plain"] + shown["speculative"]).max()) > 1
    note = "a lossless sampler gives p ~ U(0, 1)" if repeats else "no token repeats: the test has no power here"
    ax.set_title(title or (
        f"Losslessness check at T={check.temperature:g}: permutation p = {check.p_value:.2f}, "
        f"TVD = {check.tvd:.3f}\n(acceptance {100 * check.acceptance_rate:.0f}%; {note})"
    ))
    ax.grid(axis="y", alpha=0.3)
    ax.legend()
    return fig


# -- agent traces ------------------------------------------------------------------------------


def per_turn(turns: pl.DataFrame, title: str = "Per-turn results on agent traces"):
    """Two panels over turns: tokens per verification and speedup, a line per drafter (and trace)."""
    fig, left, right, rows = _line_pair(turns, ["trace", "drafter"], "turn", ("tokens_per_verify", "speedup"),
                                        _trace_style, (10.0, 4.0))
    if rows is None:
        return fig
    left.axhline(1.0, color="0.3", lw=0.9)
    right.axhline(1.0, color="0.3", lw=0.9)
    left.set_ylabel("tokens per verification (accepted + 1)")
    right.set_ylabel("speedup over plain decoding (x)")
    left.set_title("Acceptance per turn")
    right.set_title("Speedup per turn")
    for ax in (left, right):
        ax.set_xlabel("turn")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
    left.legend()
    fig.suptitle(title)
    return fig


def _trace_style(key: tuple[str, str], rows: pl.DataFrame) -> dict[str, Any]:
    """A (trace, drafter) line: the drafter's colour, the trace's line style."""
    trace, drafter = key
    traces = rows["trace"].unique(maintain_order=True).to_list()
    return dict(color=drafter_colour(drafter), ls=TRACE_STYLES[traces.index(trace) % len(TRACE_STYLES)], marker="o",
                ms=4, label=f"{drafter_label(drafter)}" + (f" ({trace})" if len(traces) > 1 else ""))


def cumulative_saved(turns: pl.DataFrame, title: str = "Model forward passes saved over a session"):
    """Cumulative tokens saved (tokens emitted minus decode forward passes) over turns, per drafter."""
    fig, ax = plt.subplots(figsize=SIZE, constrained_layout=True)
    rows = turns.filter(pl.col("drafter") != "none")
    if rows.is_empty():
        _no_data(ax, "no speculative runs")
        return fig
    for key, cell in rows.group_by(["trace", "drafter"], maintain_order=True):
        cell = cell.sort("turn")
        ax.plot(cell["turn"].to_numpy(), np.cumsum(cell["saved"].to_numpy()), **_trace_style(key, rows))
    ax.set_ylim(bottom=min(0.0, ax.get_ylim()[0]), top=max(1.0, ax.get_ylim()[1]))
    ax.set_xlabel("turn")
    ax.set_ylabel("cumulative tokens saved (forward passes avoided)")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    return fig
