"""A run's speed from its step log, and where its seconds went.

A machine's speed drifts between runs by more than the few percent a comparison of two decoding methods
asks about (plain against plain on an H200: +-10-20 % per run), while the steps of one run share its
speed. ``speed_state`` reads a run's speed from its own steady plain steps; a run's seconds over that speed
count its work in plain steps, the same in a slow run and a fast one, with the verifications, drafting,
probes and restarted stretches of a speculative run still in them. ``time_split`` says where a run's
seconds went. Both take a step log's records (``gen.log.records``); ``mean_speed`` is the speed from the
mean steady step, which cancels a run's slow-step bursts too.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence

from specbench.core.log import StepRecord

#: Steady plain steps a run needs for a speed (a run that speculated throughout has not).
MIN_STEADY = 16
#: ``time_split``'s parts: milliseconds and counts of steady steps, stretch starts and speculative steps
#: (with the tokens they emitted), and the milliseconds outside the log.
SPLIT = ("steady_ms", "steady_n", "starts_ms", "starts_n", "spec_ms", "spec_tokens", "unlogged_ms")
#: A steady step this many times its run's median is a slow one (``time_split``: ``slow_n``, ``slow_near_n``).
SLOW = 1.5
#: A slow steady step this few steps after a step that was not steady counts as near a decision.
NEAR = 3


def is_steady(before: StepRecord, record: StepRecord) -> bool:
    """A steady plain step: one of a plain stretch right after another plain step, with no draft of its own.
    Not a step a speculative decision took (``k_requested`` set): the token a pause queued past its end, read
    long after it was computed, or a step whose drafter proposed nothing."""
    return (
        record.kind == "plain"
        and before.kind == "plain"
        and not record.k_requested
        and not record.draft_s
        and not record.draft_tokens
    )


def speed_state(
    records: Sequence[StepRecord], observe_s: float = 0.0, average: Callable[[list[float]], float] = statistics.median
) -> float | None:
    """A run's speed: the ``average`` (median, or ``statistics.fmean`` for ``mean_speed``) seconds of its steady
    plain steps (``is_steady``) less the seconds its drafter's ``observe`` took per call
    (``gen.stats()["observe_s"]``, so the drafter's own per-token work stays charged to the run); None under
    ``MIN_STEADY`` steady steps."""
    steady = [r.verify_s for before, r in zip(records, records[1:]) if is_steady(before, r)]
    if len(steady) < MIN_STEADY:
        return None
    calls = sum(1 for r in records if r.emitted)
    return average(steady) - (observe_s / calls if calls else 0.0)


def mean_speed(records: Sequence[StepRecord], observe_s: float = 0.0) -> float | None:
    """``speed_state`` with the mean steady step. A run's seconds over it count every steady step as one
    plain step, however its steps scatter (bursts of slow steps, two modes of step time): plain against
    plain comes out at 1 within 0.1 % where the median's estimate scattered by several percent on an H200.
    What it cannot see is a real change in the steady steps' own time (a side effect of speculating on
    the plain steps after it): ``time_split``'s ``slow_n`` and the median's estimate show that."""
    return speed_state(records, observe_s, statistics.fmean)


def time_split(records: Sequence[StepRecord], wall_s: float) -> dict[str, float]:
    """Where a run's decode seconds (``wall_s``, after its first token) went, from its log: steady plain
    steps (as ``speed_state`` counts them), the other plain steps (a stretch's first, with any unverified
    draft), speculative steps (with the tokens they emitted), and seconds outside the log. Also the steady
    steps over ``SLOW`` times their median (``slow_n``), and those of them at most ``NEAR`` steps after a step
    that was not steady (``slow_near_n``: a verification, a stretch's start, a queued step read late)."""
    split = dict.fromkeys(SPLIT, 0.0)
    steady: list[tuple[float, int]] = []  # (seconds, steps since the last step that was not steady)
    since = 0
    for before, r in zip(records, records[1:]):
        if r.kind != "plain":
            part, count = "spec", r.emitted
        elif is_steady(before, r):
            part, count = "steady", 1
        else:
            part, count = "starts", 1
        if part == "steady":
            since += 1
            steady.append((r.verify_s, since))
        else:
            since = 0
        split[f"{part}_ms"] += 1e3 * (r.draft_s + r.verify_s + r.other_s)
        split["spec_tokens" if part == "spec" else f"{part}_n"] += count
    logged = split["steady_ms"] + split["starts_ms"] + split["spec_ms"]
    split["unlogged_ms"] = 1e3 * wall_s - logged
    median = statistics.median(s for s, _ in steady) if steady else 0.0
    slow = [after for s, after in steady if s > SLOW * median]
    split["slow_n"], split["slow_near_n"] = float(len(slow)), float(sum(after <= NEAR for after in slow))
    return split


def verify_ms_by_width(records: Sequence[StepRecord]) -> str:
    """Median in-loop milliseconds of the verify steps of each width, as "width:ms ..." (widths ascending)."""
    by_width: dict[int, list[float]] = {}
    for r in records:
        if r.kind == "verify":
            by_width.setdefault(r.verify_width, []).append(r.verify_s)
    return " ".join(f"{w}:{1e3 * statistics.median(v):.1f}" for w, v in sorted(by_width.items()))
