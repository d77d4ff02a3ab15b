"""Conversation traces: one schema, a loader, importers, and prompt rendering.

A trace is a conversation replayed turn by turn: each turn is one model call. Its prompt is the
whole history before it (earlier turns' messages and replies) plus the turn's new messages,
rendered with the model's chat template; its reply is what the model generates.

Schema (JSONL, one turn per line; the lines of a trace are consecutive, turns numbered from 0)::

    {"trace": "coding-agent", "turn": 0,
     "messages": [{"role": "system", "content": "..."}, {"role": "user", "content": "..."}],
     "assistant": {"role": "assistant", "content": "...",
                   "tool_calls": [{"id": "call_1", "name": "read_file", "arguments": {"path": "a.py"}}]},
     "tools": [{"name": "read_file", "description": "...", "parameters": {...}}],
     "meta": {"description": "...", "source": "..."}}

- ``messages``: the messages added before this turn's reply (system, user, tool results; may be
  empty). Roles: "system", "user", "assistant", "tool". ``content`` is a string (null allowed for
  an assistant message that only calls tools). Tool results are ``{"role": "tool", "content": ...,
  "name": ..., "tool_call_id": ...}`` (name and id optional).
- ``assistant``: the recorded reply (content and/or ``tool_calls``, each ``{"id"?, "name",
  "arguments"}`` with arguments a JSON object or a string), or null when none was recorded (the
  model's reply is then needed before the next turn's prompt can be rendered).
- ``tools`` (JSON-schema function descriptions) and ``meta`` appear on a trace's first line only.

Importers turn other formats into traces: OpenAI message lists (``{"messages": [...]}`` or a bare
list, JSON or JSONL), ShareGPT (``{"conversations": [{"from", "value"}]}``), tau-bench few-shot
conversations (``{"messages_display": "user: ...\\nassistant: ..."}``), SWE-agent ``.traj`` files
(``history`` messages, else ``trajectory`` steps) and Spec-Bench / MT-bench ``question.jsonl``
(``turns``: one user message per turn, no recorded replies). ``load_traces`` picks the importer.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence
from specbench.common.files import PROJECT_ROOT

ROLES = ("system", "user", "assistant", "tool")
FORMATS = ("trace", "openai", "sharegpt", "tau-bench", "swe-agent", "questions")
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

    def to_records(self) -> list[dict[str, Any]]:
        """The trace as schema lines."""
        records = []
        for i, turn in enumerate(self.turns):
            record: dict[str, Any] = {"trace": self.id, "turn": i, "messages": turn.messages, "assistant": turn.assistant}
            if i == 0 and self.tools:
                record["tools"] = self.tools
            if i == 0 and self.meta:
                record["meta"] = self.meta
            records.append(record)
        return records


# -- validation ----------------------------------------------------------------------------------
def _check_message(message: Any, where: str) -> dict[str, Any]:
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
        if not isinstance(calls, list) or not all(isinstance(c, dict) and isinstance(c.get("name"), str) for c in calls):
            raise ValueError(f"{where}: tool_calls must be a list of objects with a 'name' and 'arguments'")
    if content is None and not calls and role != "assistant":
        raise ValueError(f"{where}: a {role} message needs content")
    return message


def _turn_from_record(record: Any, where: str) -> tuple[str, int, Turn, dict[str, Any]]:
    if not isinstance(record, dict):
        raise ValueError(f"{where}: each line must be a JSON object (a turn), got {type(record).__name__}")
    missing = [key for key in ("trace", "turn", "messages") if key not in record]
    if missing:
        raise ValueError(f"{where}: a turn needs 'trace', 'turn' and 'messages'; missing {missing}")
    trace_id, number, messages = record["trace"], record["turn"], record["messages"]
    if not isinstance(trace_id, str) or not trace_id:
        raise ValueError(f"{where}: 'trace' must be a non-empty string")
    if not isinstance(number, int) or number < 0:
        raise ValueError(f"{where}: 'turn' must be an integer >= 0, got {number!r}")
    if not isinstance(messages, list):
        raise ValueError(f"{where}: 'messages' must be a list")
    messages = [_check_message(m, f"{where}: messages[{i}]") for i, m in enumerate(messages)]
    assistant = record.get("assistant")
    if assistant is not None:
        _check_message(assistant, f"{where}: assistant")
        if assistant["role"] != "assistant":
            raise ValueError(f"{where}: 'assistant' must have role 'assistant'")
    extra = {key: record[key] for key in ("tools", "meta") if key in record}
    return trace_id, number, Turn(messages, assistant), extra


def _read_json_lines(path: Path) -> Iterable[tuple[int, Any]]:
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield number, json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{number}: not valid JSON ({err.msg} at column {err.colno})") from None


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}:{err.lineno}: not valid JSON ({err.msg} at column {err.colno})") from None


def read_trace_file(path: str | os.PathLike) -> list[Trace]:
    """Traces from a file in the project's schema."""
    path = Path(path)
    traces: dict[str, Trace] = {}
    order: list[str] = []
    for number, record in _read_json_lines(path):
        where = f"{path}:{number}"
        trace_id, turn_number, turn, extra = _turn_from_record(record, where)
        trace = traces.get(trace_id)
        if trace is None:
            if turn_number != 0:
                raise ValueError(f"{where}: trace {trace_id!r} starts at turn {turn_number}; its first line must be turn 0")
            trace = traces[trace_id] = Trace(trace_id, [], extra.get("tools") or [], extra.get("meta") or {})
            order.append(trace_id)
        else:
            if order[-1] != trace_id:
                raise ValueError(f"{where}: the lines of trace {trace_id!r} must be consecutive")
            if turn_number != len(trace.turns):
                raise ValueError(f"{where}: trace {trace_id!r} expects turn {len(trace.turns)} next, got {turn_number}")
            if extra:
                raise ValueError(f"{where}: 'tools' and 'meta' belong on a trace's first line (turn 0)")
        trace.turns.append(turn)
    if not order:
        raise ValueError(f"{path}: no turns found")
    return [traces[t] for t in order]


