"""Conversation traces: one schema (described in data/traces/README.md), its loader and validation, and prompt
rendering.

A trace is a conversation replayed turn by turn: each turn is one model call. Its prompt is the whole history
before it (earlier turns' messages and replies) plus the turn's new messages, rendered with the model's chat
template; its reply is what the model generates. Importers of other formats and ``load_traces``, which picks one,
live in ``specbench.inputs.importers``.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specbench.common.files import PROJECT_ROOT
from specbench.common.text import check_strings, check_text

ROLES = ("system", "user", "assistant", "tool")
#: The thinking tags of reasoning written inline in a reply's content, and where none other is known.
THINK_TAGS = ("<think>", "</think>")
TRACES_DIR = PROJECT_ROOT / "data" / "traces"


@dataclass
class Turn:
    """One model call: the messages added before it, and the recorded reply (or None)."""

    messages: list[dict[str, Any]]
    assistant: dict[str, Any] | None = None


@dataclass
class Trace:
    """A conversation to replay: turns, tool descriptions, free-form metadata."""

    id: str
    turns: list[Turn]
    tools: list[dict[str, Any]] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.turns)

    def history(self, turn: int, replies: Sequence[Any] | None = None) -> list[dict[str, Any]]:
        """Messages of the prompt of ``turn``: earlier turns with their replies, then its own messages.

        ``replies[i]`` (a string or an assistant message) replaces turn i's recorded reply.
        """
        if not 0 <= turn < len(self.turns):
            raise ValueError(f"trace {self.id!r} has turns 0..{len(self.turns) - 1}, not {turn}")
        messages: list[dict[str, Any]] = []
        for i in range(turn):
            messages.extend(self.turns[i].messages)
            reply = replies[i] if replies is not None and i < len(replies) and replies[i] is not None else None
            if reply is None:
                reply = self.turns[i].assistant
            if reply is None:
                raise ValueError(
                    f"trace {self.id!r}: turn {i} has no recorded reply; generate it and pass it in replies"
                )
            messages.append({"role": "assistant", "content": reply} if isinstance(reply, str) else reply)
        messages.extend(self.turns[turn].messages)
        return messages


# -- validation ----------------------------------------------------------------------------------
def check_message(message: Any, where: str) -> dict[str, Any]:
    """``message`` if it is a valid schema message, else a ValueError naming ``where``."""
    if not isinstance(message, dict):
        raise ValueError(f"{where}: a message must be an object with 'role' and 'content', got {message!r:.80}")
    role = message.get("role")
    if role not in ROLES:
        raise ValueError(f"{where}: message role must be one of {ROLES}, got {role!r}")
    content = message.get("content")
    calls = message.get("tool_calls")
    if content is not None and not isinstance(content, str):
        raise ValueError(f"{where}: message content must be a string (or null), got {type(content).__name__}")
    if calls is not None:
        if role != "assistant":
            raise ValueError(f"{where}: only assistant messages carry tool_calls, not {role!r}")
        named = isinstance(calls, list) and all(isinstance(c, dict) and isinstance(c.get("name"), str) for c in calls)
        if not named:
            raise ValueError(f"{where}: tool_calls must be a list of objects with a 'name' and 'arguments'")
    if content is None and not calls and role != "assistant":
        raise ValueError(f"{where}: a {role} message needs content")
    reasoning = message.get("reasoning")
    if reasoning is not None:
        if role != "assistant":
            raise ValueError(f"{where}: only assistant messages carry reasoning, not {role!r}; drop it from the log")
        if not isinstance(reasoning, str):
            raise ValueError(
                f"{where}: reasoning must be a string (the model's reasoning text), got {type(reasoning).__name__}"
            )
    if role == "assistant" and isinstance(content, str):
        inline, rest = split_inline_reasoning(content)
        if inline is not None:
            message = {**message, "content": rest, "reasoning": joined_reasoning([reasoning, inline])}
    return check_strings(message, f"{where}: the message")


def split_inline_reasoning(content: str) -> tuple[str | None, str]:
    """(reasoning, answer) of content that starts with ``<think>...</think>``, or that holds ``</think>`` without
    an opening tag (the block opened by the generation prompt); (None, content) for any other content."""
    start, end = THINK_TAGS
    stripped = content.lstrip()
    opened = stripped.startswith(start)
    if end not in content or (not opened and start in content):
        return None, content
    head, _, answer = (stripped[len(start) :] if opened else content).partition(end)
    return head.strip("\n"), answer.lstrip("\n")


def joined_reasoning(pieces: Sequence[str | None]) -> str | None:
    """A message's reasoning from its pieces (fields, parts, inline text), in order, repeats left out."""
    kept = list(dict.fromkeys(piece for piece in pieces if piece and piece.strip()))
    return "\n\n".join(kept) if kept else None


