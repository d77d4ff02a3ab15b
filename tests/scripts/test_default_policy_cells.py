"""Paired A/B statistics (the default-policy benchmark's): the estimate in plain steps (each run over its
``speed_state``), what it cancels, what it charges; the verdicts; pooling and merging calls."""

from __future__ import annotations

import math

import pytest
from conftest import auto_run_log, log_seconds, plain_run_log

from scripts.gpu import default_policy_cells as cells
from scripts.gpu.run_speed import MIN_STEADY, speed_state, time_split


def test_plain_steps_cancel_the_machines_speed_and_keep_autos_costs():
    """A run 30 % slower as a whole changes seconds, not plain steps; Auto's verifications stay charged."""
    fast_plain, slow_auto = plain_run_log(0.01), auto_run_log(0.013)
    row = {
        "plain_s": log_seconds(fast_plain),
        "auto_s": log_seconds(slow_auto),
        "plain_state_ms": 1e3 * speed_state(fast_plain),
        "auto_state_ms": 1e3 * speed_state(slow_auto),
    }
    ((plain_steps, auto_steps),) = cells.in_plain_steps([cells.Pair.of(r) for r in [row]])
    assert log_seconds(fast_plain) / log_seconds(slow_auto) < 0.8  # in seconds Auto looks 20 %+ slower
    same_speed = log_seconds(plain_run_log(0.01)) / log_seconds(auto_run_log(0.01))
    assert plain_steps / auto_steps == pytest.approx(same_speed)  # in plain steps: as at equal speed
    assert plain_steps / auto_steps < 1.0  # the two verifications and the drafts still cost


def test_an_auto_run_that_speculated_throughout_counts_its_seconds_ratio():
    """Without a speed of its own, Auto's run takes its pair's plain speed (its seconds ratio counts: those
    are the runs where speculation paid, and dropping them would bias the estimate down), and the other way
    round; a pair in which neither run has a speed (an output too short for one) is left out."""
    rows = [
        {"plain_s": 1.0, "auto_s": 0.8, "plain_state_ms": 10.0, "auto_state_ms": None},
        {"plain_s": 1.1, "auto_s": 1.0, "plain_state_ms": None, "auto_state_ms": 10.0},
        {"plain_s": 0.1, "auto_s": 0.1, "plain_state_ms": float("nan"), "auto_state_ms": float("nan")},
        {"plain_s": 1.2, "auto_s": 1.0, "plain_state_ms": 12.0, "auto_state_ms": 10.0},
    ]
    (first, second, third) = cells.in_plain_steps([cells.Pair.of(r) for r in rows])
    assert first == pytest.approx((100.0, 80.0)) and second == pytest.approx((110.0, 100.0))
    assert third == pytest.approx((100.0, 100.0))  # each run over its own speed
    assert cells.at_one_speed([cells.Pair.of(r) for r in rows]) == 2


def test_verdicts_against_097():
    assert cells.verdict(1.02, 0.98, 1.06) == "holds"
    assert cells.verdict(0.99, 0.95, 1.03) == "ok"
    assert cells.verdict(0.95, 0.91, 0.99) == "inconclusive"
    assert cells.verdict(0.90, 0.86, 0.94) == "LOSES"


def test_a_loss_must_survive_the_correction_for_the_runs_other_cells():
    # an interval wholly below 0.97 loses on its own, and when its corrected p-value is still small
    assert cells.verdict(0.90, 0.86, 0.94, p_adjusted=0.01) == "LOSES"
    assert cells.verdict(0.90, 0.86, 0.94, p_adjusted=0.10) == "inconclusive"


def test_one_run_of_many_noisy_cells_that_all_hold_rarely_shows_a_loss():
    """24 cells of 6 pairs each, true ratio 1.0, pair-to-pair noise of 20 %: uncorrected, about one cell in
    twenty "LOSES" by chance; corrected, a run shows none."""
    import random

    rng = random.Random(7)
    rows = []
    for _ in range(24):
        pairs = [(1.0, math.exp(rng.gauss(0.0, 0.2))) for _ in range(6)]
        low, high, p = cells.interval_and_p(pairs, cells.OK)
        ratio = cells.seconds_ratio(pairs)
        rows.append(cells.CellSummary(method="auto", ratio=ratio, low=low, high=high, p_loses=p))
    uncorrected = sum(cells.verdict(r.ratio, r.low, r.high) == "LOSES" for r in rows)
    assert uncorrected >= 1  # this seed's chance loss
    assert all(r.verdict != "LOSES" for r in cells.judge(rows))
    # a real loss, every pair 10 % slower, still shows after the correction
    pairs = [(1.0, 1.1 * math.exp(rng.gauss(0.0, 0.01))) for _ in range(6)]
    low, high, p = cells.interval_and_p(pairs, cells.OK)
    rows.append(cells.CellSummary(method="auto", ratio=cells.seconds_ratio(pairs), low=low, high=high, p_loses=p))
    assert cells.judge(rows)[-1].verdict == "LOSES"


