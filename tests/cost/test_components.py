"""Verify cost by component: the instrumented forward and the stack of a speculative step."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from specbench.cost.caches import CacheRestore, prefill
from specbench.cost.components import (
    ENGINE_PARTS,
    FORWARD_PARTS,
    PARTS,
    component_of,
    deciding_part,
    forward_components,
    instrumented,
    measure_components,
)
from specbench.models import synthetic

CONTEXT = list(range(3, 40))


@pytest.fixture(scope="module", params=["qwen3-8b-tiny", "qwen3-30b-a3b-tiny", "qwen3.5-9b-tiny"])
def shape(request):
    return request.param, synthetic.build(request.param)


def test_instrumented_forward_equals_the_plain_one_and_puts_every_class_back(shape):
    _, model = shape
    classes = {id(m): type(m) for _, m in model.named_modules()}
    tokens = mx.array([[5, 6, 7]], dtype=mx.uint32)
    cache = prefill(model, CONTEXT)
    restore = CacheRestore(cache)
    expected = model(tokens, cache=cache)
    mx.eval(expected)
    restore()
    with instrumented(model) as clock:
        got = model(tokens, cache=cache)
    restore()
    assert mx.array_equal(expected, got)
    assert {id(m): type(m) for _, m in model.named_modules()} == classes
    assert sum(clock.seconds.values()) > 0


def test_only_the_moe_block_and_its_expert_gathers_count_as_experts():
    model = synthetic.build("qwen3-30b-a3b-tiny")
    kinds = {type(m).__name__: component_of(m) for _, m in model.named_modules()}
    assert kinds["Qwen3MoeSparseMoeBlock"] == ("experts", False) and kinds["SwitchGLU"] == ("experts", True)
    assert kinds["Qwen3MoeDecoderLayer"] is None and kinds["Qwen3MoeModel"] is None
    assert kinds["Attention"] == ("attention", False) and kinds["Linear"] == ("linear", True)


def test_each_shape_spends_time_in_its_own_components(shape):
    name, model = shape
    cache = prefill(model, CONTEXT)
    seconds = forward_components(model, cache, mx.array([[5, 6, 7, 8]], dtype=mx.uint32), CacheRestore(cache))
    assert set(seconds) == set(FORWARD_PARTS)
    assert all(s >= 0 for s in seconds.values())
    assert seconds["linear"] > 0 and seconds["lm_head"] > 0 and seconds["attention"] > 0
    assert (seconds["experts"] > 0) == ("a3b" in name)
    assert (seconds["recurrent"] > 0) == ("3.5" in name)
    assert all(c.offset == len(CONTEXT) for c in cache if c.is_trimmable())  # put back


def test_the_stack_of_a_speculative_step_holds_every_part_and_says_how_far_off_it_is():
    model = synthetic.build("qwen3-30b-a3b-tiny")
    rows = measure_components(model, widths=(1, 3), offset=16, repeats=2, steps=3)
    assert [r["part"] for r in rows] == list(PARTS) * 2
    wide = [r for r in rows if r["width"] == 3]
    assert all(r["seconds"] >= 0 for r in wide)
    assert all(r["seconds"] > 0 for r in wide if r["part"] in ("linear", "experts", "drafting", "logging"))
    assert all(r["seconds"] == 0 for r in rows if r["width"] == 1 and r["part"] in ENGINE_PARTS)
    for r in rows:
        assert np.isfinite(r["error"]) and r["error"] > -1
        assert r["c"] == pytest.approx(r["seconds"] / r["plain_step_s"])


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
