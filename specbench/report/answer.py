"""The report's answer: does speculation pay for this model on this machine, per drafter and prompt kind, and why.

``answer_cells`` computes every number the index opens with (a ``Cell`` per drafter x prompt kind x policy) from the
stored records: the sweep's timed pairs (``SWEEP_RUNS``) and the report's cost model (``cost_model.json``).
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from specbench.bench.paired import MIN_UNITS
from specbench.bench.sweep_summary import summarize_sweep
from specbench.cost.breakeven import break_even_acceptance, break_even_band
from specbench.cost.profile import Profile
from specbench.report import cost_models
from specbench.report.outputs import read_json, read_table
from specbench.report.verdicts import (
    INCONCLUSIVE,
    LOSES,
    PAYS,
    SpeedVerdict,
    SummaryRow,
    settings,
    speed_word,
)

#: Where the sweep keeps its runs in a report folder.
SWEEP_RUNS = Path("draft_length_sweep") / "tables" / "runs.parquet"
#: The name its statements go by (``answer_speeds``): the index's opening, not a notebook's page.
PAGE = "answer"
#: The answer's figure in a report folder.
MAP = Path("answer") / "break_even_map.png"
#: The verdict of a cell whose runs never drafted: its policy decoded plainly, so its ratio measures no drafting.
NEVER_DRAFTED = "never drafted"


@dataclass(frozen=True)
class Cell:
    """One drafter x prompt kind x policy of the answer."""

    drafter: str
    kind: str
    policy: str
    speedup: float
    low: float | None
    high: float | None
    pairs: int
    prompts: int
    tokens_per_verify: float | None
    acceptance: float | None
    k: int | None
    break_even: float | None
    band: tuple[float, float] | None
    verdict: str
    #: True where the cost model says no acceptance pays at this k (then ``break_even`` is None).
    never_pays: bool = False
    #: The most frequent reason its runs gave for plain steps and short drafts (``specbench.core.reasons``).
    reason: str = ""
    #: The interval's level (``bench.paired.sequential_level`` of the sweep's looks).
    level: float = 0.95

    @property
    def speed(self) -> str:
        """The speedup with its interval where it has one: "1.5x [1.38-1.6]"."""
        interval = f" [{_n(self.low)}-{_n(self.high)}]" if self.low is not None and self.high is not None else ""
        return f"{_n(self.speedup)}x{interval}"

    @property
    def why(self) -> str:
        """One sentence: the realized acceptance against what the cost model says the draft length needs, and the
        main reason its runs gave for plain steps or shorter drafts."""
        text = self._acceptance_against_break_even()
        return f"{text}; mostly {self.reason}" if self.reason else text

    def _acceptance_against_break_even(self) -> str:
        if self.verdict == NEVER_DRAFTED:
            return (
                f"no draft was made: the policy decoded plainly, so its {self.speed} against plain decoding is the "
                "policy's own overhead"
            )
        if self.acceptance is None or self.k is None:
            return "no draft was verified: the policy decoded plainly"
        if self.never_pays:
            return f"acceptance {_n(self.acceptance)} at k = {self.k}, where the cost model says no acceptance pays"
        if self.break_even is None:
            return f"acceptance {_n(self.acceptance)} at k = {self.k} (no cost model to compare it with)"
        side = "over" if self.acceptance >= self.break_even else "under"
        band = f" [{_n(self.band[0])}-{_n(self.band[1])}]" if self.band else ""
        return (
            f"acceptance {_n(self.acceptance)} {side} the break-even {_n(self.break_even)}{band} "
            f"at its mean draft of k = {self.k}"
        )


def _n(x: float) -> str:
    """A number to 3 significant digits."""
    return f"{x:.3g}"


def verdict_of(low: float | None, high: float | None, pairs: int) -> str:
    """The verdict a speedup's interval allows (none without an interval)."""
    if low is None or high is None:
        return f"no interval ({pairs} pairs; {MIN_UNITS} needed)"
    word = speed_word(low, high)
    return "no difference resolvable" if word == INCONCLUSIVE else word


def answer_cells(
    runs: pl.DataFrame, profile: Profile | None, drafter_costs: dict[str, float] | None = None
) -> list[Cell]:
    """The answer's cells from a sweep's runs (``run_sweep(pairs=N)``'s) and the cost model the pages planned with
    (None: no break-even). An interval that misses its own estimate (a bootstrap of few units can) is widened to it."""
    drafted = runs.filter(pl.col("drafter") != "none")
    if drafted.is_empty():
        return []
    summary = summarize_sweep(drafted, ["drafter", "category", "policy"])
    modes = drafted["verify_mode"].unique().to_list() if "verify_mode" in drafted.columns else []
    mode = modes[0] if len(modes) == 1 else "exact"
    cells = []
    for row in SummaryRow.rows(summary):
        low, high = row.speedup_low, row.speedup_high
        speedup = math.nan if row.speedup is None else float(row.speedup)
        if low is not None and high is not None and math.isfinite(speedup):
            low, high = min(low, speedup), max(high, speedup)
        k = round((row.drafted or 0) / row.verifies) if row.verifies else None
        acceptance = (row.accepted or 0) / row.drafted if row.drafted else None
        a_star, band, never = None, None, False
        if profile is not None and k and mode in profile.costs:
            d = (drafter_costs or {}).get(str(row.drafter), 0.0)
            value = float(break_even_acceptance(profile, d, k, mode)[k - 1])
            a_star, never = (None, True) if math.isnan(value) else (value, False)
            bounds = break_even_band(profile, d, k, mode)
            if bounds is not None and a_star is not None:
                ends = [float(b[k - 1]) for b in bounds]
                band = None if any(math.isnan(e) for e in ends) else (min(ends), max(ends))
        mine = drafted.filter(drafter=row.drafter, category=row.category, policy=row.policy)
        reasons = [r for r in (mine["main_reason"] if "main_reason" in mine.columns else []) if r]
        cells.append(
            Cell(
                drafter=str(row.drafter),
                kind=str(row.category),
                policy=str(row.policy),
                speedup=speedup,
                low=low,
                high=high,
                pairs=int(row.pairs or 0),
                prompts=int(row.prompts or 0),
                tokens_per_verify=row.tokens_per_verify,
                acceptance=acceptance,
                k=k,
                break_even=a_star,
                band=band,
                verdict=verdict_of(low, high, int(row.pairs or 0)) if row.drafted else NEVER_DRAFTED,
                never_pays=never,
                reason=min(set(reasons), key=lambda r: (-reasons.count(r), r)) if reasons else "",
                level=float(row.level or 0.95),
            )
        )
    return cells


