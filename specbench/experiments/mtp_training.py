"""Training an MTP head for a frozen model by self-distillation.

The head (one decoder layer of the model's own architecture, ``fc`` and norms, sharing the
model's embeddings and lm_head) reads pairs (hidden state at i, token i+1) and learns the model's
own distribution at position i+1, i.e. its next-next token: the soft cross-entropy to the frozen
model's softmax there. Everything is available offline:

- code: the Python standard library's source;
- natural text: the standard library's docstrings and the text files installed packages ship
  (package descriptions, READMEs);
- the model's own greedy generations: answers to chat prompts the project writes (templates over
  standard-library topics) and continuations of code and text snippets. These match what the
  head sees while drafting, where token i+1 is the model's own output.

A slice of every source (chosen by file) is held out for evaluation, together with the
project's bundled prompts, which training never sees.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import json
import math
import random
import re
import sys
import sysconfig
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten, tree_map

from specbench.core.forward import logits_from_hidden, text_model
from specbench.models.mtp.attach import save_head
from specbench.models.mtp.head import MtpHead, body_layers, build_head, model_type

HELDOUT_EVERY = 20  # one source file in 20 is held out


@dataclass
class TrainConfig:
    """Recipe of a training run (defaults: the GPU run; ``TrainConfig.quick()``: a CPU smoke run)."""

    steps: int = 4000
    time_budget_s: float | None = None  # training stops at this many seconds (the schedule follows time)
    batch_size: int = 32
    seq_len: int = 256
    learning_rate: float = 1e-3
    min_learning_rate: float = 5e-5
    warmup_steps: int = 100
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    text_chars: int = 12_000_000  # natural text + code read from the installed Python
    chat_prompts: int = 4096  # chat prompts answered by the model (greedy)
    chat_tokens: int = 192
    continuation_prompts: int = 2048  # code / text snippets continued by the model (greedy)
    continuation_prompt_tokens: int = 48
    continuation_tokens: int = 128
    generation_batch: int = 512
    generation_budget_s: float | None = None  # self-generation stops after this many seconds
    mix: dict[str, float] = field(default_factory=lambda: {"generated": 0.5, "code": 0.25, "natural": 0.25})
    eval_windows: int = 64  # held-out windows per source for the teacher-forced evaluation
    eval_prompts: int = 24  # held-out prompts per set for the decoding evaluation
    eval_tokens: int = 96
    eval_k: int = 3
    init: str = "last_layer"  # see init_head
    save_dtype: str = "bfloat16"
    seed: int = 0

    @classmethod
    def quick(cls) -> "TrainConfig":
        return cls(
            steps=30, batch_size=4, seq_len=64, warmup_steps=5, text_chars=200_000, chat_prompts=8,
            chat_tokens=24, continuation_prompts=8, continuation_prompt_tokens=16, continuation_tokens=24,
            generation_batch=8, eval_windows=4, eval_prompts=2, eval_tokens=16,
        )


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
    out = []
    for m in _DOCSTRING.finditer(source):
        text = inspect.cleandoc(m.group(1))
        if not _CODE_LINE.search(text):
            out.append(text)
    return out


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
            files |= {p for p in root.glob(pattern) if "licen" not in p.name.lower() and "copying" not in p.name.lower()}
    return sorted(files)


def _metadata_body(text: str) -> str:
    """The long description of a METADATA file (after its header block)."""
    _, _, body = text.partition("\n\n")
    return body


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
                text = _metadata_body(text)
            if not text or len(text) < 400:
                continue
            out["natural"][split].append(text)
            natural_left -= len(text)
    return out


# -- prompts the project writes ------------------------------------------------------------------

_TOPICS = [
    "photosynthesis", "the water cycle", "compound interest", "binary search", "recursion", "the French Revolution",
    "black holes", "vaccines", "climate change", "the stock market", "machine learning", "electric cars",
    "the human heart", "volcanoes", "the Roman Empire", "renewable energy", "time management", "healthy sleep",
    "public speaking", "learning a new language", "the internet", "encryption", "gardening", "baking bread",
    "the solar system", "supply and demand", "democracy", "the immune system", "plate tectonics", "music theory",
    "prime numbers", "probability", "sorting algorithms", "hash tables", "databases", "version control with git",
    "unit testing", "regular expressions", "operating systems", "computer networks", "the Renaissance",
    "ocean currents", "bees and pollination", "the periodic table", "Newton's laws", "electricity", "friendship",
    "job interviews", "budgeting", "remote work", "coffee", "chess", "marathon training", "meditation",
]
_TASKS = [
    "reverses a string", "checks whether a number is prime", "merges two sorted lists", "counts word frequencies",
    "reads a CSV file and sums a column", "computes the Fibonacci sequence", "removes duplicates from a list",
    "finds the largest element of a list", "converts Celsius to Fahrenheit", "validates an email address",
    "flattens a nested list", "computes a factorial", "parses a date string", "implements a stack",
    "sorts a dictionary by value", "checks whether a string is a palindrome", "computes the median of numbers",
    "downloads nothing but formats a table of numbers", "splits a text into sentences", "counts vowels in a string",
]
_CHAT_TEMPLATES = [
    "Explain {topic} in simple terms.", "Write a short paragraph about {topic}.", "What are three facts about {topic}?",
    "Give me a brief introduction to {topic}.", "Why is {topic} important?", "Write a short poem about {topic}.",
    "Summarize the main ideas of {topic} in a few sentences.", "How would you teach {topic} to a child?",
    "List the pros and cons of {topic}.", "Write a short story that involves {topic}.",
    "What are common misconceptions about {topic}?", "Write a tweet about {topic}.",
]
_CODE_TEMPLATES = [
    "Write a Python function that {task}.", "Show me how to write code that {task} in Python.",
    "Write a Python function that {task}, with a docstring and an example.",
]
_API_TEMPLATES = [
    "What does {name} do in Python?", "Explain this Python documentation in plain words:\n\n{doc}",
    "Summarize the following text:\n\n{doc}", "Write a short example that uses {name}.",
    "When would I use {name}? Answer briefly.",
]


def chat_prompts(n: int, stdlib_docs: Sequence[tuple[str, str]], seed: int = 0) -> list[str]:
    """Up to ``n`` distinct chat prompts from templates over topics, coding tasks and documented
    standard-library names (``(name, docstring)`` pairs)."""
    rng = random.Random(seed)
    pool = [t.format(topic=x) for t in _CHAT_TEMPLATES for x in _TOPICS]
    pool += [t.format(task=x) for t in _CODE_TEMPLATES for x in _TASKS]
    for name, doc in stdlib_docs:
        pool += [t.format(name=name, doc=doc[:600]) for t in rng.sample(_API_TEMPLATES, 2)]
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
                    nodes += [(f"{path.stem}.{node.name}.{m.name}", m) for m in node.body
                              if isinstance(m, ast.FunctionDef) and not m.name.startswith("_")]
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
    parts = []
    for d in docs:
        parts.append(np.asarray(d, dtype=np.int32))
        parts.append(np.asarray([eos], dtype=np.int32))
    return np.concatenate(parts) if parts else np.zeros((0,), dtype=np.int32)


def generate_greedy(
    model: nn.Module, tokenizer: Any, prompts: Sequence[Sequence[int]], max_tokens: int, batch: int,
    deadline: float | None = None, stop_at_eos: bool = True,
) -> list[list[int]]:
    """Prompt + the model's greedy continuation for each prompt (mlx-lm's batched generation),
    in chunks of ``batch`` prompts until ``deadline`` (a ``time.perf_counter()`` value)."""
    from mlx_lm.generate import BatchGenerator

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


# -- the loss ----------------------------------------------------------------------------------


def teacher(model: nn.Module, tokens: mx.array) -> tuple[mx.array, mx.array]:
    """The frozen model over ``tokens`` [B, L]: hidden states [B, L, H] and log-probs [B, L, V]."""
    hidden = text_model(model).model(tokens)
    logits = logits_from_hidden(model, hidden).astype(mx.float32)
    return hidden, logits - mx.logsumexp(logits, axis=-1, keepdims=True)


def head_logits(model: nn.Module, head: MtpHead, tokens: mx.array, hidden: mx.array) -> mx.array:
    """Head predictions for pairs (hidden at i, token i+1), i = 0 .. L-2: logits [B, L-1, V]."""
    lm = text_model(model)
    dtype = head.norm.weight.dtype
    embeds = lm.model.embed_tokens(tokens[:, 1:])
    _, out = head(embeds.astype(dtype), hidden[:, :-1].astype(dtype))
    # The output head runs in the model's own dtype (the head may train in float32).
    return logits_from_hidden(model, out.astype(lm.model.norm.weight.dtype)).astype(mx.float32)


def distill_loss(
    model: nn.Module, head: MtpHead, tokens: mx.array, hidden: mx.array, target_logprobs: mx.array
) -> tuple[mx.array, mx.array]:
    """Soft cross-entropy to the model's distribution at i+1, and the argmax agreement rate."""
    logits = head_logits(model, head, tokens, hidden)
    logq = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    target = target_logprobs[:, 1:]
    loss = -(mx.exp(target) * logq).sum(axis=-1).mean()
    agree = (mx.argmax(logits, axis=-1) == mx.argmax(target, axis=-1)).astype(mx.float32).mean()
    return loss, agree


