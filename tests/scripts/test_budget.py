"""The one time budget of the GPU drivers: what is left, what fits, what was skipped or cut."""

from __future__ import annotations

import math

from scripts.gpu.budget import Budget


def silent(seconds: float | None, start: float = 0.0) -> tuple[Budget, list[str]]:
    said: list[str] = []
    return Budget(seconds, start=start, say=said.append), said


def test_a_phase_that_does_not_fit_is_skipped_and_recorded(monkeypatch):
    monkeypatch.setattr("time.perf_counter", lambda: 100.0)
    budget, said = silent(150.0, start=40.0)  # 60 s spent, 90 left
    assert budget.left() == 90.0 and budget.elapsed() == 60.0
    assert budget.fits("grid", 80.0)
    assert not budget.fits("bench", 120.0)
    assert budget.skipped_names() == ["bench"] and budget.skipped_lines() == ["bench (needs ~120 s, 90 s left)"]
    assert said == ["skip bench (needs ~120 s, 90 s left)"]
    assert not budget.fits("early", 30.0, until=budget.until(0.5))  # 75 s mark passed: no time before it
    assert not budget.over("late") and budget.over("phase two", until=budget.until(0.2))


def test_without_a_limit_everything_fits(monkeypatch):
    budget, _ = silent(None, start=0.0)
    assert math.isinf(budget.left()) and budget.fits("anything", 1e9) and not budget.over("anything")


def test_allot_keeps_back_a_reserve_and_cuts_are_kept(monkeypatch):
    monkeypatch.setattr("time.perf_counter", lambda: 10.0)
    budget, said = silent(110.0, start=0.0)  # 100 s left
    assert budget.allot(0.5, reserve_s=20.0) == 40.0
    assert budget.allot(1.0, reserve_s=200.0) == 0.0
    budget.cut("2 repeats instead of 8")
    assert budget.cuts == ["2 repeats instead of 8"] and said == ["  reduced: 2 repeats instead of 8"]
