"""The speed verdicts a page states, as typed statements (``SpeedVerdict``): what its words say of one quantity, a
model's decode speedup over plain decoding with one drafter and policy on one kind of prompt at one temperature and
verify mode. ``Outputs.verdict(text, speeds)`` stores them beside the words; ``report.consistency`` flags two pages
that say "pays" and "loses" of one quantity."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import polars as pl

from specbench.report.verdicts.notebooks import (
    INCONCLUSIVE,
    LOSES,
    PAYS,
    Confirmed,
    SummaryRow,
    _finite,
    aa_row,
    cannot_pay,
    drafted_methods,
    fastest,
    fewest_per_verify,
    speed_word,
)

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
        if not _finite(temperature):
            return None
        if speedup is not None and not _finite(speedup):
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