def evaluate_windows(model: nn.Module, head: MtpHead, batches: np.ndarray, batch_size: int = 16) -> dict[str, float]:
    """Held-out loss and first-draft acceptance (head argmax == model's greedy next-next token),
    teacher-forced over windows of text."""
    if len(batches) == 0:
        return {}
    losses, agrees, greedy_agree, greedy_n = [], [], 0.0, 0.0
    for i in range(0, len(batches), batch_size):
        tokens = mx.array(batches[i : i + batch_size])
        hidden, logprobs = teacher(model, tokens)
        logits = head_logits(model, head, tokens, hidden)
        target = logprobs[:, 1:]
        logq = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        hit = mx.argmax(logits, axis=-1) == mx.argmax(target, axis=-1)
        # Positions where token i+1 is the model's own greedy choice: what drafting sees.
        greedy_next = mx.argmax(logprobs[:, :-1], axis=-1) == tokens[:, 1:]
        losses.append(float((-(mx.exp(target) * logq).sum(axis=-1).mean()).item()))
        agrees.append(float(hit.astype(mx.float32).mean().item()))
        greedy_agree += float((hit & greedy_next).sum().item())
        greedy_n += float(greedy_next.sum().item())
    return {
        "loss": float(np.mean(losses)),
        "acceptance": float(np.mean(agrees)),
        "acceptance_after_greedy_token": greedy_agree / greedy_n if greedy_n else float("nan"),
        "windows": int(len(batches)),
    }


