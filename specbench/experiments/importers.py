"""Importers: other conversation formats as traces (``specbench.experiments.traces``).

OpenAI message lists (``{"messages": [...]}`` or a bare list, JSON or JSONL), ShareGPT
(``{"conversations": [{"from", "value"}]}``), tau-bench few-shot conversations
(``{"messages_display": "user: ...\\nassistant: ..."}``), SWE-agent ``.traj`` files (``history``
messages, else ``trajectory`` steps) and Spec-Bench / MT-bench ``question.jsonl`` (``turns``: one
user message per turn, no recorded replies). ``load_traces`` reads a file in any
of these formats or in the project's schema, picking the importer.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from specbench.experiments.traces import (
    TRACES_DIR,
    Trace,
    Turn,
    bundled_traces,
    check_message,
    read_json_lines,
    read_trace_file,
)

FORMATS = ("trace", "openai", "sharegpt", "tau-bench", "swe-agent", "questions")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}:{err.lineno}: not valid JSON ({err.msg} at column {err.colno})") from None


def _text(content: Any) -> str | None:
    """Message content as text: strings as they are, OpenAI content parts joined."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
        return "".join(parts)
    return json.dumps(content, ensure_ascii=False)


def _tool_call(call: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI tool call ({"function": {"name", "arguments": "<json>"}}) in the schema's form."""
    function = call.get("function", call)
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            pass
    out = {"name": function.get("name", ""), "arguments": arguments}
    if call.get("id"):
        out = {"id": call["id"], **out}
    return out


def normalize_message(message: dict[str, Any], where: str) -> dict[str, Any]:
    """An OpenAI-style message (roles, content parts, tool calls, legacy "function" role) in schema form."""
    if not isinstance(message, dict):
        raise ValueError(f"{where}: a message must be an object, got {type(message).__name__}")
    role = message.get("role")
    if role == "function":
        role = "tool"
    if role == "developer":
        role = "system"
    out: dict[str, Any] = {"role": role, "content": _text(message.get("content"))}
    if message.get("tool_calls"):
        out["tool_calls"] = [_tool_call(c) for c in message["tool_calls"]]
    elif message.get("function_call"):
        out["tool_calls"] = [_tool_call(message["function_call"])]
    for key in ("name", "tool_call_id"):
        if message.get(key) and role == "tool":
            out[key] = message[key]
    if role == "tool" and not out.get("tool_call_id") and message.get("tool_call_ids"):
        out["tool_call_id"] = message["tool_call_ids"][0]  # SWE-agent's form
    if role == "tool" and out["content"] is None:
        out["content"] = ""
    return check_message(out, where)


def from_messages(
    messages: Sequence[dict[str, Any]],
    trace_id: str,
    tools: Sequence[dict[str, Any]] | None = None,
    meta: dict[str, Any] | None = None,
) -> Trace:
    """Split a message list into turns: every assistant message ends one; trailing messages after
    the last assistant message make a final turn without a recorded reply."""
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
        raise ValueError(f"trace {trace_id!r}: no turns (it has no assistant message and nothing to answer)")
    return Trace(trace_id, turns, [_tool_schema(t) for t in tools or []], dict(meta or {}))


def _tool_schema(tool: dict[str, Any]) -> dict[str, Any]:
    return tool.get("function", tool) if isinstance(tool, dict) else tool


def import_openai(path: str | os.PathLike) -> list[Trace]:
    """OpenAI chat message lists: a JSON list of messages, an object with "messages" (and "tools"),
    a JSON list of such objects, or JSONL with one conversation per line."""
    path = Path(path)
    if path.suffix == ".jsonl":
        items = list(read_json_lines(path))
    else:
        data = _read_json(path)
        items = (
            [(1, data)]
            if isinstance(data, dict) or (isinstance(data, list) and data and "role" in data[0])
            else [(1, d) for d in data]
        )
    traces = []
    for index, (line, item) in enumerate(items):
        where = f"{path}:{line}"
        if isinstance(item, list):
            messages, tools = item, None
        elif isinstance(item, dict) and isinstance(item.get("messages"), list):
            messages, tools = item["messages"], item.get("tools")
        else:
            raise ValueError(f"{where}: expected a list of messages or an object with 'messages'")
        messages = [normalize_message(m, f"{where}: messages[{i}]") for i, m in enumerate(messages)]
        trace_id = str(item.get("id", f"{path.stem}-{index}")) if isinstance(item, dict) else f"{path.stem}-{index}"
        traces.append(from_messages(messages, trace_id, tools, {"source": str(path)}))
    return traces


_SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "model": "assistant",
    "system": "system",
    "tool": "tool",
    "observation": "tool",
    "function_response": "tool",
    "function_call": "assistant",
}


