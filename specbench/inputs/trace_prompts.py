"""A trace's turn prompts, rendered and tokenized in one pass over the conversation.

The prompt of turn t+1 is the prompt of turn t, then turn t's reply, turn t+1's messages and the
generation prompt. ``trace_prompts`` renders only that difference, through the chat template applied
to a short window of the conversation (the system message, turn t's messages, its reply and turn
t+1's messages), and tokenizes only the text after the last special token of the prompt before
(tokenizers split special tokens out before anything else, so the ids before such a token do not
change). Time and memory are linear in the conversation's length. The last turn's prompt is checked
against a render and tokenization of its whole history; a template that renders history differently
from how it renders a window (or a tokenizer without such split points) falls back to rendering
every turn in full, which ``TracePrompts.full_renders`` counts.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from specbench.inputs.traces import Trace, encode_text, render_messages, render_text, render_turn, reply_text


@dataclass
class TurnPrompt:
    """One turn's prompt (``TracePrompts.ids[:shared]`` then ``tail``) and its recorded reply's ids."""

    turn: int
    shared: int
    tail: list[int]
    output: list[int]


@dataclass
class TracePrompts:
    """The turns of a trace that have a recorded reply, their prompts sharing one list of ids."""

    trace_id: str
    ids: list[int] = field(default_factory=list)
    turns: list[TurnPrompt] = field(default_factory=list)
    skipped: int = 0
    full_renders: int = 0

    def prompt(self, index: int) -> list[int]:
        turn = self.turns[index]
        return self.ids[: turn.shared] + turn.tail

    def __iter__(self) -> Iterator[tuple[int, list[int], list[int]]]:
        """(turn number, prompt ids, output ids) per turn with a reply."""
        for i, turn in enumerate(self.turns):
            yield turn.turn, self.prompt(i), turn.output


def _split_tokens(tokenizer: Any) -> re.Pattern | None:
    """A pattern of the tokenizer's special tokens that split text (no whitespace stripping around them)."""
    added = getattr(tokenizer, "added_tokens_decoder", None)
    if not isinstance(added, dict):
        return None
    texts = [
        t.content
        for t in added.values()
        if getattr(t, "content", "")
        and not getattr(t, "lstrip", False)
        and not getattr(t, "rstrip", False)
        and (getattr(t, "special", False) or not getattr(t, "normalized", True))
    ]
    return re.compile("|".join(re.escape(t) for t in sorted(texts, key=len, reverse=True))) if texts else None


def reply_ids(tokenizer: Any, reply: dict[str, Any]) -> list[int]:
    """A recorded reply as the model would have written it: its text (``reply_text``: reasoning in the
    chat template's form, the answer, tool calls written out), then the first EOS id when the tokenizer
    has one."""
    text = reply_text(tokenizer, reply)
    eos = sorted(getattr(tokenizer, "eos_token_ids", None) or [])
    return list(tokenizer.encode(text, add_special_tokens=False)) + eos[:1]


def _text_deltas(tokenizer: Any, trace: Trace, turns: int) -> list[str] | None:
    """Each turn's prompt text less the one before (the first: all of it), each rendered from a window
    of the conversation; None when a window's render does not extend the one before it."""
    first = trace.turns[0].messages[0] if trace.turns[0].messages else None
    lead = [first] if first is not None and first["role"] == "system" else []
    deltas = [render_text(tokenizer, trace.history(0), trace.tools)]
    for t in range(turns - 1):
        before_messages = (lead if t > 0 else []) + trace.turns[t].messages
        after_messages = [*before_messages, trace.turns[t].assistant, *trace.turns[t + 1].messages]
        try:
            before = render_text(tokenizer, before_messages, trace.tools)
            after = render_text(tokenizer, after_messages, trace.tools)
        except Exception:  # a template that refuses the window (e.g. one that wants a user message first)
            return None
        if not before or not after.startswith(before):
            return None
        deltas.append(after[len(before) :])
    return deltas


