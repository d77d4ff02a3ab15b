"""Two prompt benchmarks side by side: did acceptance change, and where (``compare``)?

A researcher changes one thing (a quantization, a model version, an MLX upgrade) and runs the same prompts again
(``run_models``). Each measure is A - B with its 95 % interval, resampling whole questions of both runs together
(``specbench.bench.paired.sums_interval``), and a verdict that reads the same either way round. c(w)'s interval
joins the two profiles' own: [low A - high B, high A - low B].
"""

from __future__ import annotations

import gc
import os
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from specbench.bench.paired import MIN_UNITS, sums_interval
from specbench.bench.prompt_bench import PromptBench, bench_prompts
from specbench.bench.prompt_runs import PROMPT_BASELINE, PromptRun
from specbench.bench.prompt_summary import question_timing
from specbench.bench.turn_cache import first_divergence
from specbench.common.files import safe_name, write_json_atomic, write_parquet_atomic, write_text_atomic
from specbench.cost.profile import Profile, load_profile

#: What ``Comparison.save`` writes in its folder.
COMPARE_TABLE_FILE = "compare.md"
COMPARE_ROWS_FILE = "compare.parquet"
COMPARE_INFO_FILE = "compare.json"
#: The verdicts: symmetric in A and B.
A_HIGHER, B_HIGHER, UNRESOLVED = "A higher", "B higher", "no difference resolvable"


def verdict(low: float | None, high: float | None, units: int) -> str:
    """The verdict on a difference A - B with its interval [low, high]: "A higher" (the interval lies above 0),
    "B higher" (below 0), "no difference resolvable" (it covers 0), or, without an interval, why there is none."""
    if (low is None or high is None) and units < MIN_UNITS:
        return f"no interval ({units} prompts; {MIN_UNITS} needed)"
    if low is None or high is None:
        return "no interval (some resamples hold no verification that reached it)"
    return A_HIGHER if low > 0 else B_HIGHER if high < 0 else UNRESOLVED


@dataclass(frozen=True)
class Difference:
    """One measure under A and under B, the difference A - B with its 95 % interval (``low``, ``high``; None
    where there is none), how many units it rests on and how they were resampled (``interval``)."""

    section: str  # "overall", "position", "kind", "cost"
    measure: str
    a: float
    b: float
    low: float | None
    high: float | None
    units: int
    interval: str = "over prompts"

    @property
    def difference(self) -> float:
        return self.a - self.b

    @property
    def verdict(self) -> str:
        if self.section == "cost" and self.low is None:
            return "no interval (a profile stored without its timing rounds)"
        return verdict(self.low, self.high, self.units)

    def row(self) -> dict[str, Any]:
        return {**asdict(self), "difference": self.difference, "verdict": self.verdict}


@dataclass(frozen=True)
class PromptDivergence:
    """Where one prompt's plain greedy output under A first differs from B's (``at``: the token index; None when
    they are identical), with both outputs."""

    question_id: str
    category: str
    at: int | None
    a_tokens: list[int]
    b_tokens: list[int]