def without_reasoning(traces: Sequence[Trace]) -> list[Trace]:
    """The traces with every message's reasoning left out (the answers and tool calls kept)."""

    def bare(message: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in message.items() if k != "reasoning"}

    def turn(t: Turn) -> Turn:
        return Turn([bare(m) for m in t.messages], None if t.assistant is None else bare(t.assistant))

    return [Trace(t.id, [turn(x) for x in t.turns], t.tools, t.meta) for t in traces]


def _turn_from_record(record: Any, where: str) -> tuple[str, int, Turn, dict[str, Any]]:
    if not isinstance(record, dict):
        raise ValueError(f"{where}: each line must be a JSON object (a turn), got {type(record).__name__}")
    if missing := [key for key in ("trace", "turn", "messages") if key not in record]:
        raise ValueError(f"{where}: a turn needs 'trace', 'turn' and 'messages'; missing {missing}")
    trace_id, number, messages = record["trace"], record["turn"], record["messages"]
    if not isinstance(trace_id, str) or not trace_id:
        raise ValueError(f"{where}: 'trace' must be a non-empty string")
    if not isinstance(number, int) or number < 0:
        raise ValueError(f"{where}: 'turn' must be an integer >= 0, got {number!r}")
    if not isinstance(messages, list):
        raise ValueError(f"{where}: 'messages' must be a list")
    messages = [check_message(m, f"{where}: messages[{i}]") for i, m in enumerate(messages)]
    assistant = record.get("assistant")
    if assistant is not None:
        assistant = check_message(assistant, f"{where}: assistant")
        if assistant["role"] != "assistant":
            raise ValueError(f"{where}: 'assistant' must have role 'assistant'")
    extra = {key: record[key] for key in ("tools", "meta") if key in record}
    if "tools" in extra:
        extra["tools"] = parse_tools(extra["tools"], where)
    return trace_id, number, Turn(messages, assistant), extra


def parse_tools(value: Any, where: str) -> list[dict[str, Any]]:
    """Tool descriptions from a list (or that list written as a JSON string) of function descriptions,
    ``{"name", "description", "parameters"}`` or OpenAI's ``{"type": "function", "function": {...}}``;
    None is no tools. A ValueError names ``where`` and what was expected."""
    if value is None:
        return []
    expected = "expected a list of function descriptions (or that list as a JSON string)"
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise ValueError(f"{where}: tools: not valid JSON ({err.msg} at column {err.colno}); {expected}") from None
    if not isinstance(value, list):
        raise ValueError(f"{where}: tools: {expected}, got {type(value).__name__}")
    tools = []
    for i, tool in enumerate(value):
        if isinstance(tool, dict) and isinstance(tool.get("function"), dict):
            tool = tool["function"]
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise ValueError(
                f"{where}: tools[{i}]: expected a function description with a 'name' "
                f"({{'name', 'description', 'parameters'}} or {{'type': 'function', 'function': {{...}}}}), "
                f"got {tool!r:.60}"
            )
        tools.append(check_strings(tool, f"{where}: tools[{i}]"))
    return tools