def test_where_autos_extra_seconds_went():
    """Two verifications costing 2.5 steps each for 3 tokens, and two stretch starts with a draft: in plain
    steps the split names each, sums to the estimate in plain steps, and a slower Auto run adds slower steps."""
    plain, auto = plain_run_log(0.01, n=52), auto_run_log(0.01)
    tokens = sum(r.emitted for r in auto[1:])
    assert tokens == 52

    def row(auto_step: float) -> dict:
        slow = auto_run_log(auto_step)
        return {
            "tokens": tokens,
            "plain_state_ms": 1e3 * speed_state(plain),
            "auto_state_ms": 1e3 * speed_state(slow),
            **{f"plain_{k}": v for k, v in time_split(plain, log_seconds(plain[1:])).items()},
            **{f"auto_{k}": v for k, v in time_split(slow, log_seconds(slow[1:])).items()},
        }

    parts = cells.Pair.of(row(0.01)).excess_in_steps()
    assert parts["speculation"] == pytest.approx(5.0 - 3.0)
    assert parts["stretch starts"] == pytest.approx(0.2)  # two 0.1-step drafts; plain's one start costs 1 step
    assert parts["steady"] == pytest.approx(0.0) and parts["outside the log"] == pytest.approx(0.0)
    assert parts["slower steps"] == pytest.approx(0.0)
    in_steps = log_seconds(auto[1:]) / 0.01 - log_seconds(plain[1:]) / 0.01
    assert sum(parts.values()) == pytest.approx(in_steps)
    slow = cells.Pair.of(row(0.013)).excess_in_steps()
    assert slow["slower steps"] == pytest.approx(0.3 * tokens)
    assert slow["speculation"] == pytest.approx(parts["speculation"])
    assert cells.Pair.of({"plain_state_ms": 10.0, "auto_state_ms": None}).excess_in_steps() is None


def test_identical_pairs_below_097_are_a_loss_not_a_missing_test():
    """With no spread between pairs a t statistic is undefined; the pairs themselves settle it."""
    assert cells.p_below([(0.9, 1.0)] * 6, cells.OK) == 0.0
    assert cells.p_below([(1.0, 1.0)] * 6, cells.OK) == 1.0
    assert cells.p_below([(0.9, 1.0)], cells.OK) == 1.0  # one pair: no test


def test_slow_steady_steps_are_counted_with_how_near_a_decision_they_fall():
    """Steady steps over 1.5x their run's median: one right after a verification's stretch start, one far
    from any; the split counts both and names the one near a decision."""
    run = auto_run_log(0.01)
    # run: prefill, a stretch's start, 7 steady, 2 verifications, a start, then 40 steady steps
    run[12].verify_s = 0.03  # the first steady step after the start that follows the verifications
    run[40].verify_s = 0.03  # deep in the stretch
    run[30].verify_s = 0.014  # slower, not over 1.5x
    split = time_split(run, log_seconds(run[1:]))
    assert (split["slow_n"], split["slow_near_n"]) == (2.0, 1.0)
    plain = time_split(plain_run_log(0.01), log_seconds(plain_run_log(0.01)[1:]))
    assert (plain["slow_n"], plain["slow_near_n"]) == (0.0, 0.0)
    row = {"model": "m", "what": "w", "method": "auto", **{f"auto_{k}": v for k, v in split.items()}}
    row |= {f"plain_{k}": v for k, v in plain.items()}
    assert cells.cell_means([row, row], cells.Pair.slow_counts) == {
        ("m", "w", "auto"): {"auto": 2.0, "near": 1.0, "plain": 0.0}
    }


def test_calls_summarized_together_keep_their_repeats_apart():
    """Two calls' repeat 0 are two repeats of a cell, not one (its median over repeats counts both)."""

    def call(ratios: list[float]) -> dict:
        return {
            "runs": [{"repeat": i, "what": "exact a=0.3", "vs_plain": v} for i, v in enumerate(ratios)],
            "verify_calls": [],
        }

    out = cells.merged([call([1.0, 0.9]), call([1.1, 1.2, 0.8])])
    assert [r["repeat"] for r in out["runs"]] == [0, 1, 2, 3, 4]
    assert [r["vs_plain"] for r in out["runs"]] == [1.0, 0.9, 1.1, 1.2, 0.8]


def test_mean_steps_read_recorded_speeds_and_old_rows():
    """The estimate in mean steps takes each run's recorded mean speed; rows written before it was recorded
    give the mean steady step of their split (too few steady steps: no speed)."""
    recorded = {"plain_s": 1.0, "auto_s": 1.1, "plain_mean_ms": 10.0, "auto_mean_ms": 11.0}
    old = {"plain_s": 1.0, "auto_s": 1.0, "plain_steady_ms": 400.0, "plain_steady_n": 40, "auto_steady_ms": 500.0}
    old["auto_steady_n"] = 40
    short = {**old, "auto_steady_n": MIN_STEADY - 1}
    assert cells.Pair.of(recorded).speeds("mean") == pytest.approx((0.010, 0.011))
    assert cells.Pair.of(old).speeds("mean") == pytest.approx((0.010, 0.0125))
    assert cells.Pair.of(short).speeds("mean")[1] is None
    (first, second, third) = cells.in_plain_steps([cells.Pair.of(r) for r in [recorded, old, short]], "mean")
    assert first == pytest.approx((100.0, 100.0)) and second == pytest.approx((100.0, 80.0))
    assert third == pytest.approx((100.0, 100.0))  # one speed for both: the seconds ratio
    assert cells.at_one_speed([cells.Pair.of(r) for r in [recorded, old, short]], "mean") == 1


def test_holm_multiplies_the_smallest_p_by_the_cells_and_never_decreases():
    assert cells.holm([0.01, 0.04, 0.03, 0.5]) == pytest.approx([0.04, 0.09, 0.09, 0.5])
    assert cells.holm([]) == []