def evaluate_decoding(
    model: nn.Module, prompts: Sequence[Sequence[int]], max_tokens: int, k: int, verify: str = "fast",
    head: MtpHead | None = None,
) -> dict[str, Any]:
    """Speculative greedy decoding with the head: first-draft acceptance and acceptance length."""
    from specbench.drafters.mtp import MtpDrafter
    from specbench.core.engine import GenerateOptions, speculative_generate
    from specbench.core.policies import DraftPolicy

    verifies, first, accepted, per_position = 0, 0, 0, np.zeros(k)
    drafted_at = np.zeros(k)
    tokens = 0
    t0 = time.perf_counter()
    for prompt in prompts:
        drafter = MtpDrafter(model, head=head)
        gen = speculative_generate(
            model, list(prompt), GenerateOptions(max_tokens=max_tokens, verify=verify, ignore_eos=False), drafter,
            DraftPolicy.fixed(k),
        )
        for _ in gen:
            pass
        tokens += len(gen.tokens)
        for r in gen.log:
            if r["kind"] != "verify" or r["k_drafted"] == 0:
                continue
            verifies += 1
            first += int(r["accepted"] >= 1)
            accepted += r["accepted"]
            drafted_at[: r["k_drafted"]] += 1
            per_position[: r["accepted"]] += 1
    return {
        "prompts": len(prompts),
        "tokens": tokens,
        "verifies": verifies,
        "first_draft_acceptance": first / verifies if verifies else float("nan"),
        "mean_accepted": accepted / verifies if verifies else float("nan"),
        "tokens_per_verify": (accepted + verifies) / verifies if verifies else float("nan"),
        "per_position_acceptance": [float(a / d) if d else float("nan") for a, d in zip(per_position, drafted_at)],
        "seconds": round(time.perf_counter() - t0, 2),
    }


# -- training ----------------------------------------------------------------------------------


