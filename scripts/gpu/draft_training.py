"""Distilling a draft model for a frozen target, and the held-out split drafters are judged on.

The draft model (``draft_from_target``) has the target's architecture
with a few decoder layers, initialised as copies of target layers spread over the depth (optionally
with a narrower MLP: each layer keeps the channels of most weight), and the target's embeddings and
output head (frozen, not stored). It learns the target's next-token
distribution at every position (soft cross-entropy) on the same windows as the MTP head: the
target's own greedy outputs and offline text (``specbench.train.mtp_data``).

The held-out split (``heldout_split``) has three kinds, chosen by a rule fixed before any result:

- chat: first turns of Spec-Bench's question.jsonl (every ``len // n``-th question in file order,
  so every category is drawn), rendered with the chat template; without that file, the project's
  bundled prompts (the split's ``sources`` says which);
- natural: plain text, no template: the articles of Spec-Bench's summarization questions (the
  text after "Summarize: "), every ``len // n``-th in file order, cut to their first
  ``prompt_tokens`` tokens; without the file, held-out package documents;
- code: held-out standard-library files (``mtp_data``'s file hash rule, never trained on), in
  sorted order, ``prompt_tokens`` tokens from the first line starting with "def " or "class ".

Training data never reads Spec-Bench, and reads only the other side of the file hash rule.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_map

from specbench.core.forward import text_model
from specbench.drafters.draft_model import draft_skeleton
from specbench.inputs.prompts import bundled_questions, render_prompt
from specbench.models.load import cast_dtype
from specbench.models.synthetic import ready
from specbench.train.mtp_data import (
    _held_out,
    _read,
    encode_batch,
    package_text_files,
    stdlib_files,
)
from specbench.train.mtp_training import TrainConfig, fit, soft_cross_entropy

HELDOUT_KINDS = ("chat", "natural", "code")


def _mlp_channels(layer: nn.Module, keep: int) -> mx.array:
    """Indices of the ``keep`` MLP channels of a gated MLP (gate, up, down) carrying the most weight:
    the product of each channel's gate, up and down norms, in their original order."""
    mlp = getattr(layer, "mlp", None)
    if not all(hasattr(mlp, n) for n in ("gate_proj", "up_proj", "down_proj")):
        raise ValueError("narrowing a draft's MLP needs gated MLP layers (gate_proj, up_proj, down_proj)")
    if any(hasattr(getattr(mlp, n), "scales") for n in ("gate_proj", "up_proj", "down_proj")):
        raise ValueError("narrowing a draft's MLP needs a float target (this one is quantized)")
    weight = [mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight.T]
    score = mx.ones((weight[0].shape[0],))
    for w in weight:
        score = score * mx.linalg.norm(w.astype(mx.float32), axis=1)
    return mx.sort(mx.argsort(-score)[:keep])


def _narrowed(layer: nn.Module, keep: int | None) -> dict[str, Any]:
    """A copy of ``layer``'s parameters, its MLP cut to the ``keep`` channels of most weight (all when None)."""
    params = tree_map(mx.array, layer.parameters())
    if keep is None or keep >= layer.mlp.gate_proj.weight.shape[0]:
        return params
    channels = _mlp_channels(layer, keep)
    mlp = params["mlp"]
    mlp["gate_proj"]["weight"] = mlp["gate_proj"]["weight"][channels]
    mlp["up_proj"]["weight"] = mlp["up_proj"]["weight"][channels]
    mlp["down_proj"]["weight"] = mlp["down_proj"]["weight"][:, channels]
    return params


def draft_from_target(
    target: nn.Module, source_layers: Sequence[int], intermediate_size: int | None = None
) -> nn.Module:
    """A model of ``target``'s architecture with ``len(source_layers)`` decoder layers, copies of the
    target's layers at those indices, sharing the target's embeddings, final norm weights (copied)
    and output head (the same arrays: no extra memory). ``intermediate_size``: a narrower MLP, each
    layer keeping the channels of most weight (gated MLPs: gate, up, down)."""
    lm = text_model(target)
    total = len(lm.model.layers)
    bad = [i for i in source_layers if not 0 <= int(i) < total]
    if not source_layers or bad:
        raise ValueError(f"source layers must be indices in [0, {total}), got {list(source_layers)!r}")
    types = getattr(lm.args, "layer_types", None)
    if isinstance(types, list) and len({types[int(i)] for i in source_layers} | set(types[: len(source_layers)])) > 1:
        raise ValueError("a draft model's layers must all be of one type (this model mixes layer types)")
    draft = draft_skeleton(target, len(source_layers), intermediate_size)
    for layer, i in zip(draft.model.layers, source_layers):
        layer.update(_narrowed(lm.model.layers[int(i)], intermediate_size))
    return ready(draft)