def import_sharegpt(path: str | os.PathLike) -> list[Trace]:
    """ShareGPT conversations: objects with "conversations": [{"from": "human"|"gpt"|..., "value": ...}]."""
    path = Path(path)
    items = list(read_json_lines(path)) if path.suffix == ".jsonl" else [(1, d) for d in _ensure_list(_read_json(path))]
    traces = []
    for index, (line, item) in enumerate(items):
        where = f"{path}:{line}"
        turns = item.get("conversations") if isinstance(item, dict) else None
        if not isinstance(turns, list):
            raise ValueError(f"{where}: a ShareGPT conversation needs a 'conversations' list")
        messages = []
        for i, entry in enumerate(turns):
            speaker = entry.get("from") if isinstance(entry, dict) else None
            if speaker not in _SHAREGPT_ROLES or not isinstance(entry.get("value"), str):
                raise ValueError(
                    f"{where}: conversations[{i}] needs 'from' (one of {sorted(_SHAREGPT_ROLES)}) and a text 'value'"
                )
            message: dict[str, Any] = {"role": _SHAREGPT_ROLES[speaker], "content": entry["value"]}
            if speaker == "function_call":
                try:
                    call = json.loads(entry["value"])
                    message = {"role": "assistant", "content": None, "tool_calls": [_tool_call(call)]}
                except (json.JSONDecodeError, AttributeError):
                    pass
            messages.append(check_message(message, f"{where}: conversations[{i}]"))
        tools = item.get("tools")
        if isinstance(tools, str):
            try:
                tools = json.loads(tools)
            except json.JSONDecodeError:
                tools = None
        trace_id = str(item.get("id", f"{path.stem}-{index}"))
        tools = tools if isinstance(tools, list) else None
        traces.append(from_messages(messages, trace_id, tools, {"source": str(path)}))
    return traces


def _ensure_list(data: Any) -> list:
    return data if isinstance(data, list) else [data]


_TAU_LINE = re.compile(r"^(user|assistant|tool|system): ?(.*)$")


def import_tau_bench(path: str | os.PathLike) -> list[Trace]:
    """tau-bench few-shot conversations: JSONL of {"messages_display": "user: ...\\nassistant: ..."}.

    The display hides tool calls: an "assistant: None" line is an assistant message that called a
    tool (kept with null content); "tool: ..." lines are tool results. Lines without a role prefix
    continue the previous message.
    """
    path = Path(path)
    traces = []
    for index, (line, item) in enumerate(read_json_lines(path)):
        where = f"{path}:{line}"
        display = item.get("messages_display") if isinstance(item, dict) else None
        if not isinstance(display, str):
            raise ValueError(f"{where}: a tau-bench line needs a 'messages_display' string")
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
        for message in messages:
            check_message(message, where)
        traces.append(from_messages(messages, f"{path.stem}-{index}", None, {"source": str(path), "line": line}))
    return traces


