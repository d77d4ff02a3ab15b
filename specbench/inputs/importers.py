"""Importers: other conversation formats as traces (``specbench.inputs.traces``).

OpenAI message lists, a benchmark's published runs (tau-bench's results), ShareGPT, tau-bench few-shot
conversations, SWE-agent trajectories and Spec-Bench / MT-bench ``question.jsonl`` (each importer says what it
reads). ``load_traces`` reads a file in any of them or in the project's schema, the format detected from every
record's content (never the file's name) or given (``format=``, ``--trace-format``): a file that mixes formats,
a record that could be several, or one of another format than asked is an error naming its line or item.

Reasoning is read from a message's ``reasoning_content``, ``reasoning`` or ``thinking`` field, its
reasoning/thinking content parts and ``<think>...</think>`` at the start of its text; it becomes the message's
``reasoning`` (rendered in the chat template's form), or is left out with ``reasoning="drop"``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specbench.inputs.traces import (
    TRACES_DIR,
    Trace,
    Turn,
    bundled_traces,
    check_message,
    joined_reasoning,
    parse_tools,
    read_json_lines,
    read_text,
    traces_from_records,
    without_reasoning,
)

FORMATS = ("trace", "openai", "runs", "sharegpt", "tau-bench", "swe-agent", "questions")
#: How a user names the format on the command line.
FORMAT_FLAG = "--trace-format"
#: What becomes of the replies' reasoning: kept (replayed as the model's generated text, in the chat
#: template's form) or left out (only the answers and tool calls replayed); ``--reasoning`` on the command line.
REASONING = ("keep", "drop")

#: A record read from a file: where it is ("file:line" or "file: item i"), its line or item number, its value.
Record = tuple[str, int, Any]


def _is_message_list(data: Any) -> bool:
    return isinstance(data, list) and bool(data) and all(isinstance(m, dict) and "role" in m for m in data)


def read_records(path: str | os.PathLike) -> list[Record]:
    """The records of a JSON-lines file (one per line) or a JSON file (one object, or the items of an
    array; an array of messages is one conversation); a ValueError names the file and line of bad JSON."""
    path = Path(path)
    if path.suffix == ".jsonl":
        return [(f"{path}:{line}", line, item) for line, item in read_json_lines(path)]
    text = read_text(path)
    if text.strip():
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            try:  # JSON lines: its first line is one JSON value
                json.loads(next(line for line in text.split("\n") if line.strip()))
            except json.JSONDecodeError:
                raise ValueError(
                    f"{path}:{err.lineno}: not valid JSON ({err.msg} at column {err.colno}); expected one JSON "
                    "value, or one per line (JSON lines)"
                ) from None
        else:
            if isinstance(data, list) and not _is_message_list(data):
                return [(f"{path}: item {i}", i, item) for i, item in enumerate(data)]
            return [(f"{path}:1", 1, data)]
    return [(f"{path}:{line}", line, item) for line, item in read_json_lines(path, text)]


TEXT_PARTS = ("text", "input_text", "output_text")
#: Content parts holding a model's reasoning, and the keys their text is under (Anthropic's
#: ``{"type": "thinking", "thinking": ...}``, LLaMA-Factory's ``{"type": "reasoning", "value": ...}``).
REASONING_PARTS = {"reasoning": ("reasoning", "text", "value"), "thinking": ("thinking", "text", "value")}
#: Message fields holding a model's reasoning: DeepSeek's and vLLM's ``reasoning_content``,
#: OpenRouter's and vLLM's ``reasoning``, Ollama's ``thinking``.
REASONING_FIELDS = ("reasoning_content", "reasoning", "thinking")
_PARTS = "text, reasoning/thinking and tool_call parts"


@dataclass
class Content:
    """A message's content read from a string or a list of parts: its text, reasoning and tool calls."""

    text: str | None
    reasoning: list[str] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)


