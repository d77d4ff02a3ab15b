"""Prompts: chat-template rendering, the project's bundled prompt sets, and the prompts of a sweep."""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specbench.common.files import ASSETS_DIR
from specbench.common.text import check_strings, check_text
from specbench.inputs.importers import load_traces
from specbench.inputs.traces import Trace, bundled_traces, read_json_lines, render_turn

if TYPE_CHECKING:
    import polars as pl

PROMPTS_DIR = ASSETS_DIR / "prompts"


def render_prompt(
    tokenizer: Any, text_or_messages: str | list[dict], chat: bool = True, name: str = "the prompt"
) -> list[int]:
    """Token ids of a prompt: a user message (or a message list) through the chat template, or raw text;
    text a tokenizer cannot encode is one ValueError naming ``name``."""
    messages = (
        [{"role": "user", "content": text_or_messages}] if isinstance(text_or_messages, str) else text_or_messages
    )
    check_strings(messages, name)
    if chat and getattr(tokenizer, "chat_template", None):
        return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True))
    if not isinstance(text_or_messages, str):
        text_or_messages = "\n\n".join(m["content"] for m in messages)
    return list(tokenizer.encode(text_or_messages))


# -- question files (Spec-Bench / MT-bench question.jsonl) --------------------------------------

#: The bundled sets, in report order: Spec-Bench's six categories, then the prompt-lookup workloads.
BUNDLED_CATEGORIES = (
    "multi_turn",
    "translation",
    "summarization",
    "qa",
    "math_reasoning",
    "rag",
    "repeated_paragraph",
    "natural_text",
)

#: MT-bench's categories; Spec-Bench reports them together as multi-turn conversation.
MT_BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")


@dataclass(frozen=True)
class Question:
    """One benchmark prompt: user turns answered in order (``subcategory``: the file's own category
    when it was grouped, e.g. MT-bench's "writing" under "multi_turn")."""

    question_id: int | str
    category: str
    turns: tuple[str, ...]
    subcategory: str = ""


def load_questions(
    path: str | Path, categories: Sequence[str] | None = None, limit: int | None = None
) -> list[Question]:
    """Questions of a ``question.jsonl`` file (one JSON object a line: question_id, category, turns).

    MT-bench categories are grouped as "multi_turn", as Spec-Bench reports them. ``categories``
    keeps only those (in file order); ``limit`` keeps the first ``limit`` of each category.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no question file at {path}: give a question.jsonl path or 'bundled'")
    questions = [_question(row, f"{path}:{number}") for number, row in read_json_lines(path)]
    if not questions:
        raise ValueError(f"{path} holds no questions: expected one JSON object a line")
    return select_questions(questions, categories, limit)


def bundled_questions(categories: Sequence[str] | None = None, limit: int | None = None) -> list[Question]:
    """The project's own prompts: a few per Spec-Bench category, a paragraph repeated eight times
    (prompt lookup's classic workload) and open-ended natural text."""
    questions = [q for category in BUNDLED_CATEGORIES for q in load_questions(PROMPTS_DIR / f"{category}.jsonl")]
    return select_questions(questions, categories, limit)


def questions_from(
    source: str | Path, categories: Sequence[str] | None = None, limit: int | None = None
) -> list[Question]:
    """``"bundled"`` for the project's prompts, else a question.jsonl path (whose questions a ``limit`` leaves out
    are said: ``PromptsLeftOut``)."""
    if str(source) == "bundled":
        return bundled_questions(categories, limit)
    chosen = load_questions(source, categories, None)
    kept = select_questions(chosen, None, limit)
    _say_left_out(len(chosen) - len(kept), len(chosen), f"limit={limit} keeps {limit} per category")
    return kept


def select_questions(
    questions: Sequence[Question], categories: Sequence[str] | None = None, limit: int | None = None
) -> list[Question]:
    """Keep the given categories (a category or subcategory name) and at most ``limit`` per category."""
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1 question per category, got {limit}")
    if categories:
        known = {q.category for q in questions} | {q.subcategory for q in questions if q.subcategory}
        if unknown := [c for c in categories if c not in known]:
            raise ValueError(f"unknown categories {unknown}: choose from {', '.join(sorted(known))}")
        questions = [q for q in questions if q.category in categories or q.subcategory in categories]
    if limit is not None:  # a question is kept while fewer than ``limit`` before it share its category
        questions = [q for i, q in enumerate(questions) if sum(p.category == q.category for p in questions[:i]) < limit]
    return list(questions)


def _say_left_out(left_out: int, total: int, why: str) -> None:
    """Warn that ``left_out`` of ``total`` prompts were left out, and why (nothing when none was)."""
    if left_out > 0:
        import warnings

        warnings.warn(f"{left_out} of {total} prompts left out: {why}", PromptsLeftOut, stacklevel=3)


class PromptsLeftOut(UserWarning):
    """An option left some of the given prompts out of a run."""


def _question(row: Any, where: str) -> Question:
    if not isinstance(row, dict) or not {"question_id", "category", "turns"} <= row.keys():
        raise ValueError(f"{where}: a question needs question_id, category and turns")
    turns = row["turns"]
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t for t in turns):
        raise ValueError(f"{where}: turns must be a non-empty list of non-empty strings")
    for turn in turns:
        check_text(turn, f"{where}: a turn")
    category = str(row["category"])
    if category in MT_BENCH_CATEGORIES:
        return Question(row["question_id"], "multi_turn", tuple(turns), category)
    return Question(row["question_id"], category, tuple(turns), str(row.get("subcategory", "")))


