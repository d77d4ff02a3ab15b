"""The default-policy benchmark's paired A/B statistics (``scripts.gpu.default_policy``): each pair is a baseline
run (plain decoding, "A") and a method's run ("B", Auto) timed next to each other;
a cell (a model, a setting, a method) gathers its pairs over repeats and prompts.

Per cell: the baseline's seconds over the method's summed over every pair, with a 95 % expanded percentile
bootstrap interval (resampling pairs; none under ``MIN_UNITS`` pairs), and the same ratio *in plain steps*:
each run's seconds over its own speed (``run_speed.speed_state``), which cancels drift in the machine's speed
between the runs of a pair while keeping the method's own costs (verifications, drafting, probes) charged.
A run without a speed (speculating throughout) takes its pair's other run's. Each estimate gets a verdict
against a threshold (``OK``, 0.97): "holds", "ok", "inconclusive" or "LOSES" (``verdict``), the last needing a
one-sided t-test under ``ALPHA`` after Holm's correction over the run's cells. Pooled intervals over cells
follow (``pooled``). Rows are read into typed ``Pair`` objects; the stored column names stay those of the
results files (``plain_s``, ``auto_state_ms``, ``auto_steady_ms``, ...).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scripts.gpu.run_speed import MIN_STEADY
from scripts.result_lines import AACheck
from specbench.bench.paired import MIN_UNITS, bootstrap, seconds_ratio, student_t_above

#: The ratio (method over baseline, in speed) a default must keep: 3 % slower at most.
OK = 0.97
#: One-sided level of a "LOSES" verdict: what an interval of 95 % wholly below ``OK`` says of one cell.
ALPHA = 0.025
#: The methods of A/A cells: the baseline timed as a method is, paired with the baseline.
AA_METHODS = ("plain", "plain (A/A)")


def p_below(pairs: Sequence[tuple[float, float]], threshold: float) -> float:
    """One-sided p-value of "the method / baseline is below ``threshold``": a t-test of the pairs' log ratios
    (baseline seconds / the method's) against log ``threshold`` (1.0 for fewer than 2 pairs; with no spread,
    0.0 below the threshold and 1.0 at or above). A percentile bootstrap of 6 pairs reaches p = 0 whenever
    every pair falls below, which no correction for many cells can undo."""
    logs = [math.log(p / a) for p, a in pairs]
    if len(logs) < 2:
        return 1.0
    if statistics.stdev(logs) == 0.0:  # identical pairs: every one is below the threshold, or none is
        return 0.0 if logs[0] < math.log(threshold) else 1.0
    t = (statistics.mean(logs) - math.log(threshold)) / (statistics.stdev(logs) / math.sqrt(len(logs)))
    return 1.0 - student_t_above(t, len(logs) - 1)


def interval_and_p(pairs: Sequence[tuple[float, float]], threshold: float) -> tuple[float, float, float]:
    """(low, high, p): ``seconds_ratio``'s 95 % expanded percentile bootstrap interval over ``pairs`` and the
    one-sided p-value of "below ``threshold``" (``p_below``); no interval (0, inf, p = 1) under
    ``MIN_UNITS`` pairs."""
    if len(pairs) < MIN_UNITS:
        return 0.0, float("inf"), 1.0
    low, high = bootstrap(list(pairs), seconds_ratio)
    return low, high, p_below(pairs, threshold)


def ms_to_s(value: Any) -> float | None:
    """A speed in ms as a row keeps it (None, NaN or missing: None), in seconds."""
    return value / 1e3 if isinstance(value, (int, float)) and math.isfinite(value) and value > 0 else None


def speed_in_ms(seconds: float | None) -> float:
    """A run's speed as a row keeps it: milliseconds, NaN where the run has none (``ms_to_s`` reads it back)."""
    return 1e3 * seconds if seconds else float("nan")


@dataclass(frozen=True)
class Side:
    """One run of a pair, read from a results row's columns with its prefix (``plain_`` or ``auto_``)."""

    seconds: float  # the whole call's (category and trace runs) or per token (synthetic shapes)
    state_s: float | None  # ``speed_state``: its median steady step
    mean_s: float | None  # ``mean_speed``: its mean steady step
    split: Mapping[str, float]  # ``time_split``'s parts present in the row

    @classmethod
    def of(cls, row: Mapping[str, Any], who: str) -> Side:
        prefix = f"{who}_"
        seconds = row[f"{who}_s"] if f"{who}_s" in row else row.get(f"{who}_s_per_token", math.nan)
        split = {k[len(prefix) :]: v for k, v in row.items() if k.startswith(prefix) and isinstance(v, (int, float))}
        mean = ms_to_s(row[f"{who}_mean_ms"]) if f"{who}_mean_ms" in row else _legacy_mean(split)
        return cls(seconds, ms_to_s(row.get(f"{who}_state_ms")), mean, split)

    def speed(self, average: str = "state") -> float | None:
        """Seconds of one plain step: the median steady step ("state") or the mean one ("mean")."""
        return self.state_s if average == "state" else self.mean_s

    def in_steps(self, speed: float, ms: str, count: str | None) -> float:
        """A part of the split (``ms``) in steps at ``speed``, less ``count`` of them (the tokens it emitted)."""
        return self.split[ms] / (1e3 * speed) - (self.split[count] if count else 0.0)


