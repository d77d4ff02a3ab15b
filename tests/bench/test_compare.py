"""`specbench compare`: two runs side by side, each difference with its interval and a symmetric verdict; runs on
different prompts, tokenizers or vocabularies refused with one line."""

from __future__ import annotations

import dataclasses
import shutil

import mlx.core as mx
import pytest
from conftest import build_tiny, save_tiny_model, tokenizer_words, word_tokenizer
from mlx.utils import tree_map

from specbench.bench.compare import (
    A_HIGHER,
    B_HIGHER,
    UNRESOLVED,
    check_same_tokenizer,
    compare,
    run_models,
    verdict,
)
from specbench.bench.prompt_bench import PromptBench, load_prompt_bench
from specbench.bench.prompt_runs import PromptRun, prompt_methods
from specbench.cli import main
from specbench.common.identity import device_name, versions
from specbench.core.policies import DraftPolicy
from specbench.cost.profile import Profile, save_profile
from specbench.inputs.prompts import Question

WORDS = tokenizer_words()
METHODS = prompt_methods(["lookup"], [DraftPolicy.fixed(3)])


def _row(question: int, method: str, accepted: list[int], seconds: float = 1.0, category: str = "qa", **extra):
    """A run row as ``bench_prompts`` writes it: ``accepted`` per verification of 3 drafted tokens."""
    steps = [
        {"step": i, "position": i, "kind": "verify", "k_drafted": 3, "accepted": a} for i, a in enumerate(accepted)
    ]
    return {
        "question_key": f"k{question}",
        "question_id": str(question),
        "category": category,
        "turn": 0,
        "repeat": 0,
        "method": method,
        "verify": "exact" if method.startswith("lookup") else "none",
        "prompt_tokens": 20,
        "new_tokens": 12,
        "wall_s": seconds,
        "tokens": [question, 1, 2, 3],
        "steps": steps if method.startswith("lookup") else [],
        "engine": "mlx-lm" if method == "mlx-lm" else "specbench",
        "drafter": "lookup" if method.startswith("lookup") else "none",
        "first_token_s": 0.1,
        "forwards": 12 - sum(accepted),
        "verifies": len(accepted),
        "drafted": 3 * len(accepted),
        "accepted": sum(accepted),
        "pos_drafted": [],
        "pos_accepted": [],
        "equal": True,
        **extra,
    }


def _run(accepted_by_question: list[list[int]], seconds: float = 1.0, **info) -> PromptBench:
    rows = []
    for q, accepted in enumerate(accepted_by_question):
        category = "qa" if q % 2 else "translation"
        rows.append(_row(q, "mlx-lm", [], 2.0, category))
        rows.append(_row(q, "lookup/fixed:3", accepted, seconds, category))
    return PromptBench(
        [PromptRun.from_row(r) for r in rows],
        METHODS,
        {"model": "m", "max_tokens": 12, "tokenizer": "t1", "vocab": 97, **info},
    )


def test_verdicts_are_symmetric_and_say_when_there_is_no_interval():
    assert verdict(0.1, 0.3, 8) == A_HIGHER and verdict(-0.3, -0.1, 8) == B_HIGHER
    assert verdict(-0.1, 0.2, 8) == UNRESOLVED and verdict(0.0, 0.0, 8) == UNRESOLVED
    assert verdict(None, None, 5) == "no interval (5 prompts; 6 needed)"


