"""Compiled linear chunks as part of an exact level ("+compiled"): parsed and named, exact, picked by the
calibration where exact and measured cheaper, and run by every exact verification that level names."""

from __future__ import annotations

import json

import mlx.core as mx
import numpy as np
import pytest
from conftest import ScriptedDrafter, bitwise_forwards, build_tiny, emulate_gpu, plain_greedy
from mlx_lm.models.cache import make_prompt_cache

from specbench import GenerateOptions, speculative_generate
from specbench.core.policies import DraftPolicy
from specbench.exact import ExactPlan, ExactVerifier, calibrate, calibration_key, exact_mode, load_calibration
from specbench.exact import calibration as exact_calibration
from specbench.exact import hooks as exact_hooks

pytestmark = pytest.mark.usefixtures("fresh_calibrations")


def test_compiled_levels_parse_and_round_trip():
    assert ExactPlan.parse("attention+linear/7+compiled") == ExactPlan(attention=True, linear=7, compiled=True)
    for level in ("attention+linear/7+compiled", "linear/2+experts/unsorted+compiled", "attention+linear/7"):
        assert ExactPlan.parse(level).name == level
    assert ExactPlan.parse("compiled+linear/3+attention").name == "attention+linear/3+compiled"
    assert not ExactPlan.parse("attention+linear/7").compiled
    for bad in ("compiled", "attention+compiled", "attention+linear+compiled", "linear/vector+compiled"):
        with pytest.raises(ValueError, match="linear/c"):
            ExactPlan.parse(bad)
    with pytest.raises(ValueError, match="drop 'compiled'"):
        ExactPlan(attention=True, linear=1, compiled=True)
    with pytest.raises(ValueError, match="exact level"):
        ExactPlan.parse("linear/4+compiled/2")


@pytest.mark.parametrize(
    "arch, level", [("qwen3", "attention+linear/3+compiled"), ("qwen3_moe", "linear/2+experts/unsorted+compiled")]
)
def test_compiled_level_computes_what_its_chunks_compute(arch, level):
    """ "+compiled" runs the same products as the plain chunks: bit-identical outputs at every width (and so
    exact wherever the chunks are; the calibration takes it only where its probe finds it exact)."""
    model = build_tiny(arch)
    rng = np.random.default_rng(2)
    cache = make_prompt_cache(model)
    model(mx.array(rng.integers(0, 97, 19))[None], cache=cache)
    tokens = mx.array(rng.integers(0, 97, 7))[None]
    exact_hooks._compiled_products.clear()
    outputs = {}
    for run in (level.removesuffix("+compiled"), level):
        for width in (2, 5, 7):
            with exact_mode(model, run):
                outputs[run, width] = np.array(model(tokens[:, :width], cache=cache)[0])
            for c in cache:
                c.trim(width)
        assert bool(exact_hooks._compiled_products) == (run == level)  # only "+compiled" compiles
    for width in (2, 5, 7):
        assert np.array_equal(outputs[level, width], outputs[level.removesuffix("+compiled"), width]), width


@bitwise_forwards
@pytest.mark.parametrize(
    "arch, level", [("qwen3", "attention+linear/3+compiled"), ("qwen3_moe", "linear/2+experts/unsorted+compiled")]
)
def test_compiled_level_equals_serial_steps(arch, level):
    model = build_tiny(arch)
    rng = np.random.default_rng(2)
    cache = make_prompt_cache(model)
    model(mx.array(rng.integers(0, 97, 19))[None], cache=cache)
    tokens = mx.array(rng.integers(0, 97, 7))[None]
    serial = np.stack([np.array(model(tokens[:, i : i + 1], cache=cache)[0, 0]) for i in range(7)])
    for c in cache:
        c.trim(7)
    for width in (2, 5, 7):
        with exact_mode(model, level):
            out = np.array(model(tokens[:, :width], cache=cache)[0])
        for c in cache:
            c.trim(width)
        assert np.array_equal(out, serial[:width]), width


SECONDS = {"attention+linear/3": 2.0, "serial": 9.0}


def fake_probes(monkeypatch, compiled_seconds: float, compiled_exact: bool = True) -> None:
    """Probe timings from ``SECONDS`` (others 5 s, "+compiled" ``compiled_seconds``); "+compiled" levels
    reported inexact unless ``compiled_exact`` (other levels as the emulated device computes them)."""
    real_run = exact_calibration._Probes.run

    def run(self, level, width):
        exact, seconds = real_run(self, level, width)
        return exact and (compiled_exact or not ExactPlan.parse(level).compiled), seconds

    def timed(self, level, width, repeats):
        return compiled_seconds if ExactPlan.parse(level).compiled else SECONDS.get(level, 5.0)

    monkeypatch.setattr(exact_calibration._Probes, "run", run)
    monkeypatch.setattr(exact_calibration._Probes, "time", timed)


