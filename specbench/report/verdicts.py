"""The report's words, generated from the numbers the notebooks measured: each notebook's verdict, the key
results it records (headlines) and the labels and units the index shows them with.

- Verdicts: one or two sentences per notebook. A notebook ends with ``out.verdict(verdicts.<notebook>(...))``;
  the index shows one verdict per notebook at the top.
- Headlines: the key results a notebook records for the index (``out.summary(**verdicts.sweep_headline(...))``).
- Labels: ``describe(key, value)`` gives a label that says what a key result is and the value with its unit,
  e.g. ``("SmolLM2-135M-MoE: verify cost c(2), engine overhead included", "3.04 plain steps")``; keys without
  an entry are shown as they are.

Nothing here measures: every function reads the frames, profiles and stats the library returned.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import polars as pl

from specbench.bench.sweep import best_per_group
from specbench.common.identity import device_name
from specbench.cost.bandwidth import achieved
from specbench.cost.breakeven import break_even_acceptance
from specbench.cost.profile import Profile
from specbench.cost.reference import Reference

# -- verdicts ----------------------------------------------------------------------------------------------------

#: Speedups within this distance of 1 are reported as breaking even (run-to-run noise on a shared machine).
EVEN_BAND = 0.05


def where(device: str | None = None) -> str:
    """ "this CPU" or "the NVIDIA H200": the device the numbers were measured on."""
    device = device or device_name()
    kind, _, name = device.partition(":")
    return "this CPU" if kind == "cpu" else f"the {name or kind}"


def pays(speedup: float | None) -> str:
    """ "pays", "breaks even" or "does not pay" for a measured speedup (``EVEN_BAND`` around 1)."""
    if speedup is None or not math.isfinite(speedup):
        return "was not measured"
    if speedup > 1 + EVEN_BAND:
        return "pays"
    if speedup < 1 - EVEN_BAND:
        return "does not pay"
    return "breaks even"


def _x(value: float | None) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.2f}x"


def _method(drafter: str, policy: str, k: Any = None) -> str:
    text = f"{drafter}, {policy}"
    if k is None or f":{k}" in str(policy):
        return text
    return f"{text} (k = {k})" if float(k).is_integer() else f"{text} (mean k = {k})"


def _verified(stats: dict[str, Any]) -> str:
    """What the verifications of one generation came to, in words."""
    if not stats.get("verifies"):
        return "the drafter proposed nothing to verify, so every token came from a plain step"
    rate = stats.get("acceptance_rate") or 0.0
    return f"{stats.get('tokens_per_verify') or 0:.2f} tokens per verification, {rate:.0%} of drafted tokens accepted"


def quickstart(model: str, drafter: str, policy: str, stats: dict[str, Any], speedup: float, equal: bool) -> str:
    """One generation against plain decoding."""
    if not stats.get("verifies"):
        return (
            f"On {where()} {drafter}, {policy} proposed nothing to verify for {model} on this prompt, so every token "
            f"came from a plain step ({_x(speedup)} plain decoding's speed is timing noise); output "
            f"{'equal' if equal else 'NOT equal'} to plain decoding's."
        )
    return (
        f"On {where()} speculation {pays(speedup)} for {model} on this prompt: {_x(speedup)} plain decoding's "
        f"speed with {drafter}, {policy} ({_verified(stats)}); output {'equal' if equal else 'NOT equal'} to "
        "plain decoding's."
    )


def sweep(summary: pl.DataFrame, model: str) -> str:
    """A draft-length sweep: the best speculative method and whether outputs matched plain decoding."""
    speculative = summary.filter(pl.col("drafter") != "none").drop_nulls("speedup")
    if speculative.is_empty():
        return f"No speculative run finished for {model}."
    if "verifies" in speculative.columns and not speculative.filter(pl.col("verifies") > 0).is_empty():
        speculative = speculative.filter(pl.col("verifies") > 0)  # a method that drafted nothing ran plain steps
    best = speculative.sort("speedup", descending=True).row(0, named=True)
    worst = speculative.sort("speedup").row(0, named=True)
    equal = summary["all_equal_to_plain"].drop_nulls()
    outputs = (
        "every greedy output equal to plain decoding's"
        if len(equal) and equal.all()
        else ("some greedy outputs DIFFER from plain decoding's" if len(equal) else "outputs not compared")
    )
    k = best.get("k") if best.get("k") is not None else best.get("mean_k")
    k = None if k is None else (int(k) if float(k).is_integer() else round(float(k), 1))
    return (
        f"On {where()} speculation {pays(best['speedup'])} for {model}: best {_x(best['speedup'])}, "
        f"{_method(best['drafter'], best['policy'], k)}, worst {_x(worst['speedup'])} "
        f"({worst['drafter']}, {worst['policy']}), over {int(summary['runs'].max() or 0)} prompt(s) per method; "
        f"{outputs}."
    )


def _profile_sentence(profile: Profile, d: float, k_max: int, mode: str) -> str:
    a_star = break_even_acceptance(profile, d, k_max, mode)
    c2 = profile.c(2, mode)
    if np.all(np.isnan(a_star)):
        return (
            f"{profile.name} never breaks even: a verification costs more plain steps than a fully accepted draft "
            f"yields for every k <= {k_max} (c(2) = {c2:.2f} plain steps, engine overhead included)"
        )
    k = int(np.nanargmin(a_star)) + 1
    cost = f"c({k + 1}) = {profile.c(k + 1, mode):.2f} plain steps, engine overhead included"
    if a_star[k - 1] == 0:
        return f"{profile.name} pays at k = {k} even with every draft rejected ({cost}: no more than a plain step)"
    return f"{profile.name} breaks even from acceptance {a_star[k - 1]:.2f} per position (at its best k = {k}; {cost})"


def growth_per_row(profile: Profile, mode: str = "fast") -> float:
    """How much a verification's cost grows per added row, in plain steps: the slope of c(w) over the widths
    measured (least squares)."""
    widths = np.asarray(profile.widths[mode], dtype=float)
    if len(widths) < 2:
        return float("nan")
    return float(np.polyfit(widths, np.asarray(profile.costs[mode], dtype=float), 1)[0])


def break_even(
    profiles: Sequence[Profile],
    d: float = 0.0,
    k_max: int = 8,
    mode: str = "fast",
    grid: pl.DataFrame | None = None,
) -> str:
    """Cost profiles (a*(k) per model) and, when measured, the acceptance grid against its prediction."""
    if not profiles:
        return "No model could be profiled."
    parts = [_profile_sentence(p, d, min(k_max, max(p.widths[mode]) - 1), mode) for p in profiles if mode in p.costs]
    text = f"On {where(profiles[0].device)}: " + "; ".join(parts) + "."
    growth = [(p.name, growth_per_row(p, mode)) for p in profiles if mode in p.costs]
    if len(growth) > 1:
        (first, g1), (second, g2) = growth[0], growth[-1]
        text += (
            f" c(w) grew by {g1:.2f} plain steps per added row for {first} and {g2:.2f} for {second}"
            f" ({'faster' if g2 > g1 else 'not faster'} for the second)."
        )
    if grid is not None and not grid.is_empty():
        err = grid["error_nominal"].abs()
        best = grid.sort("speedup", descending=True).row(0, named=True)
        text += (
            f" Measured: best {_x(best['speedup'])} ({best['name']}, a = {best['a']:g}, k = {best['k']}); "
            f"the profile's predicted speedups were off by {err.mean():.0%} on average (max {err.max():.0%})."
        )
        above = grid.filter((pl.col("speedup") > 1) & (pl.col("predicted_nominal") < 1))
        if len(above):
            text += (
                f" {len(above)} of {len(grid)} cells measured above 1x where the profile predicts below 1x: "
                "their plain-decoding reference ran slower than the profile's plain step (noise on a shared machine)."
            )
    return text


def _measured_on(profile: Profile) -> str:
    """ "this CPU (OpenBLAS 0.3.21, 2 threads)" or "the NVIDIA H200": a profile's device, with the CPU's BLAS it
    recorded."""
    blas = profile.kernels.partition("|blas ")[2]
    return where(profile.device) + (f" ({blas})" if blas else "")


def _dense_vs_moe(dense: Profile, moe: Profile, mode: str, d: float, k_max: int, w_max: int) -> str:
    """How fast each model's c(w) grows per added row over widths 1..w_max, and each one's lowest a*(k)."""

    def slope(p: Profile) -> float:
        widths = [w for w in p.widths[mode] if w <= w_max]
        costs = [c for w, c in zip(p.widths[mode], p.costs[mode]) if w <= w_max]
        return float(np.polyfit(widths, costs, 1)[0]) if len(widths) > 1 else float("nan")

    def lowest(p: Profile) -> str:
        a_star = break_even_acceptance(p, d, min(k_max, max(p.widths[mode]) - 1), mode)
        if np.all(np.isnan(a_star)):
            return "never breaks even"
        k = int(np.nanargmin(a_star)) + 1
        return f"breaks even from a = {a_star[k - 1]:.2f} (k = {k})"

    g_dense, g_moe = slope(dense), slope(moe)
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
    here: dict[str, Profile], reference: Reference, mode: str = "fast", d: float = 0.0, k_max: int = 8
) -> str:
    """Dense vs MoE on this machine (``here``: "dense" and "MoE" profiles) beside the shipped reference device's
    (``specbench.cost.reference``), over the widths this machine measured, in ``mode`` (engine overhead
    included)."""
    w_max = min((max(p.widths[mode]) for p in here.values() if mode in p.costs), default=0)
    if set(here) >= {"dense", "MoE"} and all(mode in p.costs for p in here.values()) and w_max > 1:
        dense = here["dense"]
        mine = f"On {_measured_on(dense)}: {_dense_vs_moe(dense, here['MoE'], mode, d, k_max, w_max)}."
    else:
        mine = f"This machine has no dense and MoE {mode} profiles to compare."
        w_max = max(w_max, 5)
    ref = _dense_vs_moe(reference.profile("dense"), reference.profile("MoE"), mode, d, k_max, w_max)
    return f"{mine} On the {reference.describe()}, same widths (1-{w_max}): {ref}."


def traces(summary: pl.DataFrame, model: str) -> str:
    """An agent-trace replay: each drafter's speedup and tokens per verification (``overall_by_method``'s rows:
    over every trace, with its interval over traces where it has one), and exactness."""
    speculative = summary.filter(pl.col("method") != "plain").drop_nulls("speedup")
    if speculative.is_empty():
        return f"No speculative replay finished for {model}."
    drafted = speculative.filter(pl.col("tokens_per_verify").fill_null(0) > 0)
    if drafted.is_empty():
        return (
            f"On {where()} replaying agent traces, no drafter proposed anything to verify for {model}: every token "
            f"came from a plain step (the measured speedups, {_x(speculative['speedup'].min())} to "
            f"{_x(speculative['speedup'].max())}, are timing noise); "
            f"{'every turn equal' if bool(summary['identical'].all()) else 'some turns NOT equal'} to plain decoding."
        )
    best = drafted.sort("speedup", descending=True).row(0, named=True)
    identical = bool(summary["identical"].all())
    per_verify = best.get("tokens_per_verify")
    verified = f"{per_verify:.2f} tokens per verification" if per_verify else "nothing drafted to verify"
    over = ""
    if best.get("traces", 1) > 1:
        over = f" over {best['traces']} traces"
        if best.get("speedup_low") is not None:
            over += f" [95 % interval over traces {best['speedup_low']:.2f}-{best['speedup_high']:.2f}]"
    return (
        f"On {where()} replaying agent traces, speculation {pays(best['speedup'])} for {model}: best "
        f"{best['method']} at {_x(best['speedup'])}{over} ({verified}); "
        f"{'every turn equal' if identical else 'some turns NOT equal'} to plain decoding."
    )


def sampling(summary: pl.DataFrame, check: Any = None) -> str:
    """Acceptance against temperature, and the losslessness test."""
    rows = summary.filter(pl.col("drafter") != "none")
    parts = []
    temperatures = rows["temperature"].unique().sort().to_list() if len(rows) else []
    for drafter in rows["drafter"].unique(maintain_order=True).to_list():
        mine = rows.filter(pl.col("drafter") == drafter)
        at = []
        for t in (temperatures[0], temperatures[-1]) if len(temperatures) > 1 else temperatures:
            cell = mine.filter(pl.col("temperature") == t)
            drafted = cell["drafted"].sum() if "drafted" in cell.columns else None
            rate = cell["acceptance_rate"].drop_nulls().mean() if len(cell) else None
            at.append(
                f"nothing drafted at T = {t:g}" if not drafted and rate is None else f"{rate or 0:.0%} at T = {t:g}"
            )
        parts.append(f"{drafter} " + ", ".join(at))
    text = "Draft tokens accepted: " + "; ".join(parts) + "." if parts else "No sampled run finished."
    if check is not None:
        text += (
            f" Losslessness: {check.verdict} (p = {check.p_value:.2f}, {check.accepted_drafts} accepted draft tokens; "
            f"the test detects distances of {check.min_detectable_tvd:.2f} or more)."
        )
    return text


def acceptance_rules(summary: pl.DataFrame, best: pl.DataFrame, shifts: pl.DataFrame | None = None) -> str:
    """Each temperature's best lossless acceptance rule (``best_lossless``) with its tokens per verification
    and speedup, the other rules beside it, and the lossy rule's distribution shift where it was measured."""
    if best.is_empty():
        return "No lossless rule verified a draft: nothing to compare."
    parts = []
    for row in best.iter_rows(named=True):
        t = row["temperature"]
        others = summary.filter((pl.col("temperature") == t) & (pl.col("acceptance") != row["acceptance"]))
        beside = ", ".join(f"{o['acceptance']} {o['tokens_per_verify'] or 0:.2f}" for o in others.iter_rows(named=True))
        parts.append(
            f"T = {t:g}: {row['acceptance']}, {row['tokens_per_verify']:.2f} tokens per verification "
            f"and {_x(row['speedup'])} plain decoding's speed" + (f" ({beside})" if beside else "")
        )
    text = "Best lossless rule per temperature: " + "; ".join(parts) + "."
    if shifts is None:
        return text
    lossless = summary.filter(pl.col("lossless"))["acceptance"].unique().to_list()
    for row in shifts.filter(~pl.col("acceptance").is_in(lossless)).iter_rows(named=True):
        text += (
            f" {row['acceptance']} at T = {row['temperature']:g} moves the token distribution by "
            f"TVD {row['tvd']:.2f} [{row['tvd_low']:.2f}-{row['tvd_high']:.2f}] (two samples of one distribution "
            f"differ by up to {row['tvd_noise']:.2f} here; the histogram test says {row['verdict']})."
        )
    return text