def init_head(model: nn.Module, how: str = "last_layer", seed: int = 0) -> MtpHead:
    """A fresh head to train.

    ``last_layer`` (the default, which learned fastest in a comparison on the embedded model):
    the decoder layer starts as a copy of the body's last layer, ``fc`` passes the hidden half
    through, and ``norm`` starts as the model's final norm. ``random``: as built.
    """
    mx.random.seed(seed)
    head = build_head(model)
    if how == "last_layer":
        last = body_layers(model)[-1]
        if any(k.endswith(".scales") for k, _ in tree_flatten(last.parameters())):
            raise ValueError("initialising from the last layer needs a float model (this one is quantized)")
        head.layers[0].update(tree_map(lambda v: mx.array(v), last.parameters()))
        hidden = head.fc.weight.shape[0]
        fc = head.fc.weight
        head.fc.weight = mx.concatenate([fc[:, :hidden] * 0.5, mx.eye(hidden, dtype=fc.dtype)], axis=1)
        head.norm.weight = mx.array(text_model(model).model.norm.weight).astype(head.norm.weight.dtype)
    elif how != "random":
        raise ValueError(f"init must be 'last_layer' or 'random', got {how!r}")
    return head


def _dtype(name: str | None) -> mx.Dtype:
    if name is None:
        return mx.float32 if mx.default_device().type == mx.DeviceType.cpu else mx.bfloat16
    table = {"float32": mx.float32, "bfloat16": mx.bfloat16, "float16": mx.float16}
    if name not in table:
        raise ValueError(f"dtype must be one of {', '.join(table)}, got {name!r}")
    return table[name]


def _cast(module: nn.Module, dtype: mx.Dtype) -> None:
    module.update(tree_map(lambda v: v.astype(dtype) if mx.issubdtype(v.dtype, mx.floating) else v, module.parameters()))