def test_a_run_that_accepts_more_is_resolved_either_way_round():
    high = _run([[3, 2, 3]] * 4 + [[2, 3, 3]] * 4)  # 8 questions: an interval over prompts
    low = _run([[0, 1, 0]] * 4 + [[1, 0, 0]] * 4, seconds=1.5)
    ab, ba = compare(high, low, a_name="high", b_name="low"), compare(low, high, a_name="low", b_name="high")
    for d, e in zip(ab.differences, ba.differences):
        assert d.measure == e.measure and d.difference == pytest.approx(-e.difference)
        if d.low is None:
            assert e.low is None and d.verdict == e.verdict
            continue
        assert (d.low, d.high) == pytest.approx((-e.high, -e.low))  # the same draws, negated
        assert {d.verdict, e.verdict} in ({A_HIGHER, B_HIGHER}, {UNRESOLVED})
    overall = {d.measure: d for d in ab.section("overall")}
    assert overall["acceptance"].a == pytest.approx(8 / 9) and overall["acceptance"].b == pytest.approx(1 / 9)
    assert overall["acceptance"].verdict == A_HIGHER and overall["tokens per verification"].verdict == A_HIGHER
    assert overall["speedup over mlx-lm"].a == pytest.approx(2.0) and overall["speedup over mlx-lm"].b == pytest.approx(
        2.0 / 1.5
    )
    positions = ab.section("position")
    # low never accepts 2 drafts, so position 3 has no acceptance under it: left out and said
    assert [d.measure for d in positions] == ["acceptance at 1", "acceptance at 2"]
    assert "draft position 3 was reached only under high" in ab.notes[0]
    assert positions[0].a == 1.0 and positions[0].b == pytest.approx(8 / 24)
    assert positions[1].a == 1.0 and positions[1].b == 0.0  # reached in 8 of 24 verifications
    # per prompt kind: 4 questions each, too few for an interval, and said so
    assert [d.verdict for d in ab.section("kind")] == ["no interval (4 prompts; 6 needed)"] * 2
    assert "acceptance 0.889 vs 0.111: high higher by 0.778 [" in ab.verdict()
    assert "acceptance 0.111 vs 0.889: high higher by 0.778 [" in ba.verdict()  # the same interval, either way round
    assert ab.verdict().split("high higher by 0.778 ")[1][:20] == ba.verdict().split("high higher by 0.778 ")[1][:20]
    table = ab.table()
    assert "A - B [95 % interval]" in table and "outputs: identical on all 8 prompts" in table
    # the same run twice: every difference 0, nothing resolvable
    same = compare(high, high)
    assert all(d.difference == 0 and d.verdict in (UNRESOLVED,) or d.low is None for d in same.differences)
    assert "no difference resolvable in any" in same.verdict()


def test_mismatched_runs_are_one_line_naming_the_mismatch():
    base = _run([[1, 2, 3]] * 6)
    fewer = _run([[1, 2, 3]] * 5)
    with pytest.raises(ValueError, match=r"^A and B ran different prompts \(1 questions only in A \(5\), 0 only in B"):
        compare(base, fewer, a_name="A", b_name="B")
    other_tokenizer = _run([[1, 2, 3]] * 6, tokenizer="t2")
    with pytest.raises(ValueError, match="A and B have different tokenizer vocabularies \\(t1 and t2\\)"):
        compare(base, other_tokenizer, a_name="A", b_name="B")
    other_vocab = _run([[1, 2, 3]] * 6, vocab=128)
    with pytest.raises(ValueError, match="different output vocabularies \\(token ids\\) \\(97 and 128\\)"):
        compare(base, other_vocab, a_name="A", b_name="B")
    # runs recorded without a tokenizer's id: the same prompt's token count tells
    older = _run([[1, 2, 3]] * 6, tokenizer="")
    older.runs[0] = dataclasses.replace(older.runs[0], prompt_tokens=25)
    with pytest.raises(ValueError, match="tokenize the same prompt differently \\(question 0: 20 and 25 tokens\\)"):
        compare(base, older, a_name="A", b_name="B")
    longer = _run([[1, 2, 3]] * 6, max_tokens=64)
    with pytest.raises(ValueError, match="A generated up to 12 tokens per prompt and B 64"):
        compare(base, longer, a_name="A", b_name="B")
    with pytest.raises(ValueError, match="share no method 'suffix/auto': A ran lookup/fixed:3, B ran lookup/fixed:3"):
        compare(base, base, method="suffix/auto", a_name="A", b_name="B")
    for err in ("different prompts",):
        assert "\n" not in err


def _questions() -> list[Question]:
    """6 questions in 2 kinds, each ten words said six times (lookup drafts from them)."""
    out = []
    for q in range(6):
        words = " ".join(WORDS[(7 * q + i) % len(WORDS)] for i in range(10))
        out.append(Question(q, "echo" if q % 2 else "say", (" ".join([words] * 6),)))
    return out


