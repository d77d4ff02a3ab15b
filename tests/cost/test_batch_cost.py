"""Cost along the batch: c(w, B) profiles, break-even a*(k, B), predictions, the measured grid and the
batch benchmark against mlx-lm."""

from __future__ import annotations

import functools
import math
import statistics
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import build_tiny

from specbench.bench.batch_bench import bench_batch, format_batch_bench
from specbench.cost.batch import BatchProfile, measure_batch_overhead, measure_batch_profile
from specbench.cost.breakeven import expected_tokens
from specbench.cost.grid import batch_speedup_grid
from specbench.cost.predict import noise_floor, predicted_batch_seconds


def made_profile() -> BatchProfile:
    return BatchProfile(
        "m",
        "cpu",
        64,
        {1: [1.0, 1.1, 1.2, 1.3], 4: [1.0, 1.5, 2.0, 2.5], 16: [1.0, 2.0, 3.0, 4.0]},
        {1: 0.01, 4: 0.012, 16: 0.02},
    )


def test_profile_math():
    p = made_profile()
    assert p.c(3, 4) == 2.0
    assert p.c(3, 8) == pytest.approx(2.5)  # halfway in log B between 4 and 16
    with pytest.raises(ValueError, match="outside"):
        p.curve(32)
    a_star = p.break_even_acceptance(16, max_k=3)
    assert np.isnan(a_star[2]) or expected_tokens(a_star[2], 3) == pytest.approx(4.0, rel=1e-6)
    assert expected_tokens(a_star[0], 1) == pytest.approx(2.0, rel=1e-6)  # c(2, 16) = 2: a* = 1
    assert p.break_even_acceptance(1, max_k=3)[0] < p.break_even_acceptance(4, max_k=3)[0]
    pred = p.predicted([1.0, 0.0], 2, 4)
    assert pred["latency"] == pytest.approx([3 / 2.0, 1 / 2.0])
    assert pred["throughput"] == pytest.approx(1.0)
    assert p.break_even_tokens(2, 4, d=0.1) == pytest.approx(2.2)
    again = BatchProfile.from_dict(p.to_dict())
    assert again.costs == p.costs and again.plain_s == p.plain_s
    assert p.to_polars().height == 12
    auto = p.auto_policy(max_k=3)
    auto.start(None)
    assert auto.costs.lengths == [1, 2, 3]  # batch 1: c(k + 1, 1) < k + 1
    auto.set_batch_size(64)  # past the profile: its largest size, where c(k + 1) = k + 1 never pays
    assert auto.costs.lengths == [] and auto.k == 0


def test_batch_cache_is_filled_in_chunks(monkeypatch):
    """The cache a profile times is filled in chunks of at most PREFILL_TOKENS tokens (a kernel grid axis
    on CUDA holds at most 65535 routed tokens), and holds what one prompt pass would have written."""
    import mlx.core as mx

    from specbench.cost import batch

    model = build_tiny("qwen3_moe")
    whole = batch._batch_cache(model, 3, 10, np.random.default_rng(1))
    monkeypatch.setattr(batch, "PREFILL_TOKENS", 7)  # chunks of 2 tokens for 3 rows
    widths = []
    forward = type(model).__call__
    monkeypatch.setattr(type(model), "__call__", lambda self, x, **k: widths.append(x.shape) or forward(self, x, **k))
    chunked = batch._batch_cache(model, 3, 10, np.random.default_rng(1))
    assert widths == [(3, 2)] * 5
    for a, b in zip(whole, chunked):
        assert a.offset.tolist() == b.offset.tolist() == [10, 10, 10]
        assert mx.allclose(a.keys[..., :10, :], b.keys[..., :10, :], atol=1e-5).item()