def read_text(path: Path) -> str:
    """A file's text (UTF-8, a leading byte-order mark dropped); a ValueError names the line and byte
    offset of the first byte that is not UTF-8."""
    data = Path(path).read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise ValueError(
            f"{path}:{line}: not UTF-8 text (byte {err.start}: {data[err.start : err.start + 1]!r}); "
            "save the file as UTF-8"
        ) from None


def read_json_lines(path: Path, text: str | None = None) -> Iterable[tuple[int, Any]]:
    """(line number, value) of each non-blank line of a JSONL file (or of its ``text``, already read);
    a ValueError names a bad line."""
    for number, line in enumerate((read_text(path) if text is None else text).split("\n"), 1):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{number}: not valid JSON ({err.msg} at column {err.colno})") from None


def traces_from_records(path: Path, records: Iterable[tuple[str, Any]]) -> list[Trace]:
    """Traces from schema records, each with where it was read ("file:line")."""
    traces: dict[str, Trace] = {}  # in file order
    for where, record in records:
        trace_id, turn_number, turn, extra = _turn_from_record(record, where)
        trace = traces.get(trace_id)
        if trace is None:
            if turn_number != 0:
                raise ValueError(
                    f"{where}: trace {trace_id!r} starts at turn {turn_number}; its first line must be turn 0"
                )
            trace = traces[trace_id] = Trace(trace_id, [], extra.get("tools") or [], extra.get("meta") or {})
        else:
            if next(reversed(traces)) != trace_id:
                raise ValueError(f"{where}: the lines of trace {trace_id!r} must be consecutive")
            if turn_number != len(trace.turns):
                raise ValueError(f"{where}: trace {trace_id!r} expects turn {len(trace.turns)} next, got {turn_number}")
            if extra:
                raise ValueError(f"{where}: 'tools' and 'meta' belong on a trace's first line (turn 0)")
        trace.turns.append(turn)
    if not traces:
        raise ValueError(f"{path}: no turns found")
    return list(traces.values())


def pick_ids(ids: list[str], trace_ids: Sequence[str] | None, limit: int | None, source: str) -> list[str]:
    """The trace ids to replay out of ``ids`` (in file order): ``trace_ids`` (each must be there; an
    error names ``source`` and lists ids it has), else all; at most ``limit`` of them."""
    if trace_ids:
        missing = [i for i in trace_ids if i not in set(ids)]
        if missing:
            shown = ", ".join(ids[:8]) + (", ..." if len(ids) > 8 else "")
            raise ValueError(f"{source}: no trace {', '.join(map(repr, missing))} (its traces: {shown})")
        ids = [i for i in ids if i in set(trace_ids)]
    return ids[:limit] if limit is not None else ids


def bundled_traces() -> list[str]:
    """Names of the traces shipped in data/traces."""
    return sorted(p.stem for p in TRACES_DIR.glob("*.jsonl")) if TRACES_DIR.exists() else []


# -- rendering -----------------------------------------------------------------------------------
def _template_text(tokenizer: Any) -> str:
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        template = " ".join(template.values())
    return template if isinstance(template, str) else ""


_THINK_TAG = re.compile(r"</([A-Za-z_]*think[A-Za-z_]*)>")


def thinking_tags(tokenizer: Any) -> tuple[str, str]:
    """The model's thinking tags: the first closing tag naming "think" that its chat template spells
    (``</think>``, ``</thinking>``), else one of its added tokens, else ``THINK_TAGS``."""
    added = getattr(tokenizer, "added_tokens_decoder", None)
    tokens = [getattr(t, "content", "") for t in added.values()] if isinstance(added, dict) else []
    for text in (_template_text(tokenizer), *tokens):
        match = _THINK_TAG.search(text)
        if match:
            return f"<{match[1]}>", f"</{match[1]}>"
    return THINK_TAGS


