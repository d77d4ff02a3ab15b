"""The prompt benchmark's speculative methods beside the speedup the stored cost profile predicts."""

from __future__ import annotations

import math
import re
from dataclasses import replace

import polars as pl
import pytest
from conftest import build_tiny, save_tiny_model, tokenizer_words, word_tokenizer, write_questions

import specbench.cost as cost
from specbench.bench.predictions import drafting_cost
from specbench.bench.prompt_bench import PROMPT_RUNS_FILE, PROMPT_SUMMARY_FILE, bench_prompts, load_prompt_bench
from specbench.bench.prompt_runs import PromptRun
from specbench.common.identity import device_name, model_key, versions
from specbench.core.log import StepLog
from specbench.core.policies import DraftPolicy
from specbench.cost.predict import predicted_speedup
from specbench.inputs.prompts import Question

WORDS = tokenizer_words()
METHOD = "lookup/fixed:3/fast"
COSTS = [1.0, 1.3, 1.5, 1.8, 2.1, 2.4]


def questions() -> list[Question]:
    paragraph = " ".join(WORDS[i] for i in (1, 5, 13, 29, 37, 4, 8, 56, 67, 18))
    return [
        Question(1, "repeated_paragraph", (" ".join([paragraph] * 6),)),
        Question(2, "multi_turn", ("w5 w6 w7 w8 w9", "w10 w11 w12")),
    ]


def fake_profile(model, overhead: float = 0.1) -> cost.Profile:
    """A cost profile keyed to ``model`` on this device, with made-up fast verify costs."""
    widths = list(range(1, len(COSTS) + 1))
    return cost.Profile(
        model=model_key(model),
        name="tiny-llama",
        device=device_name(),
        versions=versions(),
        plain_step_s=0.001,
        widths={"fast": widths},
        costs={"fast": COSTS},
        seconds={"fast": [0.001 * c for c in COSTS]},
        overhead={"fast": overhead},
    )


def settings(out, messages) -> dict:
    return dict(
        drafters=("lookup",),
        policies=[DraftPolicy.fixed(3)],
        max_tokens=16,
        verify=("fast",),
        model_name="tiny-llama",
        out=out,
        progress=messages.append,
    )