def explorer(model: str, drafter: str, policy: str, stats: dict[str, Any]) -> str:
    """The explorer's stand-in run."""
    return f"{model}, {drafter}, {policy}: {stats.get('tokens', 0)} tokens; {_verified(stats)}."


def simulated_logs(result: Any) -> str:
    """Recorded agent logs replayed without a model: each drafter's best accepted tokens per verification."""
    summary = result.summary.drop_nulls("accepted_per_verify")
    if summary.is_empty():
        return f"No verification was simulated over {result.turns} recorded turns."
    parts = []
    for drafter in summary["drafter"].unique(maintain_order=True).to_list():
        best = (
            summary.filter(pl.col("drafter") == drafter).sort("accepted_per_verify", descending=True).row(0, named=True)
        )
        parts.append(
            f"{drafter} {best['accepted_per_verify']:.2f} accepted tokens per verification (store {best['store']}, "
            f"k = {best['k']})"
        )
    return (
        f"Replaying {result.turns} recorded turns of {result.traces} traces without a model: " + "; ".join(parts) + ". "
        "Whether that pays depends on the model's verify cost c(k+1) (see the break-even notebook)."
    )


def tree_vs_path(gain: pl.DataFrame) -> str:
    """Trees against paths of the same node budget: accepted tokens per verification, per drafter."""
    if gain.is_empty():
        return "No trace was compared."
    parts = []
    for drafter in gain["drafter"].unique(maintain_order=True).to_list():
        mine = gain.filter(pl.col("drafter") == drafter)
        better = int((mine["ratio"] > 1).sum())
        parts.append(
            f"{drafter}: the tree accepted more per verification in {better} of {len(mine)} cases "
            f"(mean {mine['tree'].mean():.2f} vs {mine['path'].mean():.2f} tokens for the path)"
        )
    return "Trees vs paths of the same node budget, accepted tokens per verification: " + "; ".join(parts) + "."


