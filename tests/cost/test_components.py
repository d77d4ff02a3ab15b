"""Verify cost by component: the forward split by subtraction and the stack of a speculative step."""

from __future__ import annotations

import gc

import mlx.core as mx
import numpy as np
import pytest

from specbench.core.forward import prefill
from specbench.cost.components import (
    ENGINE_PARTS,
    FORWARD_PARTS,
    PARTS,
    PHASES,
    WAIT,
    _cache_state,
    component_of,
    deciding_part,
    forward_components,
    forward_with_stand_ins,
    measure_components,
    phase_stack,
    record_forward,
)
from specbench.cost.timing import CacheRestore, rollback_for
from specbench.models import synthetic

CONTEXT = list(range(3, 40))


@pytest.fixture(scope="module", params=["qwen3-8b-tiny", "qwen3-30b-a3b-tiny", "qwen3.5-9b-tiny"])
def shape(request):
    return request.param, synthetic.build(request.param)


def _classes(model):
    return {id(m): type(m) for _, m in model.named_modules()}


def test_a_forward_with_any_component_stood_in_for_gives_the_same_logits_and_puts_every_class_back(shape):
    name, model = shape
    classes = _classes(model)
    tokens = mx.array([[5, 6, 7]], dtype=mx.uint32)
    cache = prefill(model, CONTEXT)
    restore, rollback = CacheRestore(cache), rollback_for(model, cache)
    expected = model(tokens, cache=cache)
    mx.eval(expected)
    restore()
    sites, recorded = record_forward(model, cache, tokens, restore, rollback)
    components = {s.component for s in sites}
    assert components == {"attention", "linear", "lm_head"} | ({"experts"} if "a3b" in name else set()) | (
        {"recurrent"} if "3.5" in name else set()
    )
    assert mx.array_equal(expected, recorded)
    for stood in [(), *((c,) for c in sorted(components)), tuple(components)]:
        timing, logits = forward_with_stand_ins(model, cache, tokens, restore, sites, stood, rollback)
        assert timing.seconds > 0 and mx.array_equal(expected, logits), stood
        assert _classes(model) == classes and all(c.offset == len(CONTEXT) for c in cache if c.is_trimmable())
    assert "as_linear" not in model.model.embed_tokens.__dict__


def test_the_timed_forward_counts_the_state_it_leaves_in_the_cache(shape):
    """The next step reads what a forward leaves in the cache, recurrent states included (which the logits do not
    need): the timed forward evaluates them, as the engine's step does."""
    name, model = shape
    cache = prefill(model, CONTEXT)
    leaves = _cache_state(cache)
    recurrent = [e for e in cache if not e.is_trimmable()]
    assert len(leaves) == 2 * len(cache)  # keys and values, or convolution and recurrent states
    assert bool(recurrent) == ("3.5" in name)
    assert all(any(leaf is a for leaf in leaves) for e in recurrent for a in e.cache)


def _head_heavy_model():
    """A tiny model whose output head (tied, over a large vocabulary) costs more than the rest of it."""
    cfg = synthetic.config("qwen3-8b-tiny") | {"vocab_size": 1 << 16, "hidden_size": 256, "tie_word_embeddings": True}
    return synthetic.build_from_config(cfg, dtype=mx.float32)


def test_a_stood_in_tied_head_gives_the_same_logits():
    model = _head_heavy_model()
    tokens = mx.array([[5, 6]], dtype=mx.uint32)
    cache = prefill(model, CONTEXT)
    restore = CacheRestore(cache)
    sites, expected = record_forward(model, cache, tokens, restore)
    assert [s.component for s in sites if s.module is None] == ["lm_head"]  # the embedding's as_linear
    _, logits = forward_with_stand_ins(model, cache, tokens, restore, sites, ("lm_head",))
    assert mx.array_equal(expected, logits)
    assert "as_linear" not in model.model.embed_tokens.__dict__