@dataclass
class Comparison:
    """Two runs of one method on the same prompts, side by side (``compare``)."""

    a: str
    b: str
    method: str
    prompts: int
    differences: list[Difference]
    divergences: list[PromptDivergence]
    notes: list[str] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)

    def section(self, name: str) -> list[Difference]:
        return [d for d in self.differences if d.section == name]

    def get(self, measure: str) -> Difference | None:
        """The difference of ``measure`` (e.g. "acceptance", "acceptance at 2"), None where it was not compared."""
        return next((d for d in self.differences if d.measure == measure), None)

    def to_polars(self):
        import polars as pl

        return pl.DataFrame([d.row() for d in self.differences], infer_schema_length=None)

    def divergence_line(self) -> str:
        """Where the outputs first differ, over the prompts' first turns."""
        if not self.divergences:
            return "outputs: no first turn in common"
        apart = sorted(d.at for d in self.divergences if d.at is not None)
        same = len(self.divergences) - len(apart)
        if not apart:
            return f"outputs: identical on all {same} prompts (plain greedy, first turns)"
        first = min(self.divergences, key=lambda d: d.at if d.at is not None else 1 << 30)
        return (
            f"outputs: {len(apart)} of {len(self.divergences)} prompts differ (plain greedy, first turns), first at "
            f"token {apart[0]} ({first.category} {first.question_id}), median {statistics.median(apart):g}; "
            f"{same} identical"
        )

    def divergence_table(self, tokenizer: Any = None, tokens: int = 12):
        """One row per prompt (first turn): where A's plain greedy output first differs from B's (null: identical)
        and each output's next ``tokens`` tokens from there, as text when a ``tokenizer`` is given."""
        import polars as pl

        def text(ids: list[int]) -> str:
            return tokenizer.decode(ids) if tokenizer is not None else " ".join(map(str, ids))

        rows = []
        for d in self.divergences:
            at = d.at if d.at is not None else len(d.a_tokens)
            rows.append(
                {
                    "question": d.question_id,
                    "kind": d.category,
                    "first_difference": d.at,
                    "common": text(d.a_tokens[:at])[-60:],
                    "A_then": text(d.a_tokens[at : at + tokens]),
                    "B_then": text(d.b_tokens[at : at + tokens]),
                }
            )
        return pl.DataFrame(rows, schema_overrides={"first_difference": pl.Int64})

    def verdict(self) -> str:
        """The comparison in words: which measures differ beyond their intervals, or that none does."""
        resolved = [d for d in self.differences if d.verdict in (A_HIGHER, B_HIGHER)]

        def higher(d: Difference) -> str:  # the higher side, by how much, and the interval of that difference
            assert d.low is not None and d.high is not None  # a resolved difference has its interval
            low, high = (d.low, d.high) if d.verdict == A_HIGHER else (-d.high, -d.low)
            who = self.a if d.verdict == A_HIGHER else self.b
            return (
                f"{d.measure} {d.a:.3g} vs {d.b:.3g}: {who} higher by {abs(d.difference):.3g} [{low:.3g}, {high:.3g}]"
            )

        said = "; ".join(higher(d) for d in resolved[:4])
        if len(resolved) > 4:
            said += f"; and {len(resolved) - 4} more measures (the table has them)"
        with_interval = sum(d.low is not None for d in self.differences)
        if not resolved and with_interval:
            said = f"no difference resolvable in any of the {with_interval} measures with an interval"
        elif not resolved:
            said = f"no measure has an interval (an interval needs {MIN_UNITS} prompts that drafted)"
        return f"{self.a} against {self.b} ({self.method}, {self.prompts} prompts): {said}. {self.divergence_line()}."

    def table(self) -> str:
        """The differences as a text table: each measure under A and B, A - B with its interval, the units it
        rests on and the verdict; then where the outputs diverge and the notes."""
        header = ("measure", f"A: {self.a}", f"B: {self.b}", "A - B [95 % interval]", "n", "verdict")
        lines = [header]
        for d in self.differences:
            interval = f"[{d.low:+.3f}, {d.high:+.3f}]" if d.low is not None else "(none)"
            unit = "rounds" if d.section == "cost" else "prompts"
            lines.append((d.measure, f"{d.a:.3f}", f"{d.b:.3f}", f"{d.difference:+.3f} {interval}", f"{d.units} {unit}",
                          d.verdict))  # fmt: skip
        widths = [max(len(row[i]) for row in lines) for i in range(len(header))]
        text = [f"{self.method}: A = {self.a}, B = {self.b}, {self.prompts} prompts (intervals resample them whole)"]
        for n, row in enumerate(lines):
            text.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
            if n == 0:
                text.append("  ".join("-" * w for w in widths))
        text.append(self.divergence_line())
        text += [f"note: {note}" for note in self.notes]
        return "\n".join(text)

    def save(self, out: str | os.PathLike) -> dict[str, Path]:
        """Write the differences (parquet), the table (text) and the settings with the divergences (JSON)."""
        out = Path(out)
        divergences = [asdict(d) for d in self.divergences]
        info = {"a": self.a, "b": self.b, "method": self.method, "prompts": self.prompts, "notes": self.notes}
        return {
            "rows": write_parquet_atomic(self.to_polars(), out / COMPARE_ROWS_FILE),
            "table": write_text_atomic(out / COMPARE_TABLE_FILE, self.table() + "\n"),
            "info": write_json_atomic(out / COMPARE_INFO_FILE, {**info, **self.info, "divergences": divergences}),
        }


