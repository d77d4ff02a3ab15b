"""Traces: the bundled set, the schema's loader and errors, importers, rendering, and trace replay."""

from __future__ import annotations

import json

import polars as pl
import pytest
from conftest import SHARED_DATA, build_tiny, tokenizer_words, word_tokenizer, write_traces

from specbench.bench.trace_bench import bench_trace, run_trace, trace_methods
from specbench.core.engine import plain_generation
from specbench.core.options import GenerateOptions
from specbench.core.policies import DraftPolicy
from specbench.drafters import PromptLookup, SuffixDecoding
from specbench.inputs.importers import detect_format, load_traces
from specbench.inputs.traces import (
    Trace,
    Turn,
    as_text_messages,
    bundled_traces,
    render_messages,
    render_turn,
)
from specbench.simulate.simulate import load_recorded, simulate

TAU = SHARED_DATA / "tau-bench-fewshot"
ROLES = ("user", "assistant", "system", "tool")
WORDS = tokenizer_words(ROLES)


def embedded_tokenizer():
    from specbench.models.load import embedded_model_path

    path = embedded_model_path("smollm2-135m")
    if not (path / "tokenizer.json").exists():
        pytest.skip("the embedded model is not set up (specbench setup)")
    from mlx_lm.utils import load_tokenizer

    return load_tokenizer(path)


# -- the bundled traces -------------------------------------------------------------------------------


def test_bundled_traces_cover_the_four_kinds():
    names = bundled_traces()
    assert {"tool-agent", "coding-agent", "chat-revision", "long-context-qa"} <= set(names)
    for name in names:
        (trace,) = load_traces(name)
        assert len(trace.turns) >= 6, name
        assert trace.meta["description"]
        assert all(turn.assistant is not None for turn in trace.turns)
    (tool,) = load_traces("tool-agent")
    calls = [c for t in tool.turns for c in (t.assistant.get("tool_calls") or [])]
    results = [m for t in tool.turns for m in t.messages if m["role"] == "tool"]
    assert len(calls) >= 5 and len(results) == len(calls)
    assert all(isinstance(json.loads(m["content"]), dict) for m in results)  # JSON tool results
    assert {c["name"] for c in calls} <= {t["name"] for t in tool.tools}
    (coding,) = load_traces("coding-agent")
    reads = [c for t in coding.turns for c in (t.assistant.get("tool_calls") or []) if c["name"] == "read_file"]
    edits = [c for t in coding.turns for c in (t.assistant.get("tool_calls") or []) if c["name"] == "replace_in_file"]
    assert len(reads) >= 3 and len(edits) >= 2  # reads, edits and re-reads the file


def test_turn_prompts_hold_the_whole_history():
    (trace,) = load_traces("chat-revision")
    history = trace.history(3)
    assert [m["role"] for m in history] == ["user", "assistant"] * 3 + ["user"]
    assert history[1] == trace.turns[0].assistant
    replaced = trace.history(3, ["first reply", None, {"role": "assistant", "content": "third"}])
    assert replaced[1]["content"] == "first reply" and replaced[3] == trace.turns[1].assistant
    assert replaced[5]["content"] == "third"
    with pytest.raises(ValueError, match="turns 0..6"):
        trace.history(7)


def test_rendering_with_the_embedded_chat_template():
    tokenizer = embedded_tokenizer()
    (trace,) = load_traces("tool-agent")
    ids = render_turn(tokenizer, trace, 2)
    text = tokenizer.decode(ids)
    assert text.endswith("<|im_start|>assistant\n")
    assert text.count("<|im_start|>tool") == 2  # two tool results so far
    assert '<tool_call>\n{"name": "find_customer", "arguments": {"email": "dana.whitfield@example.net"}}' in text
    assert '"name": "update_shipping_address"' in text  # tool descriptions in the system message
    # Each turn's prompt extends the previous turn's prompt and reply.
    longer = tokenizer.decode(render_turn(tokenizer, trace, 3))
    assert longer.startswith(text)


class _FakeTokenizer:
    """Records what reaches the chat template; encodes text as its characters."""

    def __init__(self, template, reject_tool_role=False):
        self.chat_template = template
        self.reject_tool_role = reject_tool_role
        self.calls = []

    def apply_chat_template(self, messages, tools=None, add_generation_prompt=False, tokenize=False):
        if self.reject_tool_role and any(m["role"] == "tool" for m in messages):
            raise ValueError("Conversation roles must alternate user/assistant")
        self.calls.append((messages, tools))
        return "|".join(f"{m['role']}:{m['content']}" for m in messages)

    def encode(self, text, add_special_tokens=True):
        return [ord(c) for c in text]


MESSAGES = [
    {"role": "user", "content": "weather?"},
    {"role": "assistant", "content": None, "tool_calls": [{"name": "forecast", "arguments": {"city": "Oslo"}}]},
    {"role": "tool", "name": "forecast", "content": '{"temp": 3}'},
]
TOOLS = [{"name": "forecast", "parameters": {"type": "object"}}]


