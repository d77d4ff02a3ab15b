"""Training data for an MTP head, all of it available offline.

- code: the Python standard library's source;
- natural text: the standard library's docstrings and the text files installed packages ship
  (package descriptions, READMEs);
- the model's own greedy generations: answers to chat prompts the project writes (templates over
  topics, coding tasks, arithmetic, standard-library names and passages of package documents) and
  continuations of code and text snippets and of its own answers' prose. These match what the
  head sees while drafting, where token i+1 is the model's own output.

A slice of every source (chosen by file) is held out for evaluation.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import random
import re
import sys
import sysconfig
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import mlx.nn as nn
import numpy as np
from mlx_lm.generate import BatchGenerator

HELDOUT_EVERY = 20  # one source file in 20 is held out


# -- offline text ------------------------------------------------------------------------------


def _held_out(path: str) -> bool:
    return int(hashlib.sha1(path.encode()).hexdigest(), 16) % HELDOUT_EVERY == 0


def _read(path: Path, limit: int = 400_000) -> str | None:
    try:
        if path.stat().st_size > limit:
            return None
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


_DOCSTRING = re.compile(r'^[ \t]*[rRuU]?"""(.{200,}?)"""', re.DOTALL | re.MULTILINE)
_CODE_LINE = re.compile(r"^\s*(def |class |return\b|import |from \S+ import|if .*:$|for .*:$|elif |else:|try:$)", re.M)


def _docstrings(source: str) -> list[str]:
    """Long docstrings (prose) of a Python source: triple-quoted strings opening a line."""
    texts = (inspect.cleandoc(m.group(1)) for m in _DOCSTRING.finditer(source))
    return [text for text in texts if not _CODE_LINE.search(text)]


def stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts and "dist-packages" not in p.parts)


def package_text_files() -> list[Path]:
    """Package descriptions and documentation shipped in site-packages (no licence texts)."""
    roots = {Path(p) for p in (sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"])}
    roots |= {Path(p) for p in sys.path if p.endswith(("site-packages", "dist-packages"))}
    files = set()
    for root in roots:
        if not root.is_dir():
            continue
        files |= set(root.glob("*.dist-info/METADATA"))
        for pattern in ("*/*.md", "*/*.rst", "*/*/*.md", "*/*/*.rst", "*/*.txt"):
            files |= {
                p for p in root.glob(pattern) if "licen" not in p.name.lower() and "copying" not in p.name.lower()
            }
    return sorted(files)


def gather_text(max_chars: int, seed: int = 0, heldout_share: float = 0.1) -> dict[str, dict[str, list[str]]]:
    """{"code": {"train": [...], "heldout": [...]}, "natural": {...}} read from the installed Python.

    About ``max_chars`` characters for training, half code and half natural text (docstrings fill
    at most half of the natural share, package documents the rest), and ``heldout_share`` as
    much from the held-out files.
    """
    rng = random.Random(seed)
    py = stdlib_files()
    rng.shuffle(py)
    docs = package_text_files()
    rng.shuffle(docs)
    out = {kind: {"train": [], "heldout": []} for kind in ("code", "natural")}
    for split, share in (("heldout", heldout_share), ("train", 1.0)):
        want_heldout = split == "heldout"
        code_left = natural_left = share * max_chars / 2
        docstring_floor = natural_left / 2
        for path in py:
            if code_left <= 0 and natural_left <= docstring_floor:
                break
            if _held_out(path.name) != want_heldout:
                continue
            text = _read(path)
            if not text:
                continue
            if code_left > 0:
                out["code"][split].append(text)
                code_left -= len(text)
            for doc in _docstrings(text):
                if natural_left <= docstring_floor:
                    break
                out["natural"][split].append(doc)
                natural_left -= len(doc)
        for path in docs:
            if natural_left <= 0:
                break
            if _held_out(path.parent.name + "/" + path.name) != want_heldout:
                continue
            text = _read(path)
            if text and path.name == "METADATA":
                text = text.partition("\n\n")[2]  # the long description, after the header block
            if not text or len(text) < 400:
                continue
            out["natural"][split].append(text)
            natural_left -= len(text)
    return out


# -- prompts the project writes ------------------------------------------------------------------

_TOPICS = [
    "photosynthesis",
    "the water cycle",
    "compound interest",
    "binary search",
    "recursion",
    "the French Revolution",
    "black holes",
    "vaccines",
    "climate change",
    "the stock market",
    "machine learning",
    "electric cars",
    "the human heart",
    "volcanoes",
    "the Roman Empire",
    "renewable energy",
    "time management",
    "healthy sleep",
    "public speaking",
    "learning a new language",
    "the internet",
    "encryption",
    "gardening",
    "baking bread",
    "the solar system",
    "supply and demand",
    "democracy",
    "the immune system",
    "plate tectonics",
    "music theory",
    "prime numbers",
    "probability",
    "sorting algorithms",
    "hash tables",
    "databases",
    "version control with git",
    "unit testing",
    "regular expressions",
    "operating systems",
    "computer networks",
    "the Renaissance",
    "ocean currents",
    "bees and pollination",
    "the periodic table",
    "Newton's laws",
    "electricity",
    "friendship",
    "job interviews",
    "budgeting",
    "remote work",
    "coffee",
    "chess",
    "marathon training",
    "meditation",
]
_TASKS = [
    "reverses a string",
    "checks whether a number is prime",
    "merges two sorted lists",
    "counts word frequencies",
    "reads a CSV file and sums a column",
    "computes the Fibonacci sequence",
    "removes duplicates from a list",
    "finds the largest element of a list",
    "converts Celsius to Fahrenheit",
    "validates an email address",
    "flattens a nested list",
    "computes a factorial",
    "parses a date string",
    "implements a stack",
    "sorts a dictionary by value",
    "checks whether a string is a palindrome",
    "computes the median of numbers",
    "downloads nothing but formats a table of numbers",
    "splits a text into sentences",
    "counts vowels in a string",
]
_CHAT_TEMPLATES = [
    "Explain {topic} in simple terms.",
    "Write a short paragraph about {topic}.",
    "What are three facts about {topic}?",
    "Give me a brief introduction to {topic}.",
    "Why is {topic} important?",
    "Write a short poem about {topic}.",
    "Summarize the main ideas of {topic} in a few sentences.",
    "How would you teach {topic} to a child?",
    "List the pros and cons of {topic}.",
    "Write a short story that involves {topic}.",
    "What are common misconceptions about {topic}?",
    "Write a tweet about {topic}.",
    "Write an engaging blog post about {topic}.",
    "Imagine you are a teacher. Answer a student's question about {topic}.",
    "Pretend to be a tour guide and describe {topic}.",
    "Compare {topic} and {other}: how are they alike and how do they differ?",
    "Write a persuasive essay arguing that {topic} matters.",
    "What questions would an expert ask about {topic}? Answer two of them.",
    "Describe the history of {topic} in chronological order.",
    "Give step-by-step advice for someone who wants to learn about {topic}.",
    "Write a dialogue between two friends discussing {topic}.",
    "Write a formal email to a colleague about {topic}.",
    "What would happen if {topic} did not exist? Reason it through.",
    "Create a short quiz with answers about {topic}.",
    "Write a news report about a recent event involving {topic}.",
    "Write a magazine article about {topic} for a general audience.",
]
_MATH_TEMPLATES = [
    "What is {a} multiplied by {b}? Explain your steps.",
    "A shop sells {a} apples a day for {b} days. How many apples does it sell? Show the reasoning.",
    "Solve for x: {a}x + {b} = {c}.",
    "A train travels {a} km in {b} hours. What is its average speed?",
    "If a rectangle is {a} cm long and {b} cm wide, what are its area and perimeter?",
    "Is {c} a prime number? Explain how you can tell.",
]
_TEXT_TEMPLATES = [
    "Summarize the following text:\n\n{doc}",
    "Extract the three most important points from this text:\n\n{doc}",
    "Based on the passage below, what is its main purpose?\n\n{doc}",
    "Translate the following sentence into French: {sentence}",
    "Translate the following sentence into German: {sentence}",
    "Rewrite this sentence in simpler words: {sentence}",
]
_CODE_TEMPLATES = [
    "Write a Python function that {task}.",
    "Show me how to write code that {task} in Python.",
    "Write a Python function that {task}, with a docstring and an example.",
]
_API_TEMPLATES = [
    "What does {name} do in Python?",
    "Explain this Python documentation in plain words:\n\n{doc}",
    "Summarize the following text:\n\n{doc}",
    "Write a short example that uses {name}.",
    "When would I use {name}? Answer briefly.",
]


def chat_prompts(n: int, stdlib_docs: Sequence[tuple[str, str]], seed: int = 0, texts: Sequence[str] = ()) -> list[str]:
    """Up to ``n`` distinct chat prompts from templates over topics, coding tasks, arithmetic,
    documented standard-library names (``(name, docstring)`` pairs) and passages of ``texts``
    (summaries, key points, translation and rewording of their sentences)."""
    rng = random.Random(seed)
    pool = [t.format(topic=x, other=rng.choice(_TOPICS)) for t in _CHAT_TEMPLATES for x in _TOPICS]
    pool += [t.format(task=x) for t in _CODE_TEMPLATES for x in _TASKS]
    for t in _MATH_TEMPLATES:
        for _ in range(40):
            a, b = rng.randint(2, 99), rng.randint(2, 60)
            pool.append(t.format(a=a, b=b, c=rng.randint(a + b, 999)))
    for name, doc in stdlib_docs:
        pool += [t.format(name=name, doc=doc[:600]) for t in rng.sample(_API_TEMPLATES, 2)]
    for text in texts:
        passage = text[:800].strip()
        sentences = [x.strip() for x in re.split(r"(?<=[.!?])\s+", passage) if 40 <= len(x.strip()) <= 200]
        template = rng.choice(_TEXT_TEMPLATES)
        if "{sentence}" in template:
            if sentences:
                pool.append(template.format(sentence=rng.choice(sentences)))
        elif len(passage) > 200:
            pool.append(template.format(doc=passage))
    pool = list(dict.fromkeys(pool))
    rng.shuffle(pool)
    return pool[:n]


def stdlib_module_docs(heldout: bool) -> list[tuple[str, str]]:
    """(qualified name, docstring) of documented standard-library modules, classes and functions
    (top-level modules on one side of the held-out split)."""
    out = []
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(root.glob("*.py")):
        if _held_out(path.name) != heldout or path.stem.startswith("_"):
            continue
        text = _read(path)
        if not text:
            continue
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            continue
        nodes: list[tuple[str, ast.AST]] = [(path.stem, tree)]
        for node in tree.body:
            if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and not node.name.startswith("_"):
                nodes.append((f"{path.stem}.{node.name}", node))
                if isinstance(node, ast.ClassDef):
                    nodes += [
                        (f"{path.stem}.{node.name}.{m.name}", m)
                        for m in node.body
                        if isinstance(m, ast.FunctionDef) and not m.name.startswith("_")
                    ]
        for name, node in nodes:
            doc = ast.get_docstring(node)
            if doc and len(doc) > 60:
                out.append((name, doc))
    return out


# -- tokens ------------------------------------------------------------------------------------


def encode_batch(tokenizer: Any, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of many texts (the Rust tokenizer's parallel batch encoding when available)."""
    if not texts:
        return []
    hf = getattr(tokenizer, "_tokenizer", tokenizer)
    backend = getattr(hf, "backend_tokenizer", None)
    if backend is not None:
        return [e.ids for e in backend.encode_batch(list(texts), add_special_tokens=False)]
    return [list(tokenizer.encode(t)) for t in texts]


