"""Reasoning in logs: imported from every shape logs carry it in (or left out), rendered in the chat template's own
form, simulated and replayed; bad reasoning input is one line naming the message.

The held-out logs in fixtures/reasoning are never edited to make a test pass (their README states the rule); what
a test expects of them it reads from their own JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import build_tiny, word_tokenizer, write_traces

from specbench.bench.batch_bench import trace_requests
from specbench.bench.trace_bench import run_trace
from specbench.cli import main
from specbench.core.options import GenerateOptions
from specbench.core.policies import DraftPolicy
from specbench.inputs.importers import load_traces
from specbench.inputs.trace_prompts import reply_ids, trace_prompts
from specbench.inputs.traces import Trace, Turn, render_turn, reply_text, thinking_tags
from specbench.simulate.simulate_logs import simulate_logs

HELD_OUT = Path(__file__).parent / "fixtures" / "reasoning"
ROLES = ("user", "assistant", "system", "tool", "think", "/think")  # "<think>" and "</think>" are tokens


def _raw_replies(path: Path) -> list[tuple[str | None, str, int]]:
    """(reasoning, answer text, tool calls) of every assistant message of a held-out file, read from its JSON by
    the formats' own descriptions."""
    out = []
    for line in path.read_text().splitlines():
        record = json.loads(line)
        for m in record.get("messages", []):
            if m["role"] != "assistant":
                continue
            parts = m["content"] if isinstance(m["content"], list) else []
            thought = [p.get("thinking", p.get("value")) for p in parts if p["type"] in ("reasoning", "thinking")]
            reasoning = m.get("reasoning_content") or m.get("thinking") or m.get("reasoning") or "\n\n".join(thought)
            text = (
                m["content"]
                if not parts
                else "".join(p.get("text", p.get("value")) for p in parts if p["type"] == "text")
            )
            calls = len(m.get("tool_calls", [])) + sum(p["type"] == "tool_call" for p in parts)
            out.append((reasoning or None, text or "", calls))
        for entry in record.get("conversations", []):
            if entry["from"] == "gpt":
                head, _, answer = entry["value"].partition("</think>")
                out.append((head.removeprefix("<think>").strip("\n"), answer.lstrip("\n"), 0))
    return out


@pytest.mark.parametrize("name", ["openai.jsonl", "sharegpt.jsonl"])
def test_held_out_logs_import_with_their_reasoning_kept_or_dropped(tmp_path, name):
    path = HELD_OUT / name
    expected = _raw_replies(path)
    kept, dropped = load_traces(path), load_traces(path, reasoning="drop")
    replies = [turn.assistant for trace in kept for turn in trace.turns if turn.assistant is not None]
    assert [(r.get("reasoning"), r["content"] or "", len(r.get("tool_calls", []))) for r in replies] == expected
    assert all(r is not None for r, _, _ in expected)  # every reply of these logs reasons
    bare = [turn.assistant for trace in dropped for turn in trace.turns if turn.assistant is not None]
    assert [(r["content"] or "", len(r.get("tool_calls", []))) for r in bare] == [(t, c) for _, t, c in expected]
    assert not any("reasoning" in m for t in dropped for turn in t.turns for m in [*turn.messages, turn.assistant])
    # The project's schema keeps the reasoning: a saved trace reads back the same, and drops the same.
    saved = write_traces(kept, tmp_path / "saved.jsonl")
    assert load_traces(saved) == kept and load_traces(saved, reasoning="drop") == dropped


WORD_TEMPLATES = {
    # No reasoning in the template: the reasoning goes in thinking tags before the answer.
    "plain": "{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}",
    # Renders reasoning_content only for replies after the last user message, as Qwen3's does, in a form of its
    # own: closed by a new header, as gpt-oss's analysis channel is.
    "renders": "{%- set ns = namespace(last=-1) %}{%- for m in messages %}{%- if m.role == 'user' %}"
    "{%- set ns.last = loop.index0 %}{%- endif %}{%- endfor %}{%- for m in messages %}<{{ m.role }}> "
    "{%- if m.reasoning_content and loop.index0 > ns.last %} <think> {{ m.reasoning_content }} <assistant>{% endif %}"
    " {{ m.content }} {% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}",
    # Opens the thinking block in the generation prompt and leaves reasoning out of history, as DeepSeek-R1's does.
    "opens": "{% for m in messages %}<{{ m.role }}> {{ m.content.split('</think>')[-1] }} {% endfor %}"
    "{% if add_generation_prompt %}<assistant> <think>{% endif %}",
}