def test_the_subtracted_components_add_up_to_the_forward_and_the_dominant_one_is_largest():
    model = _head_heavy_model()
    cache = prefill(model, CONTEXT)
    split = forward_components(model, cache, mx.array([[5, 6, 7, 8]], dtype=mx.uint32), CacheRestore(cache), 9)
    assert set(split.parts) == set(FORWARD_PARTS) and all(s >= 0 for s in split.parts.values())
    # the forward's dominant part is its largest (the readback, after the forward, is not one of its parts: on a busy
    # machine the argmax's read of the 64k-wide logits has outweighed the head's subtracted share)
    inside = [part for part in split.parts if part != "readback"]
    assert max(inside, key=split.parts.__getitem__) == "lm_head"
    assert split.parts["experts"] == split.parts["recurrent"] == 0
    # the small parts (attention, linear) may read 0 on a busy machine: subtractions below zero count 0
    assert split.parts["other"] > 0 and split.parts["attention"] + split.parts["linear"] < split.parts["lm_head"]
    assert split.forward_s > split.parts["lm_head"]
    forward = sum(split.parts.values()) - split.parts["readback"]
    assert split.closure == pytest.approx(forward / split.forward_s - 1)
    assert abs(split.closure) < 0.5  # loose: the machine may be busy
    assert all(c.offset == len(CONTEXT) for c in cache if c.is_trimmable())  # put back
    # the phases: the head-heavy forward's time is mostly the device's (here the CPU's) work, not the build
    assert set(split.phases) == set(PHASES) and set(split.phase_closure) == set(PHASES)
    assert all(s >= 0 for s in split.phases.values())
    assert sum(split.phases.values()) == pytest.approx(split.forward_s, rel=0.5)
    assert split.phases["dispatch"] + split.phases["wait"] > split.phases["build"]
    assert split.collections >= 0
    # each component's subtraction within each phase, the skeleton as "other": they make up the phase closures
    assert set(split.part_phases) == {"attention", "linear", "lm_head", "other"}
    for phase in PHASES:
        total = sum(split.part_phases[c][phase] for c in split.part_phases)
        assert split.phase_closure[phase] == pytest.approx(total / split.phases[phase] - 1)


def test_a_timed_forward_reports_its_phases_and_the_garbage_collections_inside():
    model = _head_heavy_model()
    cache = prefill(model, CONTEXT)
    restore = CacheRestore(cache)
    tokens = mx.array([[5, 6, 7]], dtype=mx.uint32)
    sites, _ = record_forward(model, cache, tokens, restore)
    gc.collect()
    thresholds = gc.get_threshold()
    gc.set_threshold(1)  # a collection at every allocation: the timed forward must count some
    try:
        timing, _ = forward_with_stand_ins(model, cache, tokens, restore, sites, ())
    finally:
        gc.set_threshold(*thresholds)
    assert all(getattr(timing, p) >= 0 for p in PHASES)  # the phases the split reads, each timed
    assert sum(getattr(timing, p) for p in PHASES) == pytest.approx(timing.seconds) and timing.seconds > 0
    assert timing.collections > 0 and timing.answered == 0


def test_every_variant_answers_the_same_stood_in_calls_nested_ones_included(shape):
    """A projection nested in an attention is answered whether the attention runs (only projections stand in) or
    stands in too (the skeleton): each variant pays the same stand-in calls, so the subtractions add up."""
    _, model = shape
    cache = prefill(model, CONTEXT)
    restore, rollback = CacheRestore(cache), rollback_for(model, cache)
    tokens = mx.array([[5, 6, 7]], dtype=mx.uint32)
    sites, _ = record_forward(model, cache, tokens, restore, rollback)
    present = sorted({s.component for s in sites})
    calls = {c: sum(len(s.calls) for s in sites if s.component == c) for c in present}
    for stood in [(c,) for c in present] + [tuple(present)]:
        timing, _ = forward_with_stand_ins(model, cache, tokens, restore, sites, stood, rollback)
        assert timing.answered == sum(calls[c] for c in stood), stood


def test_only_the_moe_block_and_its_expert_gathers_count_as_experts():
    model = synthetic.build("qwen3-30b-a3b-tiny")
    kinds = {type(m).__name__: component_of(m) for _, m in model.named_modules()}
    assert kinds["Qwen3MoeSparseMoeBlock"] == ("experts", False) and kinds["SwitchGLU"] == ("experts", True)
    assert kinds["Qwen3MoeDecoderLayer"] is None and kinds["Qwen3MoeModel"] is None
    assert kinds["Attention"] == ("attention", False) and kinds["Linear"] == ("linear", True)


