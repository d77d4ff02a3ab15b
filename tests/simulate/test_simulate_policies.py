"""Draft-length policies replayed on recorded outputs and ranked by predicted speedup (no model run)."""

from __future__ import annotations

import json

import polars as pl
import pytest

from specbench.cost import Profile, predicted_from_log
from specbench.simulate.policies import rank_policies, read_profile, replay_policy, top_policies
from specbench.simulate.simulate import Recorded, save_recorded

POLICIES = ["vllm", "sglang", "ollama", "confidence:0.5", "auto", "fixed:4", "fixed:1"]


def _profile(growth: float) -> Profile:
    widths = list(range(1, 10))
    costs = [1.0 + growth * (w - 1) for w in widths]
    modes = ("fast", "exact")
    return Profile(
        "m", "test", "cpu", {}, 0.1, {m: widths for m in modes}, {m: costs for m in modes}, {m: costs for m in modes}
    )


def _recorded() -> list[Recorded]:
    """Two traces whose replies repeat their prompts (prompt lookup accepts long runs) and one whose reply
    repeats a bigram with a new token after it each time (prompt lookup drafts, and is rejected)."""
    text = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]
    repeat = Recorded([1, *text, 2], [*text, *text[:6], 3], "length", "echo/0")
    again = Recorded([1, *text, 4], [*text[3:], *text, 3], "length", "echo/1")
    novel = Recorded([1, 2, 3, 4], [t for i in range(8) for t in (1, 2, 50 + i)], "length", "novel/0")
    return [repeat, again, novel]


def test_rank_prices_each_policy_by_the_steps_it_took():
    profile = _profile(0.1)
    groups = [("echo", lambda: _recorded()[:2]), ("novel", lambda: _recorded()[2:])]
    table, steps = rank_policies({"mixed": groups}, POLICIES, profile, "lookup", 8)
    assert table["policy"].to_list() == sorted(POLICIES, key=lambda p: table.filter(pl.col("policy") == p)["rank"][0])
    assert sorted(table["rank"].to_list()) == list(range(1, len(POLICIES) + 1))
    for row in table.iter_rows(named=True):  # the prediction is the cost model's on the steps replayed
        log = replay_policy(groups, row["policy"], profile, "lookup", 8)
        assert row["predicted_speedup"] == pytest.approx(predicted_from_log(log.records, profile, 0.0, "exact"))
        assert row["tokens"] == sum(len(r.output) for r in _recorded())
    assert set(steps.to_polars()["policy"].unique()) == set(POLICIES)
    fixed1 = table.filter(pl.col("policy") == "fixed:1").row(0, named=True)
    fixed4 = table.filter(pl.col("policy") == "fixed:4").row(0, named=True)
    assert fixed4["tokens_per_verify"] > fixed1["tokens_per_verify"]
    assert len(top_policies(table)) == 2


def test_dear_verifications_rank_plain_leaning_policies_first():
    groups = [("novel", lambda: _recorded()[2:])]
    table, _ = rank_policies({"novel": groups}, ["fixed:4", "ollama"], _profile(0.9), "lookup", 8)
    # drafts on the novel trace are rejected: the controller backs off to plain decoding, fixed:4 pays each one
    assert table["policy"].to_list() == ["ollama", "fixed:4"]


def test_simulate_cli_ranks_policies_on_a_recorded_fixture(tmp_path, capsys):
    from specbench.cli import main

    recorded = save_recorded(_recorded(), tmp_path / "run.plain.parquet")
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(_profile(0.1).to_dict()))
    assert read_profile(profile).costs == _profile(0.1).costs
    out = tmp_path / "out"
    args = ["simulate", "--prompts", str(recorded), "--policies", ",".join(POLICIES), "--profile", str(profile)]
    assert main([*args, "--drafters", "lookup", "--k", "8", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "2 traces" in printed and all(p in printed for p in POLICIES)
    saved = pl.read_parquet(out / "policies.parquet")
    assert saved["workload"].unique().to_list() == ["run"] and saved.height == len(POLICIES)
    assert main([*args[:5], "--drafters", "lookup", "--k", "8"]) == 2  # no --profile
    assert main([*args, "--drafters", "lookup,suffix", "--k", "8"]) == 2
