"""The one speedup predictor, and predictions beside measured speedups in sweeps."""

from __future__ import annotations

from dataclasses import replace

import polars as pl
import pytest

import specbench.cost as cost
from specbench.bench.predictions import drafting_cost, prediction_error, prediction_lines, with_predictions
from specbench.core.log import StepLog, StepRecord
from specbench.cost.predict import (
    acceptance_per_position,
    mean_absolute_error,
    noise_floor,
    predicted_speedup,
    residual,
)

COSTS = [1.2, 1.4, 1.6, 1.8, 2.0]


def profile(costs=COSTS, overhead=0.0, lengths=None, offset=64) -> cost.Profile:
    widths = list(range(1, len(costs) + 1))
    return cost.Profile(
        model="m",
        name="m",
        device="cpu",
        versions={},
        plain_step_s=0.01,
        widths={"fast": widths},
        costs={"fast": list(costs)},
        seconds={"fast": [0.01 * c for c in costs]},
        overhead={"fast": overhead},
        offset=offset,
        lengths=lengths or {},
    )


def verify(position: int, k: int, accepted: int, **extra) -> StepRecord:
    return StepRecord(
        step=0,
        position=position,
        kind="verify",
        k_drafted=k,
        accepted=accepted,
        emitted=accepted + 1,
        verify_width=k + 1,
        **extra,
    )


PREFILL = StepRecord(step=0, position=0, kind="prefill", emitted=1, verify_width=10)


def test_acceptance_per_position_is_conditional_on_reaching_the_position():
    records = [verify(0, 3, 3), verify(4, 3, 1), verify(6, 3, 0), verify(7, 2, 2)]
    # position 1 reached by all 4 (3 accepted), position 2 by 3 (2), position 3 by 1 draft of 3 that got there
    assert acceptance_per_position(records) == pytest.approx([3 / 4, 2 / 3, 1.0])
    assert acceptance_per_position([PREFILL]) == []


def test_a_fixed_length_run_is_predicted_as_expected_tokens_over_its_step_cost():
    records = [PREFILL] + [verify(i, 4, a) for i, a in enumerate([4, 2, 0, 4, 1])]
    a = acceptance_per_position(records)
    d = 0.05
    expected = cost.expected_tokens(a, 4) / (COSTS[4] + 0.3 + 4 * d)
    assert predicted_speedup(records, profile(overhead=0.3), d) == pytest.approx(expected)
    # E(k) at the run's per-position acceptance is its mean tokens per verification
    assert cost.expected_tokens(a, 4) == pytest.approx(sum(r.emitted for r in records[1:]) / 5)


def test_each_step_is_priced_at_the_context_length_it_ran_at():
    dear = [2.0 * c for c in COSTS]
    long = {"4096": {"plain_step_s": 0.02, "costs": {"fast": dear}, "seconds": {"fast": dear}}}
    p = profile(lengths=long)
    records = [PREFILL, verify(0, 2, 2), verify(3, 2, 2)]
    short = predicted_speedup(records, p, prompt_tokens=60)
    far = predicted_speedup(records, p, prompt_tokens=5000)
    assert short == pytest.approx(3 / COSTS[2]) and far == pytest.approx(3 / dear[2])


def test_plain_steps_cost_one_and_unverified_drafts_cost_d():
    records = [PREFILL, StepRecord(step=1, position=0, kind="plain", emitted=1, draft_tokens=[1, 2])]
    assert predicted_speedup(records, profile(), d=0.25) == pytest.approx(1 / 1.5)
    assert predicted_speedup([PREFILL], profile()) == 0.0


def test_residuals_and_their_mean():
    assert residual(1.1, 1.0) == pytest.approx(0.1)
    assert residual(1.0, 0.0) != residual(1.0, 0.0)  # NaN
    assert mean_absolute_error([0.1, -0.3, float("nan"), None]) == pytest.approx(0.2)


def test_sweep_runs_gain_predictions_residuals_and_a_mean_error():
    steps = [PREFILL.labelled(run=1)] + [
        replace(verify(i, 2, 1, draft_s=0.002), step=i + 1).labelled(run=1) for i in range(4)
    ]
    steps += [PREFILL.labelled(run=0)]
    frame = StepLog(steps).to_polars()
    runs = pl.DataFrame(
        {
            "run": [0, 1],
            "prompt": ["p", "p"],
            "drafter": ["none", "lookup"],
            "policy": ["none", "fixed:2"],
            "speedup": [1.0, 1.3],
            "plain_decode_s": [0.1, 0.1],
            "plain_decode_tokens": [10, 10],
            "prompt_tokens": [10, 10],
            "verify_mode": ["fast", "fast"],
        }
    )
    out = with_predictions(runs, frame, profile())
    d = drafting_cost(StepLog.from_rows(frame.filter(pl.col("run") == 1).to_dicts()).records, 0.01)
    assert d == pytest.approx(0.002 / 2 / 0.01)
    expected = 2.0 / (COSTS[2] + 2 * d)
    assert out["predicted_speedup"][0] is None
    assert out["predicted_speedup"][1] == pytest.approx(expected)
    assert out["residual"][1] == pytest.approx(1.3 / expected - 1)
    assert prediction_error(out)["mean_abs_error"][0] == pytest.approx(abs(1.3 / expected - 1))
    assert prediction_error(out, ["policy"])["policy"].to_list() == ["fixed:2"]
    lines = prediction_lines(out)
    assert "1.30x" in lines[1] and lines[-1].startswith("mean absolute prediction error")


def test_the_noise_floor_is_a_perfect_predictors_expected_miss_from_the_runs_scatter():
    import numpy as np

    assert np.isnan(noise_floor([1.2])) and np.isnan(noise_floor([]))
    assert noise_floor([1.0, 1.0, 1.0]) == 0
    assert noise_floor([0.8, 1.2]) == pytest.approx(np.sqrt(2 / np.pi) * np.std([0.8, 1.2], ddof=1) / np.sqrt(2))
    # checked by simulation: the mean of n draws around 1 misses 1 by about the floor on average
    rng = np.random.default_rng(0)
    draws = 1 + 0.1 * rng.standard_normal((4000, 3))
    misses = np.abs(draws.mean(axis=1) - 1)
    floors = [noise_floor(d) for d in draws]
    assert np.mean(floors) == pytest.approx(np.mean(misses), rel=0.15)