# -- headlines ---------------------------------------------------------------------------------------------------


def sweep_headline(summary: pl.DataFrame) -> dict[str, Any]:
    """A sweep summary's best speculative drafter and policy, its speedup, and whether every greedy
    output equalled plain decoding's (None when no output was compared)."""
    best = best_per_group(summary.filter(pl.col("drafter") != "none"), [])
    equal = summary["all_equal_to_plain"].drop_nulls()
    return {
        "best": f"{best['drafter'][0]} {best['policy'][0]}" if len(best) else "none",
        "best_speedup": best["speedup"][0] if len(best) else None,
        "outputs_equal_to_plain": bool(equal.all()) if len(equal) else None,
    }


def trace_headline(summary: pl.DataFrame) -> dict[str, Any]:
    """A trace run's summary (one row per method: ``TraceRun.overall()``): whether every method reproduced
    plain decoding, and each speculative method's speedup and tokens per verification."""
    speculative = summary.filter(pl.col("method") != "plain")
    methods = speculative["method"].to_list()
    return {
        "identical": bool(summary["identical"].all()),
        **{f"{m} speedup": s for m, s in zip(methods, speculative["speedup"].to_list())},
        **{f"{m} tokens/verify": t for m, t in zip(methods, speculative["tokens_per_verify"].to_list())},
    }


