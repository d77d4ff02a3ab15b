"""Verdict words for this machine's dense-vs-MoE verify costs beside a shipped reference device's
(``specbench.cost.reference``): what each shows, over the same widths."""

from __future__ import annotations

import math

from specbench.cost.profile import Profile
from specbench.cost.reference import Reference
from specbench.report.verdicts.components import deciding_parts
from specbench.report.verdicts.notebooks import growth_per_row, lowest_break_even, where


def _measured_on(profile: Profile) -> str:
    """ "this CPU (OpenBLAS 0.3.21, 2 threads)" or "the NVIDIA H200": a profile's device, with the CPU's BLAS it
    recorded."""
    blas = profile.kernels.partition("|blas ")[2]
    return where(profile.device) + (f" ({blas})" if blas else "")


def _dense_vs_moe(dense: Profile, moe: Profile, mode: str, d: float, max_k: int, w_max: int) -> str:
    """How fast each model's c(w) grows per added row over widths 1..w_max, and each one's lowest a*(k)."""

    def lowest(p: Profile) -> str:
        found = lowest_break_even(p, d, min(max_k, max(p.widths[mode]) - 1), mode)
        return "never breaks even" if found is None else f"breaks even from a = {found[1]:.2f} (k = {found[0]})"

    g_dense, g_moe = growth_per_row(dense, mode, w_max), growth_per_row(moe, mode, w_max)
    if not (math.isfinite(g_dense) and math.isfinite(g_moe)):
        return "too few widths to compare"
    if g_moe > 1.15 * g_dense:
        shape = "the MoE's grows faster"
    elif g_moe < g_dense / 1.15:
        shape = "the MoE's grows slower"
    else:
        shape = "about alike"
    return (
        f"c(w) grows {g_dense:.2f} plain steps per added row for the dense model and {g_moe:.2f} for the MoE "
        f"({shape}); dense {lowest(dense)}, MoE {lowest(moe)}"
    )


def reference_contrast(
    here: dict[str, Profile], reference: Reference, mode: str = "fast", d: float = 0.0, max_k: int = 8
) -> str:
    """Dense vs MoE on this machine (``here``: "dense" and "MoE" profiles) beside the shipped reference device's,
    over the widths this machine measured, in ``mode`` (engine overhead included)."""
    w_max = min((max(p.widths[mode]) for p in here.values() if mode in p.costs), default=0)
    if set(here) >= {"dense", "MoE"} and all(mode in p.costs for p in here.values()) and w_max > 1:
        dense = here["dense"]
        mine = f"On {_measured_on(dense)}: {_dense_vs_moe(dense, here['MoE'], mode, d, max_k, w_max)}."
    else:
        mine = f"This machine has no dense and MoE {mode} profiles to compare."
        w_max = max(w_max, 5)
    ref = _dense_vs_moe(reference.profile("dense"), reference.profile("MoE"), mode, d, max_k, w_max)
    return f"{mine} On the {reference.describe()}, same widths (1-{w_max}): {ref}."


def batch_reference_contrast(reference: Reference, d: float = 0.0, k: int = 4) -> str:
    """How the reference device's dense and MoE break-even at draft length ``k`` moves from the smallest to the
    largest batch size it measured (a*(k, B), from its shipped c(w, B)): the batch-axis contrast, read on any
    machine."""
    parts = []
    for name, profile in reference.batch.items():
        top = min(len(profile.costs[b]) for b in profile.batch_sizes) - 1
        if top < k:
            continue
        first, last = profile.batch_sizes[0], profile.batch_sizes[-1]
        low, high = (float(profile.break_even_acceptance(b, d, top)[k - 1]) for b in (first, last))
        trend = "falls" if high < low - 0.05 else "rises" if high > low + 0.05 else "moves"
        low_words, high_words = ("never pays" if math.isnan(a) else f"{a:.2f}" for a in (low, high))
        parts.append(
            f"{reference.kinds.get(name, name)} {trend} from a*({k}, {first}) = {low_words} to a*({k}, {last}) = "
            f"{high_words}"
        )
    if not parts:
        return f"The {reference.describe()} has no batch profile {k + 1} rows wide."
    return f"On the {reference.describe()}, along the batch: " + "; ".join(parts) + "."


def reference_stacks(reference: Reference) -> str:
    """What decides c(w) on the reference device, per shape it split by component (dense, MoE, hybrid), with how
    far its parts are from its measured steps and what set the pace there, with a leading space to follow another
    sentence ("" when it ships no stacks)."""
    if not reference.components:
        return ""
    return f" On the {reference.label}, verify cost by component:" + deciding_parts(reference.components)