# -- prompts of a sweep ----------------------------------------------------------------------


@dataclass
class Prompt:
    """One prompt of a sweep: its id, category, text (first turn) and token ids."""

    id: str
    category: str
    text: str
    ids: list[int]


def prompts_from(
    source: str | Path | Sequence[str],
    tokenizer: Any,
    categories: Sequence[str] | None = None,
    limit: int | None = None,
    chat: bool = True,
    max_prompt_tokens: int | None = None,
) -> list[Prompt]:
    """Prompts of a sweep: ``"bundled"``, a Spec-Bench-format ``question.jsonl``, or a list of texts.

    Each question's first turn is rendered with the chat template (``chat``). ``limit`` keeps the
    first ``limit`` of each category; ``max_prompt_tokens`` drops longer prompts (prefill is the
    slow part on a CPU). With ``"bundled"``, the category ``AGENTIC`` (only when named) adds agent turns of the
    shipped traces (``agentic_prompts``).
    """
    if tokenizer is None:
        raise ValueError("text prompts need a tokenizer: this model has none (use a model with a tokenizer)")
    agentic: list[Prompt] = []
    if str(source) == "bundled" and categories and AGENTIC in categories:
        agentic = agentic_prompts(tokenizer, limit, max_prompt_tokens)
        categories = [c for c in categories if c != AGENTIC]
        if not categories:  # the agentic kind alone
            return agentic
    if isinstance(source, (list, tuple)):
        texts = [("custom", f"p{i}", t) for i, t in enumerate(source)]
        if not texts:
            raise ValueError("the prompt list is empty")
        if limit is not None:
            _say_left_out(len(texts) - limit, len(texts), f"limit={limit} keeps the first {limit}")
            texts = texts[:limit]
    else:
        texts = [(q.category, str(q.question_id), q.turns[0]) for q in questions_from(source, categories, limit)]
    prompts = [Prompt(pid, category, text, render_prompt(tokenizer, text, chat=chat)) for category, pid, text in texts]
    return _within(prompts + agentic, max_prompt_tokens)


def _within(prompts: list[Prompt], max_prompt_tokens: int | None) -> list[Prompt]:
    """The prompts of at most ``max_prompt_tokens`` tokens (those left out said: ``PromptsLeftOut``)."""
    if max_prompt_tokens is not None:
        kept = [p for p in prompts if len(p.ids) <= max_prompt_tokens]
        _say_left_out(len(prompts) - len(kept), len(prompts), f"longer than max_prompt_tokens={max_prompt_tokens}")
        prompts = kept
        if not prompts:
            raise ValueError(f"no prompt has at most max_prompt_tokens={max_prompt_tokens} tokens: raise the limit")
    return prompts