def save_traces(traces: Sequence[Trace], path: str | os.PathLike) -> Path:
    """Write traces in the project's schema, atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for trace in traces:
                for record in trace.to_records():
                    f.write(json.dumps(record, ensure_ascii=False) + "\n")
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


# -- importers -----------------------------------------------------------------------------------
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
    return _check_message(out, where)


def from_messages(
    messages: Sequence[dict[str, Any]], trace_id: str, tools: Sequence[dict[str, Any]] | None = None,
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
        items = list(_read_json_lines(path))
    else:
        data = _read_json(path)
        items = [(1, data)] if isinstance(data, dict) or (isinstance(data, list) and data and "role" in data[0]) else [
            (1, d) for d in data
        ]
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
    "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
    "bing": "assistant", "bard": "assistant", "model": "assistant", "system": "system",
    "tool": "tool", "observation": "tool", "function_response": "tool", "function_call": "assistant",
}


def import_sharegpt(path: str | os.PathLike) -> list[Trace]:
    """ShareGPT conversations: objects with "conversations": [{"from": "human"|"gpt"|..., "value": ...}]."""
    path = Path(path)
    items = list(_read_json_lines(path)) if path.suffix == ".jsonl" else [(1, d) for d in _ensure_list(_read_json(path))]
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
                raise ValueError(f"{where}: conversations[{i}] needs 'from' (one of {sorted(_SHAREGPT_ROLES)}) and a text 'value'")
            message: dict[str, Any] = {"role": _SHAREGPT_ROLES[speaker], "content": entry["value"]}
            if speaker == "function_call":
                try:
                    call = json.loads(entry["value"])
                    message = {"role": "assistant", "content": None, "tool_calls": [_tool_call(call)]}
                except (json.JSONDecodeError, AttributeError):
                    pass
            messages.append(_check_message(message, f"{where}: conversations[{i}]"))
        tools = item.get("tools")
        if isinstance(tools, str):
            try:
                tools = json.loads(tools)
            except json.JSONDecodeError:
                tools = None
        trace_id = str(item.get("id", f"{path.stem}-{index}"))
        traces.append(from_messages(messages, trace_id, tools if isinstance(tools, list) else None, {"source": str(path)}))
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
    for index, (line, item) in enumerate(_read_json_lines(path)):
        where = f"{path}:{line}"
        display = item.get("messages_display") if isinstance(item, dict) else None
        if not isinstance(display, str):
            raise ValueError(f"{where}: a tau-bench line needs a 'messages_display' string")
        messages: list[dict[str, Any]] = []
        for text_line in display.split("\n"):
            match = _TAU_LINE.match(text_line)
            if match:
                role, content = match.groups()
                messages.append({"role": role, "content": None if role == "assistant" and content == "None" else content})
            elif messages:
                previous = messages[-1]
                previous["content"] = (previous["content"] or "") + "\n" + text_line
            else:
                raise ValueError(f"{where}: messages_display must start with 'user: ', 'assistant: ', 'tool: ' or 'system: '")
        for message in messages:
            _check_message(message, where)
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
    for line, item in _read_json_lines(path):
        where = f"{path}:{line}"
        turns = item.get("turns") if isinstance(item, dict) else None
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
            raise ValueError(f"{where}: a question needs 'turns', a non-empty list of strings")
        qid = item.get("question_id", line)
        meta = {"source": str(path), "question_id": qid, "category": item.get("category")}
        traces.append(Trace(f"{path.parent.name}-{qid}", [Turn([{"role": "user", "content": t}]) for t in turns], [], meta))
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
        "(the project's trace schema is described in specbench/traces.py)"
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


def bundled_traces() -> list[str]:
    """Names of the traces shipped in data/traces."""
    return sorted(p.stem for p in TRACES_DIR.glob("*.jsonl")) if TRACES_DIR.exists() else []


# -- rendering -----------------------------------------------------------------------------------
def _template_speaks_tools(tokenizer: Any) -> bool:
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        template = " ".join(template.values())
    return isinstance(template, str) and "tool_calls" in template


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
    if tools:
        listing = "You can call these tools; reply with <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call>:\n"
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
                {"id": c.get("id", f"call_{i}"), "type": "function",
                 "function": {"name": c["name"], "arguments": c.get("arguments", {})}}
                for i, c in enumerate(message["tool_calls"])
            ]
        if m.get("content") is None:
            m["content"] = ""
        out.append(m)
    return out


def render_messages(tokenizer: Any, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] = ()) -> list[int]:
    """Token ids of a prompt ending with the assistant's turn, through the tokenizer's chat template.

    Templates that know tool calls get them natively; others get them as text (``as_text_messages``);
    a template that rejects the "tool" role gets tool results as user messages. Without a chat
    template: "role: content" paragraphs ending with "assistant:".
    """
    if not getattr(tokenizer, "chat_template", None):
        text = "".join(f"{m['role']}: {m['content']}\n\n" for m in as_text_messages(messages, tools)) + "assistant:"
        return list(tokenizer.encode(text))
    if _template_speaks_tools(tokenizer):
        text = tokenizer.apply_chat_template(
            _as_template_messages(messages), tools=[{"type": "function", "function": t} for t in tools] or None,
            add_generation_prompt=True, tokenize=False,
        )
    else:
        plain = as_text_messages(messages, tools)
        try:
            text = tokenizer.apply_chat_template(plain, add_generation_prompt=True, tokenize=False)
        except Exception:  # templates that allow only system/user/assistant roles
            plain = [
                {"role": "user", "content": f"<tool_response>\n{m['content']}\n</tool_response>"} if m["role"] == "tool" else m
                for m in plain
            ]
            text = tokenizer.apply_chat_template(plain, add_generation_prompt=True, tokenize=False)
    return list(tokenizer.encode(text, add_special_tokens=False))


def render_turn(tokenizer: Any, trace: Trace, turn: int, replies: Sequence[Any] | None = None) -> list[int]:
    """Token ids of the prompt of ``turn``: the history before its reply (``Trace.history``)."""
    return render_messages(tokenizer, trace.history(turn, replies), trace.tools)
