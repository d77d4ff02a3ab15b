"""Draft-length policies replayed on recorded outputs and ranked by predicted speedup (no model run)."""

from __future__ import annotations

import json

import polars as pl
import pytest
from conftest import build_tiny, word_tokenizer

from specbench.core.options import GenerateOptions
from specbench.cost import Profile, predicted_speedup
from specbench.cost.profile import read_profile
from specbench.inputs.capabilities import has
from specbench.simulate.policies import (
    best_predicted,
    question_prompts,
    rank_policies,
    record_workloads,
    replay_policy,
    top_policies,
    trace_workloads,
)
from specbench.simulate.simulate import Recorded, record, save_recorded
from specbench.simulate.simulate_logs import load_tokenizer

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
        assert row["predicted_speedup"] == pytest.approx(
            predicted_speedup(log.records, profile, 0.0, mode="exact", tokens="emitted")
        )
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
    args = ["simulate", "--recorded", str(recorded), "--policies", ",".join(POLICIES), "--profile", str(profile)]
    assert main([*args, "--drafters", "lookup", "--k", "8", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "2 traces" in printed and all(p in printed for p in POLICIES)
    saved = pl.read_parquet(out / "policies.parquet")
    assert saved["workload"].unique().to_list() == ["run"] and saved.height == len(POLICIES)
    assert main([*args[:5], "--drafters", "lookup", "--k", "8"]) == 2  # no --profile
    assert main([*args, "--drafters", "lookup,suffix", "--k", "8"]) == 2


def _damaged_profiles() -> dict[str, tuple[object, str]]:
    """Profiles the simulator must refuse: (JSON, what the error line says)."""
    good = _profile(0.1).to_dict()
    modes = ("fast", "exact")
    narrow = {**good, **{part: {m: good[part][m][:3] for m in modes} for part in ("widths", "costs", "seconds")}}
    fast_only = {**good, **{part: {"fast": good[part]["fast"]} for part in ("widths", "costs", "seconds")}}
    return {
        "all-zero costs": ({**good, "costs": {m: [0.0] * 9 for m in modes}}, "not all finite numbers above zero"),
        "widths reversed": (
            {**good, "widths": {m: good["widths"][m][::-1] for m in modes}},
            "are not in increasing order",
        ),
        "a list": ([good], "a JSON object was expected, not list"),
        "widths 1..3 only": (narrow, "measured exact widths up to 3 only: measure wider"),
        "no exact costs": (fast_only, "has no 'exact' verify costs"),
    }


@pytest.mark.parametrize("case", list(_damaged_profiles()))
def test_simulate_policies_refuses_a_profile_every_reader_refuses(case, tmp_path, capsys):
    """The profile passed to --profile goes through the checks of every stored profile's reader, and a policy
    verifying wider than the profile measured is refused: one error line naming the file, nothing written."""
    from specbench.cli import main

    data, expected = _damaged_profiles()[case]
    recorded = save_recorded(_recorded(), tmp_path / "run.plain.parquet")
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(data))
    out = tmp_path / "out"
    args = ["simulate", "--recorded", str(recorded), "--policies", "fixed:4,fixed:1", "--profile", str(profile)]
    assert main([*args, "--drafters", "lookup", "--k", "8", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specbench simulate: error: ") and "Traceback" not in err
    assert str(profile) in lines[0] and expected in lines[0]
    assert not list(out.glob("*.parquet"))


def test_best_predicted_names_the_leaders_and_none_on_a_full_tie():
    table = pl.DataFrame(
        {
            "workload": ["a", "a", "a", "b", "b"],
            "policy": ["x", "y", "z", "x", "y"],
            "predicted_speedup": [1.2, 1.2, 0.9, 1.0, 1.0],
        }
    )
    assert best_predicted(table, "a") == ["x", "y"]
    assert best_predicted(table, "b") == []  # nothing drafted: every policy ties


@pytest.mark.skipif(not has("embedded_model"), reason="the bundled traces are tokenized with the embedded tokenizer")
def test_trace_workloads_are_the_bundled_traces_cut_to_max_turns():
    tokenizer = load_tokenizer("smollm2-135m")
    every, skipped = trace_workloads(["chat-revision"], tokenizer)
    cut, _ = trace_workloads(["chat-revision"], tokenizer, max_turns=1)
    assert list(every) == list(cut) == ["chat-revision"] and skipped >= 0
    turns = [len(list(requests())) for _, requests in every["chat-revision"]]
    assert max(turns) > 1
    assert [len(list(requests())) for _, requests in cut["chat-revision"]] == [1] * len(turns)


def _questions(path, categories=("translation", "qa"), per_category=3):
    lines = [
        json.dumps({"question_id": f"{c}{i}", "category": c, "turns": [" ".join(f"w{5 + i + j}" for j in range(6))]})
        for c in categories
        for i in range(per_category)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_question_prompts_read_spec_bench_and_fall_back_to_the_bundled_prompts(tmp_path, capsys):
    tokenizer = word_tokenizer()
    prompts, name = question_prompts(_questions(tmp_path / "question.jsonl"), tokenizer, per_category=2)
    assert name == "spec-bench"
    assert [(p.category, p.id) for p in prompts] == [
        ("translation", "translation0"),
        ("translation", "translation1"),
        ("qa", "qa0"),
        ("qa", "qa1"),
    ]
    assert "no Spec-Bench questions" not in capsys.readouterr().out
    prompts, name = question_prompts(tmp_path / "absent.jsonl", tokenizer, ["qa"], 1)
    assert name == "bundled" and [p.category for p in prompts] == ["qa"]
    assert "no Spec-Bench questions at" in capsys.readouterr().out


def test_record_workloads_are_the_models_outputs_per_category(tmp_path):
    model, tokenizer = build_tiny("llama"), word_tokenizer()
    prompts, _ = question_prompts(_questions(tmp_path / "question.jsonl"), tokenizer, per_category=2)
    options = GenerateOptions(max_tokens=6)
    workloads, requests = record_workloads(model, prompts, options, "spec-bench", tokenizer)
    assert list(workloads) == ["spec-bench/translation", "spec-bench/qa"]
    assert [r.id for r in requests] == ["translation/translation0", "translation/translation1", "qa/qa0", "qa/qa1"]
    assert [r.output for r in requests] == [r.output for r in record(model, [p.ids for p in prompts], options)]
    ((trace_id, requests_of),) = workloads["spec-bench/qa"]
    assert trace_id == "qa" and [r.id for r in requests_of()] == ["qa/qa0", "qa/qa1"]
