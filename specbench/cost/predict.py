"""The one speedup predictor every benchmark and sweep sets its measurements against.

A verification of k drafts yields E(k) = 1 + sum_j prod_{i<=j} a_i tokens (a_i: the run's acceptance per
position) and costs c(k + 1, B, L) plain steps at the context length it ran at (a batch profile's at batch size
B), the engine's overheads and k d for drafting; a plain step yields a token for one step. The predicted speedup
is expected tokens over cost; the residual is measured / predicted - 1.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from specbench.core.log import StepRecord
from specbench.cost.breakeven import expected_tokens
from specbench.cost.profile import Profile, cost_at


def acceptance_per_position(records: Iterable[StepRecord]) -> list[float]:
    """a_i for i = 1..K from a run's verifications (paths): drafts accepting position i over those that
    reached it (drafted i or more tokens and accepted the first i - 1); 1 where no draft reached it."""
    reached: list[int] = []
    accepted: list[int] = []
    for r in records:
        if r.kind != "verify" or r.tree_nodes:
            continue
        k = int(r.k_drafted)
        while len(reached) < k:
            reached.append(0)
            accepted.append(0)
        for i in range(min(k, int(r.accepted) + 1)):
            reached[i] += 1
            accepted[i] += int(i < r.accepted)
    return [a / n if n else 1.0 for a, n in zip(accepted, reached)]


def predicted_speedup(
    records: Sequence[StepRecord],
    profile: Profile,
    d: float = 0.0,
    prompt_tokens: int = 0,
    mode: str = "fast",
    row_overhead: float = 0.0,
    tokens: str = "expected",
) -> float:
    """The speedup the cost model predicts for a run's step log: expected tokens (``expected_run_tokens``; with
    ``tokens="emitted"`` the emitted ones, for replays) over their cost in plain steps (c(k + 1) at each step's
    context length plus k d and ``row_overhead`` per verification, 1 per plain step). 0 without decode steps."""
    if tokens not in ("expected", "emitted"):
        raise ValueError(f"tokens must be 'expected' or 'emitted', got {tokens!r}")
    curves: dict[int, np.ndarray] = {}
    cost = 0.0
    for r in records:
        if r.kind == "prefill":
            continue
        if r.kind != "verify":
            cost += 1.0 + len(r.draft_tokens or ()) * d
            continue
        length = profile.nearest_length(prompt_tokens + int(r.position))
        if length not in curves:  # a length measured in other modes only: the profile's own curve, as BreakEven
            at = profile.at_length(length)
            curves[length] = (at if mode in at.costs else profile).curve(mode)
        cost += cost_at(curves[length], int(r.verify_width)) + int(r.k_drafted) * d + row_overhead
    if not cost:
        return 0.0
    if tokens == "emitted":
        return sum(r.emitted for r in records if r.kind != "prefill") / cost
    return expected_run_tokens(records) / cost


def expected_run_tokens(records: Sequence[StepRecord]) -> float:
    """Tokens a run's decode steps are expected to yield: E(k) at its per-position acceptance for each
    verification of k drafts (emitted tokens for token trees), emitted tokens for plain steps."""
    acceptance = acceptance_per_position(records)
    tokens = 0.0
    for r in records:
        if r.kind == "verify" and not r.tree_nodes:
            tokens += expected_tokens(acceptance, int(r.k_drafted))
        elif r.kind != "prefill":
            tokens += r.emitted
    return tokens


def predicted_batch_seconds(batch_log: Iterable[Any], profile: Any, whole: bool = False) -> float:
    """Seconds a batch profile (``specbench.cost.batch.BatchProfile``) predicts for the batched steps of a
    run: per step of width W over B rows, c(W, B) times the [B, 1] forward plus the engine's measured overhead
    at that width and batch size (``BatchProfile.overhead``; a step never below 0 s). ``whole``: the run's
    logged prefill and drafting seconds added, which the profile does not model (what a wall clock around the
    run holds)."""
    total = 0.0
    for s in batch_log:
        if s.kind == "prefill":
            total += s.draft_s + s.verify_s + s.other_s if whole else 0.0
            continue
        step = profile.c(s.width, s.batch_size) * profile.plain_step_s(s.batch_size)
        total += max(0.0, step + profile.overhead(s.width, s.batch_size)) + (s.draft_s if whole else 0.0)
    return total


def predicted_batch_speedup(spec: Any, plain: Any, profile: Any, whole: bool = False) -> float:
    """Throughput speedup of a batched speculative run over a plain batched run (``BatchGeneration``s) that
    a batch profile predicts: each request's expected tokens (``expected_run_tokens``) per predicted second,
    over the plain run's tokens per predicted second. ``whole``: over the whole runs, their first tokens and
    logged prefill and drafting seconds included (``predicted_batch_seconds``)."""

    def tokens(gen: Any) -> float:
        first = sum(r.emitted for q in gen.requests for r in q.log.records if r.kind == "prefill")
        return sum(expected_run_tokens(q.log.records) for q in gen.requests) + (first if whole else 0)

    spec_s = predicted_batch_seconds(spec.batch_log, profile, whole)
    plain_s = predicted_batch_seconds(plain.batch_log, profile, whole)
    if not (spec_s and plain_s and tokens(plain)):
        return 0.0
    return (tokens(spec) / spec_s) / (tokens(plain) / plain_s)


def residual(measured: float, predicted: float) -> float:
    """measured / predicted - 1 (NaN without a prediction)."""
    return measured / predicted - 1.0 if predicted and np.isfinite(predicted) else float("nan")


def mean_absolute_error(residuals: Iterable[float]) -> float:
    """Mean |residual| over the finite ones (NaN for none)."""
    values = [abs(r) for r in residuals if r is not None and np.isfinite(r)]
    return float(np.mean(values)) if values else float("nan")


def noise_floor(runs: Sequence[float]) -> float:
    """The |residual| a perfect predictor would still show against the median of one cell's repeated measurements
    ``runs`` (speedups of adjacent pairs), from their scatter: E|error| of a mean of n draws, sqrt(2 / pi) s /
    sqrt(n), over the median (s: the sample standard deviation; for two runs the median is their mean). NaN for
    fewer than 2 runs. Set a grid's mean
    |residual| against the mean floor: a miss near it is the machine's noise, one well beyond it the predictor's."""
    values = [float(r) for r in runs if r is not None and np.isfinite(r)]
    if len(values) < 2:
        return float("nan")
    return float(np.sqrt(2 / np.pi) * np.std(values, ddof=1) / np.sqrt(len(values)) / np.median(values))