def test_rendering_tool_calls_natively_or_as_text():
    native = _FakeTokenizer("{% for m in messages %}{{ m.tool_calls }}{% endfor %}")
    render_messages(native, MESSAGES, TOOLS)
    messages, tools = native.calls[-1]
    assert messages[1]["tool_calls"][0]["function"] == {"name": "forecast", "arguments": {"city": "Oslo"}}
    assert tools == [{"type": "function", "function": TOOLS[0]}]
    plain = _FakeTokenizer("{{ messages }}")
    render_messages(plain, MESSAGES, TOOLS)
    messages, tools = plain.calls[-1]
    assert tools is None and messages[0]["role"] == "system" and "forecast" in messages[0]["content"]
    assert messages[2]["content"] == '<tool_call>\n{"name": "forecast", "arguments": {"city": "Oslo"}}\n</tool_call>'
    assert messages[3] == {"role": "tool", "content": '{"temp": 3}'}
    strict = _FakeTokenizer("{{ messages }}", reject_tool_role=True)
    render_messages(strict, MESSAGES, TOOLS)
    assert strict.calls[-1][0][3] == {"role": "user", "content": '<tool_response>\n{"temp": 3}\n</tool_response>'}
    bare = _FakeTokenizer(None)
    text = "".join(chr(i) for i in render_messages(bare, MESSAGES))
    assert text.startswith("user: weather?\n\n") and text.endswith('tool: {"temp": 3}\n\nassistant:')
    assert as_text_messages([{"role": "assistant", "content": "ok"}]) == [{"role": "assistant", "content": "ok"}]


# -- the schema: round trip and errors ----------------------------------------------------------------


def _write(path, lines):
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


def test_save_and_load_round_trip(tmp_path):
    trace = Trace(
        "t",
        [
            Turn([{"role": "user", "content": "hi"}], {"role": "assistant", "content": "hello"}),
            Turn([{"role": "user", "content": "bye"}], None),
        ],
        TOOLS,
        {"description": "d"},
    )
    path = write_traces([trace, Trace("u", [Turn([{"role": "user", "content": "x"}])])], tmp_path / "a.jsonl")
    assert detect_format(path) == "trace"
    back = load_traces(path)
    assert back == [trace, Trace("u", [Turn([{"role": "user", "content": "x"}])])]
    assert back[0].tools == TOOLS and back[1].turns[0].assistant is None


@pytest.mark.parametrize(
    "line, message",
    [
        ("{not json", "not valid JSON"),
        ({"trace": "t", "turn": 0}, "missing \\['messages'\\]"),
        ({"trace": "t", "turn": 0, "messages": [{"role": "robot", "content": "x"}]}, "role must be one of"),
        ({"trace": "t", "turn": 0, "messages": [{"role": "user", "content": 3}]}, "content must be a string"),
        ({"trace": "t", "turn": 0, "messages": [{"role": "user", "content": "x", "tool_calls": []}]}, "only assistant"),
        ({"trace": "t", "turn": 2, "messages": []}, "expects turn 1 next"),
        ({"trace": "t", "turn": 1, "messages": [], "tools": []}, "first line"),
        ({"trace": "t", "turn": 1, "messages": [], "assistant": {"role": "user", "content": "x"}}, "role 'assistant'"),
    ],
)
def test_malformed_lines_name_file_and_line(tmp_path, line, message):
    first = {"trace": "t", "turn": 0, "messages": [{"role": "user", "content": "hi"}]}
    path = _write(tmp_path / "bad.jsonl", [first, line])
    with pytest.raises(ValueError, match=message) as err:
        load_traces(path, "trace")
    assert f"{path}:2" in str(err.value)


def test_missing_file_and_unknown_format(tmp_path):
    with pytest.raises(FileNotFoundError, match="bundled traces"):
        load_traces(tmp_path / "nope.jsonl")
    path = _write(tmp_path / "x.jsonl", [{"something": 1}])
    with pytest.raises(ValueError, match="cannot tell its format"):
        load_traces(path)


TURN0 = {"trace": "t", "turn": 0, "messages": [{"role": "user", "content": "hi"}], "assistant": None}
CHAT = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
SHARE = {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]}


