"""Prompts: chat-template rendering, the project's bundled prompt sets, and the prompts of a sweep."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specbench.common.files import ASSETS_DIR
from specbench.common.text import check_strings, check_text
from specbench.inputs.traces import read_text

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
    questions = []
    for number, line in enumerate(read_text(path).splitlines(), 1):
        if line.strip():
            questions.append(_question(line, f"{path}:{number}"))
    if not questions:
        raise ValueError(f"{path} holds no questions: expected one JSON object a line")
    return select_questions(questions, categories, limit)


def bundled_questions(categories: Sequence[str] | None = None, limit: int | None = None) -> list[Question]:
    """The project's own prompts: a few per Spec-Bench category, a paragraph repeated eight times
    (prompt lookup's classic workload) and open-ended natural text."""
    questions = []
    for category in BUNDLED_CATEGORIES:
        questions += load_questions(PROMPTS_DIR / f"{category}.jsonl")
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
        unknown = [c for c in categories if c not in known]
        if unknown:
            raise ValueError(f"unknown categories {unknown}: choose from {', '.join(sorted(known))}")
        questions = [q for q in questions if q.category in categories or q.subcategory in categories]
    if limit is not None:
        taken: dict[str, int] = {}
        kept = []
        for q in questions:
            if taken.get(q.category, 0) < limit:
                taken[q.category] = taken.get(q.category, 0) + 1
                kept.append(q)
        questions = kept
    return list(questions)


def _say_left_out(left_out: int, total: int, why: str) -> None:
    """Warn that ``left_out`` of ``total`` prompts were left out, and why (nothing when none was)."""
    if left_out > 0:
        import warnings

        warnings.warn(f"{left_out} of {total} prompts left out: {why}", PromptsLeftOut, stacklevel=3)


class PromptsLeftOut(UserWarning):
    """An option left some of the given prompts out of a run."""


def _question(line: str, where: str) -> Question:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as err:
        raise ValueError(f"{where}: not valid JSON ({err.msg})") from None
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
    slow part on a CPU).
    """
    if tokenizer is None:
        raise ValueError("text prompts need a tokenizer: this model has none (use a model with a tokenizer)")
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
    if max_prompt_tokens is not None:
        kept = [p for p in prompts if len(p.ids) <= max_prompt_tokens]
        _say_left_out(len(prompts) - len(kept), len(prompts), f"longer than max_prompt_tokens={max_prompt_tokens}")
        prompts = kept
        if not prompts:
            raise ValueError(f"no prompt has at most max_prompt_tokens={max_prompt_tokens} tokens: raise the limit")
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