def _legacy_mean(split: Mapping[str, float]) -> float | None:
    """The mean steady step of rows written before ``mean_ms`` was recorded (a drafter's ``observe`` seconds not
    taken out)."""
    steady = split.get("steady_n")
    return ms_to_s(split["steady_ms"] / steady) if steady and steady >= MIN_STEADY else None


@dataclass(frozen=True)
class Pair:
    """A results row as a pair of runs: the cell it belongs to, both runs, whether the seconds are whole calls
    (category and trace runs) rather than per token (synthetic shapes), and the columns a cell's summary reads: a
    whole call's prompt; a shape's ratio and the spread of its baseline, the draft lengths Auto asked for, its
    verifications and paused tokens and mlx-lm's seconds per token."""

    model: str
    what: str
    method: str
    repeat: int
    tokens: int
    plain: Side
    auto: Side
    equal_plain: bool | None
    whole_calls: bool
    prompt: str = ""
    vs_plain: float = math.nan
    plain_spread: float = 0.0
    ks: str | None = None  # a shape's row alone has it
    verifies: float = 0.0
    paused: float = 0.0
    mlx_lm_s: float = math.nan

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> Pair:
        return cls(
            row.get("model", ""),
            row.get("what", ""),
            row.get("method", ""),
            row.get("repeat", 0),
            row.get("tokens", 0),
            Side.of(row, "plain"),
            Side.of(row, "auto"),
            row.get("equal_plain"),
            "plain_s" in row,
            row.get("prompt", ""),
            row.get("vs_plain", math.nan),
            row.get("plain_spread", 0.0),
            row.get("ks"),
            row.get("verifies", 0.0),
            row.get("paused", 0.0),
            row.get("mlx_lm_s_per_token", math.nan),
        )

    @property
    def cell(self) -> tuple[str, str, str]:
        return self.model, self.what, self.method

    @property
    def seconds(self) -> tuple[float, float]:
        """(baseline, method) seconds."""
        return self.plain.seconds, self.auto.seconds

    def speeds(self, average: str = "state") -> tuple[float | None, float | None]:
        return self.plain.speed(average), self.auto.speed(average)

    def in_steps(self, average: str = "state") -> tuple[float, float] | None:
        """(baseline, method) seconds each over its run's speed; a run without one takes the other's; None
        when neither has one."""
        plain_speed, auto_speed = self.speeds(average)
        if not (plain_speed or auto_speed):
            return None
        return self.plain.seconds / (plain_speed or auto_speed), self.auto.seconds / (auto_speed or plain_speed)

    def excess_in_steps(self) -> dict[str, float] | None:
        """The method's seconds beyond the baseline's, in plain steps, by where they went (``time_split``):
        speculation (its steps over the method's speed, less the tokens they emitted), stretch starts, steady
        steps and seconds outside the log (each the method's in its speed less the baseline's in its own),
        and slower steps (every token at the method's speed over the baseline's: drift between runs or a
        real per-step cost). None without both runs' splits and speeds."""
        plain_speed, auto_speed = self.speeds()
        if not (plain_speed and auto_speed) or "steady_n" not in self.auto.split or "steady_n" not in self.plain.split:
            return None
        speeds = {"auto": (self.auto, auto_speed), "plain": (self.plain, plain_speed)}

        def steps(who: str, ms: str, count: str | None) -> float:
            side, speed = speeds[who]
            return side.in_steps(speed, ms, count)

        parts = {"speculation": steps("auto", "spec_ms", "spec_tokens")}
        for part, ms, count in (("stretch starts", "starts_ms", "starts_n"), ("steady", "steady_ms", "steady_n")):
            parts[part] = steps("auto", ms, count) - steps("plain", ms, count)
        parts["outside the log"] = steps("auto", "unlogged_ms", None) - steps("plain", "unlogged_ms", None)
        parts["slower steps"] = self.tokens * (auto_speed / plain_speed - 1.0)
        return parts

    def slow_counts(self) -> dict[str, float] | None:
        """Slow steady steps per run (``time_split``): the method's, those of them near a decision, the
        baseline's; None when a run lacks them."""
        counts = {
            "auto": self.auto.split.get("slow_n"),
            "near": self.auto.split.get("slow_near_n"),
            "plain": self.plain.split.get("slow_n"),
        }
        return counts if all(isinstance(c, (int, float)) for c in counts.values()) else None