def eos_id(tokenizer: Any) -> int:
    ids = list(getattr(tokenizer, "eos_token_ids", None) or [])
    return int(ids[0]) if ids else int(tokenizer.eos_token_id)


def stream(docs: Sequence[Sequence[int]], eos: int) -> np.ndarray:
    """Documents joined into one token stream, each followed by EOS."""
    parts = [np.append(np.asarray(d, dtype=np.int32), np.int32(eos)) for d in docs]
    return np.concatenate(parts) if parts else np.zeros((0,), dtype=np.int32)


def batched_greedy(
    model: nn.Module,
    tokenizer: Any,
    prompts: Sequence[Sequence[int]],
    max_tokens: int,
    batch: int,
    deadline: float | None = None,
    stop_at_eos: bool = True,
) -> list[list[int]]:
    """Prompt + the model's greedy continuation for each prompt, in chunks of ``batch`` prompts
    until ``deadline`` (a ``time.perf_counter()`` value).

    Training data wants thousands of continuations, so this runs mlx-lm's batched generation
    (hundreds of sequences per forward pass) rather than ``specbench.core.engine.plain_generation``, which
    decodes one sequence at a time.
    """
    stop = [[t] for t in (getattr(tokenizer, "eos_token_ids", None) or [eos_id(tokenizer)])] if stop_at_eos else None
    out: list[list[int]] = []
    for start in range(0, len(prompts), batch):
        if deadline is not None and time.perf_counter() > deadline and out:
            break
        chunk = [list(p) for p in prompts[start : start + batch]]
        gen = BatchGenerator(model, stop_tokens=stop, completion_batch_size=batch, prefill_batch_size=min(batch, 64))
        uids = gen.insert(chunk, [max_tokens] * len(chunk))
        results: dict[int, list[int]] = {uid: [] for uid in uids}
        while responses := gen.next_generated():
            for r in responses:
                if r.finish_reason != "stop":
                    results[r.uid].append(int(r.token))
        gen.close()
        out += [p + results[uid] for p, uid in zip(chunk, uids)]
    return out