def test_measured_profile_and_grid_on_moe():
    model = build_tiny("qwen3_moe")
    profile = measure_batch_profile(model, (1, 2), widths=3, offset=8, repeats=1, warmup=1)
    assert profile.batch_sizes == [1, 2] and all(len(c) == 3 and c[0] == 1.0 for c in profile.costs.values())
    assert all(math.isfinite(v) and v > 0 for c in profile.costs.values() for v in c)
    experts = {(r["batch_size"], r["width"]): r["distinct_experts"] for r in profile.experts}
    assert set(experts) == {(b, w) for b in (1, 2) for w in (1, 2, 3)}
    assert all(2 <= e <= 8 for e in experts.values())  # top-2 of 8 experts
    assert experts[(2, 3)] >= experts[(1, 1)]
    with pytest.raises(ValueError, match="measures fast forwards only"):
        measure_batch_profile(model, (1,), verify="exact")
    with pytest.raises(ValueError, match="names no batch size"):
        measure_batch_profile(model, ())
    rows = batch_speedup_grid(model, profile, (2,), (1.0, 0.0), (2,), prompt_len=6, max_tokens=8)
    full, none = rows
    assert full["acceptance_measured"] == 1.0 and none["acceptance_measured"] == 0.0
    assert full["predicted"] == pytest.approx(3 / profile.c(3, 2))
    assert all(r["measured"] > 0 and r["diverged"] == 0 for r in rows)
    assert all(r["predicted_from_log"] > 0 and r["residual"] == pytest.approx(r["error_from_log"]) for r in rows)
    assert {r["verify"] for r in rows} == {"fast"}
    (exact,) = batch_speedup_grid(model, profile, (2,), (0.5,), (2,), prompt_len=6, max_tokens=8, verify="exact")
    assert exact["verify"] == "exact" and exact["diverged"] == 0 and exact["measured"] > 0


@pytest.mark.parametrize("acceptances", [(float("nan"),), (1.0, 2.0), (-1e-9,)])
def test_batch_grid_refuses_an_acceptance_outside_0_1_before_any_model_work(acceptances, monkeypatch):
    import specbench.cost.grid as grid

    def fail(*args, **kwargs):
        pytest.fail("the batch grid ran the model before checking its acceptances")

    monkeypatch.setattr(grid, "generate_batch", fail)
    with pytest.raises(ValueError, match="a grid acceptance must be a finite number in"):
        batch_speedup_grid(build_tiny("qwen3"), made_profile(), (2,), acceptances, (2,), prompt_len=6, max_tokens=8)


def test_batch_overheads_per_step_and_row_enter_the_prediction():
    model = build_tiny("qwen3")
    profile = measure_batch_profile(model, (1, 2, 4), widths=3, offset=8, repeats=1, warmup=1, count_experts=False)
    measure_batch_overhead(model, profile, widths=(1, 3), tokens=6)
    assert set(profile.overhead_s) == {"1", "3"} and all(len(v) == 3 for v in profile.overhead_s.values())
    assert profile.overhead(3, 4) == pytest.approx(profile.overhead_s["3"]["4"])  # measured there: taken as is
    halfway = (profile.overhead_s["1"]["4"] + profile.overhead_s["3"]["4"]) / 2
    assert profile.overhead(2, 4) == pytest.approx(halfway)  # linear in w between measured widths
    made = made_profile()
    made.overhead_s = {"2": {"1": 0.002, "4": 0.005, "16": 0.017}}
    assert made.overhead(2, 2) == pytest.approx(0.0035)  # linear in log B between 1 and 4
    assert made.overhead(5, 64) == pytest.approx(0.017)  # the nearest beyond the measured range
    made.overhead_s = {"1": {"1": -0.004, "4": -0.004}}  # pipelining hides part of the profile's forward
    assert made.overhead(1, 2) == pytest.approx(-0.004)  # not clamped: the measured step is what it is
    assert made_profile().overhead(2, 4) == 0.0  # none measured


