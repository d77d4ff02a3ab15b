"""The cost model: c(w) with intervals over timing rounds, the checks that mark a profile noisy, one measured
profile stored and read by every page, a noisy measurement measured again and pooled."""

from __future__ import annotations

import dataclasses
import importlib
import math

import pytest

import specbench.cost as cost
from specbench.cost import model as cost_model_module
from specbench.cost.profile import LEVEL, check_profile, level, median_interval, noise
from specbench.models import synthetic


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_HOME", str(tmp_path))
    return tmp_path


@pytest.fixture(scope="module")
def dense():
    return synthetic.build("qwen3-8b-tiny")


def test_the_median_interval_has_the_coverage_it_states():
    # 5 rounds: the range, 1 - 2/32; 9 rounds: the 2nd and 8th values reach 95 % (1 - 2 * 10/512)
    assert level(5) == pytest.approx(1 - 2 / 32)
    assert median_interval([5, 1, 4, 2, 3]) == (1, 5)
    assert level(9) == pytest.approx(1 - 2 * (1 + 9) / 512) and level(9) >= LEVEL
    assert median_interval(list(range(9, 0, -1))) == (2, 8)
    assert level(1) == 0.0 and median_interval([3.0]) == (3.0, 3.0)
    with pytest.raises(ValueError, match="at least one value"):
        median_interval([])


def test_noise_marks_a_cost_below_one_and_a_step_down_beyond_the_intervals():
    widths = [1, 2, 3, 4]
    clean = noise(widths, [1.0, 1.4, 1.8, 1.7], [[0.9, 1.1], [1.3, 1.5], [1.7, 1.9], [1.6, 1.85]])
    assert clean == []  # 1.8 -> 1.7 lies inside both intervals
    reasons = noise(widths, [1.0, 0.78, 1.8, 1.2], [[0.9, 1.1], [0.7, 0.9], [1.7, 1.9], [1.1, 1.3]])
    assert len(reasons) == 2
    assert "c(2) = 0.78 is below 1" in reasons[0] and "c(4) = 1.2 steps down from c(3) = 1.8" in reasons[1]
    # the engine's overhead counts: a 0.78 forward and 0.3 of the engine's own work cost more than a plain step
    assert noise([1, 2], [1.0, 0.78], [[0.9, 1.1], [0.7, 0.9]], overhead=0.3) == []


def test_a_measured_profile_keeps_its_rounds_intervals_and_checks(dense):
    profile = cost.measure(dense, widths=3, verify=("fast",), offset=16, repeats=3, warmup=1, plain_tokens=2)
    assert len(profile.rounds["plain"]) == 3 and all(len(r) == 3 for r in profile.rounds["fast"])
    for w in (1, 2, 3):
        low, high = profile.interval(w, "fast")
        assert low <= profile.c(w, overhead=False) <= high  # the paired median lies in its own interval
    assert profile.interval_level == pytest.approx(0.75) and isinstance(profile.noise["fast"], list)
    assert check_profile(profile.to_dict()).intervals == profile.intervals  # stored and read back whole


def test_the_cost_model_is_measured_once_and_read_by_every_page(dense, monkeypatch):
    monkeypatch.setattr(
        importlib.import_module("specbench.cost.measure"), "noise", lambda *a: []
    )  # a tiny model's timings on a busy CPU may well be noisy
    protocol = cost.Protocol(widths=3, verify=("fast",), offset=16, repeats=3, plain_tokens=2)
    said = []
    first = cost.cost_model(dense, protocol, progress=said.append)
    assert first.measured.protocol["widths"] == 3 and first.measured.seconds > 0
    assert any("measuring the cost model" in s for s in said)
    monkeypatch.setattr(cost_model_module, "measure", lambda *a, **k: pytest.fail("measured again"))
    again = cost.cost_model(dense, protocol)  # current: read from the store
    assert again.costs == first.costs and again.created == first.created
    assert cost.profile_for(dense, "fast").costs == first.costs  # what Auto and the pages plan with
    assert not cost.model.current(again, cost.Protocol(widths=4, verify=("fast",)))  # a wider protocol measures
    again.noise = {"fast": ["c(2) = 0.5 is below 1"]}
    assert not cost.model.current(again, protocol)  # a noisy one is measured again
    again.measured = dataclasses.replace(again.measured, measurements=2)
    assert cost.model.current(again, protocol)  # but once pooled, kept with its marks


