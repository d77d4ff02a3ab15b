"""The per-step view of one generation: tokens per step by source, and step times."""

from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
import numpy as np

from specbench.report.figures.style import COLOURS, no_data
from specbench.report.render import SOURCE_COLOURS, SOURCE_LABELS, SOURCES, step_records


def step_timeline(log: Any, title: str = "Per-step view of one generation") -> Any:
    """Tokens emitted per decoding step, split by source, over the drafted tokens; step times below."""
    steps = [r for r in step_records(log) if r.kind != "prefill"]
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(7.6, 4.8), sharex=True, height_ratios=(2, 1), constrained_layout=True
    )
    if not steps:
        no_data(top, "no decoding steps")
        return fig
    x = np.array([r.step for r in steps])
    verify = np.array([r.kind == "verify" for r in steps])
    emitted = np.array([r.emitted for r in steps])
    taken = np.array([r.accepted for r in steps])
    # a stop can cut a verification's accepted tokens short: show the emitted ones
    accepted = np.where(verify, np.minimum(taken, emitted), 0)
    bonus = np.where(verify, emitted - accepted, 0)
    plain = np.where(verify, 0, emitted)
    looks: tuple[dict[str, Any], ...] = ({}, {"bottom": accepted}, {"edgecolor": "0.5", "lw": 0.5})
    for source, tokens, look in zip(SOURCES, (accepted, bonus, plain), looks):
        top.bar(x, tokens, color=SOURCE_COLOURS[source], label=SOURCE_LABELS[source], width=0.85, **look)
    rejected = np.clip(np.array([r.k_drafted for r in steps]) - taken, 0, None)
    if rejected.any():
        outline = dict(fill=False, edgecolor="#b2182b", hatch="///", lw=0.6, width=0.85)
        top.bar(x, rejected, bottom=emitted, label="rejected draft tokens", **outline)
    top.set(ylabel="tokens per step", title=title)
    top.legend(loc="upper right", fontsize=7.5, ncol=2)
    top.set_ylim(0, max(1, int((emitted + rejected).max())) + 1.2)
    top.yaxis.get_major_locator().set_params(integer=True)
    top.grid(axis="y", alpha=0.3)
    ms = [1e3 * (r.draft_s + r.verify_s + r.other_s) for r in steps]
    colours = np.where(verify, SOURCE_COLOURS["bonus"], COLOURS["plain"])
    bottom.bar(x, ms, color=colours, width=0.85)
    bottom.set(ylabel="step time (ms)", xlabel="decoding step (step 0 is the prefill)")
    bottom.grid(axis="y", alpha=0.3)
    return fig