# -- checks ------------------------------------------------------------------------------------------------------


def _first_turn_rows(run: PromptBench) -> dict[str, PromptRun]:
    """The baseline's first run of each question's first turn, by question key."""
    return {r.question_key: r for r in run.runs if r.method == PROMPT_BASELINE and r.turn == 0 and r.repeat == 0}


def check_comparable(a: PromptBench, b: PromptBench, a_name: str = "A", b_name: str = "B") -> None:
    """One ValueError naming the mismatch when two runs cannot be set side by side: different prompts, a different
    tokenizer or vocabulary, or a different number of tokens generated per prompt."""
    keys_a = {r.question_key: r for r in a.runs}
    keys_b = {r.question_key: r for r in b.runs}
    only_a = [str(keys_a[k].question_id) for k in keys_a if k not in keys_b]
    only_b = [str(keys_b[k].question_id) for k in keys_b if k not in keys_a]
    if only_a or only_b:
        raise ValueError(
            f"{a_name} and {b_name} ran different prompts ({len(only_a)} questions only in {a_name}"
            f"{' (' + ', '.join(only_a[:3]) + ')' if only_a else ''}, {len(only_b)} only in {b_name}"
            f"{' (' + ', '.join(only_b[:3]) + ')' if only_b else ''}): compare runs of the same prompt set "
            "(the same prompts, --categories and --limit)"
        )
    for what, words in (("tokenizer", "tokenizer vocabularies"), ("vocab", "output vocabularies (token ids)")):
        x, y = a.info.get(what), b.info.get(what)
        if x and y and x != y:
            raise ValueError(
                f"{a_name} and {b_name} have different {words} ({x} and {y}): their token ids, acceptance and "
                "outputs cannot be set side by side; compare models that share a tokenizer"
            )
    first_a, first_b = _first_turn_rows(a), _first_turn_rows(b)
    for key, row in first_a.items():
        other = first_b.get(key)
        if other is not None and other.prompt_tokens != row.prompt_tokens:
            raise ValueError(
                f"{a_name} and {b_name} tokenize the same prompt differently (question {row.question_id}: "
                f"{row.prompt_tokens} and {other.prompt_tokens} tokens): different tokenizers cannot be "
                "compared token by token; compare models that share a tokenizer"
            )
    if a.info.get("max_tokens") != b.info.get("max_tokens"):
        raise ValueError(
            f"{a_name} generated up to {a.info.get('max_tokens')} tokens per prompt and {b_name} "
            f"{b.info.get('max_tokens')}: acceptance depends on it; run both with the same --max-tokens"
        )


def pick_method(a: PromptBench, b: PromptBench, method: str | None, a_name: str = "A", b_name: str = "B") -> str:
    """``method`` when both runs ran it, else (None) the first speculative method both ran; one ValueError naming
    each run's methods otherwise."""
    in_a, in_b = ([m.name for m in run.methods if m.engine == "specbench" and m.drafter != "none"] for run in (a, b))
    shared = [m for m in in_a if m in in_b]
    if method is not None and method in shared:
        return method
    if method is None and shared:
        return shared[0]
    wanted = f"method {method!r}" if method else "a speculative method"
    raise ValueError(
        f"{a_name} and {b_name} share no {wanted}: {a_name} ran {', '.join(in_a) or 'none'}, {b_name} ran "
        f"{', '.join(in_b) or 'none'}"
    )


