"""Timing hygiene: the collector paused in a timed run (re-entrant), the steadier affinity chosen."""

from __future__ import annotations

import gc
import os

import pytest

from specbench.common import timing


def test_quiet_pauses_the_collector_and_nests():
    assert gc.isenabled()
    with timing.quiet():
        assert not gc.isenabled()
        with timing.quiet():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the inner one does not resume it
    assert gc.isenabled()


def test_quiet_resumes_the_collector_after_an_error():
    with pytest.raises(RuntimeError), timing.quiet():
        raise RuntimeError
    assert gc.isenabled()


def test_few_cores_stay_free(monkeypatch):
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no affinity control here")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    chosen = timing.steadier_affinity(lambda: pytest.fail("nothing is timed on 2 cores"))
    assert chosen.chosen == "free (2 cores)" and chosen.as_dict() == {"chosen": "free (2 cores)"}


def test_the_steadier_of_free_and_pinned_is_kept(monkeypatch):
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no affinity control here")
    pinned_to: list[set[int]] = []
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    monkeypatch.setattr(os, "sched_setaffinity", lambda pid, cores: pinned_to.append(set(cores)))
    times = iter([1.0, 1.5, 0.5, 1.2, 0.8, 1.0] + [1.0, 1.01, 0.99, 1.0, 1.0, 1.0])  # free noisy, pinned steady
    chosen = timing.steadier_affinity(lambda: next(times))
    assert chosen.chosen == "pinned to cores [12, 13, 14, 15]" and pinned_to == [{12, 13, 14, 15}]
    assert chosen.pinned_cv < chosen.free_cv
    times = iter([1.0, 1.01, 0.99, 1.0, 1.0, 1.0] + [1.0, 1.5, 0.5, 1.2, 0.8, 1.0])  # pinned noisier: back to free
    assert timing.steadier_affinity(lambda: next(times)).chosen == "free"
    assert pinned_to[-1] == set(range(16))