def test_the_stack_of_a_speculative_step_holds_every_part_and_says_how_far_off_it_is():
    model = synthetic.build("qwen3-30b-a3b-tiny")
    rows = measure_components(model, widths=(1, 3), offset=16, repeats=2, steps=3, forward_repeats=5)
    assert [r["part"] for r in rows] == list(PARTS) * 2
    wide = [r for r in rows if r["width"] == 3]
    assert all(r["seconds"] >= 0 for r in wide)
    assert all(r["seconds"] > 0 for r in wide if r["part"] in ("other", "readback", "drafting", "logging"))
    assert sum(r["seconds"] for r in wide if r["part"] in ("attention", "linear", "experts", "lm_head")) > 0
    assert all(r["seconds"] == 0 for r in rows if r["width"] == 1 and r["part"] in ENGINE_PARTS)
    for r in rows:
        assert np.isfinite(r["error"]) and r["error"] > -1
        assert r["c"] == pytest.approx(r["seconds"] / r["plain_step_s"])
        assert r["forward_s"] > 0 and np.isfinite(r["closure"]) and r["closure"] > -1
        assert 0 <= r["step_spread"] < 10  # the whole steps' interquartile range over their median
        assert all(r[f"forward_{p}_s"] >= 0 and np.isfinite(r[f"{p}_closure"]) for p in PHASES)
        # counted by phase: a forward component's host work; readback and the engine's parts as timed
        assert r["host_s"] >= 0
        if r["part"] in ("readback", *ENGINE_PARTS):
            assert r["host_s"] == r["seconds"]
    assert all(r["host_s"] == 0 for r in rows if r["part"] == "recurrent")  # none in this shape
    assert phase_stack(rows) is None  # a CPU's host does the device's work: its stack is drawn as measured


def test_the_deciding_part_is_the_one_that_grows_most():
    rows = [
        {"width": w, "part": p, "seconds": s}
        for w, parts in ((1, {"linear": 1.0, "attention": 0.5}), (5, {"linear": 1.2, "attention": 2.5}))
        for p, s in parts.items()
    ]
    part, share = deciding_part(rows)
    assert part == "attention" and share == pytest.approx(2.0 / 2.2)
    with pytest.raises(ValueError, match="two widths"):
        deciding_part(rows[:2])


def test_the_verdict_names_the_deciding_part_and_calls_a_loose_split_rough():
    from specbench.report.verdicts.components import deciding_parts

    rows = [{"width": w, "part": "linear", "seconds": s, "error": e} for w, s, e in ((1, 1.0, 0.05), (5, 3.0, 0.08))]
    assert "linear decides: 100%" in deciding_parts({"m": rows}) and "within 8%" in deciding_parts({"m": rows})
    rows[1]["error"] = -0.5
    assert "miss the measured step by up to 50%" in deciding_parts({"m": rows})
    assert deciding_parts({"m": rows[:1]}) == ""
    for r, closure in zip(rows, (0.03, -0.06)):
        r["closure"] = closure
    text = deciding_parts({"m": rows})
    assert "subtracted from the whole forward, add up to it within 6%" in text and "by up to 50%" in text


def test_a_miss_within_the_steps_own_spread_is_called_inconclusive():
    from specbench.report.verdicts.components import deciding_parts

    rows = [{"width": w, "part": "linear", "seconds": s, "error": e} for w, s, e in ((1, 1.0, 0.05), (5, 3.0, -0.16))]
    for r in rows:
        r["step_spread"] = 0.08
    assert "rough" in deciding_parts({"m": rows}) and "inconclusive" not in deciding_parts({"m": rows})
    rows[1]["step_spread"] = 0.2  # the measured step itself spread wider than the miss
    text = deciding_parts({"m": rows})
    assert "by up to 16%, within the measured step's own spread (20%" in text and "inconclusive at this noise" in text


def _phased(width, error, build, dispatch, wait, build_closure, dispatch_closure):
    return {
        "width": width,
        "part": PARTS[0],
        "device": "gpu:test",
        "seconds": width * 1e-3,
        "error": error,
        "forward_s": build + dispatch + wait,
        "step_s": build + dispatch + wait,
        "forward_build_s": build,
        "forward_dispatch_s": dispatch,
        "forward_wait_s": wait,
        "build_closure": build_closure,
        "dispatch_closure": dispatch_closure,
    }