def test_speculative_methods_are_predicted_from_the_stored_profile_and_resume_keeps_them(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_HOME", str(tmp_path / "home"))
    model, tokenizer = build_tiny("llama", seed=0), word_tokenizer()
    profile = fake_profile(model)
    cost.save_profile(profile)
    messages: list[str] = []
    result = bench_prompts(model, tokenizer, questions(), **settings(tmp_path / "out", messages))
    assert not any("no stored cost profile" in m for m in messages)
    assert result.profile is not None and result.profile.costs == profile.costs
    summary = {(r["method"], r["category"]): r for r in result.summary()}
    for category in ("repeated_paragraph", "multi_turn", "overall"):
        row = summary[(METHOD, category)]
        assert math.isfinite(row["predicted_speedup"]) and row["predicted_speedup"] > 0
        assert row["residual"] == pytest.approx(row["plain_speedup"] / row["predicted_speedup"] - 1)
        assert row["mean_abs_residual"] >= 0 and row["d"] >= 0
        assert summary[("specbench", category)]["plain_speedup"] == pytest.approx(1.0)
        assert summary[("specbench", category)]["predicted_speedup"] is None
        assert summary[("mlx-lm", category)]["predicted_speedup"] is None
    # the overall prediction pools the categories' runs: their tokens over their predicted plain steps
    by_category = [summary[(METHOD, c)]["predicted_speedup"] for c in ("repeated_paragraph", "multi_turn")]
    assert min(by_category) <= summary[(METHOD, "overall")]["predicted_speedup"] <= max(by_category)

    # the one-prompt category: the predictor on that run's kept steps, d from its drafting over the plain run's
    # seconds per decoded token, and the measured decode speedup over that plain run
    def run(method: str) -> PromptRun:
        return next(r for r in result.runs if r.method == method and r.category == "repeated_paragraph")

    spec, plain = run(METHOD), run("specbench")
    records = StepLog.from_rows(spec.steps).records
    assert [r.kind for r in records][0] == "prefill" and any(r.kind == "verify" for r in records)
    plain_s, plain_tokens = plain.wall_s - plain.first_token_s, plain.new_tokens - 1
    d = drafting_cost(records, plain_s / plain_tokens)
    expected = predicted_speedup(records, profile, d, spec.prompt_tokens, "fast")
    row = summary[(METHOD, "repeated_paragraph")]
    assert row["predicted_speedup"] == pytest.approx(expected)
    assert row["d"] == pytest.approx(d)
    measured = (plain_s / plain_tokens) / ((spec.wall_s - spec.first_token_s) / (spec.new_tokens - 1))
    assert row["plain_speedup"] == pytest.approx(measured)
    assert row["mean_abs_residual"] == pytest.approx(abs(measured / expected - 1))

    table = result.table()
    assert "Decode speedup over specbench plain, measured and predicted (cost profile of tiny-llama" in table
    overall = summary[(METHOD, "overall")]
    line = next(x for x in table.splitlines() if x.startswith(f"| {METHOD} | {overall['plain_speedup']:.2f}x"))
    assert f"| {overall['predicted_speedup']:.2f}x | {overall['residual']:+.1%} |" in line
    assert f"| {overall['mean_abs_residual']:.1%} |" in line

    saved = pl.read_parquet(tmp_path / "out" / PROMPT_SUMMARY_FILE)
    assert saved.filter(pl.col("method") == METHOD)["residual"].is_finite().all()
    loaded = load_prompt_bench(tmp_path / "out", profile)
    assert [r["predicted_speedup"] for r in loaded.summary()] == pytest.approx(
        [r["predicted_speedup"] for r in result.summary()], nan_ok=True
    )
    # a profile without the runs' verify mode predicts nothing and says which mode to measure
    exact_only = replace(profile, widths={"exact": profile.widths["fast"]}, costs={"exact": COSTS})
    assert all(r["predicted_speedup"] is None for r in replace(result, profile=exact_only).summary())
    assert (
        "it has no fast verify costs: `specbench profile tiny-llama --verify fast`"
        in replace(result, profile=exact_only).table()
    )

    # resuming runs nothing and predicts the same from the steps read back
    again = bench_prompts(model, tokenizer, questions(), **settings(tmp_path / "out", messages))
    assert "resuming: 2 questions already done" in "\n".join(messages)
    assert [r["residual"] for r in again.summary()] == pytest.approx([r["residual"] for r in result.summary()])

    # runs saved before runs kept their steps resume too, without predictions, and say so
    runs_path = tmp_path / "out" / PROMPT_RUNS_FILE
    pl.read_parquet(runs_path).drop("steps").write_parquet(runs_path)
    old = bench_prompts(model, tokenizer, questions(), **settings(tmp_path / "out", messages))
    assert len(old.runs) == len(result.runs)
    assert all(r["predicted_speedup"] is None for r in old.summary())
    assert "kept no step records" in old.table()


def test_without_a_stored_profile_the_predictions_are_null_and_it_says_so_once(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_HOME", str(tmp_path / "home"))
    model, tokenizer = build_tiny("llama", seed=0), word_tokenizer()
    messages: list[str] = []
    result = bench_prompts(model, tokenizer, questions()[:1], **settings(tmp_path / "out", messages))
    note = f"no stored cost profile for tiny-llama on {device_name()}: run `specbench profile tiny-llama` to see"
    assert [m for m in messages if "cost profile" in m] == [note + " predictions"]
    assert result.profile is None
    for row in result.summary():
        assert row["predicted_speedup"] is None and row["residual"] is None and row["mean_abs_residual"] is None
    assert f"Predictions: {note}" in result.table()
    saved = pl.read_parquet(tmp_path / "out" / PROMPT_SUMMARY_FILE)
    assert saved["predicted_speedup"].is_null().all() and saved["residual"].is_null().all()
    # the runs kept their steps all the same: a profile given later predicts from them
    assert load_prompt_bench(tmp_path / "out", fake_profile(model)).summary()[-1]["predicted_speedup"] > 0


def test_bench_cli_profile_first_stores_a_profile_and_prints_predictions(tmp_path, monkeypatch, capsys):
    from specbench.cli import main

    monkeypatch.setenv("SPECBENCH_HOME", str(tmp_path / "home"))
    model = build_tiny("llama", seed=5)
    folder = save_tiny_model(tmp_path / "tiny", model)
    prompts = write_questions(tmp_path / "question.jsonl", questions())
    command = [
        "bench",
        "prompts",
        str(prompts),
        "--model",
        str(folder),
        "--drafters",
        "lookup",
        "--policies",
        "fixed:3",
    ]
    command += [
        "--max-tokens",
        "10",
        "--verify",
        "fast",
        "--categories",
        "repeated_paragraph",
        "--out",
        str(tmp_path / "out"),
    ]
    assert main(command + ["--profile-first"]) == 0
    printed = capsys.readouterr().out
    assert "--profile-first: measuring the fast verify costs" in printed and "profile: " in printed
    assert cost.load_profile(model) is not None
    assert "Decode speedup over specbench plain, measured and predicted (cost profile of" in printed
    assert re.search(rf"\| {re.escape(METHOD)} \| \d+\.\d\dx \| \d+\.\d\dx \| [+-]\d+\.\d% \| \d+\.\d% \|", printed)
    # stored now: a second run measures nothing
    assert main(command + ["--profile-first", "--fresh"]) == 0
    assert "--profile-first" not in capsys.readouterr().out
