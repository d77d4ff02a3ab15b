"""Self-speculative early exit (LayerSkip, Draft & Verify): the target's first L layers, its final
norm and its output head draft; no weights of their own.

The drafter shares the target's weights (the same modules, not copies) but keeps its own KV cache
for those L layers: the engine's target owns its cache and rolls it back itself, and the drafter
is never handed it, so the first L layers' keys and values are computed twice (once while
drafting, once in the verify pass). The drafter's cache follows the target's through
``DraftModel``'s rollback. ``sweep_exit_layers`` (``scripts/gpu/drafter_eval.py``) measures acceptance per L on
given prompts and ``best_exit_layer`` picks L.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import make_prompt_cache

from specbench.core.accept import SamplingSettings
from specbench.core.forward import logits_from_hidden, text_model
from specbench.core.options import GenerateOptions
from specbench.drafters.draft_model import DraftModel
from specbench.drafters.registry import DrafterInputs, register_drafter
from specbench.models.mtp.head import model_type
from specbench.models.synthetic import parameter_bytes

#: Families whose body is embed -> decoder layers (one causal mask) -> final norm, as this drafter runs it.
EARLY_EXIT_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "mixtral")


def exit_layer_count(model: nn.Module) -> int:
    """The number of decoder layers of ``model`` (the largest exit is one less)."""
    return len(text_model(model).model.layers)


class EarlyExit(DraftModel):
    """Drafts with the first ``layers`` decoder layers of ``model`` (the target) and its output head."""

    name = "early-exit"

    def __init__(
        self,
        model: nn.Module,
        layers: int,
        *,
        sampling: SamplingSettings | GenerateOptions | None = None,
        preferred_k: int = 3,
    ):
        family = model_type(model)
        if family not in EARLY_EXIT_FAMILIES:
            raise ValueError(
                f"early exit supports {', '.join(EARLY_EXIT_FAMILIES)} models, not {family or type(model).__name__}"
            )
        total = exit_layer_count(model)
        if not isinstance(layers, int) or isinstance(layers, bool) or not 1 <= layers < total:
            raise ValueError(f"early exit needs 1 <= layers < {total} (the model's depth), got {layers!r}")
        if any(getattr(layer, "use_sliding", False) for layer in text_model(model).model.layers[:layers]):
            raise ValueError("early exit does not support sliding-window layers among the first layers")
        self.layers = layers
        self.name = f"early-exit:{layers}"
        super().__init__(model, target=model, sampling=sampling, preferred_k=preferred_k)

    def _new_cache(self) -> list[Any]:
        return make_prompt_cache(self.model)[: self.layers]

    def _logits(self, inputs: mx.array, cache: list[Any]) -> mx.array:
        body = text_model(self.model).model
        h = body.embed_tokens(inputs)
        mask = create_attention_mask(h, cache[0])
        for layer, c in zip(body.layers[: self.layers], cache):
            h = layer(h, mask, c)
        return logits_from_hidden(self.model, body.norm(h))

    def _draft_bytes(self) -> int:
        """What drafting reads: the first L layers, the final norm and the output head."""
        lm = text_model(self.model)
        head = getattr(lm, "lm_head", None) or lm.model.embed_tokens
        return sum(parameter_bytes(layer) for layer in lm.model.layers[: self.layers]) + parameter_bytes(head)


@register_drafter(
    "early-exit",
    "the target's first layers and its head (self-speculation)",
    needs=("model",),
    parameter="L: exit after L layers (default: half of them)",
)
def _early_exit(inputs: DrafterInputs) -> EarlyExit:
    return EarlyExit(inputs.model, inputs.value or max(1, exit_layer_count(inputs.model) // 2))