def _part_text(part: dict[str, Any], keys: Sequence[str], where: str) -> str:
    key = next((k for k in keys if k in part), keys[-1])
    text = part.get(key)
    if not isinstance(text, str):
        got = "nothing" if key not in part else type(text).__name__
        raise ValueError(
            f"{where}: a {part.get('type', 'text')!r} part needs its text as a string in "
            f"{' or '.join(repr(k) for k in keys)}, got {got}"
        )
    return text


def _call_part(part: dict[str, Any], where: str) -> dict[str, Any]:
    """A ``{"type": "tool_call", "value": {"name", "arguments"}}`` part (the object or its JSON text) as a call."""
    value = part.get("value", part.get("tool_call"))
    if isinstance(value, str):
        with contextlib.suppress(json.JSONDecodeError):
            value = json.loads(value)
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        raise ValueError(
            f"{where}: a 'tool_call' part needs 'value': an object with 'name' and 'arguments' (or it as JSON text)"
        )
    return _tool_call(value)


def _content(content: Any, where: str) -> Content:
    """Message content: strings as they are; a list of parts read by kind (text joined, reasoning parts
    kept apart, tool_call parts as calls); structured values (a tool's JSON result) as JSON; other
    parts are an error naming the part and the kinds that can be replayed."""
    if content is None or isinstance(content, str):
        return Content(content)
    if not isinstance(content, list):
        return Content(json.dumps(content, ensure_ascii=False))
    out = Content("")
    for i, part in enumerate(content):
        at = f"{where}: content[{i}]"
        if isinstance(part, str):
            out.text = f"{out.text}{part}"
            continue
        if not isinstance(part, dict):
            what = type(part).__name__
            raise ValueError(f"{at}: expected a part (an object with 'type'), got {what}: {_PARTS} are read")
        kind = part.get("type", "text")
        if kind in TEXT_PARTS:
            out.text = f"{out.text}{_part_text(part, ('text', 'value'), at)}"
        elif kind in REASONING_PARTS:
            out.reasoning.append(_part_text(part, REASONING_PARTS[kind], at))
        elif kind == "tool_call":
            out.calls.append(_call_part(part, at))
        else:
            raise ValueError(
                f"{at}: a {kind!r} part cannot be replayed: only {_PARTS} are read; remove it from the log"
            )
    return out


def _reasoning_fields(message: dict[str, Any], where: str) -> list[str]:
    pieces = [(key, message[key]) for key in REASONING_FIELDS if message.get(key) is not None]
    for key, value in pieces:
        if not isinstance(value, str):
            raise ValueError(
                f"{where}: {key!r} must be a string (the model's reasoning text), got {type(value).__name__}; "
                "write the reasoning as text"
            )
    return [value for _, value in pieces]


