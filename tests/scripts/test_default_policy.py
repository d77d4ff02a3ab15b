"""The default-policy benchmark's estimate in plain steps (``speed_state``): what it cancels, what it charges."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("default_policy", ROOT / "scripts" / "gpu" / "default_policy.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def record(kind: str, seconds: float, draft_s: float = 0.0, draft_tokens=(), emitted: int = 1) -> dict:
    return {
        "kind": kind,
        "verify_s": seconds,
        "draft_s": draft_s,
        "draft_tokens": list(draft_tokens),
        "emitted": emitted,
    }


def plain_run(step: float, n: int = 40) -> list[dict]:
    return [record("prefill", 5 * step)] + [record("plain", step) for _ in range(n)]


def auto_run(step: float, n: int = 40) -> list[dict]:
    """A stretch with a shadow draft, two verifications costing 2.5 steps, then a long plain stretch."""
    head = [record("prefill", 5 * step), record("plain", step, 0.1 * step, [7, 8])]
    head += [record("plain", step) for _ in range(7)]
    head += [record("verify", 2.5 * step, emitted=2), record("verify", 2.5 * step, emitted=1)]
    return head + [record("plain", step, 0.1 * step, [9])] + [record("plain", step) for _ in range(n)]


def seconds(records: list[dict]) -> float:
    return sum(r["verify_s"] + r["draft_s"] for r in records)


def test_speed_is_the_median_steady_plain_step(bench):
    run = plain_run(0.01)
    run[5]["verify_s"] = 0.5  # one hiccup moves a mean, not the median
    assert bench.speed_state(run) == pytest.approx(0.01)
    # steps that start a stretch with a draft, verifications and the prefill are not steady steps
    assert bench.speed_state(auto_run(0.01)) == pytest.approx(0.01)
    assert bench.speed_state(plain_run(0.01, n=bench.MIN_STEADY - 1)) is None


def test_plain_steps_cancel_the_machines_speed_and_keep_autos_costs(bench):
    """A run 30 % slower as a whole changes seconds, not plain steps; Auto's verifications stay charged."""
    fast_plain, slow_auto = plain_run(0.01), auto_run(0.013)
    row = {
        "plain_s": seconds(fast_plain),
        "auto_s": seconds(slow_auto),
        "plain_state_ms": 1e3 * bench.speed_state(fast_plain),
        "auto_state_ms": 1e3 * bench.speed_state(slow_auto),
    }
    ((plain_steps, auto_steps),) = bench.in_plain_steps([row])
    assert seconds(fast_plain) / seconds(slow_auto) < 0.8  # in seconds Auto looks 20 %+ slower
    same_speed = seconds(plain_run(0.01)) / seconds(auto_run(0.01))
    assert plain_steps / auto_steps == pytest.approx(same_speed)  # in plain steps: as at equal speed
    assert plain_steps / auto_steps < 1.0  # the two verifications and the drafts still cost


def test_a_drafters_observe_seconds_stay_charged(bench):
    run = auto_run(0.01)
    calls = sum(1 for r in run if r["emitted"])
    assert bench.speed_state(run, observe_s=0.001 * calls) == pytest.approx(0.009)
    # a pair missing a speed is left out, never guessed
    rows = [
        {"plain_s": 1.0, "auto_s": 1.0, "plain_state_ms": sp, "auto_state_ms": sa} for sp, sa in ((None, 10), (10, 0))
    ]
    assert bench.in_plain_steps(rows) == []


def test_verdicts_against_097(bench):
    assert bench.verdict(1.02, 0.98, 1.06) == "holds"
    assert bench.verdict(0.99, 0.95, 1.03) == "ok"
    assert bench.verdict(0.95, 0.91, 0.99) == "inconclusive"
    assert bench.verdict(0.90, 0.86, 0.94) == "LOSES"