def trace_prompts(tokenizer: Any, trace: Trace) -> TracePrompts:
    """The prompts and recorded replies of ``trace``'s turns up to the first without a reply (skipped,
    with the turns after it: their prompts would need that reply), in time linear in its length."""
    turns = next((t for t, turn in enumerate(trace.turns) if turn.assistant is None), len(trace.turns))
    out = TracePrompts(trace.id, skipped=len(trace.turns) - turns)
    if turns == 0:
        return out
    deltas = _text_deltas(tokenizer, trace, turns)
    outputs = [reply_ids(tokenizer, trace.turns[t].assistant) for t in range(turns)]
    if deltas is not None:
        split = _split_tokens(tokenizer)

        def encode(text: str) -> list[int]:  # the first text as a prompt's start, the rest as its continuation
            return list(tokenizer.encode(text, add_special_tokens=False)) if out.ids else encode_text(tokenizer, text)

        tail = ""
        for t, delta in enumerate(deltas):
            text = tail + delta
            cut = max((m.end() for m in split.finditer(text)), default=0) if split is not None else 0
            if cut:
                out.ids += encode(text[:cut])
            tail = text[cut:]
            out.turns.append(TurnPrompt(t, len(out.ids), encode(tail) if tail or not out.ids else [], outputs[t]))
        text = "".join(deltas)
        last = render_text(tokenizer, trace.history(turns - 1), trace.tools) if turns > 1 else text
        if last == text and out.prompt(turns - 1) == encode_text(tokenizer, text):
            return out
    # The template or tokenizer does not compose: every turn in full.
    out.ids, out.full_renders = [], turns
    out.turns = [TurnPrompt(t, 0, render_turn(tokenizer, trace, t), outputs[t]) for t in range(turns)]
    return out


#: What to do with a turn whose prompt does not fit the model's context: stop with an error naming
#: the trace and turn, or drop the oldest messages (after the system message) until it fits.
TRUNCATE = ("error", "oldest")


def fitted_turn(
    tokenizer: Any,
    trace: Trace,
    turn: int,
    replies: Sequence[Any] | None,
    context: int | None,
    reply_tokens: int,
    truncate: str = "error",
) -> tuple[list[int], int]:
    """The prompt ids of ``turn`` and how many of its oldest messages were dropped to fit ``context``.

    Without truncation a prompt of ``context`` tokens or more is an error naming the trace and turn;
    with ``truncate="oldest"`` the oldest messages after a leading system message are dropped (and
    then any tool or assistant message left at the front) until the prompt and ``reply_tokens``
    fit, or only the turn's last message is left.
    """
    if truncate not in TRUNCATE:
        raise ValueError(f"truncate must be one of {TRUNCATE}, got {truncate!r}")
    messages = trace.history(turn, replies)
    prompt = render_messages(tokenizer, messages, trace.tools)
    if context is None or (len(prompt) < context and (truncate == "error" or len(prompt) + reply_tokens <= context)):
        return prompt, 0
    if truncate == "error":
        raise ValueError(
            f"trace {trace.id!r} turn {turn}: the prompt has {len(prompt)} tokens, the model's context is {context}; "
            "replay fewer turns (--turns), or drop the oldest messages (--truncate oldest)"
        )
    keep = 1 if messages[0]["role"] == "system" else 0
    dropped = 0
    while len(prompt) + reply_tokens > context and len(messages) - keep > 1:
        del messages[keep]
        dropped += 1
        while len(messages) - keep > 1 and messages[keep]["role"] in ("tool", "assistant"):
            del messages[keep]
            dropped += 1
        prompt = render_messages(tokenizer, messages, trace.tools)
    if len(prompt) >= context:
        raise ValueError(
            f"trace {trace.id!r} turn {turn}: even its last message alone makes a prompt of {len(prompt)} tokens, "
            f"the model's context is {context}"
        )
    return prompt, dropped
