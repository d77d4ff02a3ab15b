"""The types at the public joints: what a prompt, a tokenizer, a prompt cache and the per-request arguments of
batched decoding may be."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import mlx.core as mx
from mlx_lm.tokenizer_utils import TokenizerWrapper

from specbench.core.draft import Drafter
from specbench.core.options import GenerateOptions
from specbench.core.policies import DraftPolicy

#: A prompt: text (with a tokenizer), token ids, or an mx.array of token ids.
Prompt = str | Sequence[int] | mx.array
#: mlx-lm's tokenizer, as ``specbench.load`` returns it.
Tokenizer = TokenizerWrapper
#: mlx-lm's prompt cache: one cache object per layer (``mlx_lm.models.cache.make_prompt_cache``).
PromptCache = list[Any]
#: A policy: the object, its text (``"auto"``, ``"fixed:4"``) or a draft length k (``DraftPolicy.fixed(k)``).
PolicySpec = DraftPolicy | str | int
#: Per request of a batch: one value for all, one per prompt, or a factory (request index -> value).
BatchOptions = GenerateOptions | Sequence[GenerateOptions] | None
BatchDrafters = Drafter | Sequence[Drafter | None] | Callable[[int], Drafter | None] | None
BatchPolicies = PolicySpec | Sequence[PolicySpec] | Callable[[int], PolicySpec] | None

__all__ = ["BatchDrafters", "BatchOptions", "BatchPolicies", "PolicySpec", "Prompt", "PromptCache", "Tokenizer"]