def _inline(reasoning: str, answer: str, tags: tuple[str, str]) -> str:
    return f"{tags[0]}\n{reasoning.strip(chr(10))}\n{tags[1]}\n\n{answer.lstrip(chr(10))}"


def _reasoning_in_template_form(tokenizer: Any, messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages whose reasoning is in the form the chat template takes: ``reasoning_content`` for a template
    that renders it, else written before the answer in the model's thinking tags (``_inline``)."""
    if not any(m.get("reasoning") is not None for m in messages):
        return list(messages)
    template = _template_text(tokenizer)  # whether it renders reasoning_content (as Qwen3's does) and tool calls
    speaks, calls_native = "reasoning_content" in template, "tool_calls" in template
    tags = thinking_tags(tokenizer)
    out = []
    for message in messages:
        reasoning = message.get("reasoning")
        if reasoning is not None:
            message = {k: v for k, v in message.items() if k != "reasoning"}
            if speaks:
                message["reasoning_content"] = reasoning
            else:  # tool calls the template writes as text follow the answer, inside the reply's text
                answer = message.get("content") or ""
                if message.get("tool_calls") and not calls_native:
                    answer = as_text_messages([message])[0]["content"]
                    del message["tool_calls"]
                message["content"] = _inline(reasoning, answer, tags)
        out.append(message)
    return out


def _eos_texts(tokenizer: Any) -> list[str]:
    texts = [getattr(tokenizer, "eos_token", None)]
    for token in getattr(tokenizer, "eos_token_ids", None) or []:
        with contextlib.suppress(Exception):
            texts.append(tokenizer.convert_ids_to_tokens(token))
    return [t for t in texts if isinstance(t, str) and t]


def reply_text(tokenizer: Any, reply: dict[str, Any]) -> str:
    """A recorded reply's text as the model generates it after the generation prompt (no EOS): its answer, tool
    calls written out as ``as_text_messages`` writes them, and its reasoning before them in the chat template's
    own form. That form is what the template renders for the reply after a user message, up to its EOS text
    (Qwen3's template: ``<think>\\n...\\n</think>\\n\\n`` from ``reasoning_content``); for a template that
    leaves the reasoning out of what it renders (DeepSeek-R1's, QwQ's) or no template, the reasoning goes in the
    model's thinking tags (``thinking_tags``) as ``<think>\\n...\\n</think>\\n\\n`` before the answer, without the
    opening tag when the generation prompt ends in it."""
    answer = as_text_messages([{k: v for k, v in reply.items() if k != "reasoning"}])[0]["content"]
    reasoning = reply.get("reasoning")
    if reasoning is None:
        return answer
    tags = thinking_tags(tokenizer)
    if not getattr(tokenizer, "chat_template", None):
        return _inline(reasoning, answer, tags)
    asked = [{"role": "user", "content": "?"}]
    message = {"role": "assistant", "content": answer, "reasoning": reasoning}
    try:
        prompt = tokenizer.apply_chat_template(asked, add_generation_prompt=True, tokenize=False)
        rendered = tokenizer.apply_chat_template(
            _reasoning_in_template_form(tokenizer, [*asked, message]), add_generation_prompt=False, tokenize=False
        )
    except Exception:  # a template that refuses the short exchange: the thinking tags
        prompt = rendered = ""
    generated = rendered[len(prompt) :] if prompt and rendered.startswith(prompt) else ""
    shown = reasoning.strip()
    if shown in generated and answer.strip() in generated[generated.index(shown) + len(shown) :]:
        after = generated.index(shown) + len(shown)
        ends = [i for i in (generated.find(e, after) for e in _eos_texts(tokenizer)) if i >= 0]
        return generated[: min(ends)] if ends else generated.rstrip()
    text = _inline(reasoning, answer, tags)
    opened = prompt.rstrip(" \n").endswith(tags[0])
    return text[len(tags[0]) :].lstrip("\n") if opened else text


def _call_text(call: dict[str, Any]) -> str:
    body = {"name": call["name"], "arguments": call.get("arguments", {})}
    return "<tool_call>\n" + json.dumps(body, ensure_ascii=False) + "\n</tool_call>"


def as_text_messages(messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] = ()) -> list[dict[str, str]]:
    """Messages for a template without tool support: tool calls written into the assistant's text
    (``<tool_call>{json}</tool_call>``), tool results as "tool" messages, tool descriptions appended
    to the system message."""
    out: list[dict[str, str]] = []
    for message in messages:
        content = message.get("content") or ""
        if message.get("tool_calls"):
            calls = "\n".join(_call_text(c) for c in message["tool_calls"])
            content = f"{content}\n{calls}" if content else calls
        out.append({"role": message["role"], "content": content})
        if message.get("reasoning_content") is not None:
            out[-1]["reasoning_content"] = message["reasoning_content"]
    if tools:
        listing = 'You can call these tools; reply with <tool_call>{"name": ..., "arguments": ...}</tool_call>:\n'
        listing += "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + listing}
        else:
            out.insert(0, {"role": "system", "content": listing})
    return out


