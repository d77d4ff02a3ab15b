"""The batch benchmark: oracle drafters recorded before timing (no model work inside a timed run, drafting
on after a divergence), real drafters on prompt files and trace turns, through the CLI."""

from __future__ import annotations

import csv
import json

import pytest
from conftest import SHARED_DATA, build_tiny, emulate_gpu, plain_greedy, save_tiny_model, word_tokenizer

from specbench.bench.batch_bench import bench_batch, first_divergence, oracle_drafters
from specbench.core.batch import BatchGeneration
from specbench.core.options import GenerateOptions
from specbench.core.policies import DraftPolicy
from specbench.drafters.oracle import Oracle
from specbench.inputs.prompts import questions_from, render_prompt

PROMPTS = [[5, 17, 3], [9, 5, 17, 3, 9, 5, 17], [44, 2, 8, 5, 17]]
SPEC_BENCH = SHARED_DATA / "spec-bench" / "question.jsonl"


@pytest.fixture
def model_calls(monkeypatch):
    """A tiny model whose forwards are counted: all of them, and those made while an oracle drafts."""
    model = build_tiny("qwen3")
    calls = {"all": 0, "drafting": 0, "in_draft": False}
    forward, draft = type(model).__call__, Oracle.draft

    def counted_forward(self, *args, **kwargs):
        calls["all"] += 1
        calls["drafting"] += calls["in_draft"]
        return forward(self, *args, **kwargs)

    def counted_draft(self, context, k):
        calls["in_draft"] = True
        try:
            return draft(self, context, k)
        finally:
            calls["in_draft"] = False

    monkeypatch.setattr(type(model), "__call__", counted_forward)
    monkeypatch.setattr(Oracle, "draft", counted_draft)
    return model, calls


def test_oracle_drafts_on_after_a_divergence_without_running_the_model(model_calls):
    model, calls = model_calls
    n = 12
    plain = BatchGeneration(model, PROMPTS, GenerateOptions(max_tokens=n)).run()
    calls["all"] = 0
    BatchGeneration(model, PROMPTS, GenerateOptions(max_tokens=1)).run()
    prompt_passes = calls["all"]
    # A recording that leaves the model's output at position 3 of request 0 (as a GPU's batched run
    # can): the oracle must go on drafting it there, never re-record with the model.
    recorded = [list(t) for t in plain]
    recorded[0][3] = (recorded[0][3] + 1) % 97
    drafters = oracle_drafters(PROMPTS, recorded, 1.0, 97)
    gen = BatchGeneration(model, PROMPTS, GenerateOptions(max_tokens=n), drafters, DraftPolicy.fixed(3))
    calls["all"] = 0
    assert gen.run() == plain  # greedy output is the model's whatever the drafts
    assert calls["drafting"] == 0
    # the prompt passes and one forward per batched step: nothing else ran the model
    assert calls["all"] == prompt_passes + len(gen.batch_log)
    assert drafters[0].diverged_at == 3 and drafters[1].diverged_at is None
    after = [r for r in gen.requests[0].log.records if r.kind == "verify" and r.position > 3]
    assert after and all(r.draft_tokens for r in after)  # kept drafting past the divergence
    stats = [r.stats() for r in gen.requests]
    assert stats[1]["acceptance_rate"] == 1.0 and stats[0]["acceptance_rate"] < 1.0


def test_bench_oracle_is_recorded_from_the_plain_batched_run(model_calls):
    model, calls = model_calls
    result = bench_batch(model, PROMPTS, 2, ["oracle:1.0", "oracle:0.0"], "fixed:3", max_tokens=8, warmup=False)
    rows = {r.engine: r for r in result.rows}
    assert calls["drafting"] == 0
    full, none = rows["oracle:1.0/fixed:3"], rows["oracle:0.0/fixed:3"]
    assert full.acceptance_rate == 1.0 and full.diverged_from_recording == 0
    assert none.acceptance_rate == 0.0
    assert full.identical_to_plain == none.identical_to_plain == 1.0
    with pytest.raises(ValueError, match="oracle:A"):
        bench_batch(model, PROMPTS, 2, ["oracle:often"], "fixed:3", warmup=False)
    with pytest.raises(ValueError, match="at least one drafter"):
        bench_batch(model, PROMPTS, 2, ["none"], "fixed:3", warmup=False)


def test_bench_batch_in_exact_mode_equals_single_request_greedy_on_an_emulated_gpu(monkeypatch):
    model = build_tiny("llama")
    emulate_gpu(monkeypatch, size=0.05)  # multi-row products (B requests x 1 row included) round otherwise
    single = [plain_greedy(model, p, 8) for p in PROMPTS]
    summaries = {}
    for verify in ("fast", "exact"):
        result = bench_batch(
            model, PROMPTS, 2, ["oracle:0.8"], "fixed:3", 8, single=single, warmup=False, verify=verify
        )
        summaries[verify] = {(s.engine, s.reference): s.identical for s in result.divergence_summary}
        assert {r.verify for r in result.rows if r.engine != "mlx-lm"} == {verify}
    assert summaries["exact"][("plain", "single")] == summaries["exact"][("oracle:0.8/fixed:3", "single")] == 1.0
    assert summaries["fast"][("plain", "single")] < 1.0  # the emulated GPU has teeth