def _tool_call(call: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI tool call ({"function": {"name", "arguments": "<json>"}}) in the schema's form."""
    function = call.get("function", call)
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        with contextlib.suppress(json.JSONDecodeError):
            arguments = json.loads(arguments)
    out = {"name": function.get("name", ""), "arguments": arguments}
    if call.get("id"):
        out = {"id": call["id"], **out}
    return out


def normalize_message(message: dict[str, Any], where: str) -> dict[str, Any]:
    """An OpenAI-style message (roles, content parts, tool calls, legacy "function" role) in schema form."""
    if not isinstance(message, dict):
        raise ValueError(f"{where}: a message must be an object, got {type(message).__name__}")
    role = {"function": "tool", "developer": "system"}.get(str(message.get("role")), message.get("role"))
    content = _content(message.get("content"), where)
    out: dict[str, Any] = {"role": role, "content": content.text}
    calls = content.calls
    if message.get("tool_calls"):
        calls = [_tool_call(c) for c in message["tool_calls"]] + calls
    elif message.get("function_call"):
        calls = [_tool_call(message["function_call"])] + calls
    if calls:
        out["tool_calls"] = calls
        out["content"] = out["content"] or None
    reasoning = joined_reasoning(_reasoning_fields(message, where) + content.reasoning)
    if reasoning is not None:
        out["reasoning"] = reasoning
    if role == "tool":
        out |= {key: message[key] for key in ("name", "tool_call_id") if message.get(key)}
        if not out.get("tool_call_id") and message.get("tool_call_ids"):
            out["tool_call_id"] = message["tool_call_ids"][0]  # SWE-agent's form
        out["content"] = out["content"] or ""
    return check_message(out, where)


def from_messages(
    messages: Sequence[dict[str, Any]],
    trace_id: str,
    tools: Sequence[dict[str, Any]] | None = None,
    meta: dict[str, Any] | None = None,
    where: str | None = None,
) -> Trace:
    """Split a message list into turns: every assistant message ends one; trailing messages after
    the last assistant message make a final turn without a recorded reply. ``where`` (file and line
    or item) prefixes errors."""
    turns: list[Turn] = []
    pending: list[dict[str, Any]] = []
    for message in messages:
        if message["role"] == "assistant":
            turns.append(Turn(pending, message))
            pending = []
        else:
            pending.append(message)
    if pending and any(m["role"] in ("user", "tool") for m in pending):
        turns.append(Turn(pending, None))
    if not turns:
        raise ValueError(
            f"{where or 'trace ' + repr(trace_id)}: no turns: expected at least one assistant message, "
            "or a user or tool message to answer"
        )
    return Trace(trace_id, turns, list(tools or []), dict(meta or {}))


def _messages(item: Any, key: str, where: str) -> list[dict[str, Any]]:
    return [normalize_message(m, f"{where}: {key}[{i}]") for i, m in enumerate(item)]


def import_openai(path: Path, records: Sequence[Record]) -> list[Trace]:
    """OpenAI chat message lists: a JSON list of messages, an object with "messages" (and "tools"),
    a JSON list of such objects, or JSONL with one conversation per line."""
    traces = []
    for index, (where, _, item) in enumerate(records):
        if isinstance(item, list):
            messages, tools = _messages(item, "messages", where), []
        elif isinstance(item, dict) and isinstance(item.get("messages"), list):
            messages, tools = _messages(item["messages"], "messages", where), parse_tools(item.get("tools"), where)
        else:
            raise ValueError(f"{where}: expected a list of messages or an object with 'messages', got {_keys(item)}")
        trace_id = str(item.get("id", f"{path.stem}-{index}")) if isinstance(item, dict) else f"{path.stem}-{index}"
        traces.append(from_messages(messages, trace_id, tools, {"source": str(path)}, where))
    return traces


def import_runs(path: Path, records: Sequence[Record]) -> list[Trace]:
    """A benchmark's published runs (tau-bench's results files): a JSON list (or JSON lines) of
    ``{"task_id", "reward", "traj": [OpenAI messages with tool_calls], "trial"}``; one trace per run,
    named ``task<task_id>-trial<trial>``, with task_id, reward and trial in its meta."""
    traces = []
    seen: set[str] = set()
    needs = "a run needs 'traj', a list of OpenAI messages"
    for index, where, _, item, traj in _records_with(records, "traj", list, needs):
        trace_id = f"task{item.get('task_id', index)}" + (f"-trial{item['trial']}" if "trial" in item else "")
        if trace_id in seen:
            trace_id = f"{trace_id}-{index}"
        seen.add(trace_id)
        meta = {"source": str(path), **{k: item[k] for k in ("task_id", "reward", "trial") if k in item}}
        tools = parse_tools(item.get("tools"), where)
        traces.append(from_messages(_messages(traj, "traj", where), trace_id, tools, meta, where))
    return traces


#: ShareGPT's speaker names ("from") by the role each stands for.
_SHAREGPT_ROLES = {
    **dict.fromkeys(("human", "user"), "user"),
    **dict.fromkeys(("gpt", "assistant", "chatgpt", "bing", "bard", "model", "function_call"), "assistant"),
    **dict.fromkeys(("tool", "observation", "function_response"), "tool"),
    "system": "system",
}


def _records_with(
    records: Sequence[Record], key: str, kind: type, needs: str
) -> Iterator[tuple[int, str, int, dict[str, Any], Any]]:
    """(index, where, line, record, record[key]) for each of ``records``; a record without a ``kind`` value at
    ``key`` is an error naming it (``needs`` says what)."""
    for index, (where, line, item) in enumerate(records):
        value = item.get(key) if isinstance(item, dict) else None
        if not isinstance(value, kind):
            raise ValueError(f"{where}: {needs}")
        yield index, where, line, item, value


def import_sharegpt(path: Path, records: Sequence[Record]) -> list[Trace]:
    """ShareGPT conversations: objects with "conversations": [{"from": "human"|"gpt"|..., "value": ...}]."""
    traces = []
    needs = "a ShareGPT conversation needs a 'conversations' list"
    for index, where, _, item, turns in _records_with(records, "conversations", list, needs):
        messages = []
        for i, entry in enumerate(turns):
            speaker = entry.get("from") if isinstance(entry, dict) else None
            if speaker not in _SHAREGPT_ROLES or entry.get("value") is None:
                raise ValueError(
                    f"{where}: conversations[{i}] needs 'from' (one of {sorted(_SHAREGPT_ROLES)}) and a text 'value'"
                )
            message = {"role": _SHAREGPT_ROLES[speaker], "content": entry["value"]}
            with contextlib.suppress(json.JSONDecodeError, TypeError):  # a function_call's value: the call as JSON
                call = json.loads(entry["value"]) if speaker == "function_call" else None
                if isinstance(call, dict):
                    message = {"role": "assistant", "content": None, "tool_calls": [call]}
            messages.append(normalize_message(message, f"{where}: conversations[{i}]"))
        trace_id = str(item.get("id", f"{path.stem}-{index}"))
        tools = parse_tools(item.get("tools"), where)
        traces.append(from_messages(messages, trace_id, tools, {"source": str(path)}, where))
    return traces


_TAU_LINE = re.compile(r"^(user|assistant|tool|system): ?(.*)$")


def import_tau_bench(path: Path, records: Sequence[Record]) -> list[Trace]:
    """tau-bench few-shot conversations: JSONL of {"messages_display": "user: ...\\nassistant: ..."}.

    The display hides tool calls: an "assistant: None" line is an assistant message that called a
    tool (kept with null content); "tool: ..." lines are tool results. Lines without a role prefix
    continue the previous message.
    """
    traces = []
    needs = "a tau-bench line needs a 'messages_display' string"
    for index, where, line, _, display in _records_with(records, "messages_display", str, needs):
        messages: list[dict[str, Any]] = []
        for text_line in display.split("\n"):
            match = _TAU_LINE.match(text_line)
            if match:
                role, content = match.groups()
                hidden_call = role == "assistant" and content == "None"
                messages.append({"role": role, "content": None if hidden_call else content})
            elif messages:
                previous = messages[-1]
                previous["content"] = (previous["content"] or "") + "\n" + text_line
            else:
                raise ValueError(
                    f"{where}: messages_display must start with 'user: ', 'assistant: ', 'tool: ' or 'system: '"
                )
        messages = [check_message(message, where) for message in messages]
        meta = {"source": str(path), "line": line}
        traces.append(from_messages(messages, f"{path.stem}-{index}", None, meta, where))
    return traces


def import_swe_agent(path: Path, records: Sequence[Record]) -> list[Trace]:
    """A SWE-agent trajectory (``.traj``, JSON): its ``history`` messages when present, else its ``trajectory``
    steps (the first step's ``query``, then each ``response`` as a reply and ``observation`` as the next user
    message); mini-SWE-agent's ``{"messages": [...]}`` as an OpenAI message list.
    """
    data = records[0][2] if len(records) == 1 else None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a SWE-agent trajectory is a JSON object with 'history' or 'trajectory'")
    trace_id = path.name.split(".")[0]
    meta = {"source": str(path)}
    if isinstance(data.get("info"), dict) and data["info"].get("exit_status"):
        meta["exit_status"] = data["info"]["exit_status"]
    for key in ("history", "messages"):
        if isinstance(data.get(key), list) and data[key]:
            return [from_messages(_messages(data[key], key, str(path)), trace_id, None, meta, str(path))]
    steps = data.get("trajectory")
    if not isinstance(steps, list) or not steps:
        raise ValueError(f"{path}: a SWE-agent trajectory needs a non-empty 'history' or 'trajectory'")
    messages = []
    first_query = steps[0].get("query") if isinstance(steps[0], dict) else None
    if isinstance(first_query, list):
        messages.extend(normalize_message(m, f"{path}: trajectory[0].query[{i}]") for i, m in enumerate(first_query))
    for i, step in enumerate(steps):
        if not isinstance(step, dict) or not isinstance(step.get("response", step.get("action")), str):
            raise ValueError(f"{path}: trajectory[{i}] needs a 'response' (or 'action') string")
        reply = {"role": "assistant", "content": step.get("response") or step["action"]}
        messages.append(check_message(reply, f"{path}: trajectory[{i}]"))
        if isinstance(step.get("observation"), str):
            messages.append({"role": "user", "content": step["observation"]})
    return [from_messages(messages, trace_id, None, meta, str(path))]


def import_questions(path: Path, records: Sequence[Record]) -> list[Trace]:
    """Spec-Bench / MT-bench ``question.jsonl``: {"question_id", "category", "turns": [str, ...]}.

    Each question is a trace with one user message per turn and no recorded replies."""
    traces = []
    for where, line, item in records:
        turns = item.get("turns") if isinstance(item, dict) else None
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
            raise ValueError(f"{where}: a question needs 'turns', a non-empty list of strings")
        qid = item.get("question_id", line)
        meta = {"source": str(path), "question_id": qid, "category": item.get("category")}
        questions = [Turn([{"role": "user", "content": t}]) for t in turns]
        traces.append(Trace(f"{path.parent.name}-{qid}", questions, [], meta))
    return traces


def import_trace_schema(path: Path, records: Sequence[Record]) -> list[Trace]:
    """Traces in the project's schema (``specbench.inputs.traces``), from JSON lines or a JSON array."""
    return traces_from_records(path, ((where, item) for where, _, item in records))


IMPORTERS = {
    "trace": import_trace_schema,
    "openai": import_openai,
    "runs": import_runs,
    "sharegpt": import_sharegpt,
    "tau-bench": import_tau_bench,
    "swe-agent": import_swe_agent,
    "questions": import_questions,
}

#: Keys that mark a record of each format (a record with "trace" or "turn" is the project's schema,
#: also when it has "messages"; SWE-agent files may hold "messages" too).
_MARKERS = {
    "trace": ("trace", "turn"),
    "runs": ("traj",),
    "tau-bench": ("messages_display",),
    "questions": ("turns",),
    "sharegpt": ("conversations",),
    "swe-agent": ("history", "trajectory"),
    "openai": ("messages",),
}


def record_formats(record: Any) -> set[str]:
    """The formats a record carries the marking keys of: one for a clear record, none for an unknown
    one, several for a record that could be more than one; {"message"} for a bare chat message."""
    if isinstance(record, list):
        return {"openai"} if _is_message_list(record) or not record else set()
    if not isinstance(record, dict):
        return set()
    found = {name for name, keys in _MARKERS.items() if any(key in record for key in keys)}
    if found & {"trace", "swe-agent"}:
        found.discard("openai")
    if not found and "role" in record:
        return {"message"}
    return found


def _a(noun: str) -> str:
    return f"{'an' if noun[0] in 'aeiou' else 'a'} {noun}"


def _keys(record: Any) -> str:
    if isinstance(record, dict):
        return "keys: " + (", ".join(sorted(map(str, record))) or "none")
    return f"a list of {len(record)} items" if isinstance(record, list) else _a(type(record).__name__)


def _flag(choices: Sequence[str]) -> str:
    return f"choose one with {FORMAT_FLAG} {'|'.join(choices)} (format= in Python)"


def detect_format(path: str | os.PathLike, records: Sequence[Record] | None = None) -> str:
    """A file's format: the one format every record in it has (not its name); a ValueError names the first record
    that differs or is unclear."""
    path = Path(path)
    records = read_records(path) if records is None else records
    if not records:
        raise ValueError(f"{path}: empty: expected conversations (JSON, or one per line as JSON lines)")
    first: tuple[str, str] | None = None
    for where, _, record in records:
        found = record_formats(record)
        if found == {"message"}:
            raise ValueError(
                f"{where}: a bare chat message; expected a conversation (a list of messages, or an object with "
                "'messages')"
            )
        if len(found) > 1:
            raise ValueError(
                f"{where}: ambiguous: this record could be {' or '.join(sorted(found))} ({_keys(record)}); "
                + _flag(sorted(found))
            )
        if not found:
            raise ValueError(
                f"{where}: cannot tell its format from this record ({_keys(record)}); expected one of "
                f"{', '.join(FORMATS)} (the project's trace schema is described in data/traces/README.md); "
                + _flag(FORMATS)
            )
        (name,) = found
        if first is None:
            first = (where, name)
        elif name != first[1]:
            raise ValueError(
                f"{where}: {_a(name)} record, but {first[0]} is {_a(first[1])} record: a file holds one format "
                "(split it into one file per format)"
            )
    assert first is not None
    return first[1]


def check_format(records: Sequence[Record], format: str) -> None:
    """A ValueError naming the first record that is plainly of another format than ``format``."""
    for where, _, record in records:
        found = record_formats(record)
        if not found or format in found or (format == "swe-agent" and "openai" in found):
            continue  # unknown records: the importer names what they lack
        what = "a bare chat message" if found == {"message"} else _a(f"{'/'.join(sorted(found))} record")
        lost = " (read so, each turn would lose the history before it)" if "trace" in found else ""
        raise ValueError(f"{where}: {what}, not {format}{lost}; pass the file's own format, or none to detect it")


def load_traces(path: str | os.PathLike, format: str | None = None, reasoning: str = "keep") -> list[Trace]:
    """Traces from ``path`` in any supported format (``format`` None: detected from every record);
    the replies' reasoning kept or, with ``reasoning="drop"``, left out.

    A bare name (no such file) is looked up in the project's ``data/traces`` folder.
    """
    if reasoning not in REASONING:
        raise ValueError(f"reasoning: {' or '.join(REASONING)}, got {reasoning!r}")
    path = Path(path)
    if not path.exists() and not path.is_absolute() and (TRACES_DIR / path).exists():
        path = TRACES_DIR / path
    elif not path.exists() and not path.suffix and (TRACES_DIR / f"{path}.jsonl").exists():
        path = TRACES_DIR / f"{path}.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"no trace file at {path} (bundled traces: {', '.join(bundled_traces()) or 'none'})")
    if format is not None and format not in IMPORTERS:
        raise ValueError(f"unknown trace format {format!r}: use one of {', '.join(FORMATS)}")
    records = read_records(path)
    if format is None:
        format = detect_format(path, records)
    else:
        check_format(records, format)
    traces = IMPORTERS[format](path, records)
    if not traces:
        raise ValueError(f"{path}: no conversations found (read as {format!r})")
    return without_reasoning(traces) if reasoning == "drop" else traces