# -- the agentic kind: turns of the shipped traces -------------------------------------------

#: The prompt kind of agent turns (``agentic_prompts``), named beside ``BUNDLED_CATEGORIES`` with the "bundled" source.
AGENTIC = "agentic"
#: The characters a reply must repeat verbatim from a tool result to make its turn agentic (a quoted field, an id
#: with its key, a line of code): set from the shipped traces' text alone, before any model ran on them.
REPEATED_CHARS = 20


def repeated_chars(trace: Trace, turn: int) -> int:
    """The longest run of characters ``turn``'s recorded reply (its text, then each tool call's arguments as JSON)
    repeats verbatim from a tool result of its history (0 without a reply or a tool result)."""
    reply = trace.turns[turn].assistant
    if reply is None:
        return 0
    calls = reply.get("tool_calls") or []
    text = (reply.get("content") or "") + "".join(
        json.dumps(c.get("arguments"), ensure_ascii=False) for c in calls if isinstance(c, dict)
    )
    results = [m["content"] for t in trace.turns[: turn + 1] for m in t.messages if m["role"] == "tool"]
    return max(
        (
            SequenceMatcher(None, text, r, autojunk=False).find_longest_match(0, len(text), 0, len(r)).size
            for r in results
        ),
        default=0,
    )


def agentic_turns(traces: Sequence[Trace]) -> list[tuple[Trace, int]]:
    """The turns the agentic kind is made of, by a rule fixed before measuring: a turn answering a tool result (its
    new messages end with one) whose recorded reply repeats at least ``REPEATED_CHARS`` characters of a tool
    result verbatim (``repeated_chars``): where an agent's reply copies tool output. In rounds over the traces (each
    one's first such turn, then each one's second, ...), traces in the order given."""
    per_trace = [
        [
            (trace, t)
            for t, turn in enumerate(trace.turns)
            if turn.messages and turn.messages[-1]["role"] == "tool" and repeated_chars(trace, t) >= REPEATED_CHARS
        ]
        for trace in traces
    ]
    return [turn for rank in itertools.zip_longest(*per_trace) for turn in rank if turn is not None]


def agentic_prompts(tokenizer: Any, limit: int | None = None, max_prompt_tokens: int | None = None) -> list[Prompt]:
    """The agentic kind: the ``agentic_turns`` of the shipped traces (``data/traces``, by name), each its history up
    to that turn's reply (earlier replies as recorded) through the model's chat template; the first ``limit`` of
    those of at most ``max_prompt_tokens`` tokens (the longer ones are skipped: prefill is the slow part on a CPU).
    Id ``TRACE:TURN``, text the turn's tool result."""
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1 prompt per kind, got {limit}")
    traces = [trace for name in bundled_traces() for trace in load_traces(name)]
    prompts = []
    for trace, t in agentic_turns(traces):
        ids = render_turn(tokenizer, trace, t)
        if max_prompt_tokens is None or len(ids) <= max_prompt_tokens:
            prompts.append(Prompt(f"{trace.id}:{t}", AGENTIC, trace.turns[t].messages[-1]["content"], ids))
        if len(prompts) == limit:
            break
    if not prompts:
        raise ValueError(f"no agentic turn has at most max_prompt_tokens={max_prompt_tokens} tokens: raise the limit")
    return prompts


def prompt_table(prompts: Sequence[Prompt], width: int = 60) -> pl.DataFrame:
    """A short table of prompts: id, category, tokens, the text's start."""
    import polars as pl

    return pl.DataFrame(
        {
            "id": [p.id for p in prompts],
            "category": [p.category for p in prompts],
            "tokens": [len(p.ids) for p in prompts],
            "text": [p.text[:width].replace("\n", " ") + ("..." if len(p.text) > width else "") for p in prompts],
        }
    )