def test_the_phases_say_what_sets_the_pace_and_where_a_miss_lies():
    from specbench.cost.components import phase_reading
    from specbench.report.verdicts.components import deciding_parts

    # as measured on the H200 for the hybrid shape: the host builds and dispatches, the device hardly waits
    host_bound = [_phased(1, -0.18, 4.0, 8.4, 1.2, -0.15, -0.06), _phased(16, -0.34, 22.5, 59.5, 1.3, -0.03, -0.07)]
    reading = phase_reading(host_bound)
    assert reading[1]["wait_share"] == pytest.approx(1.2 / 13.6)
    assert reading[1]["host_closure"] == pytest.approx((4.0 * 0.85 + 8.4 * 0.94) / 12.4 - 1)
    text = deciding_parts({"m": host_bound})
    assert "wait 2%-9% of their time for the device (host-bound" in text
    assert "host's phases alone add up within 9%" in text and "moving the bottleneck" in text
    # counted by phase: each part's host work, the wait whole, readback and the engine's parts, against the step
    assert reading[1]["phase_error"] == pytest.approx((4.0 * 0.85 + 8.4 * 0.94 + 1.2) / 13.6 - 1)
    assert "Counted by phase" in text and "the step's parts add up to the measured step within 8%" in text
    engine = {"width": 16, "part": "rollback", "seconds": 6.0, "device": "gpu:test"}
    host_bound[1]["step_s"] += 6.0  # the engine's rollback is in the measured step: counted, it closes as before
    assert phase_reading([*host_bound, engine])[16]["phase_error"] == pytest.approx(
        (22.5 * 0.97 + 59.5 * 0.93 + 1.3 + 6.0) / 89.3 - 1
    )
    assert phase_reading(host_bound)[16]["phase_error"] == pytest.approx((22.5 * 0.97 + 59.5 * 0.93 + 1.3) / 89.3 - 1)
    # the host's phases missing too: no such claim, the count by phase still given
    host_bound[1]["build_closure"] = -0.4
    assert "moving the bottleneck" not in deciding_parts({"m": host_bound})
    assert "Counted by phase" in deciding_parts({"m": host_bound})
    for r in host_bound:  # parts within 10 % of the step: nothing to explain
        r["error"] = 0.05
    assert "Counted by phase" not in deciding_parts({"m": host_bound})
    # a device that waits most of the time
    device_bound = [_phased(1, 0.02, 1.0, 1.0, 8.0, 0, 0), _phased(4, 0.03, 1.0, 1.0, 20.0, 0, 0)]
    assert "(device-bound" in deciding_parts({"m": device_bound})
    turns = [_phased(1, 0.02, 1.7, 3.2, 4.0, 0, 0), _phased(4, 0.03, 3.8, 9.8, 1.0, 0, 0)]
    assert "take turns" in deciding_parts({"m": turns})
    # the stack counted by phase: each part's host work and the wait apart, with the drawn sum against the step
    for r in turns:
        r.update(host_s=r["forward_build_s"] + r["forward_dispatch_s"], plain_step_s=2.0)  # its closures are 0
    engine = [{**turns[i], "part": "rollback", "seconds": 0.5, "host_s": 0.5} for i in (0, 1)]
    counted = phase_stack([*turns, *engine])
    assert [(r["width"], r["part"]) for r in counted] == [(w, p) for w in (1, 4) for p in (PARTS[0], "rollback", WAIT)]
    wait = {r["width"]: r for r in counted if r["part"] == WAIT}
    assert wait[4]["seconds"] == 1.0 and wait[4]["c"] == 0.5
    assert wait[1]["error"] == pytest.approx((1.7 + 3.2 + 0.5 + 4.0) / 8.9 - 1)  # phase_reading's phase_error
    assert phase_stack(turns[:1] + [{k: v for k, v in turns[1].items() if k != "host_s"}]) is None  # an older run
    for r in turns:  # a CPU's: its host does the device's work too
        r["device"] = "cpu:test"
    assert "for the device" not in deciding_parts({"m": turns}) and phase_reading(turns) is not None
    for r in turns:  # rows of a run before the phases were timed
        del r["forward_wait_s"]
    assert phase_reading(turns) is None and "for the device" not in deciding_parts({"m": turns})