def test_detection_reads_every_record_and_rejects_mixed_files(tmp_path):
    # The first lines agree; line 3 is of another format: an error at line 3, not a silent misread.
    mixed = _write(tmp_path / "mixed.jsonl", [CHAT, CHAT, SHARE])
    for fmt in (None, "openai"):
        with pytest.raises(ValueError, match=f"{mixed}:3: a sharegpt record"):
            load_traces(mixed, fmt)
    assert "one format" in str(pytest.raises(ValueError, detect_format, mixed).value)
    # A record with the keys of two schemas is unclear: detection refuses it, an explicit format reads it.
    both = _write(tmp_path / "both.jsonl", [CHAT, {**CHAT, **SHARE}])
    ambiguous = f"{both}:2: ambiguous: this record could be openai or sharegpt .*--trace-format openai\\|sharegpt"
    with pytest.raises(ValueError, match=ambiguous):
        load_traces(both)
    assert len(load_traces(both, "openai")) == 2
    # A record that only half matches the trace schema is read as the schema, whose error names what it lacks.
    half = _write(tmp_path / "half.jsonl", [TURN0, {"trace": "t", "messages": []}])
    with pytest.raises(ValueError, match=f"{half}:2: a turn needs .*missing \\['turn'\\]"):
        load_traces(half)
    # JSON arrays: the error names the item.
    array = tmp_path / "array.json"
    array.write_text(json.dumps([CHAT, SHARE]))
    with pytest.raises(ValueError, match=f"{array}: item 1: a sharegpt record"):
        load_traces(array)
    array.write_text(json.dumps([CHAT, {"role": "user", "content": "x"}]))
    with pytest.raises(ValueError, match=f"{array}: item 1: a bare chat message"):
        load_traces(array)
    array.write_text(json.dumps([SHARE, SHARE]))
    assert detect_format(array) == "sharegpt" and len(load_traces(array)) == 2
    unknown = _write(tmp_path / "unknown.jsonl", [CHAT, {"text": "x"}])
    with pytest.raises(ValueError, match=f"{unknown}:2: cannot tell its format .*keys: text"):
        load_traces(unknown)


def test_a_trace_file_is_not_read_as_another_format(tmp_path):
    """Each schema line holds "messages": read as OpenAI it would replay every turn without its history."""
    trace = Trace(
        "t",
        [
            Turn([{"role": "user", "content": "q1"}], {"role": "assistant", "content": "a1"}),
            Turn([{"role": "user", "content": "q2"}], {"role": "assistant", "content": "a2"}),
        ],
    )
    path = write_traces([trace], tmp_path / "t.jsonl")
    for fmt in ("openai", "sharegpt", "questions", "tau-bench"):
        with pytest.raises(ValueError, match=f"{path}:1: a trace record, not {fmt} .*lose the history"):
            load_traces(path, fmt)
    (back,) = load_traces(path)
    assert back.history(1)[:2] == [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"}]
    chat = _write(tmp_path / "chat.jsonl", [CHAT])
    with pytest.raises(ValueError, match=f"{chat}:1: an openai record, not trace"):
        load_traces(chat, "trace")


def test_non_utf8_files_name_file_and_line(tmp_path):
    good = json.dumps(CHAT).encode()
    path = tmp_path / "latin.jsonl"
    path.write_bytes(good + b"\n" + json.dumps(CHAT).replace("hello", "h\u00e9llo").encode("latin-1") + b"\n")
    offset = len(good) + 1 + json.dumps(CHAT).index("hello") + 1
    for fmt in (None, "openai"):
        with pytest.raises(ValueError, match=f"{path}:2: not UTF-8 text \\(byte {offset}"):
            load_traces(path, fmt)
    as_json = tmp_path / "latin.json"
    as_json.write_bytes(b"\xff\xfe[]")
    with pytest.raises(ValueError, match=f"{as_json}:1: not UTF-8 text \\(byte 0"):
        load_traces(as_json)
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + good + b"\n")
    assert len(load_traces(bom)) == 1


def test_text_that_is_not_text_is_refused_where_prompts_enter(tmp_path):
    """A lone surrogate (a JSON escape of bytes that were not UTF-8) in a trace file, a tool description, a
    trace built in code, a message list or a text prompt given to the engine: one ValueError saying so, never
    the tokenizer's TypeError."""
    from specbench.core.engine import token_ids
    from specbench.inputs.prompts import render_prompt
    from specbench.inputs.traces import render_messages

    tokenizer = word_tokenizer(ROLES)
    not_text = "w5 \ud800"
    chat = {"messages": [{"role": "user", "content": not_text}, {"role": "assistant", "content": "w6"}]}
    (tmp_path / "chat.jsonl").write_text(json.dumps(chat) + "\n")
    with pytest.raises(ValueError, match="chat.jsonl:1.*cannot be tokenized: character 3"):
        load_traces(tmp_path / "chat.jsonl")
    tools = {**CHAT, "tools": [{"name": "find", "description": not_text}]}
    (tmp_path / "tools.jsonl").write_text(json.dumps(tools) + "\n")
    with pytest.raises(ValueError, match=r"tools.jsonl:1.*tools\[0\] cannot be tokenized"):
        load_traces(tmp_path / "tools.jsonl")
    with pytest.raises(ValueError, match="the rendered trace prompt cannot be tokenized"):
        render_turn(tokenizer, Trace("made", [Turn([{"role": "user", "content": not_text}])]), 0)
    with pytest.raises(ValueError, match="cannot be tokenized"):
        render_messages(tokenizer, [{"role": "user", "content": not_text}])
    parts = [{"role": "user", "content": [{"type": "text", "text": not_text}]}]
    with pytest.raises(ValueError, match="the prompt cannot be tokenized: character 3"):
        render_prompt(tokenizer, parts)
    with pytest.raises(ValueError, match="the prompt cannot be tokenized: character 3"):
        token_ids(not_text, tokenizer)
    assert token_ids("w5 w6", tokenizer) == list(tokenizer.encode("w5 w6"))


# -- importers ------------------------------------------------------------------------------------------


