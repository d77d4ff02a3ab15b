"""Model forward passes: logits, and the hidden states drafters such as MTP heads read."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn


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


def forward(
    model: nn.Module, inputs: mx.array, cache: list[Any], return_hidden: bool = False
) -> mx.array | tuple[mx.array, mx.array]:
    """Run ``inputs`` ([1, w] token ids) through the model, extending ``cache``.

    Returns logits [1, w, vocab], or ``(logits, hidden)`` with ``hidden`` the post-final-norm
    states [1, w, hidden] when ``return_hidden`` is set.
    """
    if not return_hidden:
        return model(inputs, cache=cache)
    lm = text_model(model)
    hidden = lm.model(inputs, cache=cache)
    return logits_from_hidden(model, hidden), hidden


def vocab_size(model: nn.Module) -> int:
    """The size of the model's vocabulary (its config's, else its embedding's rows)."""
    lm = text_model(model)
    value = getattr(getattr(lm, "args", None), "vocab_size", None)
    return int(value) if value else int(lm.model.embed_tokens.weight.shape[0])


def context_length(model: nn.Module) -> int | None:
    """The model's context length (``max_position_embeddings``), or None when its config has none."""
    value = getattr(getattr(text_model(model), "args", None), "max_position_embeddings", None)
    return int(value) if value else None


def greedy(logits: mx.array) -> mx.array:
    """Argmax of log-probabilities over the last axis, as mlx-lm's greedy sampler computes it."""
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    return mx.argmax(logprobs, axis=-1)