def test_a_noisy_measurement_is_measured_again_and_pooled(dense, monkeypatch):
    """The first measurement finds c(2) below 1; the second is pooled with it, every round of both kept; the second
    times the offset only, and the other context length keeps the first's costs."""
    real = cost_model_module.measure
    calls = []

    def measured(model, **kwargs):
        profile = real(model, **kwargs)
        calls.append(profile)
        if len(calls) == 1:  # a plain step that ran slow in every round: c(2) < 1
            profile.rounds["plain"] = [10 * s for s in profile.rounds["plain"]]
            profile.noise = {"fast": ["c(2) = 0.1 is below 1"]}
        return profile

    monkeypatch.setattr(cost_model_module, "measure", measured)
    protocol = cost.Protocol(widths=2, verify=("fast",), offset=16, repeats=3, plain_tokens=2, lengths=(40,))
    said = []
    profile = cost.cost_model(dense, protocol, progress=said.append)
    assert len(calls) == 2 and profile.measured.measurements == 2 and profile.repeats == 6
    assert list(calls[0].lengths) == ["40"] and not calls[1].lengths  # the second times the offset only
    assert profile.lengths == calls[0].lengths and profile.context_lengths == [16, 40]
    assert profile.measured.protocol["lengths"] == [40] and cost.model.current(profile, protocol)
    assert profile.rounds["plain"] == calls[0].rounds["plain"] + calls[1].rounds["plain"]
    assert any("measuring again" in s for s in said)
    ratios = sorted(s / p for s, p in zip(profile.rounds["fast"][1], profile.rounds["plain"]))
    assert profile.intervals["fast"][1] == [ratios[0], ratios[-1]]  # 6 rounds: the range
    assert math.isclose(profile.interval_level, level(6))


def test_only_the_noisy_mode_is_measured_again(dense, monkeypatch):
    """Noisy in fast mode alone: the second measurement times fast mode only; exact keeps the first's rounds, each
    paired with its own round's plain step, and the stated interval level is that of its fewer rounds."""
    real = cost_model_module.measure
    calls = []

    def measured(model, **kwargs):
        calls.append(kwargs["verify"])
        profile = real(model, **kwargs)
        if len(calls) == 1:
            profile.noise = {"fast": ["c(2) = 0.1 is below 1"], "exact": []}
        return profile

    monkeypatch.setattr(cost_model_module, "measure", measured)
    monkeypatch.setattr(importlib.import_module("specbench.cost.measure"), "noise", lambda *a: [])
    protocol = cost.Protocol(widths=2, verify=("fast", "exact"), offset=16, repeats=3, plain_tokens=2)
    profile = cost.cost_model(dense, protocol)
    assert calls == [("fast", "exact"), ("fast",)]
    assert len(profile.rounds["plain"]) == 6 and len(profile.rounds["fast"][1]) == 6
    assert len(profile.rounds["exact"][1]) == 3
    ratios = sorted(s / p for s, p in zip(profile.rounds["exact"][1], profile.rounds["plain"][:3]))
    assert profile.costs["exact"][1] == ratios[1] and profile.intervals["exact"][1] == [ratios[0], ratios[-1]]
    assert profile.repeats == 3 and math.isclose(profile.interval_level, level(3))
    assert "2 measurements pooled (fast)" in cost.model.describe(profile) and cost.model.current(profile, protocol)


def test_a_protocol_out_of_bounds_is_refused_before_any_model_work():
    with pytest.raises(ValueError, match="widths must be an integer from 2 to 129"):
        cost.Protocol(widths=1000)
    with pytest.raises(ValueError, match="repeats must be an integer >= 1"):
        cost.Protocol(repeats=0)
    with pytest.raises(ValueError, match="verify"):
        cost.Protocol(verify=("sloppy",))