def spread_layers(total: int, n: int) -> list[int]:
    """``n`` layer indices spread evenly over ``total`` layers, the first and last included."""
    if not 1 <= n <= total:
        raise ValueError(f"a draft needs 1 to {total} layers, got {n}")
    if n == 1:
        return [total - 1]
    return [round(i * (total - 1) / (n - 1)) for i in range(n)]


def train_draft(
    model: nn.Module,
    sampler: Any,
    config: TrainConfig,
    layers: int = 2,
    log: Callable[[str], None] = print,
    intermediate_size: int | None = None,
) -> tuple[nn.Module, dict[str, Any]]:
    """A ``layers``-layer draft model of ``model`` distilled on windows from ``sampler`` (float32;
    its embeddings and output head are frozen copies of the target's; ``intermediate_size``: a
    narrower MLP than the target's, initialised from each source layer's channels of most weight).
    Returns it and the record."""
    total = len(text_model(model).model.layers)
    source = spread_layers(total, layers)
    draft = draft_from_target(model, source, intermediate_size)
    lm = text_model(draft)
    lm.model.embed_tokens = nn.Embedding(*lm.model.embed_tokens.weight.shape)
    lm.model.embed_tokens.weight = mx.array(text_model(model).model.embed_tokens.weight)
    if getattr(lm, "lm_head", None) is not None:
        head = lm.lm_head
        lm.lm_head = nn.Linear(head.weight.shape[1], head.weight.shape[0], bias=False)
        lm.lm_head.weight = mx.array(head.weight)
        lm.lm_head.freeze()
    cast_dtype(draft, mx.float32)
    lm.model.embed_tokens.freeze()

    def loss(tokens: mx.array, hidden: mx.array, target: mx.array) -> tuple[mx.array, mx.array]:
        logits = draft(tokens[:, :-1]).astype(mx.float32)
        return soft_cross_entropy(logits, target[:, :-1])

    record = fit(model, draft, loss, sampler, config, log)
    record["source_layers"] = source
    record["intermediate_size"] = intermediate_size or int(text_model(model).args.intermediate_size)
    return draft, record


def _spread(items: Sequence[Any], n: int) -> list[Any]:
    step = max(1, len(items) // max(n, 1))
    return list(items[::step])[:n]


def _code_snippet(text: str) -> str | None:
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.startswith(("def ", "class ")):
            return "".join(lines[i:])
    return None


def heldout_split(tokenizer: Any, data_dir: str | Path | None, n: int = 8, prompt_tokens: int = 64) -> dict[str, Any]:
    """The held-out prompts of each kind (token ids) by the module's rule, and where they came from."""
    questions_file = Path(data_dir) / "spec-bench" / "question.jsonl" if data_dir is not None else None
    prompts: dict[str, list[list[int]]] = {}
    sources: dict[str, str] = {}
    if questions_file is not None and questions_file.is_file():
        rows = [json.loads(line) for line in questions_file.read_text(encoding="utf-8").splitlines() if line.strip()]
        prompts["chat"] = [render_prompt(tokenizer, q["turns"][0]) for q in _spread(rows, n)]
        sources["chat"] = f"{questions_file}: first turns, every {max(1, len(rows) // n)}-th question"
        articles = [q["turns"][0].removeprefix("Summarize: ") for q in rows if q.get("category") == "summarization"]
        texts = _spread(articles, n)
        sources["natural"] = f"{questions_file}: summarization articles, every {max(1, len(articles) // n)}-th"
    else:
        prompts["chat"] = [render_prompt(tokenizer, q.turns[0]) for q in _spread(bundled_questions(), n)]
        sources["chat"] = "the project's bundled prompts (no Spec-Bench file)"
        docs = [p for p in package_text_files() if _held_out(p.parent.name + "/" + p.name)]
        texts = [t for t in (_read(p) for p in docs) if t and len(t) > 400][:n]
        sources["natural"] = "held-out package documents (no Spec-Bench file)"
    prompts["natural"] = [ids[:prompt_tokens] for ids in encode_batch(tokenizer, texts)]
    code = []
    for path in stdlib_files():
        if len(code) >= n:
            break
        if not _held_out(path.name):
            continue
        snippet = _code_snippet(_read(path) or "")
        if snippet:
            code.append(snippet)
    prompts["code"] = [ids[:prompt_tokens] for ids in encode_batch(tokenizer, code)]
    sources["code"] = "held-out standard-library files (sha1(file name) % 20 == 0), from their first def/class"
    lengths = {k: float(np.mean([len(p) for p in v])) if v else 0.0 for k, v in prompts.items()}
    return {"prompts": prompts, "sources": sources, "mean_prompt_tokens": lengths}