def test_batch_overheads_are_measured_with_rows_out_of_step(monkeypatch):
    """The speculative steps the overhead is measured on accept some drafts and reject others, differently per row
    (as served rows do), after an untimed run of the same batch and width."""
    import specbench.cost.batch as batch_cost

    runs = []

    class Recorded(batch_cost.BatchGeneration):
        def run(self):
            result = super().run()
            runs.append(self)
            return result

    monkeypatch.setattr(batch_cost, "BatchGeneration", Recorded)
    model = build_tiny("qwen3")
    profile = measure_batch_profile(model, (4,), widths=3, offset=8, repeats=1, warmup=1, count_experts=False)
    measure_batch_overhead(model, profile, widths=(3,), tokens=8, repeats=2)
    warm, timed, again = runs  # an untimed run identical to the timed ones first: its tail's shapes used once
    assert [r.requests[0].options.max_tokens for r in runs] == [8, 8, 8]
    stats = [r.stats() for r in timed.requests]
    assert all(st["drafted"] > 0 for st in stats)
    accepted = [st["accepted"] for st in stats]
    assert sum(accepted) > 0 and any(st["accepted"] < st["drafted"] for st in stats)
    assert all(len(r.tokens) == 8 for r in timed.requests)  # as long as the runs it prices
    means = []
    for gen in (timed, again):
        steps = [s.verify_s + s.other_s for s in gen.batch_log if s.width == 3 and s.batch_size == 4]
        means.append(sum(steps) / len(steps))  # the mean over the run's w = 3 steps
    beyond = statistics.median(means) - profile.c(3, 4) * profile.plain_s[4]  # the median over the timed runs
    assert profile.overhead_s["3"]["4"] == pytest.approx(beyond)
    with pytest.raises(ValueError, match="repeats"):
        measure_batch_overhead(model, profile, widths=(3,), tokens=8, repeats=0)


def test_predicted_batch_seconds_adds_the_measured_overhead_and_never_goes_below_zero():
    profile = made_profile()
    step = SimpleNamespace(kind="verify", width=1, batch_size=2, draft_s=0.0, verify_s=0.0, other_s=0.0)
    forward = profile.c(1, 2) * profile.plain_step_s(2)
    profile.overhead_s = {"1": {"1": -0.25 * forward, "4": -0.25 * forward}}
    assert predicted_batch_seconds([step], profile) == pytest.approx(0.75 * forward)
    profile.overhead_s = {"1": {"1": -2 * forward, "4": -2 * forward}}
    assert predicted_batch_seconds([step], profile) == 0.0


def test_batch_bench_agrees_with_mlx_lm():
    model = build_tiny("llama")
    prompts = [[5, 17, 3, 9, 5, 17, 3, 9][:n] for n in (3, 8, 5)]
    result = bench_batch(model, prompts, 2, ["lookup", "suffix"], "fixed:3", max_tokens=8, warmup=False)
    rows = {r.engine: r for r in result.rows}
    assert list(rows) == ["plain", "lookup/fixed:3", "suffix/fixed:3", "mlx-lm"]
    assert all(r.tokens == 24 for r in rows.values())
    for name in ("lookup/fixed:3", "suffix/fixed:3"):
        row = rows[name]
        assert row.identical_to_plain == 1.0 and row.identical_to_mlx_lm == 1.0
        assert row.speedup_vs_plain > 0 and row.kind == "speculative"
    assert rows["plain"].identical_to_mlx_lm == 1.0
    summary = result.divergence_summary
    assert {(s.engine, s.reference) for s in summary} == {
        ("plain", "mlx-lm"),
        ("lookup/fixed:3", "mlx-lm"),
        ("suffix/fixed:3", "mlx-lm"),
        ("lookup/fixed:3", "plain"),
        ("suffix/fixed:3", "plain"),
    }
    assert all(s.identical == 1.0 and s.min_first_divergence is None for s in summary)