@pytest.mark.parametrize(
    "compiled_seconds, compiled_exact, measure, chosen",
    [
        (1.0, True, True, "attention+linear/3+compiled"),  # exact and cheaper: taken
        (3.0, True, True, "attention+linear/3"),  # dearer: kept plain
        (1.0, False, True, "attention+linear/3"),  # cheaper but not exact: kept plain
        (1.0, True, False, "attention+linear/3"),  # not measured: kept plain
    ],
)
def test_calibration_takes_compiled_chunks_only_where_exact_and_cheaper(
    monkeypatch, compiled_seconds, compiled_exact, measure, chosen
):
    emulate_gpu(monkeypatch, attention=True, linear_rows=3, vector=True)  # chunks of up to 3 rows are exact
    fake_probes(monkeypatch, compiled_seconds, compiled_exact)
    model = build_tiny("qwen3", num_hidden_layers=1)
    calibration = calibrate(model, [6], measure=measure, repeats=1)
    assert calibration.level_for(6) == chosen
    tested = {r["level"]: r for r in calibration.rows()}
    assert tested["attention+linear/3"]["exact"] is True
    compiled = tested["attention+linear/3+compiled"]
    assert compiled["exact"] is compiled_exact
    assert compiled["seconds"] == (compiled_seconds if compiled_exact and measure else None)
    exact_calibration._calibrations.clear()
    assert load_calibration(model).level_for(6) == chosen  # stored and read back


def test_calibration_tests_no_compiled_variant_without_linear_chunks(monkeypatch):
    emulate_gpu(monkeypatch, attention=True, linear_rows=1, vector=True)
    calibration = calibrate(build_tiny("qwen3", num_hidden_layers=1), [4], measure=False)
    assert calibration.level_for(4) == "attention+linear"
    assert not any(ExactPlan.parse(r["level"]).compiled for r in calibration.rows())


def test_exact_generation_runs_the_calibrated_compiled_chunks(monkeypatch):
    """No caller asks for compiling: the calibration picks "+compiled" and the decode loop's verifier runs it."""
    emulate_gpu(monkeypatch, attention=True, linear_rows=2)
    fake_probes(monkeypatch, compiled_seconds=1.0)
    monkeypatch.setitem(SECONDS, "attention+linear/2", 2.0)  # chunks of 2 rows: exact, and cheapest
    model = build_tiny("qwen3", seed=2)
    prompt = [3, 14, 15, 9, 26, 5, 35]
    truth = plain_greedy(model, prompt, 16)
    verifier = ExactVerifier(model, widths=range(2, 5))
    assert [verifier.level_for(w) for w in (2, 3, 4)] == ["attention", *["attention+linear/2+compiled"] * 2]
    exact_hooks._compiled_products.clear()
    drafter = ScriptedDrafter(truth, len(prompt), 97, wrong_at=lambda step, i: step % 3 == 1 and i == 1)
    gen = speculative_generate(
        model, prompt, GenerateOptions(max_tokens=16), drafter=drafter, policy=DraftPolicy.fixed(3)
    )
    assert list(gen) == truth
    assert any(r.verify_width > 2 for r in gen.log if r.kind == "verify")
    assert exact_hooks._compiled_products  # the verifications ran the compiled chunks


def test_calibration_stored_with_older_level_names_loads_unchanged():
    model = build_tiny("qwen3_moe", num_hidden_layers=1)
    key = calibration_key(model)
    levels = {2: "none", 3: "attention+linear/vector+experts/unsorted", 4: "attention+linear/3+experts", 5: "serial"}
    stored = {
        "key": key,
        "device": "cpu",
        "versions": {"mlx": "0.0"},
        "widths": {
            str(w): {"level": level, "tests": [{"level": level, "exact": True, "seconds": 0.01}], "lengths": [32]}
            for w, level in levels.items()
        },
    }
    path = exact_calibration._calibration_path(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(stored), encoding="utf-8")
    calibration = load_calibration(model)
    assert calibration is not None and calibration.to_json() == stored
    assert path.exists() and not list(path.parent.glob("*damaged*"))  # not set aside as damaged
    plans = exact_calibration.calibrated_plans(model)
    for w, level in levels.items():
        assert plans(w) == ExactPlan.parse(level) and not plans(w).compiled