def spread(values: Sequence[float]) -> float:
    """Relative spread (max / min - 1) of positive values."""
    return max(values) / min(values) - 1.0 if values and min(values) > 0 else 0.0


def verdict(ratio: float, low: float, high: float, p_adjusted: float | None = None, threshold: float = OK) -> str:
    """Against ``threshold`` with a 95 % interval [low, high] of method / baseline: "holds" (low >= threshold),
    "ok" (the ratio is >= threshold, the interval reaches below), "inconclusive" (the ratio is below, the
    interval reaches the threshold, or its p-value corrected for the run's other cells, ``p_adjusted``, is not
    under ``ALPHA``), "LOSES" (the whole interval is below and so is the corrected p-value)."""
    if low >= threshold:
        return "holds"
    if ratio >= threshold:
        return "ok"
    loses = high < threshold and (p_adjusted is None or p_adjusted < ALPHA)
    return "LOSES" if loses else "inconclusive"


def in_plain_steps(pairs: Sequence[Pair], average: str = "state") -> list[tuple[float, float]]:
    """``Pair.in_steps`` of each pair that has it."""
    return [steps for pair in pairs if (steps := pair.in_steps(average)) is not None]


def at_one_speed(pairs: Sequence[Pair], average: str = "state") -> int:
    """How many of ``in_plain_steps``'s pairs count their seconds ratio: one run with a speed, the other none."""
    return sum(1 for pair in pairs if sum(bool(speed) for speed in pair.speeds(average)) == 1)


def estimate(pairs: Sequence[tuple[float, float]]) -> tuple[float | None, float, float, float]:
    """(ratio, low, high, p) of ``interval_and_p``, the ratio None under ``MIN_UNITS`` pairs."""
    low, high, p = interval_and_p(pairs, OK)
    return (seconds_ratio(pairs) if len(pairs) >= MIN_UNITS else None), low, high, p


@dataclass(frozen=True, kw_only=True)
class CellSummary:
    """A cell's summary (``cell_row``): the seconds ratio (baseline over method) over every pair with its interval
    and one-sided p-value of a loss, the same in plain steps and in mean steps, the median over repeats
    (``auto_over_plain``) and its range, the baseline's own noise, and whether the outputs equal plain's.
    ``judge`` adds the Holm-corrected p-values and the verdicts; a shape's cell adds the draft lengths Auto asked
    for (``ks``), its median verifications and paused tokens, and its speed over mlx-lm's."""

    model: str = ""
    what: str = ""
    method: str
    repeats: int = 0
    pairs: int = 0
    ratio: float
    low: float
    high: float
    auto_over_plain: float = math.nan
    lowest: float = math.nan
    highest: float = math.nan
    plain_noise: float = 0.0
    in_steps: float | None = None
    steps_low: float = 0.0
    steps_high: float = math.inf
    steps_pairs: int = 0
    steps_in_seconds: int = 0
    in_mean_steps: float | None = None
    mean_steps_low: float = 0.0
    mean_steps_high: float = math.inf
    p_loses: float
    steps_p_loses: float = 1.0
    equal_plain: bool | None = None
    p_loses_holm: float | None = None
    steps_p_loses_holm: float | None = None
    verdict: str | None = None
    verdict_in_steps: str | None = None
    ks: str | None = None
    verifies: float | None = None
    paused: float | None = None
    vs_mlx_lm: float | None = None


