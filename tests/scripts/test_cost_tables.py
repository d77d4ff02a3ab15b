"""The cost experiment's tables from profiles and grid rows: a*(k) per profile and mode, the grid's expected
seconds, its compact table and its prediction errors."""

from __future__ import annotations

import pytest

from scripts.gpu.cost import break_even_table, grid_lines, grid_seconds, prediction_error_lines
from specbench.cost.breakeven import best_k, break_even_acceptance
from specbench.cost.profile import Profile


def profile(name: str, fast: list[float], exact: list[float] | None = None) -> Profile:
    costs = {"fast": fast} | ({"exact": exact} if exact else {})
    return Profile(
        model=name,
        name=name,
        device="cpu",
        versions={},
        plain_step_s=0.02,
        widths={mode: list(range(1, len(c) + 1)) for mode, c in costs.items()},
        costs=costs,
        seconds={mode: [0.02 * x for x in c] for mode, c in costs.items()},
        overhead={"fast": 0.1},
    )


def test_break_even_table_has_a_row_per_profile_mode_and_k():
    dense, moe = profile("dense", [1.0, 1.05, 1.1, 1.2, 1.3], [1.0, 1.2, 1.4]), profile("moe", [1.0, 1.5, 2.0])
    rows = break_even_table([dense, moe], max_k=15)
    assert [(r["name"], r["mode"], r["k"]) for r in rows] == [
        *(("dense", "fast", k) for k in (1, 2, 3, 4)),
        *(("dense", "exact", k) for k in (1, 2)),
        *(("moe", "fast", k) for k in (1, 2)),
    ]
    first = rows[0]
    assert first["c_k1"] == pytest.approx(1.05) and first["overhead"] == 0.1
    assert first["a_star"] == pytest.approx(break_even_acceptance(dense, 0.0, 4, "fast")[0], nan_ok=True)
    assert first["best_k_a0.8"] == best_k(0.8, dense, 0.0, 4, "fast")[0]
    assert rows[4]["overhead"] == 0.0  # no overhead measured in exact mode
    assert set(first) == {
        "name",
        "mode",
        "k",
        "c_k1",
        "overhead",
        "a_star",
        *(f"best_k_a{x}" for x in (0.6, 0.7, 0.8, 0.9)),
    }
    assert len(break_even_table([dense], max_k=2)) == 4  # fast k = 1, 2 and exact k = 1, 2


def test_grid_seconds_scale_with_cells_tokens_and_the_plain_step():
    p = profile("dense", [1.0, 1.1])
    one = grid_seconds(p, cells=1, repeats=1, max_tokens=100, verify="exact")
    assert one == pytest.approx(1 * 2.4 * 100 * 0.02 * 1.2 + 5)
    assert grid_seconds(p, 4, 2, 100, "exact") - 5 == pytest.approx(8 * (one - 5))
    assert grid_seconds(p, 1, 1, 100, "fast") > one


def grid_row(mode: str, error: float, plain_over_profile: float) -> dict:
    return {
        "mode": mode,
        "a": 0.8,
        "k": 2,
        "speedup": 1.5,
        "predicted_nominal": 1.6,
        "error_nominal": error,
        "error_from_log": error / 2,
        "error_time_nominal": -error,
        "error_time": error / 4,
        "tokens_per_verify": 2.2,
        "acceptance_measured": 0.78,
        "diverged_at": None,
        "follows": 0,
        "plain_over_profile": plain_over_profile,
    }


def test_grid_lines_and_prediction_errors():
    rows = [grid_row("exact", 0.1, 1.0), grid_row("exact", -0.3, 1.2), grid_row("fast", 0.05, 0.9)]
    table = grid_lines(rows)
    assert len(table) == 4 and table[0].split()[:4] == ["a", "k", "measured", "predicted"]
    assert table[1].split()[:5] == ["0.80", "2", "1.50", "1.60", "+10.0"]
    lines = prediction_error_lines(rows)
    assert len(lines) == 6  # per mode: speedup, seconds per token, plain runs against the profile
    assert "speedup |measured / predicted - 1|, exact verify, 2 cells: at nominal a mean 20.0% max 30.0%" in lines[0]
    assert "for the steps taken mean 10.0% max 15.0%" in lines[0]
    assert lines[2].endswith("median 1.20 (1.00-1.20)") and "fast verify, 1 cells" in lines[3]
    assert prediction_error_lines([]) == []