# -- per question ------------------------------------------------------------------------------------------------


def _unit_sums(run: PromptBench, method: str, keys: Sequence[str], names: Sequence[str]) -> np.ndarray:
    """Per question (a row per key of ``keys``; all its turns), the sums (columns ``names``) each measure is a ratio
    of: for ``method``'s first repeat, each draft position's (accepted, reached), the accepted and drafted tokens and
    the verifications; for timing, the baseline's and the method's (tokens, seconds), each turn's seconds the median
    over repeats."""
    sums = np.zeros((len(keys), len(names)))
    row, column = {k: i for i, k in enumerate(keys)}, {n: j for j, n in enumerate(names)}

    def add(key: str, name: str, value: float) -> None:
        sums[row[key], column[name]] += value

    for side, name in (("base", PROMPT_BASELINE), ("mine", method)):
        for key, (tokens, seconds) in question_timing(r for r in run.runs if r.method == name).items():
            add(key, f"{side}_tokens", tokens)
            add(key, f"{side}_s", seconds)
    verifies = [(r.question_key, s) for r in run.runs if r.method == method and r.repeat == 0 for s in r.step_records()]
    for key, step in verifies:
        if step.kind == "verify":
            add(key, "verifies", 1)
            add(key, "accepted", step.accepted)
            add(key, "drafted", step.k_drafted)
            for i in range(min(step.k_drafted, step.accepted + 1)):  # the positions this verification reached
                add(key, f"reached{i}", 1)
                add(key, f"hit{i}", step.accepted > i)
    return sums


Statistic = Callable[[Callable[[str], np.ndarray]], np.ndarray]


def _cost_differences(a: PromptBench, b: PromptBench, mode: str, widths: int) -> tuple[list[Difference], list[str]]:
    """c(w) of A and B at each width 2..``widths`` both models' stored profiles hold in verify ``mode``, with the
    interval joined from both profiles' intervals, and notes on them; or a note saying whose profile is missing."""
    profiles: list[Profile | None] = []
    for run in (a, b):
        key = run.info.get("model_key")
        profiles.append(load_profile(key, device=run.info.get("device")) if key else None)
    missing = [run.info.get("model", "?") for run, p in zip((a, b), profiles) if p is None or mode not in p.costs]
    if missing:
        return [], [
            f"c(w): no stored {mode} cost profile of {' and '.join(missing)} for this device, library versions and "
            f"BLAS (`specbench profile MODEL --verify {mode}` stores one)"
        ]
    pa, pb = profiles
    assert pa is not None and pb is not None
    level = 1.0 - (1.0 - pa.interval_level) - (1.0 - pb.interval_level)
    rounds = min(len(pa.rounds.get("plain", [])), len(pb.rounds.get("plain", [])))
    out = []
    for w in range(2, widths + 1):
        ia, ib = pa.interval(w, mode), pb.interval(w, mode)
        if w not in pa.widths[mode] or w not in pb.widths[mode]:
            continue
        low = ia[0] - ib[1] if ia and ib else None
        high = ia[1] - ib[0] if ia and ib else None
        ca, cb = pa.c(w, mode, overhead=False), pb.c(w, mode, overhead=False)
        joined = f"both profiles' intervals (at least {level:.0%})"
        out.append(Difference("cost", f"c({w}) {mode}", ca, cb, low, high, rounds, joined))
    notes = [
        f"c(w): {run.info.get('model', '?')}'s profile is marked noisy: measure it again at a quieter time"
        for run, p in zip((a, b), (pa, pb))
        if p.noise.get(mode)
    ]
    if out:
        notes.append(
            "c(w) intervals join both profiles' intervals over their timing rounds: they cover the difference at "
            f"least {level:.0%} of the time, not 95 %"
        )
    return out, notes