def test_two_tiny_models_run_and_compared_end_to_end(tmp_path, capsys):
    """A model and a perturbed copy run on the same prompts: their outputs diverge, and the CLI compares the recorded
    runs and draws the figure; a run against itself: every acceptance difference 0, nothing resolvable."""
    a = save_tiny_model(tmp_path / "a", build_tiny("llama", seed=5))
    perturbed = build_tiny("llama", seed=5)
    noise = mx.random.key(1)
    perturbed.update(tree_map(lambda p: p + 0.05 * mx.random.normal(p.shape, key=noise), perturbed.parameters()))
    b = save_tiny_model(tmp_path / "b", perturbed)
    settings = dict(drafter="lookup", policy="fixed:3", max_tokens=8, progress=None)
    runs = run_models([str(a), str(b)], _questions(), out=tmp_path / "runs", **settings)
    assert runs[0].info["tokenizer"] == runs[1].info["tokenizer"] and runs[0].info["model_key"]
    changed = compare(runs[0], runs[1], a_name="a", b_name="b")
    assert any(d.at is not None for d in changed.divergences), "a perturbed model's outputs should differ somewhere"
    assert "prompts differ (plain greedy, first turns), first at token" in changed.divergence_line()
    assert {d.section for d in changed.differences} >= {"overall", "position", "kind"}
    itself = compare(runs[0], runs[0], a_name="a", b_name="a again")
    assert all(d.difference == 0 for d in itself.differences)
    assert all(d.verdict == UNRESOLVED for d in itself.differences if d.low is not None)
    speedup = next(d for d in itself.differences if d.measure == "speedup over mlx-lm")
    assert speedup.units == 6 and speedup.low == 0.0 == speedup.high  # 6 prompts: an interval, [0, 0]
    assert all(d.at is None for d in itself.divergences) and len(itself.divergences) == 6

    recorded = sorted(p for p in (tmp_path / "runs").iterdir())
    assert len(recorded) == 2
    out = tmp_path / "cmp"
    assert main(["compare", str(recorded[0]), str(recorded[1]), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "acceptance at 1" in printed and "Verdict:" in printed and "tokens per verification" in printed
    assert (out / "compare.png").read_bytes()[:4] == b"\x89PNG" and (out / "compare.md").is_file()
    assert load_prompt_bench(recorded[0]).info["model_key"] == runs[0].info["model_key"]


def test_the_cli_refuses_a_run_against_a_model_and_different_tokenizers_in_one_line(tmp_path, capsys):
    a = save_tiny_model(tmp_path / "a")
    run = _run([[1, 2, 3]] * 6)
    run.save(tmp_path / "run")
    assert main(["compare", str(tmp_path / "run"), str(a)]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "is a recorded run and" in err[0] and "is not" in err[0], err
    other = tmp_path / "other"
    shutil.copytree(a, other)
    word_tokenizer(roles=("user", "assistant", "system")).save_pretrained(str(other))
    with pytest.raises(ValueError, match="have different tokenizers or vocabularies"):
        check_same_tokenizer([str(a), str(other)])
    # before any model work: the tokenizers are compared first
    assert main(["compare", str(a), str(other), "--limit", "1", "--categories", "qa"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "different tokenizers or vocabularies" in err[0], err


def test_compare_is_a_documented_command(capsys):
    with pytest.raises(SystemExit):
        main(["compare", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "a folder of `specbench bench prompts --out`, or a model" in out and "(default: lookup)" in out


def test_a_difference_row_holds_its_verdict():
    run = _run([[1, 2, 3]] * 6)
    row = compare(run, run).differences[0].row()
    assert row["verdict"] == UNRESOLVED and row["difference"] == 0 and dataclasses.is_dataclass(compare(run, run))


def test_runs_that_drafted_nothing_compare_their_speed_and_say_why_acceptance_is_missing():
    idle = _run([[]] * 6)
    comparison = compare(idle, idle)
    assert [d.measure for d in comparison.differences] == ["speedup over mlx-lm"]
    assert "acceptance, tokens per verification" in comparison.notes[0] and "drafted anything" in comparison.notes[0]


def _profile(key: str, costs: list[float], half_width: float) -> Profile:
    widths = list(range(1, len(costs) + 1))
    return Profile(
        model=key,
        name=key,
        device=device_name(),
        versions=versions(),
        plain_step_s=0.01,
        widths={"exact": widths},
        costs={"exact": costs},
        seconds={"exact": [0.01 * c for c in costs]},
        rounds={"plain": [0.01] * 5},
        intervals={"exact": [[c - half_width, c + half_width] for c in costs]},
        interval_level=0.9375,
    )


def test_c_of_w_is_compared_where_both_models_have_a_stored_profile(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECBENCH_HOME", str(tmp_path))
    a, b = _run([[1, 2, 3]] * 6, model_key="cheap"), _run([[1, 2, 3]] * 6, model_key="dear", model="n")
    assert compare(a, b).section("cost") == [] and "no stored exact cost profile of m and n" in compare(a, b).notes[0]
    save_profile(_profile("cheap", [1.0, 1.1, 1.2, 1.3], 0.05))
    save_profile(_profile("dear", [1.0, 1.1, 2.0, 1.35], 0.1))
    costs = {d.measure: d for d in compare(a, b).section("cost")}
    assert list(costs) == ["c(2) exact", "c(3) exact", "c(4) exact"]  # up to the longest draft + 1
    assert costs["c(3) exact"].difference == pytest.approx(-0.8) and costs["c(3) exact"].verdict == B_HIGHER
    assert (costs["c(3) exact"].low, costs["c(3) exact"].high) == pytest.approx((-0.95, -0.65))
    assert costs["c(2) exact"].verdict == UNRESOLVED and costs["c(4) exact"].units == 5
    assert "at least 88% of the time" in compare(a, b).notes[-1]
