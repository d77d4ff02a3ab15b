"""Prompt sets: no option leaves a user's prompts out without saying how many and why; the agentic kind is the turns
its rule picks."""

from __future__ import annotations

import warnings
from unittest.mock import ANY

import pytest

from specbench.inputs.importers import load_traces
from specbench.inputs.prompts import (
    AGENTIC,
    REPEATED_CHARS,
    PromptsLeftOut,
    agentic_turns,
    prompts_from,
    repeated_chars,
)
from specbench.inputs.traces import Trace, Turn, bundled_traces, render_turn


class _Tokenizer:
    """Characters as token ids; no chat template."""

    chat_template = None

    def encode(self, text, add_special_tokens=True):
        return [ord(c) % 97 for c in text]


@pytest.fixture
def tokenizer():
    return _Tokenizer()


def test_a_limit_on_a_users_prompts_says_how_many_it_leaves_out(tokenizer):
    with pytest.warns(PromptsLeftOut, match="2 of 3 prompts left out: limit=1 keeps the first 1"):
        kept = prompts_from(["aa", "bb", "cc"], tokenizer, limit=1, chat=False)
    assert [p.text for p in kept] == ["aa"]


def test_a_length_limit_says_how_many_prompts_it_leaves_out(tokenizer):
    with pytest.warns(PromptsLeftOut, match="1 of 3 prompts left out: longer than max_prompt_tokens=3"):
        kept = prompts_from(["aa", "bbbbbb", "cc"], tokenizer, chat=False, max_prompt_tokens=3)
    assert [p.text for p in kept] == ["aa", "cc"]


def test_nothing_is_said_where_nothing_is_left_out(tokenizer):
    with warnings.catch_warnings():
        warnings.simplefilter("error", PromptsLeftOut)
        assert len(prompts_from(["aa", "bb"], tokenizer, limit=5, chat=False, max_prompt_tokens=10)) == 2


def _agent_trace(reply: str, last: str = "tool") -> Trace:
    """Two turns: a tool call, then (after a tool result, or a user message with ``last="user"``) ``reply``."""
    result = '{"order_id": "HB-20931", "status": "processing", "city": "Portland"}'
    call = {"role": "assistant", "content": None, "tool_calls": [{"name": "get_order", "arguments": {"id": "HB-1"}}]}
    second = {"role": last, "content": result} if last == "tool" else {"role": "user", "content": "and now?"}
    messages = [{"role": "system", "content": "You help."}, {"role": "user", "content": "Where is HB-20931?"}]
    turns = [Turn(messages, call), Turn([second], {"role": "assistant", "content": reply})]
    if last == "user":  # the tool result earlier in the history: repeated, but the turn answers the user
        turns[0] = Turn([*messages, {"role": "tool", "content": result}], call)
    return Trace("t", turns)


def test_an_agentic_turn_answers_a_tool_result_and_repeats_it():
    twenty = '"status": "processing"'[:REPEATED_CHARS]  # exactly the threshold, verbatim
    assert repeated_chars(_agent_trace(f"It says:{twenty}."), 1) == REPEATED_CHARS
    assert agentic_turns([_agent_trace(f"It says:{twenty}.")]) == [(ANY, 1)]
    assert agentic_turns([_agent_trace(f"It says:{twenty[:-1]}.")]) == []  # one character short
    assert agentic_turns([_agent_trace(f"It says:{twenty}.", last="user")]) == []  # answers the user, not a tool
    # the reply's tool calls count, written as JSON: an id copied from the result with its key
    calls = {"role": "assistant", "content": None, "tool_calls": [{"name": "x", "arguments": {"status": "processing"}}]}
    trace = _agent_trace("")
    trace.turns[1].assistant = calls
    assert repeated_chars(trace, 1) == len('"status": "processing"')


def test_the_agentic_kind_takes_the_shipped_traces_turns_in_rounds():
    """The rule picks, of the shipped traces (in name order), the turns answering a tool result whose reply repeats
    20 characters of one: coding-agent's edit quoting the file it read (turn 2) and the test rerun (4), the tool
    agent's calls quoting the customer and order ids (1, 2); one turn of each trace in turn."""
    traces = [trace for name in bundled_traces() for trace in load_traces(name)]
    picked = [(trace.id, t) for trace, t in agentic_turns(traces)]
    assert picked[:4] == [("coding-agent", 2), ("tool-agent", 1), ("coding-agent", 4), ("tool-agent", 2)]
    assert {trace for trace, _ in picked} == {"coding-agent", "tool-agent"}  # the traces with tool results
    for trace in traces:
        for t, turn in enumerate(trace.turns):
            wanted = turn.messages[-1]["role"] == "tool" and repeated_chars(trace, t) >= REPEATED_CHARS
            assert ((trace.id, t) in picked) == wanted


def test_agentic_prompts_render_each_turns_history_and_skip_the_long_ones(tokenizer):
    prompts = prompts_from("bundled", tokenizer, [AGENTIC], 2, chat=False)
    assert [(p.id, p.category) for p in prompts] == [("coding-agent:2", AGENTIC), ("tool-agent:1", AGENTIC)]
    trace = load_traces("coding-agent")[0]
    assert prompts[0].ids == render_turn(tokenizer, trace, 2)  # the history up to that turn's reply
    # a length limit skips the longer turns and takes the next ones, up to the kind's limit
    cap = len(prompts[0].ids) - 1
    short = prompts_from("bundled", tokenizer, ["rag", AGENTIC], 2, chat=False, max_prompt_tokens=cap)
    assert [p.category for p in short] == ["rag", "rag", AGENTIC, AGENTIC]
    assert all(len(p.ids) <= cap for p in short) and "coding-agent:2" not in {p.id for p in short}
    with pytest.raises(ValueError, match="no agentic turn has at most max_prompt_tokens=10"):
        prompts_from("bundled", tokenizer, [AGENTIC], 2, chat=False, max_prompt_tokens=10)