def compare(
    a: PromptBench,
    b: PromptBench,
    method: str | None = None,
    a_name: str | None = None,
    b_name: str | None = None,
) -> Comparison:
    """Set runs ``a`` and ``b`` of the same prompts side by side for ``method`` (default: the first speculative
    method both ran): acceptance per position and per prompt kind, tokens per verification, speedup over mlx-lm and
    c(w), each as A - B with its interval and verdict, and where the plain greedy outputs first differ.
    Mismatched runs raise one ValueError naming the mismatch (``check_comparable``)."""
    a_name = a_name or str(a.info.get("model", "A"))
    b_name = b_name or str(b.info.get("model", "B"))
    check_comparable(a, b, a_name, b_name)
    method = pick_method(a, b, method, a_name, b_name)
    drafts = [s.k_drafted for run in (a, b) for r in run.runs if r.method == method for s in r.step_records()]
    positions = max(drafts, default=0)
    names = ["base_tokens", "base_s", "mine_tokens", "mine_s", "verifies", "accepted", "drafted"]
    names += [f"{what}{i}" for i in range(positions) for what in ("reached", "hit")]
    keys = list(dict.fromkeys(r.question_key for r in a.runs))
    ua, ub = _unit_sums(a, method, keys, names), _unit_sums(b, method, keys, names)
    everything = np.arange(len(keys))

    def difference(section: str, measure: str, rows: np.ndarray, statistic: Statistic, over: str) -> Difference:
        """A measure that is a ratio of column sums (``over``'s sum below), under A and B over the questions
        ``rows`` selects that have a denominator under A or B (a prompt that drafted nothing holds no acceptance),
        with the interval of A - B resampling those questions of both runs together."""
        j = names.index(over)
        rows = rows[(ua[rows, j] > 0) | (ub[rows, j] > 0)]
        units, width = np.hstack([ua[rows], ub[rows]]), len(names)

        def of(sums: np.ndarray, offset: int) -> np.ndarray:
            with np.errstate(divide="ignore", invalid="ignore"):
                return statistic(lambda name: sums[:, offset + names.index(name)])

        totals = units.sum(axis=0, keepdims=True)
        interval = sums_interval(units, lambda sums: of(sums, 0) - of(sums, width))
        # no interval where a resample has nothing to divide by (no verification drafted this position)
        low, high = interval if interval is not None and all(np.isfinite(interval)) else (None, None)
        return Difference(section, measure, float(of(totals, 0)[0]), float(of(totals, width)[0]), low, high, len(rows))

    def rate(hits: str, tries: str) -> tuple[Statistic, str]:
        return (lambda col: col(hits) / col(tries)), tries

    notes: list[str] = []
    diffs = [
        difference("overall", "acceptance", everything, *rate("accepted", "drafted")),
        difference(
            "overall",
            "tokens per verification",
            everything,
            lambda col: (col("accepted") + col("verifies")) / col("verifies"),
            "verifies",
        ),
        difference(
            "overall",
            "speedup over mlx-lm",
            everything,
            lambda col: (col("mine_tokens") / col("mine_s")) / (col("base_tokens") / col("base_s")),
            "mine_s",
        ),
    ]
    for i in range(positions):
        reached = [side[:, names.index(f"reached{i}")].sum() for side in (ua, ub)]
        if not all(reached):
            who = a_name if reached[0] else b_name
            notes.append(f"draft position {i + 1} was reached only under {who}: no acceptance to compare there")
            continue
        diffs.append(difference("position", f"acceptance at {i + 1}", everything, *rate(f"hit{i}", f"reached{i}")))
    kinds = {r.question_key: r.category for r in a.runs}
    for kind in dict.fromkeys(kinds.values()):
        rows = np.array([i for i, k in enumerate(keys) if kinds[k] == kind])
        diffs.append(difference("kind", f"acceptance, {kind}", rows, *rate("accepted", "drafted")))
    empty = [d.measure for d in diffs if d.units == 0]
    if empty:
        notes.append(f"{', '.join(empty)}: no prompt drafted anything under A or B, so there is nothing to compare")
        diffs = [d for d in diffs if d.units > 0]
    mode = next((r.verify for r in a.runs if r.method == method and r.verify not in (None, "none")), "exact")
    costs, cost_notes = _cost_differences(a, b, mode, positions + 1)
    diffs += costs
    notes += cost_notes
    first_a, first_b = _first_turn_rows(a), _first_turn_rows(b)
    divergences = [
        PromptDivergence(str(r.question_id), r.category, first_divergence(r.tokens, o.tokens), r.tokens, o.tokens)
        for k, r in first_a.items()
        if (o := first_b.get(k)) is not None
    ]
    if len(everything) < MIN_UNITS:
        notes.append(f"{len(everything)} prompts: an interval needs {MIN_UNITS} (run more prompts)")
    info = {
        "a_model": a.info.get("model"),
        "b_model": b.info.get("model"),
        "device": a.info.get("device"),
        "max_tokens": a.info.get("max_tokens"),
    }
    return Comparison(a_name, b_name, method, len(everything), diffs, divergences, notes, info)