def cell_row(cell: tuple[str, str, str], pairs: Sequence[Pair]) -> CellSummary:
    """A cell's summary (``CellSummary``), not yet judged; a shape's cell with what Auto did."""
    by_repeat: dict[int, list[Pair]] = {}
    for pair in pairs:
        by_repeat.setdefault(pair.repeat, []).append(pair)
    if pairs[0].whole_calls:  # a category's or trace's seconds summed per repeat
        ratios = [seconds_ratio([p.seconds for p in ps]) for ps in by_repeat.values()]
        plain_by_prompt: dict[str, list[float]] = {}
        for pair in pairs:
            plain_by_prompt.setdefault(pair.prompt, []).append(pair.plain.seconds)
        noise = statistics.median(spread(v) for v in plain_by_prompt.values())
    else:
        ratios = [statistics.mean(p.vs_plain for p in ps) for ps in by_repeat.values()]
        noise = statistics.median(p.plain_spread for p in pairs)
    seconds = [p.seconds for p in pairs]
    low, high, p_loses = interval_and_p(seconds, OK)
    steps = in_plain_steps(pairs)
    in_steps, steps_low, steps_high, steps_p = estimate(steps)
    in_mean, mean_low, mean_high, _ = estimate(in_plain_steps(pairs, "mean"))
    equal = [p.equal_plain for p in pairs if p.equal_plain is not None]
    shape: dict[str, Any] = {}
    if pairs[0].ks is not None:  # a shape's cell
        shape = {
            "ks": " | ".join(p.ks or "-" for p in pairs),
            "verifies": statistics.median(p.verifies for p in pairs),
            "paused": statistics.median(p.paused for p in pairs),
            "vs_mlx_lm": statistics.median(p.mlx_lm_s / p.auto.seconds for p in pairs),
        }
    model, what, method = cell
    return CellSummary(
        model=model,
        what=what,
        method=method,
        repeats=len(ratios),
        pairs=len(pairs),
        ratio=seconds_ratio(seconds),
        low=low,
        high=high,
        auto_over_plain=statistics.median(ratios),
        lowest=min(ratios),
        highest=max(ratios),
        plain_noise=noise,
        in_steps=in_steps,
        steps_low=steps_low,
        steps_high=steps_high,
        steps_pairs=len(steps),
        steps_in_seconds=at_one_speed(pairs),
        in_mean_steps=in_mean,
        mean_steps_low=mean_low,
        mean_steps_high=mean_high,
        p_loses=p_loses,
        steps_p_loses=steps_p,
        equal_plain=all(equal) if equal else None,
        **shape,
    )


def cells(runs: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str, str], list[Pair]]:
    """The run rows as pairs by cell (model, what, method), in order of appearance; rows whose method run took
    no time (a trace turn that did not run) left out."""
    found: dict[tuple[str, str, str], list[Pair]] = {}
    for row in runs:
        if row.get("auto_s", 1.0) > 0:
            pair = Pair.of(row)
            found.setdefault(pair.cell, []).append(pair)
    return found


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment of ``p_values`` (same order): the family-wise error stays under alpha when
    each adjusted p-value is compared with alpha, however many cells a run has."""
    order = sorted(range(len(p_values)), key=p_values.__getitem__)
    adjusted, running = [0.0] * len(p_values), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def judge(rows: Sequence[CellSummary]) -> list[CellSummary]:
    """Each cell with its verdicts, on seconds and in plain steps (``verdict``, ``verdict_in_steps``). A run judges
    many cells at once: "LOSES" needs the cell's p-value under ``ALPHA`` after Holm's correction over the run's
    cells (A/A cells aside), so that a run of cells that all hold has under 2.5 % chance of showing any."""
    judged = [r for r in rows if r.method not in AA_METHODS]
    on_seconds = dict(zip(map(id, judged), holm([r.p_loses for r in judged])))
    in_steps = [r for r in judged if r.in_steps is not None]
    on_steps = dict(zip(map(id, in_steps), holm([r.steps_p_loses for r in in_steps])))
    out = []
    for r in rows:
        if r.method in AA_METHODS:
            out.append(dataclasses.replace(r, verdict="a/a", verdict_in_steps=None))
            continue
        p, steps_p = on_seconds[id(r)], on_steps.get(id(r))
        out.append(
            dataclasses.replace(
                r,
                p_loses_holm=p,
                steps_p_loses_holm=steps_p,
                verdict=verdict(r.ratio, r.low, r.high, p),
                verdict_in_steps=None
                if r.in_steps is None
                else verdict(r.in_steps, r.steps_low, r.steps_high, steps_p),
            )
        )
    return out


@dataclass(frozen=True)
class PooledRow:
    """A statistic pooled over ``n`` items (runs or pairs) with its 95 % bootstrap interval, and the lowest
    single item's ratio."""

    model: str
    what: str
    n: int
    ratio: float
    low: float
    high: float
    lowest: float


def pooled_row(model: str, what: str, items: list, statistic: Callable, ratio: Callable) -> list[PooledRow]:
    """The pooled row of ``items`` (none under 2): ``statistic`` with its 95 % bootstrap interval, and the
    lowest single ``ratio(item)``."""
    if len(items) < 2:
        return []
    low, high = bootstrap(items, statistic)
    return [PooledRow(model, what, len(items), statistic(items), low, high, min(map(ratio, items)))]