def profile_headline(profile: Profile, drafter_cost: float, widths: int, mode: str = "fast") -> dict[str, Any]:
    """A cost profile's c(2) and c(widths), engine overhead included (as the figures and the break-even math
    count it), the overhead itself, and the break-even acceptance a*(4) (None: never breaks even at k = 4)."""
    a_star = break_even_acceptance(profile, drafter_cost, widths - 1, mode)
    values = {f"{profile.name} c(2)": profile.c(2, mode), f"{profile.name} c({widths})": profile.c(widths, mode)}
    if mode in profile.overhead:
        values[f"{profile.name} overhead"] = profile.overhead[mode]
    if len(a_star) > 3:
        values[f"{profile.name} a*(4)"] = None if np.isnan(a_star[3]) else float(a_star[3])
    return values


def describe_profile(profile: Profile, mode: str = "fast", model: Any = None) -> str:
    """One line on a profile: plain step, c(w) (engine overhead included, and the overhead) and, given the
    model, the plain step's memory bandwidth against the device's measured peak."""
    curve = " ".join(f"{profile.c(w, mode):.2f}" for w in profile.widths[mode])
    text = (
        f"{profile.name}: plain step {1e3 * profile.plain_step_s:.1f} ms; c(w) {mode} for w = "
        f"{', '.join(map(str, profile.widths[mode]))}: {curve} plain steps "
        f"(engine overhead {profile.overhead.get(mode, 0.0):.2f} included)"
    )
    if model is not None:
        text += f"\n  plain decoding: {achieved(model, 1.0 / profile.plain_step_s).describe()}"
    return text