def test_openai_and_sharegpt(tmp_path):
    conversation = {
        "id": "c1",
        "tools": [{"type": "function", "function": TOOLS[0]}],
        "messages": [
            {"role": "developer", "content": [{"type": "text", "text": "be brief"}]},
            {"role": "user", "content": "weather in Oslo?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_9",
                        "type": "function",
                        "function": {"name": "forecast", "arguments": '{"city": "Oslo"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_9", "content": "3 C"},
            {"role": "assistant", "content": "3 C in Oslo."},
            {"role": "user", "content": "thanks"},
        ],
    }
    path = tmp_path / "chat.json"
    path.write_text(json.dumps(conversation))
    (trace,) = load_traces(path)
    assert trace.id == "c1" and trace.tools == TOOLS and len(trace.turns) == 3
    assert trace.turns[0].messages[0] == {"role": "system", "content": "be brief"}
    call = {"id": "call_9", "name": "forecast", "arguments": {"city": "Oslo"}}
    assert trace.turns[0].assistant["tool_calls"] == [call]
    assert trace.turns[1].messages == [{"role": "tool", "content": "3 C", "tool_call_id": "call_9"}]
    assert trace.turns[2].assistant is None  # the trailing user message is an open turn
    share = _write(
        tmp_path / "share.jsonl",
        [
            {
                "conversations": [
                    {"from": "system", "value": "sys"},
                    {"from": "human", "value": "q1"},
                    {"from": "gpt", "value": "a1"},
                    {"from": "human", "value": "q2"},
                    {"from": "gpt", "value": "a2"},
                ]
            }
        ],
    )
    (trace,) = load_traces(share)
    assert [t.assistant["content"] for t in trace.turns] == ["a1", "a2"]
    bad = _write(tmp_path / "bad.jsonl", [{"conversations": [{"from": "alien", "value": "x"}]}])
    with pytest.raises(ValueError, match=f"{bad}:1: conversations\\[0\\]"):
        load_traces(bad, "sharegpt")


@pytest.mark.skipif(not TAU.exists(), reason="shared tau-bench data absent")
def test_tau_bench_conversations():
    path = TAU / "MockAirlineDomainEnv-few_shot.jsonl"
    traces = load_traces(path)
    assert len(traces) == sum(1 for line in path.open() if line.strip())
    trace = traces[0]
    assert trace.turns[0].messages[0]["role"] == "user"
    roles = [m["role"] for t in trace.turns for m in t.messages]
    assert "tool" in roles
    hidden_calls = [t for t in trace.turns if t.assistant is not None and t.assistant["content"] is None]
    assert hidden_calls  # "assistant: None" lines: tool calls the display hides
    # Multi-line messages stay whole.
    retail = load_traces(TAU / "MockRetailDomainEnv-few_shot.jsonl")
    assert any("\n" in ((t.assistant or {}).get("content") or "") for tr in retail for t in tr.turns)


def test_tau_bench_malformed(tmp_path):
    path = _write(tmp_path / "tau.jsonl", [{"messages_display": "user: hi\nassistant: hello"}, {"messages_display": 5}])
    with pytest.raises(ValueError, match=f"{path}:2"):
        load_traces(path, "tau-bench")


def test_swe_agent_trajectories(tmp_path):
    history = [
        {"role": "system", "content": "SETTING: You are an autonomous programmer.", "agent": "primary"},
        {
            "role": "user",
            "content": [{"type": "text", "text": "<issue>sum() is off by one</issue>"}],
            "agent": "primary",
            "message_type": "observation",
        },
        {
            "role": "assistant",
            "content": "Let me look.",
            "thought": "Let me look.",
            "action": "open calc.py",
            "agent": "primary",
            "message_type": "action",
            "tool_calls": [
                {
                    "id": "t1",
                    "type": "function",
                    "function": {"name": "bash", "arguments": '{"command": "cat calc.py"}'},
                }
            ],
        },
        {
            "role": "tool",
            "content": [{"type": "text", "text": "def total(xs):\n    return sum(xs) + 1"}],
            "tool_call_ids": ["t1"],
            "agent": "primary",
            "message_type": "observation",
        },
        {"role": "assistant", "content": "Remove the + 1.", "agent": "primary", "message_type": "action"},
    ]
    path = tmp_path / "calc__calc-1.traj"
    path.write_text(json.dumps({"trajectory": [], "history": history, "info": {"exit_status": "submitted"}}))
    (trace,) = load_traces(path)
    assert trace.id == "calc__calc-1" and trace.meta["exit_status"] == "submitted"
    assert len(trace.turns) == 2
    assert trace.turns[0].messages[1] == {"role": "user", "content": "<issue>sum() is off by one</issue>"}
    assert trace.turns[0].assistant["tool_calls"][0]["arguments"] == {"command": "cat calc.py"}
    assert trace.turns[1].messages[0]["tool_call_id"] == "t1"
    # Older files: only trajectory steps.
    steps = [
        {
            "response": "DISCUSSION\nls",
            "action": "ls",
            "observation": "calc.py",
            "thought": "x",
            "query": [{"role": "system", "content": "sys"}, {"role": "user", "content": "issue"}],
        },
        {"response": "open calc.py", "action": "open calc.py", "observation": "1: def total"},
    ]
    old = tmp_path / "old.traj"
    old.write_text(json.dumps({"trajectory": steps}))
    (trace,) = load_traces(old)
    assert [t.assistant["content"] for t in trace.turns[:2]] == ["DISCUSSION\nls", "open calc.py"]
    assert trace.turns[2].assistant is None  # the last observation awaits a reply
    assert trace.turns[0].messages == [{"role": "system", "content": "sys"}, {"role": "user", "content": "issue"}]
    assert trace.turns[2].messages == [{"role": "user", "content": "1: def total"}]
    broken = tmp_path / "broken.traj"
    broken.write_text('{"trajectory": [}')
    with pytest.raises(ValueError, match=f"{broken}:1"):
        load_traces(broken)


@pytest.mark.parametrize("name", ["mt-bench", "spec-bench"])
def test_question_files(name):
    path = SHARED_DATA / name / "question.jsonl"
    if not path.exists():
        pytest.skip("shared question data absent")
    traces = load_traces(path)
    assert len(traces) == sum(1 for line in path.open() if line.strip())
    multi = [t for t in traces if len(t.turns) == 2]
    assert multi and all(t.turns[1].assistant is None for t in multi)
    with pytest.raises(ValueError, match="no recorded reply"):
        multi[0].history(1)
    assert multi[0].history(1, ["an answer"])[1] == {"role": "assistant", "content": "an answer"}


# -- trace replay ---------------------------------------------------------------------------------------


def _word_trace() -> Trace:
    block = " ".join(WORDS[i] for i in (3, 17, 29, 8, 41, 56, 12, 70, 33, 5))
    return Trace(
        "words",
        [
            Turn([{"role": "system", "content": "w6 w7"}, {"role": "user", "content": f"{block} {block} w9"}]),
            Turn([{"role": "tool", "content": f"{block} w10 {block}"}]),
            Turn([{"role": "user", "content": f"w11 {block}"}]),
        ],
    )


def test_bench_trace_replays_turns_with_identical_outputs(tmp_path):
    model = build_tiny("llama", seed=4)
    tokenizer = word_tokenizer(ROLES)
    trace = _word_trace()
    suffix = SuffixDecoding(max_spec_tokens=6)
    drafters = {"lookup": PromptLookup(), "suffix": suffix}
    result = bench_trace(model, tokenizer, trace, drafters, DraftPolicy.fixed(4), max_tokens=24, out_dir=tmp_path)
    assert result.identical
    turns = result.turns
    assert turns.height == 3 * 3 and set(turns["method"]) == {"plain", "lookup", "suffix"}
    plain = turns.filter(pl.col("method") == "plain")
    assert (plain["drafted"] == 0).all() and (plain["speedup"] == 1.0).all()
    spec = turns.filter(pl.col("method") == "suffix").sort("turn")
    assert spec["accepted"].sum() > 0
    assert spec["cum_accepted"].to_list() == list(__import__("itertools").accumulate(spec["accepted"].to_list()))
    # Later prompts hold earlier replies: each prompt extends the one before it.
    prompts = [r.prompt for r in result.recorded]
    for before, after, rec in zip(prompts, prompts[1:], result.recorded):
        assert len(after) > len(before) + len(rec.output) - 2
    # Every method keeps its prompt cache: after the first turn only the new tokens are prefilled ...
    for method in ("plain", "lookup", "suffix"):
        cached = turns.filter(pl.col("method") == method).sort("turn")["cached_prompt_tokens"].to_list()
        assert cached == [0] + [len(p) for p in prompts[:-1]]
    prefills = result.steps.to_polars().filter(pl.col("kind") == "prefill").sort("turn", "method")
    assert prefills["cached_prompt_tokens"].to_list() == [n for p in [[]] + prompts[:-1] for n in [len(p)] * 3]
    # ... and every turn's output equals plain decoding from an empty cache.
    for rec in result.recorded:
        assert rec.output == list(plain_generation(model, rec.prompt, GenerateOptions(max_tokens=24)))
    assert suffix.stored_sequences == 3  # the store kept every turn's reply
    summary = result.summary
    assert summary.height == 3 and summary.filter(pl.col("method") == "suffix")["tokens_per_verify"][0] > 1.0
    assert "suffix" in result.table()
    # Files: per-turn table, per-step log, plain outputs; the simulator reproduces the suffix run from them.
    steps = pl.read_parquet(tmp_path / "words.steps.parquet")
    assert set(steps["method"]) == {"plain", "lookup", "suffix"}
    recorded = load_recorded(tmp_path / "words.plain.parquet")
    simulated = simulate(
        recorded, SuffixDecoding(max_spec_tokens=6), DraftPolicy.fixed(4), GenerateOptions(max_tokens=24)
    )
    real = steps.filter(pl.col("method") == "suffix")
    assert real["accepted"].to_list() == [r.accepted for r in simulated.records]
    assert real["k_drafted"].to_list() == [r.k_drafted for r in simulated.records]
    # `specbench simulate --recorded FOLDER` reads the plain outputs there and replays lookup as it ran.
    from specbench.simulate.simulate_logs import simulate_logs

    replay = simulate_logs(tmp_path, ["lookup"], [4], ["per-trace"], recorded=True)
    assert (replay.traces, replay.turns, replay.prompt_tokens) == (1, 3, sum(len(p) for p in prompts))
    real = steps.filter(pl.col("method") == "lookup")
    assert replay.steps.to_polars()["accepted"].to_list() == real["accepted"].to_list()


def test_run_trace_from_a_file_resumes(tmp_path, capsys):
    model = build_tiny("llama", seed=4)
    tokenizer = word_tokenizer(ROLES)
    path = write_traces([_word_trace()], tmp_path / "words.jsonl")
    out = tmp_path / "out"
    policies = [DraftPolicy.fixed(3), DraftPolicy.adaptive(3)]
    first = run_trace(model, tokenizer, path, ["suffix", "none"], policies, max_tokens=12, out=out)
    assert set(first.summary["method"]) == {"plain", "suffix@fixed:3", "suffix@adaptive:3"} and first.identical
    assert (out / "trace_bench_summary.parquet").exists() and (out / "trace_bench.txt").exists()
    again = run_trace(model, tokenizer, path, ["suffix", "none"], policies, max_tokens=12, out=out)
    assert "finished earlier" in capsys.readouterr().out
    timings = ("decode_s", "tokens_per_s", "speedup")
    assert again.summary.drop(*timings).equals(first.summary.drop(*timings))
    # Damaged files of a finished trace: a ValueError naming the file, before any decoding.
    resume = dict(max_tokens=12, out=out, progress=False)
    for damaged in ("words.plain.parquet", "words.steps.parquet", "words.turns.parquet", "trace_bench_config.json"):
        path = out / damaged
        kept = path.read_bytes()
        path.write_bytes(kept[: len(kept) // 2])
        with pytest.raises(ValueError, match=f"{path}: damaged .*delete it"):
            run_trace(None, tokenizer, path.parent.parent / "words.jsonl", ["suffix", "none"], policies, **resume)
        path.write_bytes(kept)
    with pytest.raises(ValueError, match="unknown drafter"):
        trace_methods(["ngram"], [DraftPolicy.auto()])
    with pytest.raises(TypeError, match="a policy is a DraftPolicy"):
        trace_methods(["suffix"], [3.5])
    with pytest.raises(ValueError, match="distinct names"):
        trace_methods(["suffix"], [DraftPolicy.fixed(3), DraftPolicy.fixed(3)])


def _run_two(ids, out, **kwargs):
    """``run_trace`` over two copies of the word trace named ``ids``, one turn each, into ``out``."""
    from dataclasses import replace

    model, tokenizer = build_tiny("llama", seed=4), word_tokenizer(ROLES)
    traces = [replace(_word_trace(), id=i) for i in ids]
    return run_trace(
        model, tokenizer, traces, ["lookup"], [DraftPolicy.fixed(2)], max_tokens=6, turns=1, out=out, **kwargs
    )


def test_a_run_under_new_settings_interrupted_after_its_first_trace_reruns_the_second(tmp_path, monkeypatch, capsys):
    """New settings rewrite the run's settings file; the traces finished under the old ones must not pass for
    finished under the new when that run is interrupted before reaching them."""
    import specbench.bench.trace_bench as trace_bench

    out = tmp_path / "out"
    _run_two(["a", "b"], out)
    real = trace_bench.bench_trace

    def interrupted_at_b(model, tokenizer, trace, *args, **kwargs):
        if trace.id == "b":
            raise KeyboardInterrupt
        return real(model, tokenizer, trace, *args, **kwargs)

    monkeypatch.setattr(trace_bench, "bench_trace", interrupted_at_b)
    with pytest.raises(KeyboardInterrupt):
        _run_two(["a", "b"], out, options=GenerateOptions(max_tokens=5))
    monkeypatch.setattr(trace_bench, "bench_trace", real)
    capsys.readouterr()
    _run_two(["a", "b"], out, options=GenerateOptions(max_tokens=5))
    said = capsys.readouterr().out
    assert "a: finished earlier" in said and "b: finished earlier" not in said


def test_trace_ids_that_differ_only_in_spelling_get_files_of_their_own(tmp_path, capsys):
    """``a/b`` and ``a_b`` (and ``A`` beside ``a``, for a file system that ignores case) write distinct files:
    a resumed run reads each trace's own results, once."""
    from specbench.bench.trace_bench import _file_stem

    assert len({_file_stem(i).lower() for i in ("a/b", "a_b", "A", "a", "a:b")}) == 5
    out = tmp_path / "out"
    first = _run_two(["a/b", "a_b"], out)
    assert len(list(out.glob("*.turns.parquet"))) == 2
    capsys.readouterr()
    again = _run_two(["a/b", "a_b"], out)
    said = capsys.readouterr().out
    assert said.count("finished earlier") == 2 and "a/b: finished" in said and "a_b: finished" in said
    assert [set(r.turns["trace"]) for r in again.results] == [{"a/b"}, {"a_b"}]
    assert again.summary.drop("decode_s", "tokens_per_s", "speedup").equals(
        first.summary.drop("decode_s", "tokens_per_s", "speedup")
    )
    # A file of another trace under a trace's name (as runs before names were one per id left): refused.
    mine = out / f"{_file_stem('a/b')}.turns.parquet"
    mine.write_bytes((out / "a_b.turns.parquet").read_bytes())
    with pytest.raises(ValueError, match=f"{mine}: holds trace 'a_b', not 'a/b'; delete it"):
        _run_two(["a/b", "a_b"], out)


def test_a_full_disk_ends_a_trace_run_with_one_line_and_keeps_the_finished_traces(tmp_path, monkeypatch, capsys):
    """ENOSPC while the second trace is saved: one OSError naming the file and what is kept, nothing written in
    half (no temporary file left), the first trace kept; the same run again resumes after it."""
    import errno
    from pathlib import Path

    from specbench.cli import error_line

    out = tmp_path / "out"
    write_bytes = Path.write_bytes

    def full_for_the_second(self, data):
        if "second" in self.name:
            raise OSError(errno.ENOSPC, "No space left on device")
        return write_bytes(self, data)

    monkeypatch.setattr(Path, "write_bytes", full_for_the_second)
    with pytest.raises(OSError) as caught:
        _run_two(["first", "second"], out, progress=False)
    line = error_line(caught.value)
    assert f"cannot write {out / 'second.steps.parquet'} (No space left on device)" in line
    assert f"the 1 traces finished before are kept in {out}" in line and "\n" not in line
    assert sorted(p.name for p in out.iterdir()) == [
        "first.plain.parquet",
        "first.steps.parquet",
        "first.turns.parquet",
        "trace_bench_config.json",
    ]
    monkeypatch.undo()
    capsys.readouterr()
    run = _run_two(["first", "second"], out)
    said = capsys.readouterr().out
    assert "first: finished earlier" in said and "second: finished earlier" not in said
    assert [r.trace for r in run.results] == ["first", "second"] and (out / "second.turns.parquet").exists()


def test_damaged_recorded_outputs_name_the_file(tmp_path):
    path = tmp_path / "plain.parquet"
    path.write_bytes(b"PAR1 not really")
    with pytest.raises(ValueError, match=f"{path}: damaged or not a parquet file"):
        load_recorded(path)
    pl.DataFrame({"prompt": ["abc"], "output": [[1, 2]], "finish_reason": ["stop"]}).write_parquet(path)
    with pytest.raises(ValueError, match="column 'prompt' must hold lists of token ids"):
        load_recorded(path)


def test_recorded_replies_simulate_drafters_on_a_trace():
    from specbench.inputs.trace_prompts import trace_prompts
    from specbench.simulate.simulate import recorded_turns

    tokenizer = embedded_tokenizer()
    (trace,) = load_traces("chat-revision")
    recorded = list(recorded_turns(trace_prompts(tokenizer, trace), tokenizer))
    assert len(recorded) == len(trace.turns)
    eos = min(tokenizer.eos_token_ids)
    assert all(r.output[-1] == eos and r.finish_reason == "stop" for r in recorded)
    assert tokenizer.decode(recorded[1].output[:-1]) == trace.turns[1].assistant["content"]
    # Revisions repeat the earlier email: both drafters accept many tokens on the recorded text.
    for drafter in (PromptLookup(), SuffixDecoding()):
        stats = simulate(recorded, drafter, DraftPolicy.fixed(8), GenerateOptions(max_tokens=4096)).stats()
        assert stats["tokens"] == sum(len(r.output) for r in recorded)
        assert stats["tokens_per_verify"] > 2.0


def test_context_policy_names_trace_and_turn_or_drops_the_oldest_messages(tmp_path, capsys):
    from specbench.cli import main
    from specbench.inputs.trace_prompts import fitted_turn

    tokenizer = word_tokenizer(ROLES)
    trace = _word_trace()
    replies = ["w20 w21 w22", "w23 w24"]
    full = render_turn(tokenizer, trace, 2, replies)
    assert fitted_turn(tokenizer, trace, 2, replies, None, 8) == (full, 0)
    with pytest.raises(ValueError, match=f"trace 'words' turn 2: the prompt has {len(full)} tokens.*--truncate oldest"):
        fitted_turn(tokenizer, trace, 2, replies, len(full), 8)
    prompt, dropped = fitted_turn(tokenizer, trace, 2, replies, len(full), 8, truncate="oldest")
    assert dropped > 0 and len(prompt) + 8 <= len(full)
    # The system message and the turn's own message stay; the oldest others go first (no reply or tool
    # result is left at the front).
    history = trace.history(2, replies)
    assert (prompt, dropped) == (render_messages(tokenizer, [history[0], history[-1]]), 4)
    # bench trace reads and checks the trace (and the ids asked for) before loading any model.
    path = write_traces([trace], tmp_path / "words.jsonl")
    assert main(["bench", "trace", str(path), "--trace-id", "nope", "--model", "/no/such/model"]) == 2
    assert "no trace 'nope' (its traces: words)" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": [{"type": "img"}]}]}\n')
    assert main(["bench", "trace", str(bad), "--model", "/no/such/model"]) == 2
    assert f"{bad}:1: messages[0]: content[0]: a 'img' part cannot be replayed" in capsys.readouterr().err


class _CharTokenizer:
    """A chat template over characters: messages as <role>content</s>; ``numbered`` templates number
    every message, so a turn's prompt does not extend a render of a window of the conversation."""

    chat_template = "(a template)"
    eos_token_ids = [0]

    def __init__(self, numbered: bool):
        self.numbered = numbered

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=False, tools=None):
        tags = [f"{i}:" if self.numbered else "" for i in range(len(messages) + 1)]
        body = "".join(f"<{tags[i]}{m['role']}>{m['content']}</s>" for i, m in enumerate(messages))
        return body + f"<{tags[-1]}assistant>"

    def encode(self, text, add_special_tokens=True):
        return [ord(c) for c in text]


@pytest.mark.parametrize("numbered", [False, True])
def test_turn_prompts_rendered_once_equal_full_renders(numbered):
    from specbench.inputs.trace_prompts import trace_prompts

    tokenizer = _CharTokenizer(numbered)
    trace = Trace(
        "t",
        [
            Turn(
                [{"role": "system", "content": "s"}, {"role": "user", "content": "q1"}],
                {"role": "assistant", "content": "a1"},
            ),
            Turn([{"role": "tool", "content": "r"}], {"role": "assistant", "content": "a2"}),
            Turn([{"role": "user", "content": "q3"}], {"role": "assistant", "content": "a3"}),
            Turn([{"role": "user", "content": "q4"}]),
        ],
    )
    prompts = trace_prompts(tokenizer, trace)
    assert prompts.skipped == 1 and [t.turn for t in prompts.turns] == [0, 1, 2]
    assert [p for _, p, _ in prompts] == [render_turn(tokenizer, trace, t) for t in range(3)]
    assert prompts.turns[1].output == [ord(c) for c in "a2"] + [0]
    assert prompts.full_renders == (3 if numbered else 0)


def test_overall_speedup_over_traces_with_its_interval():
    """Per method over every trace: tokens/s over plain's summed over traces; from 6 independent traces a 95 %
    interval over traces, none with fewer or with a store shared across traces (their results depend)."""
    from specbench.bench.trace_summary import overall_by_method

    def summary(traces: int) -> pl.DataFrame:
        rows = []
        for i in range(traces):
            plain = {"trace": f"t{i}", "method": "plain", "decode_tokens": 100, "decode_s": 1.0, "identical": True}
            rows.append({**plain, "verifies": 0, "accepted": 0})
            rows.append(
                {**plain, "method": "suffix", "decode_s": 1 / (1.2 + 0.4 * (i % 2)), "verifies": 40, "accepted": 60}
            )
        return pl.DataFrame(rows)

    overall = {r["method"]: r for r in overall_by_method(summary(8)).iter_rows(named=True)}
    assert overall["plain"]["speedup"] == pytest.approx(1.0) and overall["plain"]["speedup_low"] is None
    suffix = overall["suffix"]
    assert suffix["traces"] == 8 and suffix["decode_tokens"] == 800
    assert suffix["tokens_per_verify"] == pytest.approx((8 * 60 + 8 * 40) / (8 * 40)) and suffix["identical"]
    assert suffix["speedup"] == pytest.approx(800 / (4 / 1.2 + 4 / 1.6) / 100)
    assert 1.2 < suffix["speedup_low"] < suffix["speedup"] < suffix["speedup_high"] < 1.6
    assert overall_by_method(summary(8), independent=False)["speedup_low"].null_count() == 2
    assert overall_by_method(summary(3))["speedup_low"].null_count() == 2


def test_run_trace_over_six_traces_reports_the_overall_speedup(tmp_path):
    """Six traces through `run_trace`: the table ends with the overall speedups and their intervals over
    traces, also written to trace_bench_overall.parquet."""
    model = build_tiny("llama", seed=4)
    tokenizer = word_tokenizer(ROLES)
    base = _word_trace()
    traces = [Trace(f"words{i}", base.turns[: 1 + i % 2]) for i in range(6)]
    run = run_trace(
        model, tokenizer, traces, ["suffix"], [DraftPolicy.fixed(3)], max_tokens=8, out=tmp_path, progress=False
    )
    assert run.identical
    overall = pl.read_parquet(tmp_path / "trace_bench_overall.parquet")
    suffix = overall.filter(pl.col("method") == "suffix").row(0, named=True)
    assert suffix["traces"] == 6 and suffix["speedup_low"] <= suffix["speedup"] <= suffix["speedup_high"]
    table = (tmp_path / "trace_bench.txt").read_text()
    assert "overall, 6 traces" in table and f"{suffix['speedup']:.2f}x [{suffix['speedup_low']:.2f}-" in table
    shared = run_trace(
        model, tokenizer, traces, ["suffix"], [DraftPolicy.fixed(3)], max_tokens=8, share_store=True, progress=False
    )
    assert shared.overall().filter(pl.col("method") == "suffix")["speedup_low"].null_count() == 1
