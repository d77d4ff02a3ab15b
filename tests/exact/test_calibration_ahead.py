"""Calibration happens before the first token, reports progress, and concurrent writers merge;
linear layers are split into the widest exact chunks."""

from __future__ import annotations

import threading
import time

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from conftest import ScriptedDrafter, bitwise_forwards, build_tiny, emulate_gpu, plain_greedy
from mlx_lm.models.cache import make_prompt_cache

from specbench import GenerateOptions, speculative_generate
from specbench.core.policies import DraftPolicy
from specbench.exact import Calibration, WidthCalibration, exact_mode, load_calibration
from specbench.exact import calibration as exact_calibration
from specbench.exact.calibration import calibrate, chunk_sizes

PROMPT = [3, 14, 15, 9, 26, 5, 35]


@pytest.fixture
def counted(monkeypatch, fresh_calibrations):
    """How many widths have been calibrated so far."""
    calls: list[int] = []
    original = exact_calibration._calibrate_width

    def counting(probe, width, *args, **kwargs):
        calls.append(width)
        return original(probe, width, *args, **kwargs)

    monkeypatch.setattr(exact_calibration, "_calibrate_width", counting)
    return calls


def test_calibration_stops_at_the_drafters_longest_draft(counted, monkeypatch):
    """A policy that may ask for 16 tokens of a drafter that never drafts more than 3: widths 2..4 only."""
    emulate_gpu(monkeypatch, attention=True, linear_rows=3)
    model = build_tiny("qwen3", seed=2)
    ref = plain_greedy(model, PROMPT, 12)
    drafter = ScriptedDrafter(ref, len(PROMPT), 97)
    drafter.max_draft = 3
    gen = speculative_generate(
        model, PROMPT, GenerateOptions(max_tokens=12), drafter=drafter, policy=DraftPolicy.fixed(16), progress=None
    )
    assert sorted(counted) == [2, 3, 4]
    assert list(gen) == ref


def test_exact_generation_calibrates_every_width_before_the_first_token(counted, monkeypatch):
    emulate_gpu(monkeypatch, attention=True, linear_rows=3)
    model = build_tiny("qwen3", seed=2)
    ref = plain_greedy(model, PROMPT, 40)
    said: list[str] = []
    drafter = ScriptedDrafter(ref, len(PROMPT), 97, wrong_at=lambda step, i: step % 3 == 1 and i == 2)
    policy = DraftPolicy.auto(break_even=1.2, measured=True)
    gen = speculative_generate(
        model, PROMPT, GenerateOptions(max_tokens=40), drafter=drafter, policy=policy, progress=said.append
    )
    assert sorted(counted) == list(range(2, 10))  # every width Auto may verify (k <= 8)
    assert any("calibrating exact verification" in s for s in said) and any("width 9 runs" in s for s in said)
    before = len(counted)
    assert list(gen) == ref
    assert len(counted) == before  # nothing calibrated inside the timed generation
    assert {r.verify_width for r in gen.log if r.kind == "verify"} <= set(range(2, 10))
    # a second generation of the same model finds every width calibrated and says nothing
    said.clear()
    speculative_generate(
        model, PROMPT, GenerateOptions(max_tokens=4), drafter=drafter, policy=policy, progress=said.append
    )
    assert len(counted) == before and said == []


def test_fixed_policy_calibrates_only_its_widths(counted):
    model = build_tiny("llama")
    drafter = ScriptedDrafter(plain_greedy(model, PROMPT, 4), len(PROMPT), 97)
    speculative_generate(
        model, PROMPT, GenerateOptions(max_tokens=4), drafter=drafter, policy=DraftPolicy.fixed(3), progress=None
    )
    assert sorted(counted) == [2, 3, 4]


