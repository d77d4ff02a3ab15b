"""Paired timing statistics: Student's t tail, Holm's correction, the bootstrap interval of a throughput
ratio over prompts."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from specbench.bench import paired
from specbench.bench.prompt_runs import Method, PromptRun
from specbench.bench.prompt_summary import MethodSummary, prompt_table, summarize_prompt_runs


@pytest.mark.parametrize("dof", [1, 2, 3, 5, 6, 9, 40])
def test_students_t_tail_matches_scipy(dof):
    stats = pytest.importorskip("scipy.stats")
    for t in (-3.0, -0.5, 0.0, 0.7, 2.0, 4.5):
        assert paired.student_t_above(t, dof) == pytest.approx(stats.t.sf(t, dof), abs=1e-12)


def test_ratio_interval_over_prompts():
    """Prompts twice as fast for the method: the interval is 2 when every prompt agrees, spans the spread of
    per-prompt ratios when they differ, and is missing under MIN_UNITS prompts."""
    base = [(100.0, 1.0 + 0.1 * i) for i in range(8)]
    same = [(tokens, seconds / 2) for tokens, seconds in base]
    assert paired.ratio_interval(base, same) == pytest.approx((2.0, 2.0))
    mixed = [(tokens, seconds / (1.5 if i % 2 else 2.5)) for i, (tokens, seconds) in enumerate(base)]
    low, high = paired.ratio_interval(base, mixed)
    overall = (800.0 / sum(s for _, s in mixed)) / (800.0 / sum(s for _, s in base))
    assert 1.5 < low < overall < high < 2.5
    assert paired.ratio_interval(base[: paired.MIN_UNITS - 1], same[: paired.MIN_UNITS - 1]) is None
    with pytest.raises(ValueError, match="same units"):
        paired.ratio_interval(base, same[:-1])


def _run(method: str, prompt: int, seconds: float) -> PromptRun:
    """One prompt-bench run row as the summary reads it (greedy, nothing drafted)."""
    return PromptRun(
        method=method,
        category="qa",
        question_key=f"q{prompt}",
        new_tokens=100,
        wall_s=seconds,
        first_token_s=0.01,
        verify="exact",
        drafter="none" if method == "mlx-lm" else "lookup",
        engine="mlx-lm" if method == "mlx-lm" else "specbench",
        forwards=99,
        equal=True,
    )


def test_bench_summary_gives_each_speedup_its_interval_over_prompts():
    """`specbench bench`'s speedup per category: with its 95 % interval over prompts from 6 prompts on (the
    tables print it), none below."""
    methods = [Method("mlx-lm", "mlx-lm"), Method("lookup", "specbench", "lookup")]
    for prompts, has_interval in ((8, True), (3, False)):
        runs = [_run("mlx-lm", i, 1.0) for i in range(prompts)]
        runs += [_run("lookup", i, 1.0 / (1.2 if i % 2 else 1.6)) for i in range(prompts)]
        row = next(r for r in summarize_prompt_runs(runs, methods) if r.method == "lookup" and r.category == "qa")
        table = prompt_table(summarize_prompt_runs(runs, methods), methods, ["qa"], {})
        if has_interval:
            assert 1.2 < row.speedup_low < row.speedup < row.speedup_high < 1.6
            assert f"{row.speedup:.2f}x [{row.speedup_low:.2f}-{row.speedup_high:.2f}]" in table
        else:
            assert row.speedup_low is None and row.speedup_high is None and "x [" not in table


def test_bench_figure_whiskers_show_the_interval_over_prompts_else_the_range_over_repeats():
    """The bench figure's whisker of a bar is its interval over prompts (black) where the summary has one, the
    range over repeats (grey) where it has not, and absent with neither."""
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    from specbench.report.figures.bench import prompt_figure, speedup_whisker

    methods = [Method("mlx-lm", "mlx-lm"), Method("lookup", "specbench", "lookup")]
    runs = [_run("mlx-lm", i, 1.0) for i in range(8)] + [
        _run("lookup", i, 1 / (1.2 if i % 2 else 1.6)) for i in range(8)
    ]
    rows = {r.category: r for r in summarize_prompt_runs(runs, methods) if r.method == "lookup"}
    low, high, kind = speedup_whisker(rows["qa"], repeats=1)
    assert kind == "interval" and (low, high) == (rows["qa"].speedup_low, rows["qa"].speedup_high)
    few = replace(rows["qa"], speedup_low=None, speedup_high=None, speedup_min=1.1, speedup_max=1.3)
    assert speedup_whisker(few, repeats=3) == (1.1, 1.3, "range")
    assert speedup_whisker(few, repeats=1) is None

    figure = prompt_figure(list(rows.values()), methods, ["qa"], {"repeats": 1})
    (bars,) = figure.axes[0].containers[:1]
    whiskers = [c for c in figure.axes[0].containers if type(c).__name__ == "ErrorbarContainer"]
    assert len(bars) == 2 and len(whiskers) == 1  # qa and overall, both with an interval over 8 prompts
    segments = whiskers[0].lines[2][0].get_segments()
    drawn = sorted(v for s in segments for v in (s[0][1], s[1][1]))
    assert drawn == pytest.approx(sorted(v for r in rows.values() for v in (r.speedup_low, r.speedup_high)))


def test_intervals_of_few_prompts_cover_about_as_often_as_they_claim():
    """Six prompts whose method runs exactly as fast as the baseline, each timing off by 10 %: the 95 %
    interval of the speedup holds 1.0 in at least 90 % of 300 benchmarks (a plain percentile bootstrap: about
    85 %), and the expanded percentile's cut tends to 2.5 % as prompts grow."""
    import numpy as np

    rng = np.random.default_rng(11)
    covered = 0
    for trial in range(300):
        tokens = rng.integers(20, 200, 6).astype(float)
        base = [(k, 0.01 * k * np.exp(rng.normal(0.0, 0.1))) for k in tokens]
        mine = [(k, 0.01 * k * np.exp(rng.normal(0.0, 0.1))) for k in tokens]
        low, high = paired.ratio_interval(base, mine, draws=1000, seed=trial)
        covered += low <= 1.0 <= high
    assert covered / 300 >= 0.90
    assert paired.expanded_tail(6) == pytest.approx(0.0024, abs=2e-4)
    assert paired.expanded_tail(20) < paired.expanded_tail(100) < paired.expanded_tail(10_000) < 0.025
    assert paired.expanded_tail(10_000) == pytest.approx(0.025, abs=2e-4)