# -- labels ------------------------------------------------------------------------------------------------------


def _number(value: Any, spec: str = ".2f", unit: str = "") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "not measured"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int) and spec.endswith("f"):
        return f"{value}{unit}"
    if isinstance(value, (int, float)):
        return f"{value:{spec}}{unit}"
    return str(value)


def _times(value: Any) -> str:
    return _number(value, ".2f", "x")


def _percent(value: Any) -> str:
    return _number(value, ".0%") if isinstance(value, (int, float)) and not isinstance(value, bool) else _number(value)


def _yes_no(value: Any) -> str:
    return {True: "yes", False: "NO", None: "not compared"}.get(value, str(value))


def _plain_steps(value: Any) -> str:
    return _number(value, ".2f", " plain steps")


def _a_star(value: Any) -> str:
    return "never breaks even" if value is None else _number(value, ".2f", " per position")


_Formatter = Callable[[Any], str]

#: key -> (label, formatter)
LABELS: dict[str, tuple[str, _Formatter]] = {
    "verdict": ("verdict", str),
    "drafter": ("drafter", str),
    "policy": ("draft policy", str),
    "tokens": ("tokens generated", _number),
    "prompts": ("prompts", _number),
    "runs": ("generations timed", _number),
    "traces": ("traces replayed", _number),
    "speedup": ("decode speedup over plain decoding (tokens/s ratio, same run)", _times),
    "best": ("best drafter and policy", str),
    "best_speedup": ("best decode speedup over plain decoding (same run)", _times),
    "tokens_per_verify": ("tokens per verification (accepted drafts + 1)", lambda v: _number(v, ".2f")),
    "acceptance_rate": ("draft tokens accepted / drafted", _percent),
    "equal_to_plain": ("greedy output equal to plain decoding's", _yes_no),
    "outputs_equal_to_plain": ("every greedy output equal to plain decoding's", _yes_no),
    "identical": ("every turn's output equal to plain decoding's", _yes_no),
    "mean_abs_prediction_error": ("speedup prediction error, mean |measured / predicted - 1|", _percent),
    "lossless_verdict": ("losslessness test verdict", str),
    "lossless_p_value": ("losslessness: permutation-test p-value (small: biased)", lambda v: _number(v, ".3f")),
    "lossless_tvd": (
        "losslessness: total variation distance, plain vs speculative token histograms",
        lambda v: _number(v, ".3f"),
    ),
    "lossless_min_detectable_tvd": (
        "losslessness: smallest distance the test could detect",
        lambda v: _number(v, ".3f"),
    ),
    "lossless_accepted_drafts": ("losslessness: accepted draft tokens tested", _number),
    "lossless_acceptance": ("losslessness: draft tokens accepted / drafted", _percent),
}

