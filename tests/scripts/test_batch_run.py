"""The batch experiment's phases (``scripts.gpu.batch_run``): a tiny shape end to end within a budget, what
a spent budget leaves out, the verdict and the divergence table from rows, and its figure."""

from __future__ import annotations

import json
import math

import pytest

from scripts.gpu.batch_run import TABLES, BatchRun, batch_verdict, break_even_rows, divergence_table, lowest_break_even
from scripts.gpu.budget import Budget
from specbench.cost.batch import BatchProfile

TINY = {
    "batch_sizes": [1, 2],
    "widths": 3,
    "offset": 8,
    "repeats": 1,
    "warmup": 1,
    "grid_batch_sizes": [1, 4],
    "acceptances": [1.0],
    "ks": [2],
    "prompt_len": 6,
    "max_tokens": 6,
    "bench_batch_sizes": [2],
    "bench_tokens": 6,
    "bench_acceptance": 1.0,
    "bench_k": 2,
    "single": 2,
    "max_k": 2,
}


def quiet_run(tmp_path, seconds: float | None) -> tuple[BatchRun, list[str]]:
    said: list[str] = []
    return BatchRun(dict(TINY), tmp_path, Budget(seconds, say=said.append), say=said.append), said


def test_a_tiny_shape_fills_every_table_and_writes_as_it_goes(tmp_path):
    run, said = quiet_run(tmp_path, None)
    run.shape("qwen3-8b-tiny", share=120.0)
    label = "synthetic:qwen3-8b-tiny-fp32"
    assert list(run.profiles) == [label] and not run.failures
    grid = run.tables["grid"]
    assert {r["batch_size"] for r in grid} == {1} and all(r["model"] == label for r in grid)
    assert run.budget.skipped_names() == [f"{label} grid B=4: not in the profile"]
    assert {(r["batch_size"], r["k"]) for r in run.tables["break_even"]} == {(b, k) for b in (1, 2) for k in (1, 2)}
    kinds = {r["kind"] for r in run.tables["bench"]}
    assert "speculative" in kinds and {r["batch_size"] for r in run.tables["bench"]} == {2}
    assert {(s["engine"], s["reference"]) for s in run.divergence_summary} >= {("plain", "single"), ("plain", "mlx-lm")}
    summary = json.loads((tmp_path / "batch_summary.json").read_text())
    assert summary["skipped"] == run.budget.skipped_lines() and label in summary["profiles"]
    assert set(summary["profiles"][label]["overhead_s"]) == {"1", "3"}  # the engine's own work, priced in the grid
    for name in ("costs", "break_even", "grid", "bench", "divergence"):
        assert (tmp_path / f"batch_{name}.csv").exists(), name
    run.conclude()
    assert len(run.verdict) == 1 and run.verdict[0].startswith(f"{label}: grid a=1.0: pays at B=")
    assert any("first divergence of greedy outputs (6 tokens" in line for line in said)


def test_a_spent_budget_profiles_but_skips_grid_and_bench(tmp_path):
    run, said = quiet_run(tmp_path, 0.0)
    run.shape("qwen3-8b-tiny", share=30.0)
    assert run.profiles and not run.tables["grid"] and not run.tables["bench"]
    names = run.budget.skipped_names()
    assert "synthetic:qwen3-8b-tiny-fp32 grid B=1" in names and "synthetic:qwen3-8b-tiny-fp32 bench B=2" in names
    assert any(line.startswith("skip ") for line in said)


