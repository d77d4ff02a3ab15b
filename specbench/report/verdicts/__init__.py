"""The report's words, generated from the numbers the notebooks measured: each notebook's verdict
(``out.verdict(verdicts.<notebook>(...), verdicts.<notebook>_speeds(...))``) and the key results it records for the
index (headlines; ``labels.describe`` gives their labels and units). Nothing here measures.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any, TypeGuard

import numpy as np
import polars as pl

from specbench.bench import paired
from specbench.bench.policy_confirm import MIN_REQUESTS
from specbench.bench.sweep import best_per_group
from specbench.checks.lossless import POWER
from specbench.common.identity import device_name
from specbench.cost.bandwidth import achieved
from specbench.cost.breakeven import break_even_acceptance
from specbench.cost.predict import mean_absolute_error
from specbench.cost.profile import Profile
from specbench.cost.reference import Reference
from specbench.report.verdicts.components import deciding_parts
from specbench.simulate.policies import best_predicted

# -- verdicts ----------------------------------------------------------------------------------------------------

#: The word of a speed verdict whose interval lies above 1, below 1, or holds 1 (or is missing).
PAYS, LOSES, INCONCLUSIVE = "pays", "loses", "inconclusive at this sample"


@dataclass(frozen=True)
class SummaryRow:
    """A row of a summary as the report reads it (a sweep's, ``bench.sweep_summary.summarize_sweep``; a trace run's,
    ``TraceRun.overall``; a prompt benchmark's, ``summarize_prompt_runs``): a column the summary lacks reads as None."""

    drafter: str | None = None
    method: str | None = None
    policy: str | None = None
    category: str | None = None
    speedup: float | None = None
    speedup_low: float | None = None
    speedup_high: float | None = None
    pairs: int | None = None
    prompts: int | None = None
    resampled: str | None = None
    level: float | None = None
    k: float | None = None
    mean_k: float | None = None
    verifies: int | None = None
    drafted: int | None = None
    accepted: int | None = None
    tokens_per_verify: float | None = None
    acceptance_rate: float | None = None
    verification_s: float | None = None
    plain_decode_s: float | None = None
    plain_decode_tokens: int | None = None
    exact_divergence: str | None = None
    mean_accepted_tokens: float | None = None

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> SummaryRow:
        return cls(**{f.name: row.get(f.name) for f in fields(cls) if f.name in row})

    @classmethod
    def rows(cls, summary: pl.DataFrame) -> list[SummaryRow]:
        return [cls.of(row) for row in summary.iter_rows(named=True)]


def where(device: str | None = None) -> str:
    """ "this CPU" or "the NVIDIA H200": the device the numbers were measured on."""
    device = device or device_name()
    kind, _, name = device.partition(":")
    return "this CPU" if kind == "cpu" else f"the {name or kind}"


def _finite(value: Any) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def speed_word(low: float | None, high: float | None, aa: tuple[float | None, float | None] | None = None) -> str:
    """``PAYS`` when a speedup's 95 % interval lies above 1, ``LOSES`` when below, else ``INCONCLUSIVE`` (no
    interval, or one that holds 1); ``INCONCLUSIVE`` too when the A/A cell's interval (plain against plain,
    ``aa``) excludes 1: the machine's speed then drifted more than pairing removes."""
    if aa is not None and _finite(aa[0]) and _finite(aa[1]) and (aa[0] > 1 or aa[1] < 1):
        return INCONCLUSIVE
    if not (_finite(low) and _finite(high)):
        return INCONCLUSIVE
    return PAYS if low > 1 else LOSES if high < 1 else INCONCLUSIVE


def _x(value: float | None) -> str:
    return "n/a" if not _finite(value) else f"{value:.2f}x"


def _interval(low: float | None, high: float | None, resampled: str = "", level: float = 0.95) -> str:
    over = {"pair": " over pairs", "": ""}.get(resampled, f" over {resampled}s")
    return f"{100 * level:.3g} % interval{over} {low:.2f}-{high:.2f}"


#: Per unit a speedup's sample is counted in: the count in words, and how many an interval needs.
_UNITS = {
    "pair": ("pair(s) of runs", f"{paired.MIN_UNITS} pairs or prompts"),
    "prompt": ("prompt(s)", f"{paired.MIN_UNITS} prompts"),
    "trace": ("trace(s)", f"{paired.MIN_UNITS} traces"),
    "request": ("request(s)", f"{MIN_REQUESTS} requests"),
}


def speed(
    ratio: float | None,
    low: float | None,
    high: float | None,
    count: int = 0,
    resampled: str = "",
    aa: SummaryRow | None = None,
    level: float = 0.95,
    unit: str = "pair",
) -> str:
    """A measured speedup over ``count`` ``unit``s ("pair", "prompt", "trace", "request") in words: "pays"/"loses"
    with its interval (at ``level``, over ``resampled``s) only when the interval excludes 1, else "inconclusive at
    this sample (...)" saying why; with the A/A cell (``aa``: plain against plain) beside it."""
    aa_bounds = (aa.speedup_low, aa.speedup_high) if aa else None
    word = speed_word(low, high, aa_bounds)
    noise = ""
    if aa:
        noise = f"; plain against plain (A/A) {_x(aa.speedup)}"
        if _finite(aa_bounds[0]) and _finite(aa_bounds[1]):
            noise += f" [{aa_bounds[0]:.2f}-{aa_bounds[1]:.2f}]"
    if not count:
        return f"{INCONCLUSIVE} ({_x(ratio)} from single unpaired runs: no interval){noise}"
    if not (_finite(low) and _finite(high)):
        counted, needs = _UNITS[unit]
        return f"{INCONCLUSIVE} ({_x(ratio)} over {count} {counted}; an interval needs {needs}){noise}"
    text = f"{word} ({_x(ratio)}, {_interval(low, high, resampled, level)} of {count} {unit}s){noise}"
    if word == INCONCLUSIVE and aa_bounds and speed_word(*aa_bounds) != INCONCLUSIVE:
        text += ": plain against plain is not 1 here, so the machine's speed drifted more than pairing removes"
    return text


def sample(
    prompts: int | None = None,
    tokens: int | None = None,
    policy: str | None = None,
    temperature: float | None = 0.0,
    traces: int | None = None,
    turns: int | None = None,
) -> str:
    """What a verdict rests on, in words: "2 prompts x 32 tokens, fixed:3, greedy"."""
    parts = []
    if traces is not None:
        parts.append(f"{traces} trace(s), {turns} turn(s)" + (f" x {tokens} tokens" if tokens else ""))
    elif prompts is not None:
        parts.append(f"{prompts} prompt(s)" + (f" x {tokens} tokens" if tokens else ""))
    if policy:
        parts.append(policy)
    if temperature is not None:
        parts.append("greedy" if temperature == 0 else f"T = {temperature:g}")
    return ", ".join(parts)


def _method(drafter: str | None, policy: str | None, k: Any = None) -> str:
    text = f"{drafter}, {policy}"
    if k is None or f":{k}" in str(policy):
        return text
    return f"{text} (k = {k})" if float(k).is_integer() else f"{text} (mean k = {k})"


def _verified(row: SummaryRow) -> str:
    """What the verifications of one generation came to, in words."""
    if not row.verifies:
        return "the drafter proposed nothing to verify, so every token came from a plain step"
    rate = row.acceptance_rate or 0.0
    return f"{row.tokens_per_verify or 0:.2f} tokens per verification, {rate:.0%} of drafted tokens accepted"


def aa_row(summary: pl.DataFrame) -> SummaryRow | None:
    from specbench.bench.sweep import AA_POLICY

    rows = SummaryRow.rows(summary.filter((pl.col("drafter") == "none") & (pl.col("policy") == AA_POLICY)))
    return rows[0] if rows else None


def fastest(rows: pl.DataFrame) -> SummaryRow | None:
    """The row of ``rows`` with the highest measured speedup (None where none was measured)."""
    found = SummaryRow.rows(rows.drop_nulls("speedup").sort("speedup", descending=True).head(1))
    return found[0] if found else None


def drafted_methods(summary: pl.DataFrame) -> pl.DataFrame:
    """A sweep summary's methods that drafted (verified at least one draft) and have a measured speedup."""
    speculative = summary.filter(pl.col("drafter") != "none").drop_nulls("speedup")
    return speculative.filter(pl.col("verifies").fill_null(0) > 0)


def fewest_per_verify(by_category: pl.DataFrame | None) -> list[SummaryRow]:
    """The drafted cell of a summary by category with the fewest tokens per verification (none without one): the
    one a sweep's verdict says cannot pay, where its log says so (``cannot_pay``)."""
    if by_category is None or by_category.is_empty():
        return []
    drafted = by_category.filter((pl.col("drafter") != "none") & (pl.col("verifies").fill_null(0) > 0))
    return SummaryRow.rows(drafted.sort("tokens_per_verify").head(1))


def _row_speed(row: SummaryRow, aa: SummaryRow | None) -> str:
    pairs, level = int(row.pairs or 0), float(row.level or 0.95)
    return speed(row.speedup, row.speedup_low, row.speedup_high, pairs, row.resampled or "", aa, level)


def all_equal(summary: pl.DataFrame) -> bool | None:
    """Whether every greedy output of a sweep summary equalled plain decoding's (None: none was compared)."""
    equal = summary["all_equal_to_plain"].drop_nulls()
    return bool(equal.all()) if len(equal) else None


def verify_cost(row: SummaryRow) -> float | None:
    """A method's measured cost of one verification in plain steps: its verifications' own forward seconds
    (``verification_s``: not its prompt's nor its plain steps') per verification over its plain baseline's seconds
    per token (None without a verification, or for records that predate ``verification_s``)."""
    if not row.verifies or not row.plain_decode_s or not row.plain_decode_tokens or row.verification_s is None:
        return None
    return (row.verification_s / row.verifies) / (row.plain_decode_s / row.plain_decode_tokens)


def cannot_pay(row: SummaryRow) -> str:
    """Why a drafted method cannot pay, from its own log: a verification yields ``tokens_per_verify`` tokens and
    costs ``verify_cost`` plain steps ("" when it yields more than it costs)."""
    cost, per_verify = verify_cost(row), row.tokens_per_verify
    if cost is None or per_verify is None or not _finite(per_verify) or per_verify > cost:
        return ""
    return (
        f"a verification yielded {per_verify:.2f} tokens ({row.acceptance_rate or 0:.0%} of drafted tokens "
        f"accepted) and cost {cost:.2f} plain steps, so speculation cannot pay there"
    )


def quickstart(model: str, summary: pl.DataFrame, tokens: int, equal: bool | None) -> str:
    """One drafter and policy against plain decoding on one prompt, over paired runs (``run_sweep(pairs=N)``'s
    summary by drafter and policy)."""
    rows = SummaryRow.rows(summary.filter(pl.col("drafter") != "none"))
    if not rows:
        return f"No speculative run finished for {model}."
    row = rows[0]
    on = f"{sample(1, tokens, row.policy)}, {row.pairs or 0} pairs of runs"
    outputs = {True: "equal", False: "NOT equal", None: "not compared"}[equal]
    if not row.verifies:
        return (
            f"On {where()} {row.drafter}, {row.policy} fell back to plain decoding for {model} on this prompt "
            f"(never drafted: 0 verifications), so there is no speedup to judge ({on}); output {outputs} to plain "
            "decoding's."
        )
    return (
        f"On {where()} speculation {_row_speed(row, aa_row(summary))} for {model} with {row.drafter}, "
        f"{row.policy} on this prompt ({on}; {_verified(row)}); output {outputs} to plain decoding's." + audited(row)
    )


def audited(row: SummaryRow) -> str:
    """Where the audit of exact verification found a verification that differed from serial steps (a run's
    ``exact_divergence``): a sentence naming the first diverging operation; else nothing."""
    found = row.exact_divergence
    if not found:
        return ""
    return (
        f" Exact verification differed from serial steps (audit): first diverging operation {found}; those runs "
        "verified by serial steps from there, so their output stayed exact, at a cost."
    )


def sweep(summary: pl.DataFrame, model: str, tokens: int | None = None, by_category: pl.DataFrame | None = None) -> str:
    """A draft-length sweep: the fastest method that drafted, its speed verdict over paired runs, the methods
    that fell back to plain, the category where speculation cannot pay and why (``by_category``: the summary by
    category, drafter and policy), and whether outputs matched plain decoding."""
    speculative = summary.filter(pl.col("drafter") != "none").drop_nulls("speedup")
    if speculative.is_empty():
        return f"No speculative run finished for {model}."
    drafted = drafted_methods(summary)
    plain_only = [f"{r.drafter}, {r.policy}" for r in SummaryRow.rows(speculative) if not r.verifies]
    outputs = {
        True: "every greedy output equal to plain decoding's",
        False: "some greedy outputs DIFFER from plain decoding's",
        None: "outputs not compared",
    }[all_equal(summary)]
    prompts = int(speculative["prompts"].max() or 0) if "prompts" in speculative.columns else None
    on = sample(prompts, tokens)
    fallback = f" Fell back to plain (never drafted): {'; '.join(plain_only)}." if plain_only else ""
    if drafted.is_empty():
        return f"On {where()} no method drafted anything for {model} ({on}).{fallback} {outputs.capitalize()}."
    best = fastest(drafted)
    assert best is not None
    k = best.k or best.mean_k
    k = None if k is None else (int(k) if float(k).is_integer() else round(float(k), 1))
    text = (
        f"On {where()} the fastest method that drafted, {_method(best.drafter, best.policy, k)}, "
        f"{_row_speed(best, aa_row(summary))} for {model} ({on}; {_verified(best)}).{fallback}"
    )
    for row in fewest_per_verify(by_category):
        why = cannot_pay(row)
        if why:
            text += f" On {row.category} ({row.drafter}, {row.policy}) {why}."
    found = [r for r in SummaryRow.rows(speculative) if r.exact_divergence]
    return f"{text} {outputs.capitalize()}." + (audited(found[0]) if found else "")


def lowest_break_even(profile: Profile, d: float, max_k: int, mode: str) -> tuple[int, float] | None:
    """(k, a*(k)) at the draft length k <= ``max_k`` whose break-even acceptance is lowest (None: none breaks even)."""
    a_star = break_even_acceptance(profile, d, max_k, mode)
    if np.all(np.isnan(a_star)):
        return None
    k = int(np.nanargmin(a_star)) + 1
    return k, float(a_star[k - 1])


def _profile_sentence(profile: Profile, d: float, max_k: int, mode: str) -> str:
    lowest = lowest_break_even(profile, d, max_k, mode)
    if lowest is None:
        return (
            f"{profile.name} never breaks even: a verification costs more plain steps than a fully accepted draft "
            f"yields for every k <= {max_k} (c(2) = {profile.c(2, mode):.2f} plain steps, engine overhead included)"
        )
    k, a_star = lowest
    cost = f"c({k + 1}) = {profile.c(k + 1, mode):.2f} plain steps, engine overhead included"
    if a_star == 0:
        return f"{profile.name} pays at k = {k} even with every draft rejected ({cost}: no more than a plain step)"
    return f"{profile.name} breaks even from acceptance {a_star:.2f} per position (at its best k = {k}; {cost})"


def growth_per_row(profile: Profile, mode: str = "fast", w_max: int | None = None) -> float:
    """How much a verification's cost grows per added row, in plain steps: the slope of c(w) over the widths
    measured (up to ``w_max``; least squares)."""
    pairs = [(w, c) for w, c in zip(profile.widths[mode], profile.costs[mode]) if w_max is None or w <= w_max]
    if len(pairs) < 2:
        return float("nan")
    widths, costs = np.asarray(pairs, dtype=float).T
    return float(np.polyfit(widths, costs, 1)[0])


def break_even(
    profiles: Sequence[Profile],
    d: float = 0.0,
    max_k: int = 8,
    mode: str = "fast",
    grid: pl.DataFrame | None = None,
    stacks: dict[str, list[dict[str, Any]]] | None = None,
) -> str:
    """Cost profiles (a*(k) per model), the part deciding each c(w) (``stacks``: component stacks per model)
    and, when measured, the acceptance grid against its prediction."""
    if not profiles:
        return "No model could be profiled."
    parts = [_profile_sentence(p, d, min(max_k, max(p.widths[mode]) - 1), mode) for p in profiles if mode in p.costs]
    text = f"On {where(profiles[0].device)}: " + "; ".join(parts) + "."
    growth = [(p.name, growth_per_row(p, mode)) for p in profiles if mode in p.costs]
    if len(growth) > 1:
        (first, g1), (second, g2) = growth[0], growth[-1]
        text += (
            f" c(w) grew by {g1:.2f} plain steps per added row for {first} and {g2:.2f} for {second}"
            f" ({'faster' if g2 > g1 else 'not faster'} for the second)."
        )
    text += deciding_parts(stacks or {})
    if grid is not None and not grid.is_empty():
        text += " " + measured_cells(grid, "speedup", "predicted_nominal", "error_nominal")
    return text


def batch_break_even(profiles: dict[str, Any], grid: pl.DataFrame | None, acceptances: Sequence[float]) -> str:
    """Break-even by batch size: what the measured cells show, the one predictor's predictions for the steps each run
    took (``predicted_from_log``, overheads in) and residuals beside them; predictions alone give no verdict."""
    if not profiles:
        return "No batch profile was measured."
    if grid is None or grid.is_empty():
        return (
            f"No cell was measured for {', '.join(profiles)}: the c(w, B) predictions stand untested, so there is no "
            "verdict."
        )
    parts = []
    for name in profiles:
        mine = grid.filter(pl.col("model") == name)
        if mine.is_empty():
            parts.append(f"{name}: no cell measured (predictions untested)")
            continue
        sizes = ", ".join(str(b) for b in mine["batch_size"].unique().sort().to_list())
        cells = measured_cells(mine, "measured", "predicted_from_log", "residual", "model")
        parts.append(
            f"{name} at B = {sizes} (acceptances {', '.join(f'{a:g}' for a in acceptances)}): "
            + cells.removeprefix("Measured cells ")
        )
    return f"On {where()}: " + " ".join(parts)


def traces(
    summary: pl.DataFrame, model: str, turns: int | None = None, tokens: int | None = None, policy: str | None = None
) -> str:
    """An agent-trace replay: the fastest drafter's speed verdict (``overall_by_method``'s rows: over every trace,
    with its interval over traces from 6 traces on), the drafters that never drafted, its sample (``turns`` replayed
    in all, ``tokens`` at most per turn, ``policy``), and exactness."""
    speculative = summary.filter(pl.col("method") != "plain").drop_nulls("speedup")
    if speculative.is_empty():
        return f"No speculative replay finished for {model}."
    identical = "every turn equal" if bool(summary["identical"].all()) else "some turns NOT equal"
    trace_count = int(summary["traces"].max()) if "traces" in summary.columns else 1
    on = sample(traces=trace_count, turns=turns, tokens=tokens, policy=policy)
    drafted = speculative.filter(pl.col("tokens_per_verify").fill_null(0) > 0)
    if drafted.is_empty():
        return (
            f"On {where()} replaying agent traces, every drafter fell back to plain decoding for {model} (never "
            f"drafted), so there is no speedup to judge ({on}); {identical} to plain decoding."
        )
    best = fastest(drafted)
    assert best is not None
    verdict = speed(best.speedup, best.speedup_low, best.speedup_high, trace_count, "trace", unit="trace")
    return (
        f"On {where()} replaying agent traces, the fastest drafter, {best.method}, {verdict} for {model} "
        f"({on}; {best.tokens_per_verify or 0:.2f} tokens per verification); {identical} to plain decoding."
    )


def bench(summary: Sequence[dict[str, Any]], baseline: str) -> str:
    """``specbench bench``'s verdict over its prompts (``summarize_prompt_runs``'s "overall" rows, every method run
    next to the others on each prompt in a rotating order): the fastest method that drafted with its interval over
    prompts, and the methods that fell back to plain (never drafted)."""
    rows = [SummaryRow.of(r) for r in summary if r.get("category") == "overall" and r.get("method") != baseline]
    plain_only = [r for r in rows if r.drafter != "none" and not _finite(r.acceptance_rate)]
    drafted = [r for r in rows if r.drafter != "none" and r not in plain_only and _finite(r.speedup)]
    text = "No method drafted anything."
    if drafted:
        best = max(drafted, key=lambda r: r.speedup or 0.0)
        prompts = int(best.prompts or 0)
        verdict = speed(best.speedup, best.speedup_low, best.speedup_high, prompts, "prompt", unit="prompt")
        mat = best.mean_accepted_tokens
        text = (
            f"Fastest method that drafted, {best.method}: {verdict} against {baseline} "
            f"({sample(best.prompts, policy=best.policy)}; #MAT {float('nan') if mat is None else mat:.2f})."
        )
    if plain_only:
        text += " Fell back to plain (never drafted): " + ", ".join(str(r.method) for r in plain_only) + "."
    return text


def losslessness(check: Any) -> str:
    """The losslessness test's conclusion at its sample: what it could detect, and what it found."""
    detectable = (
        f"a shift of {check.min_detectable_tvd:.2f} or more of the probability mass between two groups of tokens "
        f"would be found {POWER:.0%} of the time"
    )
    if check.verdict == "fail":
        return (
            f"Losslessness FAILED: the speculative token histogram differs from plain sampling's (p = "
            f"{check.p_value:.3f} over {check.accepted_drafts} accepted draft tokens; TVD {check.tvd:.2f})."
        )
    if check.verdict == "pass":
        return (
            f"Losslessness: no shift found at this sample (p = {check.p_value:.2f} over {check.accepted_drafts} "
            f"accepted draft tokens): {detectable}; the histograms' TVD of {check.tvd:.2f} is what two samples of "
            "this size differ by."
        )
    return (
        f"Losslessness: inconclusive at this sample ({check.reason}; p = {check.p_value:.2f} over "
        f"{check.accepted_drafts} accepted draft tokens): only {detectable.replace(' would be found', ', found')}."
    )


def sampling(summary: pl.DataFrame, check: Any = None, same: Any = None) -> str:
    """Acceptance against temperature (counts, not speeds), the losslessness test, and the same-tokens check
    (``specbench.checks.same_tokens``) when it ran."""
    rows = summary.filter(pl.col("drafter") != "none")
    parts = []
    temperatures = rows["temperature"].unique().sort().to_list() if len(rows) else []
    for (drafter,), mine in rows.group_by("drafter", maintain_order=True):
        at = []
        for t in (temperatures[0], temperatures[-1]) if len(temperatures) > 1 else temperatures:
            cell = mine.filter(pl.col("temperature") == t)
            drafted = cell["drafted"].sum() if "drafted" in cell.columns else None
            rate = cell["acceptance_rate"].drop_nulls().mean() if len(cell) else None
            at.append(
                f"nothing drafted at T = {t:g}" if not drafted and rate is None else f"{rate or 0:.0%} at T = {t:g}"
            )
        parts.append(f"{drafter} " + ", ".join(at))
    prompts = int(rows["prompts"].max()) if "prompts" in rows.columns and len(rows) else None
    over = f" ({sample(prompts, temperature=None)})" if prompts else ""
    text = f"Draft tokens accepted{over}: " + "; ".join(parts) + "." if parts else "No sampled run finished."
    if check is not None:
        text += " " + losslessness(check)
    if same is not None:
        text += (
            f" Sampled by position with one seed, speculative tokens were plain sampling's on {same.same} of "
            f"{same.runs} runs ({same.accepted_drafts} draft tokens accepted)."
        )
    return text


def acceptance_rules(summary: pl.DataFrame, best: pl.DataFrame, shifts: pl.DataFrame | None = None) -> str:
    """Each temperature's best lossless acceptance rule (``best_lossless``) with its tokens per verification
    and speedup, the other rules beside it, and the lossy rule's distribution shift where it was measured."""
    if best.is_empty():
        return "No lossless rule verified a draft: nothing to compare."
    parts = []
    for t, rule, per_verify in best.select("temperature", "acceptance", "tokens_per_verify").iter_rows():
        others = summary.filter((pl.col("temperature") == t) & (pl.col("acceptance") != rule))
        beside = ", ".join(f"{o} {v or 0:.2f}" for o, v in others.select("acceptance", "tokens_per_verify").iter_rows())
        parts.append(
            f"T = {t:g}: {rule}, {per_verify:.2f} tokens per verification" + (f" ({beside})" if beside else "")
        )
    text = (
        "Best lossless rule per temperature, by tokens per verification (its speeds come from single unpaired runs: "
        "no speed verdict): " + "; ".join(parts) + "."
    )
    if shifts is None:
        return text
    lossless = summary.filter(pl.col("lossless"))["acceptance"].unique().to_list()
    lossy = shifts.filter(~pl.col("acceptance").is_in(lossless))
    columns = ("acceptance", "temperature", "tvd", "tvd_low", "tvd_high", "tvd_noise", "verdict")
    for rule, t, tvd, low, high, noise, verdict in lossy.select(columns).iter_rows():
        text += (
            f" {rule} at T = {t:g} moves the token distribution by TVD {tvd:.2f} [{low:.2f}-{high:.2f}] (two samples "
            f"of one distribution differ by up to {noise:.2f} here; the histogram test says {verdict})."
        )
    return text


def explorer(model: str, drafter: str, policy: str, stats: dict[str, Any]) -> str:
    """The explorer's stand-in run."""
    return f"{model}, {drafter}, {policy}: {stats.get('tokens', 0)} tokens; {_verified(SummaryRow.of(stats))}."


def simulated_logs(result: Any) -> str:
    """Recorded agent logs replayed without a model: each drafter's best accepted tokens per verification."""
    summary = result.summary.drop_nulls("accepted_per_verify")
    if summary.is_empty():
        return f"No verification was simulated over {result.turns} recorded turns."
    best = summary.group_by("drafter", maintain_order=True).agg(
        pl.col("accepted_per_verify", "store", "k").sort_by("accepted_per_verify", descending=True).first()
    )
    parts = [
        f"{drafter} {per_verify:.2f} accepted tokens per verification (store {store}, k = {k})"
        for drafter, per_verify, store, k in best.iter_rows()
    ]
    return (
        f"Replaying {result.turns} recorded turns of {result.traces} traces without a model: " + "; ".join(parts) + ". "
        "Whether that pays depends on the model's verify cost c(k+1) (see the break-even notebook)."
    )


def tree_vs_path(gain: pl.DataFrame) -> str:
    """Trees against paths of the same node budget: accepted tokens per verification, per drafter."""
    if gain.is_empty():
        return "No trace was compared."
    per_drafter = gain.group_by("drafter", maintain_order=True).agg(
        (pl.col("ratio") > 1).sum(), pl.len(), pl.col("tree").mean(), pl.col("path").mean()
    )
    parts = [
        f"{drafter}: the tree accepted more per verification in {better} of {cases} cases "
        f"(mean {tree:.2f} vs {path:.2f} tokens for the path)"
        for drafter, better, cases, tree, path in per_drafter.iter_rows()
    ]
    return "Trees vs paths of the same node budget, accepted tokens per verification: " + "; ".join(parts) + "."


# -- speed verdicts as statements --------------------------------------------------------------------------------
# The speed verdicts a page states, as typed statements (``SpeedVerdict``): what its words say of one quantity, a
# model's decode speedup over plain decoding with one drafter and policy on one kind of prompt at one temperature and
# verify mode. ``Outputs.verdict(text, speeds)`` stores them beside the words; ``report.consistency`` flags two pages
# that say "pays" and "loses" of one quantity.

#: The prompt kind of the quickstart's prompt: one of its own (a parameter of that page), no kind of the prompt set.
OWN_PROMPT = "quickstart"


@dataclass(frozen=True)
class SpeedVerdict:
    """``word`` (``PAYS``, ``LOSES`` or ``INCONCLUSIVE``) of ``model``'s speedup over plain decoding with ``drafter``
    and ``policy`` (its name: "fixed:3", "auto") on ``kind`` prompts (a category, several joined by "+", or a kind of
    the page's own) at ``temperature``, verified ``verify``; ``speedup`` as measured (None where not)."""

    model: str
    drafter: str
    policy: str
    kind: str
    temperature: float
    verify: str
    word: str
    speedup: float | None = None

    @property
    def quantity(self) -> tuple[str, str, str, str, float, str]:
        return (self.model, self.drafter, self.policy, self.kind, self.temperature, self.verify)

    def names(self) -> str:
        """The quantity in words: "m with lookup, fixed:3 on qa prompts, greedy, exact verification"."""
        heat = "greedy" if self.temperature == 0 else f"T = {self.temperature:g}"
        on = f"{self.kind} prompts, {heat}, {self.verify} verification"
        return f"{self.model} with {self.drafter}, {self.policy} on {on}"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def of_json(cls, data: Any) -> SpeedVerdict | None:
        """A stored statement, or None where ``data`` is not one (a damaged or older summary)."""
        if not isinstance(data, Mapping):
            return None
        text = ("model", "drafter", "policy", "kind", "verify", "word")
        if not all(isinstance(data.get(k), str) for k in text) or data["word"] not in (PAYS, LOSES, INCONCLUSIVE):
            return None
        temperature, speedup = data.get("temperature"), data.get("speedup")
        if not _finite(temperature) or (speedup is not None and not _finite(speedup)):
            return None
        return cls(**{k: data[k] for k in text}, temperature=float(temperature), speedup=speedup)


def one(runs: pl.DataFrame, column: str, default: Any = "") -> Any:
    """The one value ``column`` takes in ``runs`` (several joined by "+", sorted; ``default`` without it)."""
    if column not in runs.columns:
        return default
    values = sorted({v for v in runs[column].to_list() if v is not None}, key=str)
    if len(values) == 1:
        return values[0]
    return "+".join(map(str, values)) if values else default


def settings(runs: pl.DataFrame) -> tuple[float, str]:
    """The temperature and verify mode of a page's speculative ``runs``."""
    drafted = runs.filter(pl.col("drafter") != "none")
    return float(one(drafted, "temperature", 0.0)), str(one(drafted, "verify_mode"))


def row_word(row: SummaryRow, aa: SummaryRow | None = None) -> str:
    """The word ``verdicts.speed`` gives a summary row (with its A/A row beside it)."""
    if not row.pairs:
        return INCONCLUSIVE
    return speed_word(row.speedup_low, row.speedup_high, (aa.speedup_low, aa.speedup_high) if aa else None)


def sweep_speeds(
    summary: pl.DataFrame, runs: pl.DataFrame, model: str, by_category: pl.DataFrame | None = None
) -> list[SpeedVerdict]:
    """What ``verdicts.sweep`` says of speed: the fastest method that drafted over the sweep's prompt kinds, and
    "cannot pay" (loses) of the kind its ``by_category`` rows name. ``runs``: the sweep's runs."""
    best = fastest(drafted_methods(summary))
    temperature, verify = settings(runs)
    said: list[SpeedVerdict] = []
    if best is not None:
        word = row_word(best, aa_row(summary))
        kind = str(one(runs.filter(pl.col("drafter") != "none"), "category"))
        said.append(
            SpeedVerdict(model, str(best.drafter), str(best.policy), kind, temperature, verify, word, best.speedup)
        )
    for row in fewest_per_verify(by_category):
        if cannot_pay(row):
            said.append(
                SpeedVerdict(model, str(row.drafter), str(row.policy), str(row.category), temperature, verify, LOSES)
            )
    return said


def quickstart_speeds(summary: pl.DataFrame, runs: pl.DataFrame, model: str) -> list[SpeedVerdict]:
    """What ``verdicts.quickstart`` says of speed: its drafter and policy on its own prompt (``OWN_PROMPT``)."""
    rows = SummaryRow.rows(summary.filter(pl.col("drafter") != "none"))
    if not rows or not rows[0].verifies:
        return []
    row, (temperature, verify) = rows[0], settings(runs)
    word = row_word(row, aa_row(summary))
    return [SpeedVerdict(model, str(row.drafter), str(row.policy), OWN_PROMPT, temperature, verify, word, row.speedup)]


def trace_speeds(
    overall: pl.DataFrame, model: str, traces: Iterable[str], policy: str, verify: str
) -> list[SpeedVerdict]:
    """What ``verdicts.traces`` says of speed: the fastest drafter over the ``traces`` replayed (greedy)."""
    best = fastest(overall.filter((pl.col("method") != "plain") & (pl.col("tokens_per_verify").fill_null(0) > 0)))
    if best is None:
        return []
    word = speed_word(best.speedup_low, best.speedup_high)
    kind = "traces " + "+".join(sorted(traces))
    return [SpeedVerdict(model, str(best.method), policy, kind, 0.0, verify, word, best.speedup)]


def policy_speeds(
    confirmed: pl.DataFrame | None, model: str, drafter: str, kind: str, verify: str
) -> list[SpeedVerdict]:
    """What ``verdicts.policies`` says of the confirmed policies' speed, on ``kind`` prompts (greedy)."""
    rows = [] if confirmed is None else Confirmed.rows(confirmed)
    words = [speed_word(r.measured_low, r.measured_high) for r in rows]
    return [
        SpeedVerdict(model, drafter, r.policy, kind, 0.0, verify, w, r.measured_speedup) for r, w in zip(rows, words)
    ]


# -- a measured grid beside its predictions (the break-even and batch pages) -------------------------------------


def measured_cells(grid: pl.DataFrame, measured: str, predicted: str, residual: str, label: str = "name") -> str:
    """Measured speedups of a grid of cells beside the profile's predictions and their residuals (measured /
    predicted - 1): a test of the predictions, not a speed verdict (a cell's few runs have no interval). Where the
    cells were timed as repeated pairs (``measured_runs``, ``noise_floor``: ``specbench.cost.grid``), the mean
    |residual| is set against what a perfect predictor would miss by at that scatter."""
    residuals = grid[residual].abs()
    below = int((grid[measured] < 1).sum())
    predicted_above = grid.filter((pl.col(predicted) > 1) & (pl.col(measured) < 1))
    pairs = int(grid["measured_runs"].list.len().min()) if "measured_runs" in grid.columns else 1
    timed = "one plain and one speculative run each" if pairs < 2 else f"the median of {pairs} adjacent pairs each"
    text = (
        f"Measured cells ({timed}, no interval, so no speed verdict): "
        f"{grid[measured].min():.2f}-{grid[measured].max():.2f}x, below 1 in {below} of {len(grid)}, against "
        f"predictions of {grid[predicted].min():.2f}-{grid[predicted].max():.2f}x; residual "
        f"(measured / predicted - 1) {grid[residual].mean():+.0%} on average, |residual| up to {residuals.max():.0%}."
    )
    scatter = grid["noise_floor"].to_list() if "noise_floor" in grid.columns else []
    floors = [f for f in scatter if f is not None and math.isfinite(f)]
    if floors:
        floor, error = mean_absolute_error(floors), mean_absolute_error(grid[residual].to_list())
        # a perfect predictor's |residuals| are half-normal: their mean over n cells has a standard deviation of
        # sqrt(pi / 2 - 1) floor / sqrt(n); two of them above the floor is beyond the noise
        reading = (
            "within the noise: the machine cannot tell a better predictor here"
            if error <= floor * (1 + 2 * math.sqrt(math.pi / 2 - 1) / math.sqrt(len(floors)))
            else "beyond the noise: the predictor misses"
        )
        text += (
            f" Mean |residual| {error:.1%} against {floor:.1%} that a perfect predictor would show from the pairs'"
            f" scatter ({reading})."
        )
    if len(predicted_above):
        where_cells = ", ".join(
            f"{r[label]} a = {r.get('a', r.get('acceptance'))}, k = {r['k']}"
            + (f", B = {r['batch_size']}" if "batch_size" in r else "")
            for r in predicted_above.head(4).iter_rows(named=True)
        )
        text += f" Predicted above 1 but measured below: {where_cells}{' ...' if len(predicted_above) > 4 else ''}."
    return text


# -- draft-length policies: the ranking by predicted speedup and the confirmed ones ------------------------------


@dataclass(frozen=True)
class Confirmed:
    """A row of ``bench.policy_confirm.confirm_policies``: a policy's measured speedup with its 95 % interval over
    requests (None: too few requests), its predicted speedup and the residual."""

    policy: str
    requests: int
    measured_speedup: float
    measured_low: float | None
    measured_high: float | None
    predicted_speedup: float
    residual: float

    @classmethod
    def rows(cls, confirmed: pl.DataFrame) -> list[Confirmed]:
        return [cls(**row) for row in confirmed.iter_rows(named=True)]


def confirmed_speed(row: Confirmed) -> str:
    """One confirmed policy in words: its speed verdict over requests (``speed``), then its prediction and the
    residual."""
    low, high, requests = row.measured_low, row.measured_high, row.requests
    measured = speed(row.measured_speedup, low, high, requests, "request", unit="request")
    return f"{row.policy} {measured}, predicted {row.predicted_speedup:.2f}x (residual {row.residual:+.0%})"


def policies(table: pl.DataFrame, confirmed: pl.DataFrame | None, model: str, drafter: str, sample: str) -> str:
    """Which policy the cost profile ranks first on how many workloads, and what the real runs of the confirmed
    ones measured on ``sample`` (e.g. "6 prompt(s) x 32 tokens, greedy")."""
    if table.is_empty():
        return "No policy was replayed: no workload had a recorded output."
    workloads = table["workload"].unique(maintain_order=True).to_list()
    bests = [best_predicted(table, workload) for workload in workloads]
    firsts = Counter(best[0] for best in bests if len(best) == 1)
    # workloads where several policies share the top; where every policy ties
    shared, ties = sum(len(best) > 1 for best in bests), sum(not best for best in bests)
    counts = [f"{p} on {n}" for p, n in sorted(firsts.items(), key=lambda item: (-item[1], item[0]))]
    counts += [f"two or more policies tied at the top on {shared}"] * bool(shared)
    counts += [f"every policy tied on {ties}"] * bool(ties)
    text = (  # each workload counted once: the counts add up to the workloads
        f"{model}, {drafter} drafts: best predicted speedup (a prediction from the cost profile, not a "
        f"measurement) {', '.join(counts) or 'none'} of {len(workloads)} workload(s)."
    )
    if confirmed is None or confirmed.is_empty():
        return text + " No policy was confirmed by real runs, so there is no speed verdict."
    parts = "; ".join(confirmed_speed(r) for r in Confirmed.rows(confirmed))
    return f"{text} Real runs on {where()} ({sample}): {parts}."


# -- this machine beside a shipped reference device (``specbench.cost.reference``) -------------------------------


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


# -- headlines ---------------------------------------------------------------------------------------------------


def sweep_headline(summary: pl.DataFrame) -> dict[str, Any]:
    """A sweep summary's best speculative drafter and policy, its speedup, and whether every greedy
    output equalled plain decoding's (None when no output was compared)."""
    best = SummaryRow.rows(best_per_group(summary.filter(pl.col("drafter") != "none"), []))
    return {
        "best": f"{best[0].drafter} {best[0].policy}" if best else "none",
        "best_speedup": best[0].speedup if best else None,
        "outputs_equal_to_plain": all_equal(summary),
    }


def trace_headline(summary: pl.DataFrame) -> dict[str, Any]:
    """A trace run's summary (one row per method: ``TraceRun.overall()``): whether every method reproduced
    plain decoding, and each speculative method's speedup and tokens per verification."""
    rows = SummaryRow.rows(summary.filter(pl.col("method") != "plain"))
    return {
        "identical": bool(summary["identical"].all()),
        **{f"{r.method} speedup": r.speedup for r in rows},
        **{f"{r.method} tokens/verify": r.tokens_per_verify for r in rows},
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
