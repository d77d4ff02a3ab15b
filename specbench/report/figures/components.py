"""Why speculation pays or not: the verify cost as a stack of its parts (``component_stack``), and c(w) along the
context length (``costs_by_length``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib.pyplot as plt
import numpy as np

from specbench.cost.breakeven import break_even_acceptance
from specbench.cost.components import PARTS, WAIT, ComponentRow, phase_stack
from specbench.cost.profile import Profile
from specbench.report.figures.style import finish, model_label

#: One colour per part: the forward's in blues and greens, the engine's in warm tones.
PART_COLOURS = {
    "attention": "#1f77b4",
    "linear": "#aec7e8",
    "experts": "#2ca02c",
    "recurrent": "#98df8a",
    "lm_head": "#9467bd",
    "other": "#c5b0d5",
    "readback": "#8c564b",
    "drafting": "#ff7f0e",
    "acceptance": "#ffbb78",
    "rollback": "#d62728",
    "logging": "#ff9896",
    "host": "#7f7f7f",
    WAIT: "#e0e0e0",
}


def component_stack(stacks: Mapping[str, Sequence[dict[str, Any]]], title: str | None = None, by_phase: bool = False):
    """A panel per model: per width, the parts of a speculative step stacked in plain steps, the measured
    whole step as a black marker, and the sum's error above each bar. ``by_phase``: the parts counted by phase
    (``specbench.cost.components.phase_stack``: each part's host work, the wait for the device a part of its own);
    models whose rows lack the phases are left out."""
    if by_phase:
        stacks = {name: phase_stack(rows) for name, rows in stacks.items()}
    names = [n for n, rows in stacks.items() if rows]
    fig, axes = plt.subplots(1, max(1, len(names)), figsize=(5.2 * max(1, len(names)), 4.2), squeeze=False)
    for ax, name in zip(axes[0], names):
        rows = ComponentRow.rows(stacks[name])
        widths = sorted({r.width for r in rows})
        at = {(r.width, r.part): r for r in rows}
        x = np.arange(len(widths))
        bottom = np.zeros(len(widths))
        for part in (*PARTS, WAIT):
            if (widths[0], part) not in at:
                continue
            values = np.array([at[w, part].c for w in widths])
            if values.max() <= 0:
                continue
            ax.bar(x, values, 0.6, bottom=bottom, color=PART_COLOURS[part], label=part)
            bottom += values
        whole = np.array([at[w, PARTS[0]].c_step for w in widths])
        ax.plot(x, whole, "k_", ms=22, mew=2, label="measured step")
        for i, w in enumerate(widths):
            ax.annotate(f"{at[w, PARTS[0]].error:+.0%}", (x[i], max(bottom[i], whole[i])), ha="center", va="bottom")
        ax.set_xticks(x, [f"w={w}" for w in widths])
        ax.set_ylim(0, 1.15 * max(bottom.max(), whole.max()))
        finish(ax, "verify width w (rows)", "plain steps", model_label(name), grid="y", fontsize=10)
    if names:  # every panel's parts in one legend (a MoE's experts, a hybrid's recurrent layers), stack order
        drawn = {label: handle for ax in axes[0] for handle, label in zip(*ax.get_legend_handles_labels())}
        labels = [p for p in (*PARTS, WAIT, "measured step") if p in drawn][::-1]
        axes[0][-1].legend([drawn[p] for p in labels], labels, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    what = "host work by part, the wait for the device apart" if by_phase else "a speculative step of width w"
    fig.suptitle(title or f"Verify cost by component: {what} (drafts rejected)", fontsize=11)
    fig.tight_layout()
    return fig


def costs_by_length(profiles: Sequence[Profile], mode: str = "fast", d: float = 0.0, title: str | None = None):
    """c(w) (left) and a*(k) (right) at each context length of each profile: where speculation stops
    paying as the context grows (a curve that ends: no acceptance pays past it)."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    styles = ["-", "--", "-.", ":"]
    for i, profile in enumerate(profiles):
        colour = f"C{i}"
        for j, length in enumerate(profile.context_lengths):
            at = profile.at_length(length)
            if mode not in at.costs:
                continue
            curve = at.curve(mode)
            label = f"{model_label(profile.name)}, L = {length}"
            style = styles[j % len(styles)]
            left.plot(np.arange(1, len(curve) + 1), curve, style, color=colour, marker="o", ms=3, label=label)
            a_star = break_even_acceptance(at, d, len(curve) - 1, mode)
            right.plot(np.arange(1, len(a_star) + 1), a_star, style, color=colour, marker="o", ms=3, label=label)
    left.axhline(1.0, color="0.6", lw=0.8)
    right.set_ylim(0, 1)
    finish(left, "verification width w", "c(w, L): verify step / plain step at L")
    # e.g. a*(k) = 0 at every length (pays even when every draft is rejected): the legend names the hidden ones
    legend = dict(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    finish(right, "draft length k", "break-even acceptance a*(k)", legend=legend)
    fig.suptitle(title or f"Verify cost and break-even by context length ({mode})", fontsize=11)
    fig.tight_layout()
    return fig
