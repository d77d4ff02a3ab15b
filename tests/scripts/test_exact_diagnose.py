"""scripts.gpu.exact_layout and exact_lockstep: the probes behind scripts/gpu/exact_diagnose.py."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import build_tiny

from scripts.gpu import exact_layout, exact_lockstep
from specbench.checks import exactness
from specbench.exact import calibrate, hooks

pytestmark = pytest.mark.usefixtures("fresh_calibrations")


def test_a_snapshot_rebuilds_the_same_contents_in_any_buffer_length():
    model = build_tiny("qwen3")
    cache = exact_layout._prefill(model, list(range(1, 20)))
    snap = exact_layout.Snapshot(cache)
    wider = snap.cache(512)
    assert wider[0].offset == 19 and wider[0].keys.shape[2] == 512
    assert exact_layout.same(wider[0].keys[..., :19, :], cache[0].keys[..., :19, :])


def test_split_rows_at_a_crossing_match_serial_steps_call_by_call_on_the_cpu():
    model = build_tiny("qwen3")
    report = exact_layout.crossing_calls(model, 3, 255, "attention+linear")
    layers = len(model.model.layers)
    assert len(report["calls"]) == 3 * layers and report["first_mismatch"] is None
    assert [c["keys"] for c in report["calls"][:3]] == [256, 257, 258]
    copied = exact_layout.copied_cache_steps(model, 40, 3)
    assert copied["copy_equal"] and copied["rerun_equal"] and copied["after_other_calls_equal"]


def test_row_reports_name_the_first_layer_that_differs():
    ref = np.zeros((3, 4))
    got = ref.copy()
    got[1, 0] = 1.0
    layers_ref = {0: np.zeros((3, 2)), 1: np.zeros((3, 2))}
    layers_got = {0: np.zeros((3, 2)), 1: np.ones((3, 2))}
    assert exact_lockstep.row_report(ref, layers_ref, got, layers_got, 10) == ["=", "11:L1", "="]
    assert exact_lockstep.row_report(ref, None, got, None, 10) == ["=", "11:head", "="]


def test_the_layout_switch_restores_the_serial_layout():
    with exact_lockstep.layout(False):
        assert hooks.serial_kv_layout is exact_lockstep.NO_LAYOUT[0]
    assert hooks.serial_kv_layout is exact_lockstep.SERIAL_LAYOUT[0]


def test_lockstep_finds_every_verification_of_an_exact_run_equal_to_serial_steps():
    model = build_tiny("qwen3")
    prompt = exactness.random_prompts(model, 1, lengths=(8, 12))[0]
    truth = exactness.mlx_lm_greedy(model, prompt, 16)
    calibrations = {on: calibrate(model, [2, 3, 4], measure=False, save=False, force=True) for on in (False, True)}
    out, log = exact_lockstep.run_exact(model, prompt, truth, 16, 3, 0, True, calibrations)
    assert out == truth
    step = exact_lockstep.lockstep(model, prompt, log.records, True, calibrations, analyse=True)
    assert step["verify"] is None and step["verifies_checked"] == log.stats()["verifies"]
