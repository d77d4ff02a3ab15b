"""This machine's verify costs beside a shipped reference device's (``specbench.cost.reference``): c(w) and
a*(k) of a dense and an MoE model, one column per device, on shared axes."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt

from specbench.cost.profile import Profile
from specbench.cost.reference import Reference
from specbench.report.figures.cost import break_even, verify_costs


def beside_reference(
    here: Sequence[Profile], reference: Reference, mode: str = "fast", d: float = 0.0, max_k: int = 8
) -> plt.Figure:
    """Top: c(w) on this machine (left) and on the reference device (right), over the widths this machine
    measured; bottom: a*(k) for k up to ``max_k``. Each row shares its y axis; each panel's legend sits under it."""
    widths = max((max(p.widths[mode]) for p in here if mode in p.costs), default=max_k + 1)
    shown = [_first_widths(p, widths) for p in reference.profiles]
    fig, axes = plt.subplots(2, 2, figsize=(13, 12.5), sharey="row")
    blas = next((p.kernels.partition("|blas ")[2] for p in here if "|blas " in p.kernels), "")
    device = here[0].device.split(":", 1)[-1] if here else "this machine"
    mine = f"This machine: {device}" + (f" ({blas})" if blas else "")
    theirs = reference.describe()
    verify_costs(here, [mode], ax=axes[0, 0], title=f"{mine}\nverify cost c(w), {mode}")
    verify_costs(shown, [mode], ax=axes[0, 1], title=f"{theirs}\nverify cost c(w), {mode}, widths 1-{widths}")
    break_even(here, d, max_k, [mode], ax=axes[1, 0], title=f"{mine}\nbreak-even acceptance a*(k)")
    break_even(shown, d, max_k, [mode], ax=axes[1, 1], title=f"{theirs}\nbreak-even acceptance a*(k)")
    for ax in axes.flat:
        ax.tick_params(labelleft=True)
        ax.legend(fontsize=7.5, loc="upper center", bbox_to_anchor=(0.5, -0.13), frameon=False)
    fig.subplots_adjust(hspace=0.95, wspace=0.22)
    return fig


def _first_widths(profile: Profile, widths: int) -> Profile:
    """``profile`` cut to widths 1..``widths`` (the reference measured wider verifications than a CPU run)."""
    keep = {mode: [i for i, w in enumerate(ws) if w <= widths] for mode, ws in profile.widths.items()}
    data = profile.to_dict()
    for part in ("widths", "costs", "seconds"):
        data[part] = {mode: [values[i] for i in keep[mode]] for mode, values in data[part].items()}
    return Profile.from_dict(data)