def test_a_failing_forward_is_recorded_and_the_run_goes_on(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("kernel did not launch")

    monkeypatch.setattr("scripts.gpu.batch_run.measure_batch_profile", broken)
    run, _ = quiet_run(tmp_path, None)
    run.shape("qwen3-8b-tiny", share=30.0)
    assert run.failures == [
        {"what": "synthetic:qwen3-8b-tiny-fp32 profile", "error": "RuntimeError: kernel did not launch"}
    ]
    assert not run.profiles and all(not run.tables[name] for name in TABLES)


def grid_row(b: int, a: float, k: int, measured: float, predicted: float = 1.0) -> dict:
    return {"model": "m", "batch_size": b, "acceptance": a, "k": k, "measured": measured, "predicted": predicted}


def test_verdict_takes_the_best_k_per_batch_size_and_the_lowest_break_even():
    tables = {
        "grid": [
            grid_row(1, 0.8, 2, 1.3),
            grid_row(1, 0.8, 4, 1.6),
            grid_row(8, 0.8, 2, 0.9),
            grid_row(8, 0.8, 4, 0.7),
        ],
        "bench": [
            {"model": "m", "kind": "plain", "batch_size": 1},
            {
                "model": "m",
                "kind": "speculative",
                "batch_size": 1,
                "speedup_vs_plain": 1.5,
                "speedup_vs_mlx_lm": 1.4,
                "acceptance_rate": 0.79,
            },
        ],
        "break_even": [
            {"model": "m", "batch_size": 1, "k": 1, "a_star": 0.3},
            {"model": "m", "batch_size": 1, "k": 2, "a_star": 0.2},
            {"model": "m", "batch_size": 8, "k": 1, "a_star": math.nan},
        ],
    }
    (line,) = batch_verdict(["m"], tables, 0.8, 3)
    assert line == (
        "m: grid a=0.8: pays at B=[1], not at B=[8] [B=1 1.60x (k=4), B=8 0.90x (k=2)]; "
        "bench a=0.8 k=3: B=1 1.50x vs plain, 1.40x vs mlx-lm (acceptance 0.79); lowest a*(k, B) over k: B=1 0.20"
    )


def test_divergence_table_has_a_cell_per_pair_and_batch_size():
    cell = {"model": "m", "engine": "plain", "reference": "mlx-lm", "identical": 0.5, "median_first_divergence": 7.0}
    lines = divergence_table(
        [{**cell, "batch_size": 1, "min_first_divergence": 3}, {**cell, "batch_size": 4, "min_first_divergence": None}],
        10,
    )
    assert "(10 tokens;" in lines[0]
    assert lines[1].startswith("m\n") and "B=1" in lines[1] and "B=4" in lines[1]
    assert lines[2].split() == ["plain", "vs", "mlx-lm", "50%/7/3", "50%/7/-"]


def test_batch_figure_passes_the_report_checks():
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from scripts.gpu.batch import batch_break_even
    from specbench.report.figures.checks import figure_problems

    break_even = [
        {"model": model, "batch_size": b, "k": k, "a_star": a * k / b}
        for model, a in (("dense", 0.1), ("moe", 0.25))
        for b in (1, 4, 16)
        for k in (1, 2, 3, 4)
    ]
    grid = [
        grid_row(b, a, 4, shift + 2.0 / b + a, shift + 1.5 / b + a) | {"model": model}
        for model, shift in (("dense", 0.0), ("moe", 0.05))
        for a in (0.6, 0.9)
        for b in (1, 4, 16)
    ]
    fig = batch_break_even(break_even, grid, 4)
    assert figure_problems(fig) == []
    assert {line.get_label() for line in fig.axes[0].lines} == {
        f"{m} k={k}" for m in ("dense", "moe") for k in (1, 2, 4)
    }
    plt.close(fig)


def test_break_even_rows_and_the_lowest_per_batch_size():
    costs = {1: [1.0, 1.1, 1.2, 1.3], 4: [1.0, 1.5, 2.0, 2.5], 16: [1.0, 2.0, 3.0, 4.0]}
    p = BatchProfile("m", "cpu", 64, costs, {1: 0.01, 4: 0.012, 16: 0.02})
    rows = break_even_rows(p, max_k=5)  # the profile holds c(1..4): k stops at 3
    assert {(r["batch_size"], r["k"]) for r in rows} == {(b, k) for b in (1, 4, 16) for k in (1, 2, 3)}
    for r in rows:
        expected = p.break_even_acceptance(r["batch_size"], max_k=3)[r["k"] - 1]
        assert r["a_star"] == pytest.approx(expected, nan_ok=True)
    lowest = lowest_break_even([*rows, {"batch_size": 32, "k": 1, "a_star": math.nan}])
    assert list(lowest) == [1, 4, 16]  # no finite a* at B = 32
    assert lowest[1] == min(r["a_star"] for r in rows if r["batch_size"] == 1 and math.isfinite(r["a_star"]))
    assert all(0.0 <= a <= 1.0 for a in lowest.values())