class WindowSampler:
    """Random windows of ``length`` tokens from token streams, mixed with fixed weights."""

    def __init__(self, streams: dict[str, np.ndarray], weights: dict[str, float], length: int, seed: int = 0):
        self.streams = {k: v for k, v in streams.items() if len(v) > length + 1 and weights.get(k, 0) > 0}
        if not self.streams:
            raise ValueError(f"no training data: every token stream is shorter than one window of {length + 1} tokens")
        names = list(self.streams)
        w = np.array([weights[k] for k in names], dtype=np.float64)
        self.names, self.p = names, w / w.sum()
        self.length = length
        self.rng = np.random.default_rng(seed)

    def batch(self, size: int) -> np.ndarray:
        picks = self.rng.choice(len(self.names), size=size, p=self.p)
        rows = []
        for i in picks:
            s = self.streams[self.names[i]]
            start = int(self.rng.integers(0, len(s) - self.length - 1))
            rows.append(s[start : start + self.length + 1])
        return np.stack(rows)


def windows(s: np.ndarray, length: int, count: int) -> np.ndarray:
    """Up to ``count`` evenly spread windows of ``length`` + 1 tokens of stream ``s``."""
    if len(s) <= length + 1:
        return np.zeros((0, length + 1), dtype=np.int32)
    starts = np.linspace(0, len(s) - length - 2, num=min(count, max(1, (len(s) - 1) // length))).astype(int)
    return np.stack([s[a : a + length + 1] for a in starts])
