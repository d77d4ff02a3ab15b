"""Per-call verify timing: one forward's seconds, the cache trimmed back after every call."""

from __future__ import annotations

from conftest import build_tiny

from scripts.gpu import verify_calls as calls


def test_a_timed_call_leaves_the_cache_as_it_found_it():
    model = build_tiny("qwen3")
    cache = calls.filled_cache(model, 20)
    assert cache[0].offset == 20
    seconds = calls.time_call(model, cache, calls.random_rows(model, 5), None, repeats=3)
    assert seconds > 0 and cache[0].offset == 20
    assert calls.time_call(model, cache, calls.random_rows(model, 5), "none", repeats=2) > 0
    assert cache[0].offset == 20


def test_levels_are_timed_per_width_and_rows_name_each_part():
    model = build_tiny("llama")
    cache = calls.filled_cache(model, 12)
    seconds = calls.level_seconds(model, cache, ["fast", "none"], [1, 3], repeats=2, warmup=1)
    assert set(seconds) == {"fast", "none"} and all(set(per) == {1, 3} for per in seconds.values())
    assert cache[0].offset == 12
    said: list[str] = []
    rows = calls.verify_call_rows(model, "tiny", [1, 3], lambda w: "none", 2, 12, say=said.append)
    assert [r["width"] for r in rows] == [1, 3] and len(said) == 2
    assert "attention_split_s" not in rows[0] and {"attention_split_s", "linear_split_s"} <= set(rows[1])
    assert all(r["exact_over_fast"] == r["exact_s"] / r["fast_s"] for r in rows)
