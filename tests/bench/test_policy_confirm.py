"""Policies confirmed by real runs: measured beside predicted speedup, the residual and its interval."""

from __future__ import annotations

import gc

import pytest
from conftest import build_tiny

from specbench.bench import timing
from specbench.bench.policy_confirm import confirm_policies
from specbench.core.options import GenerateOptions
from specbench.cost import Profile, predicted_speedup
from specbench.simulate.policies import policy_copy
from specbench.simulate.simulate import model_free_drafter, record, simulate


def _profile() -> Profile:
    widths = list(range(1, 10))
    costs = [1.0 + 0.2 * (w - 1) for w in widths]
    modes = ("fast", "exact")
    return Profile(
        "m", "test", "cpu", {}, 0.1, {m: widths for m in modes}, {m: costs for m in modes}, {m: costs for m in modes}
    )


def test_confirmed_policies_carry_measured_predicted_and_residual():
    model = build_tiny("llama")
    prompts = [[1, 2, 3, 4, 5, 1, 2, 3], [7, 8, 9, 7, 8, 9, 7], [11, 12, 13, 11, 12]]
    requests = record(model, prompts, GenerateOptions(max_tokens=12))
    profile = _profile()
    table = confirm_policies(model, requests, ["fixed:2", "ollama:3"], profile, "lookup", 4, resamples=200)
    assert table["policy"].to_list() == ["fixed:2", "ollama:3"]
    for row in table.iter_rows(named=True):
        replay = simulate(requests, model_free_drafter("lookup", 4), policy_copy(row["policy"]), cost=profile)
        assert row["predicted_speedup"] == pytest.approx(
            predicted_speedup(replay.records, profile, 0.0, mode="exact", tokens="emitted")
        )
        assert row["residual"] == pytest.approx(row["measured_speedup"] / row["predicted_speedup"] - 1)
        assert 0 < row["measured_low"] <= row["measured_high"]
    short = confirm_policies(model, requests[:2], ["fixed:2"], profile, "lookup", 4)
    assert short["measured_low"][0] is None  # two requests: inconclusive


def test_each_confirmation_run_is_timed_with_the_garbage_collector_paused(monkeypatch):
    """As every timed run (``timing.timed_generation``, which confirmation times its runs by): a collection in the
    middle of a run would count as decoding."""
    seen = []

    class Run:
        def __iter__(self):
            for token in range(3):
                seen.append(gc.isenabled())
                yield token

        def stats(self):
            return {"decode_s": 0.25}

    monkeypatch.setattr(timing, "plain_generation", lambda *args, **kwargs: Run())
    assert gc.isenabled()
    assert timing.timed_generation(None, [1], GenerateOptions()).run.stats()["decode_s"] == 0.25
    assert seen == [False] * 3 and gc.isenabled()