def test_batch_bench_prints_each_speedup_beside_its_prediction():
    model = build_tiny("llama")
    prompts = [[5, 17, 3, 9, 5, 17, 3, 9][:n] for n in (3, 8)]
    profile = made_profile()
    result = bench_batch(model, prompts, 2, ["lookup"], "fixed:3", max_tokens=8, warmup=False, profile=profile)
    row = next(r for r in result.rows if r.engine == "lookup/fixed:3")
    assert row.predicted_vs_plain > 0
    assert row.residual == pytest.approx(row.speedup_vs_plain / row.predicted_vs_plain - 1)
    assert next(r for r in result.rows if r.engine == "plain").residual is None
    assert f"predicted {row.predicted_vs_plain:.2f}x" in format_batch_bench(result)


def test_each_timed_grid_run_follows_an_untimed_run_of_its_own_kind(monkeypatch):
    """A plain run after speculative steps of another width ran slower on the H200: every timed run (plain and
    speculative) comes right after a short untimed one of the same kind; a cell's repeats are adjacent pairs whose
    medians it reports."""
    import specbench.cost.batch as batch_module
    import specbench.cost.grid as batch_cost

    runs = []

    class Recorded(batch_cost.BatchGeneration):
        def run(self):
            kind = "spec" if any(r.drafter is not None for r in self.requests) else "plain"
            runs.append((kind, self.requests[0].options.max_tokens))
            return super().run()

    monkeypatch.setattr(batch_cost, "BatchGeneration", Recorded)
    for module in (batch_cost, batch_module):  # the grid's plain runs, and the recording its oracles draft
        monkeypatch.setattr(
            module, "generate_batch", lambda model, prompts, options, **kw: Recorded(model, prompts, options, **kw)
        )
    model = build_tiny("qwen3")
    profile = measure_batch_profile(model, (2,), widths=3, offset=6, repeats=1, warmup=1, count_experts=False)
    grid = functools.partial(batch_speedup_grid, model, profile, (2,), (1.0,), prompt_len=6, max_tokens=10)
    rows = grid((1, 2), warmup_tokens=3)
    assert len(rows) == 2
    assert runs[0] == ("plain", 10)  # the untimed recording the oracles draft from
    cells = runs[1:]
    pair = [("plain", 3), ("plain", 10), ("spec", 3), ("spec", 10)]
    assert cells == [("spec", 10), *pair] * 2  # a full-length untimed run first: every shape of its tail used once
    runs.clear()
    (row,) = grid((2,), warmup_tokens=3, repeats=3)
    assert runs[1:] == [("spec", 10), *pair * 3]
    assert row["repeats"] == 3 and len(row["measured_runs"]) == 3
    assert row["measured"] == pytest.approx(statistics.median(row["measured_runs"]))
    assert row["noise_floor"] == pytest.approx(noise_floor(row["measured_runs"]))  # the cell's own scatter
    assert all(math.isnan(r["noise_floor"]) for r in rows)  # one pair: no scatter to read
    with pytest.raises(ValueError, match="repeats"):
        grid((2,), repeats=0)


def test_a_batch_size_whose_forward_fails_ends_the_profile_and_the_first_one_fails_it(monkeypatch):
    import specbench.cost.batch as batch

    model = build_tiny("qwen3")

    def failing_from(size):
        def time_widths(model, cache, b, widths, *rest):
            if b >= size:
                raise RuntimeError(f"no launch at B={b}")
            return {w: 0.01 * w for w in widths}

        return time_widths

    monkeypatch.setattr(batch, "_time_widths", failing_from(4))
    profile = measure_batch_profile(model, (1, 2, 4, 8), widths=2, offset=4, count_experts=False)
    assert profile.batch_sizes == [1, 2] and profile.failures == [{"batch_size": 4, "error": "no launch at B=4"}]
    monkeypatch.setattr(batch, "_time_widths", failing_from(1))
    with pytest.raises(RuntimeError, match="no batch size could be measured: no launch at B=1"):
        measure_batch_profile(model, (1, 2), widths=2, offset=4)