def test_concurrent_writers_merge_their_widths(fresh_calibrations, monkeypatch):
    model = build_tiny("llama")
    key = exact_calibration.calibration_key(model)
    original = exact_calibration.write_json_atomic

    def slow_write(path, data):  # widen the window between reading and writing the stored file
        time.sleep(0.05)
        return original(path, data)

    monkeypatch.setattr(exact_calibration, "write_json_atomic", slow_write)
    start = threading.Barrier(6)

    def writer(width: int) -> None:
        calibration = Calibration(key, "cpu", {}, {width: WidthCalibration(width, "none")})
        start.wait()
        exact_calibration._save(calibration)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(2, 8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    exact_calibration._calibrations.clear()
    assert sorted(load_calibration(model).widths) == list(range(2, 8))


def test_a_calibration_stopped_midway_keeps_the_widths_it_finished(counted, monkeypatch):
    model = build_tiny("llama")
    finished = exact_calibration._calibrate_width

    def stopped_at_four(probe, width, *args, **kwargs):
        if width == 4:
            raise KeyboardInterrupt  # a run's time limit, say
        return finished(probe, width, *args, **kwargs)

    monkeypatch.setattr(exact_calibration, "_calibrate_width", stopped_at_four)
    with pytest.raises(KeyboardInterrupt):
        calibrate(model, 5, measure=False)
    exact_calibration._calibrations.clear()  # a later process
    assert sorted(load_calibration(model).widths) == [2, 3]
    monkeypatch.setattr(exact_calibration, "_calibrate_width", finished)
    calibrate(model, 5, measure=False)
    assert sorted(load_calibration(model).widths) == [2, 3, 4, 5]
    assert counted == [2, 3, 4, 5]  # the second run calibrated only the widths the first left


def test_chunk_sizes_run_widest_first():
    assert chunk_sizes(9) == [8, 7, 6, 5, 4, 3, 2]
    assert chunk_sizes(2) == []


@bitwise_forwards
@pytest.mark.parametrize("rows", [8, 7, 4])
def test_linear_layers_split_into_the_widest_exact_chunks(fresh_calibrations, monkeypatch, rows):
    """With kernels row-invariant up to ``rows`` rows (a device emulated over one whose batched forwards are
    row-invariant), width 9 runs its linear layers in chunks of ``rows`` (two calls at 7, not three at 4),
    bit-identical to serial steps."""
    emulate_gpu(monkeypatch, attention=True, linear_rows=rows, vector=True)
    model = build_tiny("qwen3", seed=1)
    calibration = calibrate(model, [9], measure=False)
    assert calibration.level_for(9) == f"attention+linear/{rows}"
    tested = {r["level"]: r["exact"] for r in calibration.rows()}
    assert all(tested[f"attention+linear/{c}"] is False for c in range(rows + 1, 9))
    assert f"attention+linear/{rows - 1}" not in tested  # narrower chunks only add calls
    calls: list[int] = []
    original = nn.Linear.__dict__["__call__"]

    def spy(self, x, *args, **kwargs):
        calls.append(x.size // x.shape[-1])
        return original(self, x, *args, **kwargs)

    tokens = mx.array([PROMPT + [1, 2]])
    serial_cache = make_prompt_cache(model)
    serial = [np.array(model(tokens[:, i : i + 1], cache=serial_cache)[0, 0]) for i in range(9)]
    monkeypatch.setattr(nn.Linear, "__call__", spy)
    with exact_mode(model):
        out = model(tokens, cache=make_prompt_cache(model))
    chunks = [rows] * (9 // rows) + [9 % rows] * (9 % rows > 0)  # 7: [7, 2], two calls a layer
    assert calls == chunks * (len(calls) // len(chunks))
    assert np.array_equal(np.array(out[0]), np.stack(serial))


class _ScriptedProbe:
    """A calibration probe whose levels are exact where ``exact(level)`` says, each costing ``seconds``."""

    def __init__(self, exact):
        self.exact, self.timed = exact, []

    def run(self, level, width):
        return self.exact(level), 0.0

    def time(self, level, width, repeats):
        self.timed.append(level)
        return 1.0 + level.count("+") + (5.0 if level == "serial" else 0.0)


def test_an_exact_batched_family_ends_its_search_and_serial_steps_are_timed_only_against_kernels():
    """Where only attention differs across rows, the linear layers' batched call is exact: their split schemes
    (MLX's calls in smaller pieces, never cheaper) are not tested. Serial steps are timed against a pick through
    the kernels only: a split through MLX's own calls runs no op in smaller pieces than serial steps do."""
    probe = _ScriptedProbe(lambda level: level not in ("none", "linear"))
    picked = exact_calibration._calibrate_width(probe, 5, moe=False, measure=True, repeats=1)
    assert picked.level == "attention"
    assert [t["level"] for t in picked.tests] == ["none", "linear", "attention"]
    assert "serial" not in probe.timed
    # where the linear layers must be split too, their schemes are searched
    probe = _ScriptedProbe(lambda level: level not in ("none", "linear", "attention"))
    picked = exact_calibration._calibrate_width(probe, 5, moe=False, measure=True, repeats=1)
    assert picked.level == "attention+linear/vector"  # the first of the schemes that cost the same
    assert {"attention+linear/vector", "attention+linear/4"} <= {t["level"] for t in picked.tests}
    assert "serial" not in probe.timed
    # a pick through the kernels is timed against serial steps, and loses to them where they are cheaper
    probe = _ScriptedProbe(lambda level: "kernel" in level or level == "serial")
    probe.time = lambda level, width, repeats: {"serial": 2.0}.get(level, 9.0)
    picked = exact_calibration._calibrate_width(probe, 5, moe=False, measure=True, repeats=1, kernel=True)
    assert picked.level == "serial"


def test_a_probe_prefills_a_long_prefix_in_chunks(monkeypatch):
    """A probe's prefix runs in forwards of at most ``PREFILL_CHUNK`` tokens (one forward of 16k tokens ran an H100
    out of memory), and its cache ends holding every prefix token."""
    model = build_tiny("llama")
    monkeypatch.setattr(exact_calibration, "PREFILL_CHUNK", 8)
    widths: list[int] = []
    call = type(model).__call__
    monkeypatch.setattr(type(model), "__call__", lambda self, x, **k: widths.append(x.shape[1]) or call(self, x, **k))
    probe = exact_calibration._Probe(model, 21, 3, np.random.default_rng(0))
    assert widths[:3] == [8, 8, 5] and all(w == 1 for w in widths[3:])  # the prefix, then 3 serial reference steps
    assert probe.reference.shape[0] == 3 and probe.cache[0].offset == 21


def test_probes_at_several_lengths_share_one_prefill(monkeypatch):
    """Probes at 5, 12 and 21 cached tokens: the longest is prefilled (in chunks) and the shorter ones start from its
    first rows, each with its own serial reference steps from its own cache."""
    model = build_tiny("llama")
    monkeypatch.setattr(exact_calibration, "PREFILL_CHUNK", 8)
    widths: list[int] = []
    call = type(model).__call__
    monkeypatch.setattr(type(model), "__call__", lambda self, x, **k: widths.append(x.shape[1]) or call(self, x, **k))
    probes = exact_calibration._Probe.at(model, [5, 12, 21], 3, np.random.default_rng(0))
    assert widths == [8, 8, 5] + [1] * 9  # one prefill; 3 reference steps per probe
    assert [p.offset for p in probes] == [5, 12, 21] and [p.cache[0].offset for p in probes] == [5, 12, 21]
    longest = probes[-1].saved[0][0]
    for probe in probes[:-1]:
        assert mx.array_equal(probe.saved[0][0], longest[..., : probe.offset, :])
        assert probe.reference.shape[0] == 3 and not np.array_equal(probe.reference, probes[-1].reference)


def test_where_the_kernels_are_tried_the_batched_forward_is_timed_and_fast_mode_takes_the_cheaper():
    """Fast mode takes a width's exact level where calibration timed it at most FASTER_BY of the batched forward;
    the batched forward is timed only where the kernels are tried (elsewhere no exact level is cheaper)."""
    probe = _ScriptedProbe(lambda level: "kernel" in level or level == "serial")
    probe.time = lambda level, width, repeats: probe.timed.append(level) or {"none": 3.0, "serial": 9.0}.get(level, 2.0)
    picked = exact_calibration._calibrate_width(probe, 5, moe=False, measure=True, repeats=1, kernel=True)
    assert "kernel" in picked.level and probe.timed[0] == "none"
    assert picked.fast_level == picked.level  # 2.0 s against the batched forward's 3.0
    probe.timed.clear()
    probe.time = lambda level, width, repeats: probe.timed.append(level) or {"none": 2.0, "serial": 9.0}.get(level, 2.0)
    picked = exact_calibration._calibrate_width(probe, 5, moe=False, measure=True, repeats=1, kernel=True)
    assert picked.fast_level == "none"  # a tie keeps MLX's batched forward
    probe.timed.clear()
    picked = exact_calibration._calibrate_width(probe, 5, moe=False, measure=True, repeats=1)
    assert "none" not in probe.timed and picked.fast_level == "none"


def test_fast_mode_runs_the_exact_level_at_the_widths_where_it_is_cheaper(fresh_calibrations, monkeypatch):
    """Where the kernels run, ``verifier_for(model, "fast")`` is a FastVerifier: at a width whose stored calibration
    timed the exact level cheaper than the batched forward, its verification computes every row as serial steps do;
    at other widths, and past the cache lengths a width was probed at, it is MLX's batched forward."""
    from specbench.exact import FastVerifier, calibration_key, verifier_for
    from specbench.exact import verifier as exact_verifier

    model = build_tiny("llama")
    emulate_gpu(monkeypatch)  # batched forwards differ from serial steps
    assert verifier_for(model, "fast") is not None and not isinstance(verifier_for(model, "fast"), FastVerifier)
    monkeypatch.setattr(exact_verifier, "uses_kernel", lambda model: True)
    cheaper = [{"level": "none", "exact": False, "seconds": 2.0}, {"level": "serial", "exact": True, "seconds": 1.0}]
    dearer = [{"level": "none", "exact": False, "seconds": 1.0}, {"level": "serial", "exact": True, "seconds": 2.0}]
    exact_calibration._calibrations[calibration_key(model)] = Calibration(
        calibration_key(model),
        "test",
        {},
        {4: WidthCalibration(4, "serial", cheaper, [32]), 3: WidthCalibration(3, "serial", dearer, [32])},
    )
    verifier = verifier_for(model, "fast")
    assert isinstance(verifier, FastVerifier) and verifier.mode == "fast"

    def verified(width: int, cached: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        tokens = mx.array([(PROMPT * 8)[: cached + width]])
        cache = make_prompt_cache(model)
        model(tokens[:, :cached], cache=cache)
        serial_cache = make_prompt_cache(model)
        model(tokens[:, :cached], cache=serial_cache)
        serial = np.stack(
            [np.array(model(tokens[:, cached + i : cached + i + 1], cache=serial_cache)[0, 0]) for i in range(width)]
        )
        batch_cache = make_prompt_cache(model)
        model(tokens[:, :cached], cache=batch_cache)
        batched = np.array(model(tokens[:, cached:], cache=batch_cache)[0])
        with verifier.running():
            got = np.array(verifier.forward(model, tokens[:, cached:], cache)[0])
        return got, serial, batched

    got, serial, batched = verified(4, 8)
    assert np.array_equal(got, serial) and not np.array_equal(serial, batched)
    got, serial, batched = verified(3, 8)  # the batched forward was cheaper at width 3
    assert np.array_equal(got, batched) and not np.array_equal(got, serial)
    got, serial, batched = verified(4, 40)  # past the 32 cached tokens width 4 was probed at
    assert np.array_equal(got, batched)


def test_fast_mode_where_the_kernels_run_calibrates_its_widths_before_the_first_token(counted, monkeypatch):
    """A fast generation through a FastVerifier calibrates the widths its policy may verify up front, as exact mode
    does, and verifies at the widths whose exact level was timed cheaper through that level."""
    from specbench.exact import verifier as exact_verifier

    monkeypatch.setattr(exact_verifier, "uses_kernel", lambda model: True)
    model = build_tiny("llama")
    ref = plain_greedy(model, PROMPT, 8)
    gen = speculative_generate(
        model,
        PROMPT,
        GenerateOptions(max_tokens=8, verify="fast"),
        drafter=ScriptedDrafter(ref, len(PROMPT), 97),
        policy=DraftPolicy.fixed(3),
        progress=None,
    )
    assert sorted(counted) == [2, 3, 4]
    before = len(counted)
    assert len(list(gen)) == 8 and len(counted) == before


def test_where_the_batched_forward_is_exact_the_linear_kernels_are_taken_where_cheaper():
    """MLX's products below 8 rows read the weights once per row, the kernels once for all rows: where the batched
    forward is exact and the kernels are tried, ``linear/kernel`` (attention batched) is timed against it and taken
    where it costs at most FASTER_BY of it; without the kernels the batched forward ends the search untimed."""
    probe = _ScriptedProbe(lambda level: True)
    probe.time = lambda level, width, repeats: probe.timed.append(level) or {"none": 3.0}.get(level, 2.0)
    picked = exact_calibration._calibrate_width(probe, 3, moe=False, measure=True, repeats=1, kernel=True)
    assert picked.level == "linear/kernel" and probe.timed == ["none", "linear/kernel"]
    assert picked.fast_level == "linear/kernel"
    probe.time = lambda level, width, repeats: {"none": 2.0}.get(level, 2.0)
    picked = exact_calibration._calibrate_width(probe, 3, moe=False, measure=True, repeats=1, kernel=True)
    assert picked.level == "none" and picked.fast_level == "none"  # a tie keeps MLX's batched forward
    probe.timed.clear()
    probe.time = lambda level, width, repeats: probe.timed.append(level) or 1.0
    picked = exact_calibration._calibrate_width(probe, 3, moe=False, measure=True, repeats=1)
    assert picked.level == "none" and probe.timed == [] and [t["level"] for t in picked.tests] == ["none"]