def _as_template_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages in the form Hugging Face chat templates with tool support expect."""
    out = []
    for message in messages:
        m = {k: v for k, v in message.items() if k != "tool_calls"}
        if message.get("tool_calls"):
            m["tool_calls"] = [
                {
                    "id": c.get("id", f"call_{i}"),
                    "type": "function",
                    "function": {"name": c["name"], "arguments": c.get("arguments", {})},
                }
                for i, c in enumerate(message["tool_calls"])
            ]
        if m.get("content") is None:
            m["content"] = ""
        out.append(m)
    return out


def render_text(tokenizer: Any, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] = ()) -> str:
    """The text of a prompt ending with the assistant's turn, through the tokenizer's chat template: tool calls
    natively where it knows them, else as text (``as_text_messages``; tool results as user messages where it
    rejects the "tool" role); reasoning in its form (``_reasoning_in_template_form``). Without a template:
    "role: content" paragraphs ending with "assistant:".
    """
    messages = _reasoning_in_template_form(tokenizer, messages)
    if not getattr(tokenizer, "chat_template", None):
        return "".join(f"{m['role']}: {m['content']}\n\n" for m in as_text_messages(messages, tools)) + "assistant:"
    if "tool_calls" in _template_text(tokenizer):
        return tokenizer.apply_chat_template(
            _as_template_messages(messages),
            tools=[{"type": "function", "function": t} for t in tools] or None,
            add_generation_prompt=True,
            tokenize=False,
        )
    plain = as_text_messages(messages, tools)
    try:
        return tokenizer.apply_chat_template(plain, add_generation_prompt=True, tokenize=False)
    except Exception:  # templates that allow only system/user/assistant roles
        plain = [
            {"role": "user", "content": f"<tool_response>\n{m['content']}\n</tool_response>"}
            if m["role"] == "tool"
            else m
            for m in plain
        ]
        return tokenizer.apply_chat_template(plain, add_generation_prompt=True, tokenize=False)


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """Token ids of rendered prompt text (special tokens are in the text; none are added); text that is not
    (a lone surrogate in a trace built in code) is one ValueError."""
    check_text(text, "the rendered trace prompt")
    if not getattr(tokenizer, "chat_template", None):
        return list(tokenizer.encode(text))
    return list(tokenizer.encode(text, add_special_tokens=False))


def render_messages(
    tokenizer: Any, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] = ()
) -> list[int]:
    """Token ids of a prompt ending with the assistant's turn (``render_text``, then ``encode_text``)."""
    return encode_text(tokenizer, render_text(tokenizer, messages, tools))


def render_turn(tokenizer: Any, trace: Trace, turn: int, replies: Sequence[Any] | None = None) -> list[int]:
    """Token ids of the prompt of ``turn``: the history before its reply (``Trace.history``)."""
    return render_messages(tokenizer, trace.history(turn, replies), trace.tools)