def import_swe_agent(path: str | os.PathLike) -> list[Trace]:
    """A SWE-agent trajectory (``.traj``, JSON).

    Uses ``history`` (the messages the model saw and wrote: system prompt, demonstrations, the issue,
    thought/action replies, observations; SWE-agent's tool-call messages included) when present;
    otherwise the ``trajectory`` steps (``query`` of the first step when recorded, then each step's
    ``response`` as a reply and its ``observation`` as the next user message). mini-SWE-agent's
    ``{"messages": [...]}`` files are read as OpenAI message lists.
    """
    path = Path(path)
    data = _read_json(path)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a SWE-agent trajectory is a JSON object with 'history' or 'trajectory'")
    trace_id = path.name.split(".")[0]
    meta = {"source": str(path)}
    if isinstance(data.get("info"), dict) and data["info"].get("exit_status"):
        meta["exit_status"] = data["info"]["exit_status"]
    if isinstance(data.get("history"), list) and data["history"]:
        messages = [normalize_message(m, f"{path}: history[{i}]") for i, m in enumerate(data["history"])]
        return [from_messages(messages, trace_id, None, meta)]
    if isinstance(data.get("messages"), list) and data["messages"]:
        messages = [normalize_message(m, f"{path}: messages[{i}]") for i, m in enumerate(data["messages"])]
        return [from_messages(messages, trace_id, None, meta)]
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
        messages.append({"role": "assistant", "content": step.get("response") or step["action"]})
        if isinstance(step.get("observation"), str):
            messages.append({"role": "user", "content": step["observation"]})
    return [from_messages(messages, trace_id, None, meta)]


def import_questions(path: str | os.PathLike) -> list[Trace]:
    """Spec-Bench / MT-bench ``question.jsonl``: {"question_id", "category", "turns": [str, ...]}.

    Each question is a trace with one user message per turn and no recorded replies."""
    path = Path(path)
    traces = []
    for line, item in read_json_lines(path):
        where = f"{path}:{line}"
        turns = item.get("turns") if isinstance(item, dict) else None
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
            raise ValueError(f"{where}: a question needs 'turns', a non-empty list of strings")
        qid = item.get("question_id", line)
        meta = {"source": str(path), "question_id": qid, "category": item.get("category")}
        questions = [Turn([{"role": "user", "content": t}]) for t in turns]
        traces.append(Trace(f"{path.parent.name}-{qid}", questions, [], meta))
    return traces


IMPORTERS = {
    "trace": read_trace_file,
    "openai": import_openai,
    "sharegpt": import_sharegpt,
    "tau-bench": import_tau_bench,
    "swe-agent": import_swe_agent,
    "questions": import_questions,
}


def detect_format(path: str | os.PathLike) -> str:
    """Guess a file's format from its name and first record."""
    path = Path(path)
    if path.name.endswith(".traj") or path.name.endswith(".traj.json"):
        return "swe-agent"
    with open(path, encoding="utf-8") as f:
        head = f.read(1 << 16)
    first_line = head.split("\n", 1)[0].strip()
    try:
        first = json.loads(first_line)
    except json.JSONDecodeError:
        try:
            first = json.loads(head)
        except json.JSONDecodeError:
            first = None
            if head.lstrip().startswith("["):
                return "openai" if '"role"' in head else "sharegpt" if '"conversations"' in head else "openai"
    if isinstance(first, list):
        first = first[0] if first else None
    if isinstance(first, dict):
        if "trace" in first and "turn" in first:
            return "trace"
        if "messages_display" in first:
            return "tau-bench"
        if "turns" in first:
            return "questions"
        if "conversations" in first:
            return "sharegpt"
        if "messages" in first or "role" in first:
            return "openai"
        if "trajectory" in first or "history" in first:
            return "swe-agent"
    raise ValueError(
        f"{path}: cannot tell its format; pass format= one of {FORMATS} "
        "(the project's trace schema is described in specbench/experiments/traces.py)"
    )


def load_traces(path: str | os.PathLike, format: str | None = None) -> list[Trace]:
    """Traces from ``path`` in any supported format (``format`` None: detected).

    A bare name (no such file) is looked up in the project's ``data/traces`` folder.
    """
    path = Path(path)
    if not path.exists() and not path.is_absolute() and (TRACES_DIR / path).exists():
        path = TRACES_DIR / path
    elif not path.exists() and not path.suffix and (TRACES_DIR / f"{path}.jsonl").exists():
        path = TRACES_DIR / f"{path}.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"no trace file at {path} (bundled traces: {', '.join(bundled_traces()) or 'none'})")
    if format is None:
        format = detect_format(path)
    if format not in IMPORTERS:
        raise ValueError(f"unknown trace format {format!r}: use one of {FORMATS}")
    traces = IMPORTERS[format](path)
    if not traces:
        raise ValueError(f"{path}: no conversations found (read as {format!r})")
    return traces