#: (pattern, label template, formatter): keys that carry a model or method name.
PATTERNS: list[tuple[re.Pattern[str], str, _Formatter]] = [
    (re.compile(r"^(?P<m>.+) c\((?P<w>\d+)\)$"), "{m}: verify cost c({w}), engine overhead included", _plain_steps),
    (
        re.compile(r"^(?P<m>.+) a\*\((?P<w>\d+)\)$"),
        "{m}: break-even acceptance a*({w}) for a draft of {w}",
        _a_star,
    ),
    (re.compile(r"^(?P<m>.+) overhead$"), "{m}: engine overhead per speculative step", _plain_steps),
    (re.compile(r"^(?P<m>.+) speedup$"), "{m}: decode speedup over plain decoding", _times),
    (re.compile(r"^(?P<m>.+) tokens/verify$"), "{m}: tokens per verification", lambda v: _number(v, ".2f")),
    (re.compile(r"^(?P<m>.+) bandwidth$"), "{m}: memory bandwidth achieved / measured peak", _percent),
]


def describe(key: str, value: Any) -> tuple[str, str]:
    """(label, value with its unit) of a key result."""
    if key in LABELS:
        label, fmt = LABELS[key]
        return label, fmt(value)
    for pattern, template, fmt in PATTERNS:
        match = pattern.match(key)
        if match:
            return template.format(**match.groupdict()), fmt(value)
    return key, _number(value, ".3g")
