"""specbench.checks.exactness and `specbench check-exact`: speculative greedy against plain greedy."""

from __future__ import annotations

import pytest
from conftest import build_tiny, emulate_gpu

from specbench.checks import exactness
from specbench.cli import main

pytestmark = pytest.mark.usefixtures("fresh_calibrations")


def test_check_on_the_cpu_finds_both_modes_equal():
    model = build_tiny("qwen3")
    prompts = [[5, 17, 42, 8], [61, 3, 29, 77, 12, 50]]
    rows = exactness.check(model, prompts, max_tokens=20, draft_lengths=(3, 5))
    assert rows.height == 4 and rows["equal"].all() and rows["first_divergence"].null_count() == 4
    assert rows.filter(rows["prompt"] == 1)["k"].to_list() == [5, 5]
    summary = exactness.summarize(rows)
    assert summary["equal"].to_list() == [2, 2] and summary["accepted_per_verify"][0] > 0.5


def test_check_counts_divergences_of_the_fast_mode_on_an_emulated_gpu(monkeypatch):
    model = build_tiny("qwen3")
    emulate_gpu(monkeypatch, attention=True, linear_rows=1, size=0.3)
    prompts = exactness.random_prompts(model, 3, lengths=(8, 16))
    summary = exactness.summarize(exactness.check(model, prompts, max_tokens=30, draft_lengths=(4,)))
    by_mode = {r["mode"]: r for r in summary.iter_rows(named=True)}
    assert by_mode["exact"]["equal"] == 3 and by_mode["exact"]["first_divergence_min"] is None
    assert by_mode["fast"]["equal"] < 3 and by_mode["fast"]["first_divergence_min"] is not None


def test_check_rejects_bad_input():
    model = build_tiny("qwen3")
    with pytest.raises(ValueError, match="no prompts"):
        exactness.check(model, [])
    with pytest.raises(ValueError, match="verify mode"):
        exactness.check(model, [[1, 2]], modes=("exact", "slow"))
    with pytest.raises(ValueError, match="no verify modes"):
        exactness.check(model, [[1, 2]], modes=())


def test_cli_check_exact(tmp_path, capsys, monkeypatch):
    out = tmp_path / "rows.parquet"
    flags = ["--model", "synthetic:qwen3-8b-tiny"]
    argv = ["check-exact", *flags, "--num-prompts", "2", "--max-tokens", "12", "--out", str(out)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "exact: 2/2 prompts equal to mlx-lm greedy" in text and out.exists()
    # A divergence of the exact mode is the command's failure.
    monkeypatch.setattr(exactness, "mlx_lm_greedy", lambda model, prompt, max_tokens: [0] * max_tokens)
    assert main(argv[:-2]) == 1
    assert main(["check-exact", "--model", "synthetic:qwen3-8b-tiny", "--k", "2,x"]) == 2