def pooled(runs: Sequence[Mapping[str, Any]]) -> list[PooledRow]:
    """Pooled over cells, with 95 % bootstrap intervals: per shape, the runs in which Auto fell back (paused
    for >= 90 % of the tokens), those in which it speculated, and the A/A runs (mean Auto / plain); for
    whole-call models, each method's seconds summed over every prompt and trace turn (plain / method,
    resampling prompts). A pooled interval is what a per-cell verdict of "inconclusive" lacks: power."""
    rows: list[PooledRow] = []
    every = [Pair.of(r) for r in runs]
    for model in dict.fromkeys(p.model for p in every):
        pairs = [p for p in every if p.model == model]
        if not pairs[0].whole_calls:  # a shape
            a_a = [p for p in pairs if p.method == "plain"]
            fell_back = [p for p in pairs if p.method == "auto" and p.paused >= 0.9 * p.tokens]
            speculated = [p for p in pairs if p.method == "auto" and p.paused < 0.9 * p.tokens]
            for what, group in (
                ("A/A (plain against plain)", a_a),
                ("Auto fell back", fell_back),
                ("Auto speculated", speculated),
            ):
                rows += pooled_row(model, what, [p.vs_plain for p in group], statistics.mean, float)
            for average, label in (("state", "plain"), ("mean", "mean")):
                for what, group in ((f"A/A, in {label} steps", a_a), (f"Auto fell back, in {label} steps", fell_back)):
                    ratios = [b / a for b, a in in_plain_steps(group, average)]
                    rows += pooled_row(model, what, ratios, statistics.mean, float)
            continue
        for method in dict.fromkeys(p.method for p in pairs):
            mine = [p for p in pairs if p.method == method and p.auto.seconds > 0]
            for what, units in (
                (f"{method}, every prompt and trace", [p.seconds for p in mine]),
                (f"{method}, in plain steps", in_plain_steps(mine)),
                (f"{method}, in mean steps", in_plain_steps(mine, "mean")),
            ):
                rows += pooled_row(model, what, units, seconds_ratio, lambda pair: pair[0] / pair[1])
    return rows


#: The pooled rows of the A/A arms, in seconds: a shape's, and a whole-call model's.
AA_POOLED = ("A/A (plain against plain)", "plain (A/A), every prompt and trace")


def aa_checks(pooled_rows: Sequence[PooledRow]) -> dict[str, AACheck]:
    """Per model, its A/A arm's check (``result_lines.AACheck``) from its pooled row in seconds (``pooled``)."""
    return {r.model: AACheck(r.ratio, r.low, r.high, r.n) for r in pooled_rows if r.what in AA_POOLED}


def cell_means(
    runs: Sequence[Mapping[str, Any]], parts: Callable[[Pair], dict[str, float] | None]
) -> dict[tuple[str, str, str], dict[str, float]]:
    """Per cell, the mean over its pairs of ``parts(pair)`` (``Pair.excess_in_steps``, ``Pair.slow_counts``),
    for the pairs that have it."""
    found: dict[tuple[str, str, str], list[dict[str, float]]] = {}
    for row in runs:
        pair = Pair.of(row)
        if (value := parts(pair)) is not None:
            found.setdefault(pair.cell, []).append(value)
    return {
        key: {part: statistics.mean(v[part] for v in values) for part in values[0]} for key, values in found.items()
    }


def merged(saved: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Runs of several calls (each call's saved results) as one run to summarize: each call's repeats numbered
    after the calls before it, so that no two calls' repeats are taken for one."""
    out: dict[str, Any] = {"runs": [], "verify_calls": [], "grid": [], "embedded": [], "affinity": {}}
    for one in saved:
        offset = 1 + max((r["repeat"] for r in out["runs"]), default=-1)
        out["runs"] += [{**r, "repeat": r["repeat"] + offset} for r in one["runs"]]
        out["verify_calls"] += one["verify_calls"]
        out["affinity"] = out["affinity"] or one.get("affinity", {})
    return out


def summarize(runs: Sequence[Mapping[str, Any]]) -> tuple[list[CellSummary], list[CellSummary]]:
    """One judged row per cell (``cell_row``, ``judge``): the cells of per-token runs (synthetic shapes) and those
    of whole-call runs (prompts and trace turns)."""
    judged = judge([cell_row(cell, pairs) for cell, pairs in cells(runs).items()])
    return [r for r in judged if r.ks is not None], [r for r in judged if r.ks is None]