# -- runs --------------------------------------------------------------------------------------------------------


def check_same_tokenizer(models: Sequence[str]) -> None:
    """Before any model runs: one ValueError naming two of ``models`` (local folders or embedded names) whose
    tokenizers or vocabularies differ. Models whose folder is not at hand (hub ids, synthetic shapes) are checked
    after their runs, from what the runs record."""
    from mlx_lm.utils import load_config, load_tokenizer

    from specbench.common.identity import tokenizer_key
    from specbench.models.load import local_folder

    seen: list[tuple[str, str, Any]] = []
    for name in models:
        if ":" in str(name):
            continue  # synthetic:SHAPE, tiny:NAME
        folder = local_folder(name)
        if folder is None:
            continue
        key, vocab = tokenizer_key(load_tokenizer(folder)), load_config(folder).get("vocab_size")
        for other, other_key, other_vocab in seen:
            if key != other_key or (vocab and other_vocab and vocab != other_vocab):
                raise ValueError(
                    f"{other} and {name} have different tokenizers or vocabularies ({other_key}, {other_vocab} ids "
                    f"and {key}, {vocab} ids): their acceptance and outputs cannot be set side by side; compare "
                    "models that share a tokenizer"
                )
        seen.append((str(name), key, vocab))


def run_models(
    models: Sequence[str],
    questions: Sequence[Any],
    drafter: str = "lookup",
    policy: str = "fixed:3",
    max_tokens: int = 32,
    repeats: int = 1,
    verify: str | None = None,
    out: str | os.PathLike | None = None,
    progress: Callable[[str], None] | None = print,
) -> list[PromptBench]:
    """Run the prompt benchmark of ``models`` one after the other on the same ``questions`` with the same
    ``drafter`` and ``policy`` (each against mlx-lm and specbench plain, ``bench_prompts``), each recorded in
    ``out/<n>-<model>`` when ``out`` is given (a finished one is read back, not run again). Tokenizers are checked
    first (``check_same_tokenizer``)."""
    from specbench.core.policies import DraftPolicy
    from specbench.models.load import load

    parsed = DraftPolicy.parse(policy)
    check_same_tokenizer(models)
    results = []
    for index, name in enumerate(models):
        # a model named twice (A against A: what the machine's noise alone gives) is run twice
        folder = Path(out) / f"{index + 1}-{safe_name(name)}" if out is not None else None
        if progress:
            progress(f"{name}: {len(questions)} questions, {drafter}/{parsed.name}, {max_tokens} tokens each")
        model, tokenizer = load(name)
        results.append(
            bench_prompts(
                model,
                tokenizer,
                questions,
                drafters=[drafter],
                policies=[parsed],
                max_tokens=max_tokens,
                repeats=repeats,
                verify=(verify,),
                model_name=name,
                out=folder,
                progress=progress,
            )
        )
        del model
        gc.collect()
    return results