def _word_trace() -> Trace:
    reply = {"role": "assistant", "content": "w30 w31", "reasoning": "w20 w21 w22"}
    return Trace(
        "words", [Turn([{"role": "user", "content": "w10 w11"}], reply), Turn([{"role": "user", "content": "w12"}])]
    )


@pytest.mark.parametrize("template", list(WORD_TEMPLATES))
def test_reasoning_is_rendered_in_the_chat_templates_own_form(template):
    tokenizer = word_tokenizer(ROLES)
    tokenizer._tokenizer.chat_template = WORD_TEMPLATES[template]
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in ("<think>", "</think>", "<assistant>", "<eos>", "w20", "w30")}
    trace = _word_trace()
    reply = reply_ids(tokenizer, trace.turns[0].assistant)
    thought = tokenizer.encode("w20 w21 w22", add_special_tokens=False)
    answer = [*tokenizer.encode("w30 w31", add_special_tokens=False), ids["<eos>"]]
    # The reply as generated: reasoning in thinking tags before the answer; after a prompt that opened the block,
    # from the reasoning on.
    closing = ids["<assistant>"] if template == "renders" else ids["</think>"]
    assert reply == ([] if template == "opens" else [ids["<think>"]]) + thought + [closing] + answer
    history = render_turn(tokenizer, trace, 1)
    if template == "plain":  # the reply in history as it was generated
        assert reply[:-1] == history[history.index(ids["<think>"]) :][: len(reply) - 1]
    else:  # the template leaves an earlier turn's reasoning out
        assert ids["w20"] not in history and ids["w30"] in history
    dropped = {**trace.turns[0].assistant}
    del dropped["reasoning"]
    assert reply_ids(tokenizer, dropped) == answer


def test_thinking_tags_are_the_templates_own():
    tokenizer = word_tokenizer(ROLES)
    assert thinking_tags(tokenizer) == ("<think>", "</think>")
    tokenizer._tokenizer.chat_template = (
        WORD_TEMPLATES["plain"] + "{# replies may open with <thinking>...</thinking> #}"
    )
    assert thinking_tags(tokenizer) == ("<thinking>", "</thinking>")
    reply = _word_trace().turns[0].assistant
    assert reply_text(tokenizer, reply).strip() == "<thinking>\nw20 w21 w22\n</thinking>\n\nw30 w31"


def _embedded_tokenizer():
    from specbench.models.load import embedded_model_path

    path = embedded_model_path("smollm2-135m")
    if not (path / "tokenizer.json").exists():
        pytest.skip("the embedded model is not set up (specbench setup)")
    from mlx_lm.utils import load_tokenizer

    return load_tokenizer(path)


