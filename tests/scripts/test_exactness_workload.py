"""scripts.gpu.exactness_workload: the device check's workload, its summaries, replay and cost rows."""

from __future__ import annotations

import pytest
from conftest import build_tiny

from scripts.gpu import exactness_workload as workload
from specbench.checks import exactness
from specbench.core.log import StepRecord
from specbench.models import synthetic

pytestmark = pytest.mark.usefixtures("fresh_calibrations")


def test_dtype_labels_name_quantized_and_float_weights():
    assert workload.dtype_label(build_tiny("qwen3")) == "float32"
    quantized = synthetic.build("qwen3-8b-tiny", bits=4)
    assert workload.dtype_label(quantized).startswith("4bit+")
    assert not workload.is_moe(quantized) and workload.is_moe(synthetic.build("qwen3-30b-a3b-tiny"))


def test_the_workload_finds_exact_mode_equal_and_times_the_first_prompts():
    model = build_tiny("qwen3")
    prompts = exactness.random_prompts(model, 3, lengths=(6, 10))
    done = workload.run_workload(model, "tiny", "float32", prompts, 12, [1, 3], 0.8, e2e_prompts=2)
    assert len(done.rows) == 6 and {r["mode"] for r in done.rows} == {"exact", "fast"}
    assert [r["k"] for r in done.rows if r["mode"] == "exact"] == [1, 3, 1]
    assert all(r["equal"] and r["first_divergence"] is None for r in done.rows if r["mode"] == "exact")
    exact = next(r for r in done.summary if r["mode"] == "exact")
    assert exact["equal"] == "3/3" and workload.all_equal(done.summary)
    # prompts 0 and 1 timed, one per draft length: cold and warm rows for each
    assert sorted((r["k"], r["kind"]) for r in done.e2e) == [
        (1, "measured-cold"),
        (1, "measured-warm"),
        (3, "measured-cold"),
        (3, "measured-warm"),
    ]
    assert all(r["speedup_exact"] == r["plain_s"] / r["exact_s"] for r in done.e2e)
    assert set(done.logs) == {"1", "3"} and all(r.kind for r in done.logs["3"])


def test_a_summary_counts_unequal_prompts_and_their_divergences():
    rows = [
        {"model": "m", "mode": "exact", "equal": True, "first_divergence": None, "accepted": 4, "verifies": 2},
        {"model": "m", "mode": "exact", "equal": False, "first_divergence": 7, "accepted": 2, "verifies": 2},
        {"model": "m", "mode": "fast", "equal": False, "first_divergence": 3, "accepted": 0, "verifies": 1},
    ]
    summary = {r["mode"]: r for r in workload.mode_summary(rows, "m", "float32")}
    assert summary["exact"]["equal"] == "1/2" and summary["exact"]["first_div_median"] == 7
    assert summary["exact"]["accepted_per_verify"] == 1.5 and summary["fast"]["first_div_min"] == 3
    assert not workload.all_equal(list(summary.values()))


def test_replay_prices_the_same_steps_at_each_modes_cost():
    records = [
        StepRecord(0, 0, "prefill", emitted=1, verify_width=5),
        StepRecord(1, 1, "verify", emitted=3, verify_width=3),
        StepRecord(2, 4, "verify", emitted=2, verify_width=2),
    ]
    assert workload.replay_cost(records, {1: 1.0, 3: 2.0}) == (5, 2.0 + 1.5)  # width 2 interpolated
    seconds = {"fast": {1: 0.01, 3: 0.02}, "exact": {1: 0.01, 3: 0.04}}
    (row,) = workload.replay_rows(
        "m", {"2": records, "9": [StepRecord(0, 0, "verify", emitted=1, verify_width=9)]}, seconds
    )
    assert row["k"] == 2 and row["tokens"] == 5  # k=9 needs width 9, not measured: left out
    assert row["speedup_fast"] == pytest.approx(5 / 3.5) and row["speedup_exact"] == pytest.approx(5 / 6.5)
    assert row["exact_over_fast"] == pytest.approx(3.5 / 6.5)


def test_cost_rows_are_ratios_to_the_fast_single_row_forward():
    seconds = {"fast": {1: 0.01, 2: 0.015}, "exact": {1: 0.01, 2: 0.03}}
    rows = workload.cost_rows("m", "bfloat16", seconds, {2: "attention"})
    by = {(r["level"], r["width"]): r for r in rows}
    assert by[("exact", 2)]["ratio"] == pytest.approx(3.0) and by[("exact", 2)]["exact_level"] == "attention"
    assert by[("exact", 1)]["exact_level"] == "none" and by[("fast", 2)]["exact_level"] is None


def test_the_summary_file_holds_levels_and_variant_ops():
    results = {
        "exactness_summary": [],
        "e2e": [],
        "skipped": [{"model": "x", "reason": "time budget"}],
        "calibration": [
            {"model": "m", "width": 2, "chosen": "attention"},
            {"model": "m", "width": 3, "chosen": "serial"},
        ],
        "ops": [
            {"op": "matmul", "dtype": "bfloat16", "row_invariant": False},
            {"op": "add", "dtype": "bfloat16", "row_invariant": True},
        ],
    }
    summary = workload.summary(results)
    assert summary["levels"] == {"m": {2: "attention", 3: "serial"}} and summary["ops_not_row_invariant"] == [
        "matmul[bfloat16]"
    ]


def test_text_tables_align_columns():
    text = workload.text_table([{"a": 1.23456, "b": None}, {"a": 12345.6, "b": "x"}], ["a", "b"])
    assert text.splitlines() == ["a      b", "1.23    ", "12346  x"]
    assert workload.text_table([], ["a"]) == ""


def test_tree_drafts_are_checked_in_both_modes_and_counted_in_the_verdict():
    model = build_tiny("qwen3")
    prompts = exactness.random_prompts(model, 2, lengths=(6, 10))
    done = workload.run_workload(model, "tiny", "float32", prompts, 12, [3], 0.8, tree_branches=2)
    trees = [r for r in done.rows if r["mode"].endswith("-tree")]
    assert sorted(r["mode"] for r in trees) == ["exact-tree", "exact-tree", "fast-tree", "fast-tree"]
    assert all(r["k"] == exactness.tree_nodes(3, 2) == 6 and r["verifies"] > 0 for r in trees)
    assert all(r["equal"] for r in trees if r["mode"] == "exact-tree")
    assert {r["mode"] for r in done.summary} == {"exact", "fast", "exact-tree", "fast-tree"}
    broken = [dict(r, equal="1/2") if r["mode"] == "exact-tree" else r for r in done.summary]
    assert workload.all_equal(done.summary) and not workload.all_equal(broken)
    assert exactness.tree_nodes(15, 2) == exactness.MAX_TREE_NODES
