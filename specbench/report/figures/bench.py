"""Figures of the benchmarks (``specbench.bench.prompt_bench``): speedup by prompt category.

Drafters keep the colours of every other figure (``figures.style.drafter_colour``); policies are
told apart by hatching.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from specbench.bench.paired import MIN_UNITS
from specbench.bench.prompt_bench import PromptBench
from specbench.bench.prompt_runs import PROMPT_BASELINE, Method
from specbench.bench.prompt_summary import MethodSummary, summarize_prompt_runs
from specbench.report.figures.style import drafter_colour, finish, headless_pyplot, interval_bars, save_figure

PROMPT_FIGURE_FILE = "prompt_bench_speedup.png"

#: Hatching per policy family (bars of one drafter share its colour).
POLICY_HATCHES = {"none": "", "auto": "", "fixed": "//", "adaptive": ".."}


def method_style(method: Method) -> dict[str, Any]:
    """Bar colour (by drafter) and hatching (by policy) of a method in benchmark figures."""
    policy = method.policy_name.partition(":")[0]
    return {"color": drafter_colour(method.drafter), "hatch": POLICY_HATCHES.get(policy, "xx")}


def speedup_whisker(row: MethodSummary, repeats: int) -> tuple[float, float, str] | None:
    """One bar's whisker: (low, high, "interval") for the 95 % bootstrap interval over questions where the
    summary has one, else (low, high, "range") for the extremes over repeats when there were several."""
    if row.speedup_low is not None and row.speedup_high is not None:
        return row.speedup_low, row.speedup_high, "interval"
    if repeats > 1 and row.speedup_min is not None and row.speedup_max is not None:
        return row.speedup_min, row.speedup_max, "range"
    return None


def prompt_figure(
    summary: Sequence[MethodSummary], methods: Sequence[Method], categories: Sequence[str], info: dict[str, Any]
):
    """Speedup over mlx-lm plain by category, one bar per method, whiskers as ``speedup_whisker`` draws them."""
    plt = headless_pyplot()
    import numpy as np

    groups = list(categories) + ["overall"]
    cell = {(r.method, r.category): r for r in summary}
    shown = [m for m in methods if m.name != PROMPT_BASELINE and (m.name, "overall") in cell]
    fig, ax = plt.subplots(
        figsize=(min(16.0, max(7.0, 0.2 * len(groups) * len(shown) + 3)), 4.8), constrained_layout=True
    )
    width = 0.8 / max(1, len(shown))
    x = np.arange(len(groups))
    for i, m in enumerate(shown):
        rows = [cell.get((m.name, g)) for g in groups]
        values = np.array([r.speedup if r else np.nan for r in rows], dtype=float)
        centres = x - 0.4 + width * (i + 0.5)
        ax.bar(centres, values, width, label=m.name, edgecolor="0.2", linewidth=0.5, **method_style(m))
        bounds = [speedup_whisker(r, info.get("repeats", 1)) if r else None for r in rows]
        for kind, colour in (("interval", "0.1"), ("range", "0.55")):
            at = [j for j, b in enumerate(bounds) if b is not None and b[2] == kind and np.isfinite(values[j])]
            if at:
                low, high = ([bounds[j][end] for j in at] for end in (0, 1))
                interval_bars(
                    ax, centres[at], values[at], low, high, fmt="none", ecolor=colour, elinewidth=0.8, capsize=2
                )
    ax.axhline(1.0, color="0.2", lw=0.9, ls="--", label="mlx-lm plain (1.0)")
    ax.set_xticks(x, [g.replace("_", "\n") for g in groups], fontsize=9)
    note = f"whiskers: 95 % bootstrap interval over questions (from {MIN_UNITS}); grey: range over repeats"
    ax.annotate(note, (0.0, -0.16), xycoords="axes fraction", fontsize=7, color="0.3", va="top")
    device = info.get("device", "").split(":", 1)[-1]
    title = (
        f"Speculative decoding speedup by category: {info.get('model', '')} on {device}\n"
        f"greedy, batch 1, max {info.get('max_tokens', '')} new tokens "
        f"(mlx {info.get('mlx', '')}, mlx-lm {info.get('mlx_lm', '')})"
    )
    legend = dict(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), title="method", title_fontsize=8)
    finish(ax, "prompt category", "speedup over mlx-lm plain decoding (x)", title, legend, "y", fontsize=10)
    ax.set_ylim(0, None)
    return fig


def save_prompt_figure(result: PromptBench, out: str | os.PathLike) -> Path:
    """Draw ``prompt_figure`` of a prompt benchmark's results into ``out`` (atomically); returns the path."""
    summary = summarize_prompt_runs(result.runs, result.methods, result.info, result.profile)
    figure = prompt_figure(summary, result.methods, result.categories(), result.info)
    return save_figure(figure, Path(out) / PROMPT_FIGURE_FILE)