def train_head(
    model: nn.Module,
    sampler: WindowSampler,
    config: TrainConfig,
    log: Callable[[str], None] = print,
) -> tuple[MtpHead, dict[str, Any]]:
    """Train a head on windows from ``sampler``; returns the head (float32) and a training record.

    The head's weights and optimizer state stay in float32; the frozen model runs in its own dtype.
    """
    head = init_head(model, config.init, config.seed)
    _cast(head, mx.float32)
    head.train()
    optimizer = optim.AdamW(learning_rate=config.learning_rate, weight_decay=config.weight_decay)
    loss_and_grad = nn.value_and_grad(head, lambda tokens, hidden, target: distill_loss(model, head, tokens, hidden, target))

    def update(tokens: mx.array, hidden: mx.array, target: mx.array) -> tuple[mx.array, mx.array]:
        (loss, agree), grads = loss_and_grad(tokens, hidden, target)
        if config.grad_clip:
            grads, _ = optim.clip_grad_norm(grads, config.grad_clip)
        optimizer.update(head, grads)
        return loss, agree

    def lr_at(progress: float, step: int) -> float:
        if step < config.warmup_steps:
            return config.learning_rate * (step + 1) / config.warmup_steps
        cos = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
        return config.min_learning_rate + (config.learning_rate - config.min_learning_rate) * cos

    history = []
    start = time.perf_counter()
    step = 0
    first_step_s = None
    while step < config.steps:
        elapsed = time.perf_counter() - start
        progress = step / config.steps
        if config.time_budget_s:
            if elapsed >= config.time_budget_s:
                break
            progress = max(progress, elapsed / config.time_budget_s)
        optimizer.learning_rate = lr_at(progress, step)
        tokens = mx.array(sampler.batch(config.batch_size))
        hidden, target = teacher(model, tokens)
        hidden, target = mx.stop_gradient(hidden), mx.stop_gradient(target)
        loss, agree = update(tokens, hidden, target)
        mx.eval(head.parameters(), optimizer.state, loss, agree)
        step += 1
        if first_step_s is None:
            first_step_s = time.perf_counter() - start
        if step % max(1, min(100, config.steps // 30)) == 0 or step <= 3 or step == config.steps:
            row = {"step": step, "seconds": round(time.perf_counter() - start, 2), "loss": float(loss.item()),
                   "acceptance": float(agree.item()), "lr": float(optimizer.learning_rate.item())
                   if isinstance(optimizer.learning_rate, mx.array) else float(optimizer.learning_rate)}
            history.append(row)
            log(f"step {step:5d}  {row['seconds']:7.1f}s  loss {row['loss']:.4f}  acceptance {row['acceptance']:.3f}")
    head.eval()
    seconds = time.perf_counter() - start
    record = {
        "steps": step, "seconds": round(seconds, 1), "first_step_s": round(first_step_s or 0.0, 2),
        "step_ms": round(1000 * (seconds - (first_step_s or 0)) / max(step - 1, 1), 2),
        "tokens_seen": step * config.batch_size * config.seq_len, "history": history,
    }
    return head, record


def build_data(
    model: nn.Module, tokenizer: Any, config: TrainConfig, log: Callable[[str], None] = print
) -> tuple[dict[str, np.ndarray], dict[str, Any], dict[str, Any]]:
    """Token streams for training and held-out sets for evaluation."""
    t0 = time.perf_counter()
    eos = eos_id(tokenizer)
    text = gather_text(config.text_chars, config.seed)
    streams: dict[str, np.ndarray] = {}
    heldout: dict[str, Any] = {}
    for kind in ("code", "natural"):
        streams[kind] = stream(encode_batch(tokenizer, text[kind]["train"]), eos)
        heldout[kind] = stream(encode_batch(tokenizer, text[kind]["heldout"]), eos)
    log(f"text: code {len(streams['code'])} tokens, natural {len(streams['natural'])} tokens "
        f"({time.perf_counter() - t0:.1f}s)")

    from specbench.experiments.prompts import render_prompt

    rng = random.Random(config.seed)
    train_docs = stdlib_module_docs(heldout=False)
    chats = [render_prompt(tokenizer, p) for p in chat_prompts(config.chat_prompts, train_docs, config.seed)]
    snippets = []
    for kind in ("code", "natural"):
        s = streams[kind]
        n = config.continuation_prompts // 2
        for _ in range(n):
            if len(s) <= config.continuation_prompt_tokens + 1:
                break
            a = rng.randrange(0, len(s) - config.continuation_prompt_tokens)
            snippets.append(s[a : a + config.continuation_prompt_tokens].tolist())
    t1 = time.perf_counter()
    budget = config.generation_budget_s
    # Chat answers may use 60% of the generation budget, continuations the rest.
    generated = generate_greedy(model, tokenizer, chats, config.chat_tokens, config.generation_batch,
                                t1 + 0.6 * budget if budget else None)
    generated += generate_greedy(model, tokenizer, snippets, config.continuation_tokens, config.generation_batch,
                                 t1 + budget if budget else None, stop_at_eos=False)
    streams["generated"] = stream(generated, eos)
    log(f"generated: {len(generated)} sequences, {len(streams['generated'])} tokens ({time.perf_counter() - t1:.1f}s)")

    # Held-out prompts: the project's bundled prompts (chat), and snippets of held-out code and text.
    from specbench.experiments.prompts import bundled_questions

    questions = bundled_questions()
    rng.shuffle(questions)
    heldout["chat_prompts"] = [render_prompt(tokenizer, q.turns[0]) for q in questions[: config.eval_prompts]]
    for kind in ("code", "natural"):
        s = heldout[kind]
        starts = np.linspace(0, max(len(s) - config.continuation_prompt_tokens - 1, 0), num=config.eval_prompts).astype(int)
        heldout[f"{kind}_prompts"] = [s[a : a + config.continuation_prompt_tokens].tolist() for a in starts if len(s) > a]
    heldout_chats = [render_prompt(tokenizer, p) for p in chat_prompts(config.eval_windows, stdlib_module_docs(True) or train_docs, config.seed + 1)]
    heldout["generated"] = stream(generate_greedy(model, tokenizer, heldout_chats, config.chat_tokens, config.generation_batch), eos)
    sizes = {k: int(len(v)) for k, v in streams.items()}
    sizes.update({f"heldout_{k}": int(len(heldout[k])) for k in ("code", "natural", "generated")})
    info = {"tokens": sizes, "generated_sequences": len(generated), "seconds": round(time.perf_counter() - t0, 1)}
    return streams, heldout, info


def evaluate(
    model: nn.Module, head: MtpHead, heldout: dict[str, Any], config: TrainConfig, decoding: bool = True,
    verify: str = "fast",
) -> dict[str, Any]:
    metrics: dict[str, Any] = {"teacher_forced": {}, "decoding": {}}
    for kind in ("natural", "code", "generated"):
        w = windows(heldout[kind], config.seq_len, config.eval_windows)
        metrics["teacher_forced"][kind] = evaluate_windows(model, head, w)
    if decoding:
        for kind in ("chat", "natural", "code"):
            prompts = heldout.get(f"{kind}_prompts") or []
            if prompts:
                metrics["decoding"][kind] = evaluate_decoding(model, prompts, config.eval_tokens, config.eval_k, verify, head)
    return metrics


def train_mtp(
    model: nn.Module,
    tokenizer: Any,
    out_dir: str | Path,
    config: TrainConfig | None = None,
    model_name: str | None = None,
    log: Callable[[str], None] = print,
    file_stem: str = "mtp",
    deadline: float | None = None,
    eval_reserve_s: float = 0.0,
) -> dict[str, Any]:
    """Build data, train a head for the frozen ``model``, evaluate it and write
    ``<out_dir>/<file_stem>.safetensors`` (the head) and ``<file_stem>.json`` (recipe and metrics).

    With a ``deadline`` (a ``time.perf_counter()`` value) training gets the time left before it,
    less ``eval_reserve_s`` for the evaluation.
    """
    config = config or TrainConfig()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    streams, heldout, data_info = build_data(model, tokenizer, config, log)
    sampler = WindowSampler(streams, config.mix, config.seq_len, config.seed)
    before = evaluate(model, init_head(model, config.init, config.seed), heldout, config, decoding=False)
    if deadline is not None:
        left = deadline - time.perf_counter() - eval_reserve_s
        config.time_budget_s = max(10.0, min(left, config.time_budget_s or left))
        log(f"training budget: {config.time_budget_s:.0f}s")
    head, record = train_head(model, sampler, config, log)
    _cast(head, _dtype(config.save_dtype))
    args = text_model(model).args
    model_config = {k: getattr(args, k) for k in ("model_type", "hidden_size", "num_hidden_layers", "vocab_size")}
    model_config["model_type"] = model_type(model)
    result = {
        "model": model_name or model_config["model_type"],
        "recipe": {**asdict(config), "objective": "soft cross-entropy to the frozen model's distribution at i+1",
                   "device": str(mx.default_device()), "mlx": mx.__version__},
        "data": data_info,
        "training": record,
        "metrics": {"teacher_forced_at_init": before["teacher_forced"]},
    }
    # The head is written before evaluation, so an evaluation failure loses no training.
    path = save_head(head, out_dir / f"{file_stem}.safetensors", model_config, {"model": str(model_name or "")})
    result["head"] = path.name
    result["head_parameters"] = int(sum(v.size for _, v in tree_flatten(head.parameters())))
    json_path = out_dir / f"{file_stem}.json"
    _write_json(json_path, result)
    try:
        result["metrics"].update(evaluate(model, head, heldout, config))
    except Exception as err:  # keep the trained head and report what failed
        result["metrics"]["error"] = f"{type(err).__name__}: {err}"
        log(f"evaluation failed: {result['metrics']['error']}")
    result["seconds_total"] = round(time.perf_counter() - t0, 1)
    _write_json(json_path, result)
    return result


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1, default=float))
    tmp.replace(path)