@pytest.mark.skipif(not SPEC_BENCH.exists(), reason="Spec-Bench question.jsonl not present")
def test_bench_batch_on_spec_bench_questions():
    model, tokenizer = build_tiny("llama"), word_tokenizer()
    questions = questions_from(SPEC_BENCH, None, 1)[:3]
    prompts = [render_prompt(tokenizer, q.turns[0])[:48] for q in questions]
    result = bench_batch(model, prompts, 2, ["lookup"], "fixed:3", max_tokens=6, tokenizer=tokenizer, warmup=False)
    speculative = result.rows[1]
    assert speculative.engine == "lookup/fixed:3" and speculative.identical_to_plain == 1.0


def test_a_loaded_models_shipped_draft_model_is_found_without_its_name(monkeypatch):
    """``bench batch`` builds drafters from the model alone: the name it was loaded by finds what is shipped
    for it (it said "no draft model is shipped" for a model that has one)."""
    import specbench.drafters.draft_model as drafters

    model, draft = build_tiny("llama"), build_tiny("llama", seed=3)
    model.specbench_name = "tiny-with-a-draft"
    shipped = drafters.shipped_draft_model

    def shipped_for_tiny(target, model_name):
        return draft if model_name == "tiny-with-a-draft" else shipped(target, model_name)

    monkeypatch.setattr(drafters, "shipped_draft_model", shipped_for_tiny)
    result = bench_batch(model, PROMPTS, 2, ["draft-model"], "fixed:2", max_tokens=4, warmup=False)
    assert [r.engine for r in result.rows][:2] == ["plain", "draft-model/fixed:2"]
    assert result.rows[1].identical_to_plain == 1.0


def _embedded_model():
    from specbench.models.load import embedded_model_path, load

    if not (embedded_model_path("smollm2-135m") / "config.json").is_file():
        pytest.skip("the embedded model is not set up (specbench setup)")
    return load("smollm2-135m")[0]


def test_the_embedded_models_mtp_head_and_draft_model_are_found_by_the_batch_benchmark():
    from specbench.bench.batch_bench import _methods
    from specbench.drafters import DraftModel, MtpHead, make_drafter

    model = _embedded_model()
    assert [m[0] for m in _methods(["mtp", "draft-model"], ["fixed:2"], model)] == [
        "mtp/fixed:2",
        "draft-model/fixed:2",
    ]
    assert isinstance(make_drafter("mtp", model=model), MtpHead)
    assert isinstance(make_drafter("draft-model", model=model), DraftModel)


def test_bench_batch_cli_on_traces_and_prompts(tmp_path, capsys):
    from specbench.cli import main

    folder = save_tiny_model(tmp_path / "tiny")
    lines = [
        {"trace": "t1", "turn": 0, "messages": [{"role": "user", "content": "w5 w6 w7 w5 w6 w7"}]},
        {"trace": "t1", "turn": 1, "messages": [{"role": "user", "content": "w8 w9 w5 w6"}]},
        {"trace": "t2", "turn": 0, "messages": [{"role": "user", "content": "w11 w12 w13 w11 w12"}]},
    ]
    for line, reply in zip(lines, ("w9 w10", "w7 w5", "w13 w14")):
        line["assistant"] = {"role": "assistant", "content": reply}
    trace = tmp_path / "traces.jsonl"
    trace.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "out"
    args = [
        "bench",
        "batch",
        "--model",
        str(folder),
        "--batch-size",
        "2",
        "--drafters",
        "lookup,suffix",
        "--policies",
        "fixed:3",
    ]
    assert main([*args, "--trace", str(trace), "--limit", "2", "--max-tokens", "6", "--out", str(out)]) == 0
    assert "3 requests from" in capsys.readouterr().out
    with open(out / "batch_bench.csv") as f:
        rows = {r["engine"]: r for r in csv.DictReader(f)}
    assert list(rows) == ["plain", "lookup/fixed:3", "suffix/fixed:3", "mlx-lm"]
    assert all(float(rows[m]["identical_to_plain"]) == 1.0 for m in ("lookup/fixed:3", "suffix/fixed:3"))
    with open(out / "batch_divergence.csv") as f:
        assert {r["label"] for r in csv.DictReader(f)} == {"t1/0", "t1/1", "t2/0"}
    assert main([*args, "--trace", str(trace), "--turns", "1", "--trace-id", "t1", "--max-tokens", "4"]) == 0
    assert "1 requests from" in capsys.readouterr().out
    prompts = tmp_path / "question.jsonl"
    prompts.write_text(json.dumps({"question_id": 1, "category": "qa", "turns": ["w5 w6 w7 w5 w6"]}) + "\n")
    assert main([*args, "--prompts", str(prompts), "--max-tokens", "4"]) == 0
    assert "lookup/fixed:3" in capsys.readouterr().out
    assert main([*args, "--prompts", str(prompts), "--batch-size", "0"]) == 2
    assert "--batch-size must be" in capsys.readouterr().err
    assert main([*args, "--prompts", str(prompts), "--max-tokens", "4", "--verify", "exact"]) == 0
    assert "exact verify" in capsys.readouterr().out
    assert main([*args, "--prompts", str(prompts), "--verify", "sloppy"]) == 2
    assert "invalid choice: 'sloppy'" in capsys.readouterr().err


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 5, 3], [1, 2, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2
