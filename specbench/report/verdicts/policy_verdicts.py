"""The policies notebook's verdict: the ranking by predicted speedup (a prediction, never a verdict on its own)
and each confirmed policy's measured speedup, "pays"/"loses" only where its interval excludes 1."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import polars as pl

from specbench.report.verdicts.notebooks import speed, where
from specbench.simulate.policies import best_predicted


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
