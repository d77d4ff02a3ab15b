"""What specbench reads of an mlx-lm model: its language model, its output head (logits from the hidden states
drafters such as MTP heads read), its vocabulary size and its context length; and a prompt cache filled with a
context (``prefill``). The forward itself and the greedy choice are ``specbench.core.verify.forward`` and
``greedy``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import make_prompt_cache


def text_model(model: nn.Module) -> nn.Module:
    """The language model inside ``model`` (unwraps multimodal wrappers such as Qwen3.5's)."""
    return getattr(model, "language_model", model)


def logits_from_hidden(model: nn.Module, hidden: mx.array) -> mx.array:
    """Apply the model's output head (``lm_head`` or tied embeddings) to post-norm hidden states."""
    lm = text_model(model)
    head = getattr(lm, "lm_head", None)
    if head is not None:
        return head(hidden)
    return lm.model.embed_tokens.as_linear(hidden)


def vocab_size(model: nn.Module) -> int:
    """The size of the model's vocabulary (its config's, else its embedding's rows)."""
    lm = text_model(model)
    value = getattr(getattr(lm, "args", None), "vocab_size", None)
    return int(value) if value else int(lm.model.embed_tokens.weight.shape[0])


def context_length(model: nn.Module) -> int | None:
    """The model's context length (``max_position_embeddings``), or None when its config has none."""
    value = getattr(getattr(text_model(model), "args", None), "max_position_embeddings", None)
    return int(value) if value else None


def prefill(model: nn.Module, tokens: Sequence[int], chunk: int = 512) -> list[Any]:
    """A fresh prompt cache of ``model`` holding ``tokens``, ``chunk`` tokens a forward (on the 2-core CPU the embedded
    model's 2,047 tokens took 21 s in 512-token forwards against 39 s in one; one forward of 16k tokens ran an H100 out
    of memory with a Qwen3-8B shape)."""
    cache = make_prompt_cache(model)
    for i in range(0, len(tokens), chunk):
        model(mx.array(tokens[i : i + chunk])[None], cache=cache)
        mx.eval([c.state for c in cache])
    return cache
