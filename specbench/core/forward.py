"""What specbench reads of an mlx-lm model: its language model, its output head (logits from the hidden states
drafters such as MTP heads read), its vocabulary size and its context length. The forward itself and the greedy
choice are ``specbench.core.verify.forward`` and ``greedy``."""

from __future__ import annotations

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


def vocab_size(model: nn.Module) -> int:
    """The size of the model's vocabulary (its config's, else its embedding's rows)."""
    lm = text_model(model)
    value = getattr(getattr(lm, "args", None), "vocab_size", None)
    return int(value) if value else int(lm.model.embed_tokens.weight.shape[0])


def context_length(model: nn.Module) -> int | None:
    """The model's context length (``max_position_embeddings``), or None when its config has none."""
    value = getattr(getattr(text_model(model), "args", None), "max_position_embeddings", None)
    return int(value) if value else None