def summary_lines(result: dict[str, Any]) -> list[str]:
    """A compact table of a training result."""
    lines = [f"model {result['model']}: {result['training']['steps']} steps in {result['training']['seconds']}s "
             f"({result['training']['step_ms']} ms/step), {result['training']['tokens_seen']} tokens seen"]
    if "error" in result["metrics"]:
        lines.append(f"evaluation failed: {result['metrics']['error']}")
    lines.append(f"{'held-out set':24s} {'loss':>8s} {'accept':>8s} {'after-greedy':>12s} {'init accept':>11s}")
    for kind, m in result["metrics"].get("teacher_forced", {}).items():
        if m:
            init = result["metrics"].get("teacher_forced_at_init", {}).get(kind, {}).get("acceptance", float("nan"))
            lines.append(f"{'teacher-forced ' + kind:24s} {m['loss']:8.3f} {m['acceptance']:8.3f} "
                         f"{m['acceptance_after_greedy_token']:12.3f} {init:11.3f}")
    lines.append(f"{'decoding (greedy)':24s} {'first':>8s} {'mean acc':>8s} {'tok/verify':>12s} {'per position':>11s}")
    for kind, m in result["metrics"].get("decoding", {}).items():
        pos = " ".join(f"{p:.2f}" for p in m["per_position_acceptance"])
        lines.append(f"{'decode ' + kind:24s} {m['first_draft_acceptance']:8.3f} {m['mean_accepted']:8.3f} "
                     f"{m['tokens_per_verify']:12.3f} {pos}")
    return lines