def test_held_out_reasoning_logs_simulate_and_replay():
    """The held-out logs with the embedded tokenizer: the simulator replays drafters over the reasoning (most of
    what the replies hold) or without it; the batch bench's requests hold it in history; the trace bench replays a
    reasoning log on a tiny model with its outputs identical to plain decoding."""
    tokenizer = _embedded_tokenizer()
    runs = {
        r: simulate_logs(HELD_OUT, ["suffix"], [4], ["per-trace"], tokenizer, reasoning=r) for r in ("keep", "drop")
    }
    tokens = {r: run.summary["tokens"][0] for r, run in runs.items()}
    assert runs["keep"].turns == runs["drop"].turns == len(_raw_replies(HELD_OUT / "openai.jsonl")) + 3
    assert tokens["keep"] > 2 * tokens["drop"] and runs["keep"].summary["accepted"][0] > 0
    # A reply's output holds its reasoning in thinking tags; the next turn's prompt holds the reply as generated.
    (stock,) = load_traces(HELD_OUT / "openai.jsonl")[:1]
    prompts = trace_prompts(tokenizer, stock)
    first = tokenizer.decode(prompts.turns[0].output)
    assert first.startswith("<think>\n" + stock.turns[0].assistant["reasoning"] + "\n</think>\n\n<tool_call>")
    assert tokenizer.decode(prompts.prompt(1)).startswith(tokenizer.decode(prompts.prompt(0) + prompts.turns[0].output))
    requests, _, _ = trace_requests(tokenizer, [stock], None, 4096, 8)
    bare, _, _ = trace_requests(tokenizer, load_traces(HELD_OUT / "openai.jsonl", reasoning="drop")[:1], None, 4096, 8)
    assert len(requests) == len(bare) == 4 and all(len(a) > len(b) for a, b in zip(requests[1:], bare[1:]))
    # The trace bench over a reasoning log, on a tiny model with the embedded tokenizer's vocabulary.
    model = build_tiny("llama", seed=4, vocab_size=len(tokenizer._tokenizer))
    run = run_trace(
        model, tokenizer, HELD_OUT / "openai.jsonl", ["suffix"], [DraftPolicy.fixed(4)], max_tokens=8, turns=2,
        options=GenerateOptions(max_tokens=8, verify="fast"),
        trace_ids=["capital-thinking-field"], progress=False,
    )  # fmt: skip
    assert run.identical and run.turns.height == 2 * 2


def _log(tmp_path: Path, reply: dict, name: str = "log.jsonl") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}, reply]}) + "\n")
    return path


@pytest.mark.parametrize(
    "reply, message",
    [
        (
            {"role": "assistant", "content": "ok", "reasoning_content": ["a", "b"]},
            "messages\\[1\\]: 'reasoning_content' must be a string \\(the model's reasoning text\\), got list; write",
        ),
        (
            {"role": "assistant", "content": [{"type": "thinking", "thinking": 3}, {"type": "text", "text": "ok"}]},
            "messages\\[1\\]: content\\[0\\]: a 'thinking' part needs its text as a string in 'thinking' or 'text' "
            "or 'value', got int",
        ),
        (
            {
                "role": "assistant",
                "content": [{"type": "redacted_thinking", "data": "x"}, {"type": "text", "text": "k"}],
            },
            "messages\\[1\\]: content\\[0\\]: a 'redacted_thinking' part cannot be replayed: only text, "
            "reasoning/thinking and tool_call parts are read; remove it from the log",
        ),
        (
            {"role": "assistant", "content": [{"type": "tool_call", "value": "{not json"}]},
            "messages\\[1\\]: content\\[0\\]: a 'tool_call' part needs 'value': an object with 'name' and 'arguments'",
        ),
        (
            {"role": "user", "content": [{"type": "reasoning", "value": "hm"}, {"type": "text", "value": "?"}]},
            "messages\\[1\\]: only assistant messages carry reasoning, not 'user'; drop it from the log",
        ),
    ],
)
def test_bad_reasoning_is_one_line_naming_the_message(tmp_path, capsys, reply, message):
    path = _log(tmp_path, reply)
    with pytest.raises(ValueError, match=f"^{path}:1: {message}"):
        load_traces(path)
    with pytest.raises(ValueError, match=f"^{path}:1: {message}"):
        load_traces(path, reasoning="drop")  # checked whether it is kept or not
    assert main(["simulate", "--trace", str(path), "--reasoning", "drop"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{path}:1: messages[1]" in err


def test_bad_reasoning_in_the_schema_and_a_bad_option(tmp_path, capsys):
    line = {"trace": "t", "turn": 0, "messages": [{"role": "user", "content": "hi"}]}
    path = tmp_path / "trace.jsonl"
    path.write_text(json.dumps({**line, "assistant": {"role": "assistant", "content": "ok", "reasoning": 7}}) + "\n")
    with pytest.raises(ValueError, match=f"^{path}:1: assistant: reasoning must be a string .*got int"):
        load_traces(path)
    with pytest.raises(ValueError, match="reasoning: keep or drop, got 'hide'"):
        load_traces(path, reasoning="hide")
    assert main(["simulate", "--trace", str(path), "--reasoning", "hide"]) == 2
    assert "--reasoning: invalid choice: 'hide' (choose from 'keep', 'drop')" in capsys.readouterr().err