def test_per_position_intervals_resample_prompts_not_drafts():
    """Eight prompts, 40 drafts each at position 1: four prompts accept every draft, four none. As independent
    trials (Wilson) the rate 0.5 looks known to +-0.05; resampling whole prompts, as the drafts of one
    generation depend on each other, it spans most of [0, 1]. With two prompts there is no such interval."""
    import polars as pl

    from specbench.bench.sweep_summary import per_position_acceptance

    def steps(prompts: int) -> pl.DataFrame:
        rows = []
        for p in range(prompts):
            for _ in range(40):
                rows.append(
                    {
                        "kind": "verify",
                        "drafter": "d",
                        "policy": "fixed:1",
                        "prompt": f"p{p}",
                        "k_drafted": 1,
                        "accepted": p % 2,
                    }
                )
        return pl.DataFrame(rows)

    (row,) = per_position_acceptance(steps(8)).iter_rows(named=True)
    assert (row["rate"], row["reached"], row["units"], row["interval"]) == (0.5, 320, 8, "over prompts")
    assert row["low"] < 0.2 and row["high"] > 0.8
    wilson_low, wilson_high = paired.wilson_interval(np.array([160]), np.array([320]))
    assert wilson_high[0] - wilson_low[0] < 0.11
    (few,) = per_position_acceptance(steps(2)).iter_rows(named=True)
    assert few["interval"] == "wilson" and few["units"] == 2
    assert (few["low"], few["high"]) == pytest.approx(wilson_interval_of(40, 80))


def wilson_interval_of(successes: int, trials: int) -> tuple[float, float]:
    low, high = paired.wilson_interval(np.array([successes]), np.array([trials]))
    return float(low[0]), float(high[0])


def test_bench_interval_resamples_whole_conversations():
    """Six two-turn questions are six units, not twelve: the interval of a conversation category resamples
    each question with all its turns (12 independent turns would give a narrower one), and five two-turn
    questions give none."""
    methods = [Method("mlx-lm", "mlx-lm"), Method("lookup", "specbench", "lookup")]

    def runs(questions: int, turns: int) -> list[PromptRun]:
        out = []
        for q in range(questions):
            for t in range(turns):
                factor = 1.2 if q % 2 else 1.6
                out.append(replace(_run("mlx-lm", q, 1.0), turn=t))
                out.append(replace(_run("lookup", q, 1.0 / factor), turn=t))
        return out

    def row(questions: int, turns: int) -> MethodSummary:
        summary = summarize_prompt_runs(runs(questions, turns), methods)
        return next(r for r in summary if r.method == "lookup" and r.category == "qa")

    conversations = row(6, 2)
    assert conversations.prompts == 12 and conversations.speedup_low is not None
    six_single_turns = row(6, 1)
    # the same six questions each answered once: the same units, so the same interval
    assert (conversations.speedup_low, conversations.speedup_high) == pytest.approx(
        (six_single_turns.speedup_low, six_single_turns.speedup_high)
    )
    twelve_questions = row(12, 1)
    assert twelve_questions.speedup_high - twelve_questions.speedup_low < (
        conversations.speedup_high - conversations.speedup_low
    )
    assert row(5, 2).speedup_low is None


def test_paired_ratio_resamples_prompts_from_six_else_pairs_else_none():
    assert [paired.baseline_first(i) for i in range(4)] == [True, False, True, False]
    two_prompts = [(p, 10, 1.0, 10, 0.8 + 0.01 * i) for i in range(3) for p in ("a", "b")]
    within = paired.paired_ratio(two_prompts)
    assert within.resampled == "pair" and within.pairs == 6 and within.units == 2
    assert within.ratio == pytest.approx(6.0 / sum(s for *_, s in two_prompts))  # 60 tokens each side
    assert within.has_interval and within.low > 1
    eight = paired.paired_ratio([(f"p{i}", 10, 1.0, 10, 1.0 + (0.3 if i % 2 else -0.3)) for i in range(8)])
    assert eight.resampled == "prompt" and eight.units == 8 and eight.low <= 1.0 <= eight.high
    few = paired.paired_ratio([("a", 10, 1.0, 10, 0.5)] * 3)
    assert few.resampled == "" and few.low is None and not few.has_interval and few.ratio == pytest.approx(2.0)
    with pytest.raises(ValueError):
        paired.paired_ratio([])
