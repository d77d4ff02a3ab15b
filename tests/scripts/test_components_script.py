"""The component experiment's summary of the batch engine's overheads (``scripts.gpu.components``)."""

from __future__ import annotations

import pytest

from scripts.gpu.components import overhead_terms
from specbench.cost.batch import BatchProfile


def test_overhead_terms_fit_a_line_through_the_batch_sizes_at_the_nearest_measured_width():
    profile = BatchProfile("m", "cpu", 64, {1: [1.0, 1.1], 4: [1.0, 1.5]}, {1: 0.01, 4: 0.012})
    assert overhead_terms(profile, 2) == (0.0, 0.0)  # none measured
    profile.overhead_s = {"1": {"1": 0.0, "4": 0.0}, "3": {"1": 0.002, "4": 0.005, "16": 0.017}}
    assert overhead_terms(profile, 3) == pytest.approx((0.001, 0.001))  # per step, per row
    assert overhead_terms(profile, 2) == overhead_terms(profile, 3)  # the nearest measured width, the wider on a tie
    profile.overhead_s = {"2": {"4": 0.003}}
    assert overhead_terms(profile, 5) == (0.003, 0.0)  # one batch size: no slope