def sweep_model(out: str | Path) -> str | None:
    """The model the sweep in report folder ``out`` ran (its status's parameters; None before it ran)."""
    status = read_json(Path(out) / "draft_length_sweep" / "status.json") or {}
    parameters = status.get("parameters")
    model = parameters.get("model") if isinstance(parameters, dict) else None
    return model if isinstance(model, str) else None


def answer_speeds(out: str | Path) -> list[SpeedVerdict]:
    """What the answer's table says of speed, cell by cell ("no difference resolvable", "no interval": inconclusive)."""
    runs, model = read_table(Path(out) / SWEEP_RUNS), sweep_model(out)
    if runs is None or model is None:
        return []
    temperature, verify = settings(runs)
    cells = answer_cells(runs, None)
    words = [c.verdict if c.verdict in (PAYS, LOSES) else INCONCLUSIVE for c in cells]
    return [
        SpeedVerdict(model, c.drafter, c.policy, c.kind, temperature, verify, w, c.speedup)
        for c, w in zip(cells, words)
    ]


def read_answer(
    out: str | Path, model: str | None, recorded: dict[str, tuple[Profile, str]] | None = None
) -> tuple[list[Cell], str]:
    """The answer's cells from a report folder's stored records (the sweep's runs of ``model``) and the line naming
    ``model``'s cost model ("" without one); ``recorded``: the folder's cost models, when already read."""
    out = Path(out)
    runs = read_table(out / SWEEP_RUNS)
    if runs is None:
        return [], ""
    recorded = cost_models.recorded(out) if recorded is None else recorded
    profile, line = recorded.get(model, (None, "")) if model else (None, "")
    return answer_cells(runs, profile), line


def write_map(out: str | Path, model: str | None) -> Path | None:
    """Draw the answer's break-even map (``figures.break_even_map``) into ``out/answer/``: every recorded cost
    model's a*(k) with its band, and the sweep's cells at their realized acceptance (None before the sweep ran)."""
    from specbench.report import figures

    out = Path(out)
    recorded = cost_models.recorded(out)
    cells, _ = read_answer(out, model, recorded)
    profiles = [profile for profile, _ in recorded.values()]
    mode = "exact" if any("exact" in p.costs for p in profiles) else "fast"
    with_mode = [p for p in profiles if mode in p.costs]
    if not cells or not with_mode:
        return None
    max_k = max([8, *(c.k for c in cells if c.k)])
    return figures.save_figure(figures.break_even_map(with_mode, cells, mode, max_k=max_k), out / MAP)


def answer_html(out: str | Path, model: str | None) -> str:
    """The index's opening: the answer table for ``model`` and the line naming the cost model it used ("" before
    the sweep ran)."""
    cells, named = read_answer(out, model)
    if not cells:
        return ""
    esc = html.escape
    rows = []
    for c in cells:
        # a cell that never drafted measured no drafting: its ratio (the policy's overhead) is in its why
        speed = "no drafts" if c.verdict == NEVER_DRAFTED else c.speed
        per_verify = "" if c.tokens_per_verify is None else _n(c.tokens_per_verify)
        rows.append(
            f"<tr><td>{esc(c.drafter)}</td><td>{esc(c.kind)}</td><td>{esc(c.policy)}</td>"
            f"<td>{speed}</td><td class='{esc(c.verdict.split()[0])}'>{esc(c.verdict)}</td>"
            f"<td>{c.pairs} pairs, {c.prompts} prompts, {_n(100 * c.level)} % interval</td><td>{per_verify}</td>"
            f"<td>{esc(c.why)}</td></tr>"
        )
    line = f"<p class='cost'>{esc(named or 'no cost model recorded')}</p>"
    if (Path(out) / MAP).is_file():
        line += f"<p><a href='{MAP}'><img class='map' src='{MAP}' alt='break-even map'></a></p>"
    return (
        "<h2>Does speculation pay here?</h2>"
        "<table class='answer'><tr><th>drafter</th><th>prompt kind</th><th>policy</th><th>speedup [interval]</th>"
        "<th>verdict</th><th>sample</th><th>tokens per verification (accepted + 1)</th><th>why</th></tr>"
        f"{''.join(rows)}</table>{line}"
    )
