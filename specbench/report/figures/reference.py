"""This machine beside a shipped reference device (``specbench.cost.reference``): c(w) and a*(k) of a dense and an
MoE model, one column per device, on shared axes; and a*(k, B) along the batch axis."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt

from specbench.cost.batch import BatchProfile
from specbench.cost.profile import Profile
from specbench.cost.reference import Reference
from specbench.report.figures.cost import break_even, verify_costs
from specbench.report.figures.style import finish, model_label, no_data


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


def batch_beside_reference(
    here: Mapping[str, BatchProfile], reference: Reference, d: float = 0.0, ks: Sequence[int] = (1, 4)
) -> plt.Figure:
    """a*(k, B) against batch size for the draft lengths ``ks``: this machine's batch profiles (left) beside the
    shipped reference device's dense and MoE ones (right), on a shared y axis; a k a profile is too narrow
    for is left out, and a break-even of NaN (no acceptance pays) leaves a gap."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 5), sharey=True, constrained_layout=True)
    panels = [(axes[0], here, "This machine"), (axes[1], reference.batch, reference.describe().replace(" (", "\n("))]
    for ax, profiles, title in panels:
        for (name, profile), style in zip(profiles.items(), ["-", "--", "-.", ":"]):
            kind = reference.kinds.get(name)
            label = model_label(name) + (f" ({kind})" if kind else "")
            top = min(len(profile.costs[b]) for b in profile.batch_sizes) - 1
            for k in [k for k in ks if k <= top]:
                a_star = [float(profile.break_even_acceptance(b, d, top)[k - 1]) for b in profile.batch_sizes]
                ax.plot(profile.batch_sizes, a_star, style, marker="o", ms=4, label=f"{label}, k = {k}")
        ax.set_xscale("log")
        sizes = sorted({b for profile in profiles.values() for b in profile.batch_sizes})
        ax.set_xticks(sizes, [str(b) for b in sizes], minor=False)
        ax.set_xticks([], minor=True)
        ax.set_ylim(-0.02, 1.02)
        title = f"{title}\nbreak-even acceptance a*(k, B)"
        finish(ax, "batch size B", "a*(k, B): acceptance needed to pay", title, dict(fontsize=7) if ax.lines else None)
        if not ax.lines:
            no_data(ax, "no batch profile measured")
        ax.tick_params(labelleft=True)
    return fig
