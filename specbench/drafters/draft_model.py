"""Draft-model speculation: a smaller model sharing the target's vocabulary drafts autoregressively.

The drafter keeps its own KV cache, trimmed after each verification to the longest prefix it shares with the
context (what the target kept); a draft feeds only the tokens the cache lacks and reads its k tokens once.

Sampling: the drafter cannot see the generation's options, so it is given the sampling settings
(``sampling=``: a ``SamplingSettings`` or the ``GenerateOptions`` of the run). With temperature 0
it drafts greedily (q one-hot, ``Draft.probs`` None); above 0 it samples each token from
q = ``sampling.probs(logits)`` (the target's own filters: temperature, top-p, min-p, top-k) and
returns q, so the lossless rule min(1, p/q) applies.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_map
from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache, trim_prompt_cache

from specbench.common.identity import token_map
from specbench.core.accept import SamplingSettings
from specbench.core.draft import Draft, Drafter
from specbench.core.forward import text_model, vocab_size
from specbench.core.options import GenerateOptions
from specbench.core.policy_args import MAX_DRAFT_LENGTH, whole
from specbench.core.verify import greedy
from specbench.drafters.registry import DrafterInputs, register_drafter
from specbench.models.embedded import shipped_draft_path
from specbench.models.synthetic import parameter_bytes, ready

#: Tokens fed to the draft model per forward when it catches up on a long context.
PREFILL_CHUNK = 512


class DraftModel(Drafter):
    """Drafts with ``model``, any mlx-lm model sharing the target's vocabulary.

    ``tokenizer``: the draft model's tokenizer, compared with the target's when both are known.
    ``target`` (and ``target_tokenizer``): the model it drafts for; given here, a vocabulary
    mismatch is an error at once and ``cost_per_token`` is the draft's share of the target's
    weight bytes (else it is known only once ``check_target`` is called). ``sampling``: see the
    module's docstring.
    """

    name = "draft-model"

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any = None,
        *,
        target: nn.Module | None = None,
        target_tokenizer: Any = None,
        sampling: SamplingSettings | GenerateOptions | None = None,
        preferred_k: int = 3,
    ):
        if not isinstance(model, nn.Module):
            raise TypeError(f"the draft model must be an mlx-lm model (nn.Module), got {type(model).__name__}")
        whole("preferred_k", preferred_k, 1, MAX_DRAFT_LENGTH)
        self.model = model
        self.tokenizer = tokenizer
        if sampling is None:
            sampling = SamplingSettings()  # greedy
        elif isinstance(sampling, GenerateOptions):
            sampling = sampling.sampling
        elif not isinstance(sampling, SamplingSettings):
            raise TypeError(f"sampling must be SamplingSettings, GenerateOptions or None (greedy), got {sampling!r}")
        self.sampling = sampling
        self.sampled_drafts = not self.sampling.greedy
        self.preferred_k = preferred_k
        self.vocab = vocab_size(self.model)
        if not can_trim_prompt_cache(self._new_cache()):
            raise ValueError(
                f"the draft model's cache cannot roll back ({type(self._new_cache()[0]).__name__}): use a draft model "
                "with plain attention caches"
            )
        #: Whether the target's vocabulary was checked (with ``target=``, or by speculative_generate before its work).
        self.target_checked = False
        if target is not None:
            self.check_target(target, target_tokenizer)
        self._reset([])

    # -- what a subclass changes ----------------------------------------------------------------
    def _new_cache(self) -> list[Any]:
        return make_prompt_cache(self.model)

    def _logits(self, inputs: mx.array, cache: list[Any]) -> mx.array:
        """Logits [1, w, vocab] of ``inputs`` [1, w], extending ``cache``."""
        return self.model(inputs, cache=cache)

    def _draft_bytes(self) -> int:
        return parameter_bytes(self.model)

    # -- the protocol ---------------------------------------------------------------------------
    def check_target(self, target: nn.Module, target_tokenizer: Any = None) -> None:
        """Check that ``target`` shares this drafter's vocabulary (output widths, and token-to-id maps when both
        tokenizers are known), one clear ValueError otherwise; set ``cost_per_token``."""
        if self.vocab != vocab_size(target):
            raise ValueError(
                f"vocabulary mismatch: the draft model predicts {self.vocab} token ids but the target "
                f"{vocab_size(target)}: a draft model must share the target's tokenizer and vocabulary (a smaller "
                "model of the same family)"
            )
        a, b = token_map(self.tokenizer), token_map(target_tokenizer)
        if a is not None and b is not None and a != b:
            differing = sorted(t for t in set(a) | set(b) if a.get(t) != b.get(t))
            raise ValueError(
                f"vocabulary mismatch: the draft model's tokenizer maps {len(differing)} tokens differently from the "
                f"target's (e.g. {differing[:3]!r}): a draft model must share the target's tokenizer"
            )
        self.cost_per_token = self._draft_bytes() / max(parameter_bytes(target), 1)
        self.target_checked = True

    def _reset(self, context: Sequence[int]) -> None:
        self.cache = self._new_cache()
        self.cached: list[int] = []  # tokens whose keys and values the cache holds
        self.context: list[int] = [int(t) for t in context]

    def begin(self, prompt: Sequence[int], hidden: mx.array | None = None) -> None:
        if outside := [int(t) for t in prompt if not 0 <= int(t) < self.vocab]:
            raise ValueError(
                f"vocabulary mismatch: prompt token ids {outside[:5]} are outside the draft model's vocabulary "
                f"[0, {self.vocab}): a draft model must share the target's tokenizer"
            )
        self._reset(prompt)
        if len(self.context) > 1:
            self._feed(self.context[:-1])

    def observe(self, tokens: Sequence[int], hidden: mx.array | None = None) -> None:
        self.context.extend(int(t) for t in tokens)
        self._roll_back(self.context)

    def end(self) -> None:
        self._reset([])

    def _roll_back(self, context: Sequence[int]) -> None:
        """Trim the cache to the longest prefix of ``context`` it holds (at most all but its last token)."""
        limit = min(len(self.cached), len(context) - 1)
        common = limit
        if self.cached[:limit] != list(context[:limit]):
            common = next(i for i in range(limit) if self.cached[i] != context[i])
        drop = len(self.cached) - common
        if drop > 0:
            trim_prompt_cache(self.cache, drop)
            del self.cached[common:]

    def _feed(self, tokens: Sequence[int]) -> mx.array:
        """Run ``tokens`` through the draft model (in chunks); the last position's logits [1, vocab]."""
        logits = None
        for start in range(0, len(tokens), PREFILL_CHUNK):
            chunk = mx.array([list(tokens[start : start + PREFILL_CHUNK])], dtype=mx.uint32)
            logits = self._logits(chunk, self.cache)[:, -1, :]
            if start + PREFILL_CHUNK < len(tokens):
                mx.eval([c.state for c in self.cache])
        self.cached.extend(int(t) for t in tokens)
        return logits

    def draft(self, context: Sequence[int], k: int) -> Draft:
        if k <= 0 or not context:
            return Draft([])
        if len(context) != len(self.context) or list(context) != self.context:
            self.context = [int(t) for t in context]  # a context the drafter did not follow: resynchronise
        self._roll_back(context)
        logits = self._feed(list(context[len(self.cached) :]))
        tokens: list[mx.array] = []
        probs: list[mx.array] = []
        confidence: list[mx.array] = []  # greedy: the probability of each drafted token
        for j in range(k):
            if self.sampling.greedy:
                scores = logits.astype(mx.float32)
                token = greedy(scores)
                confidence.append(mx.exp(scores.max() - mx.logsumexp(scores)))
            else:
                q = self.sampling.probs(logits)
                token = mx.random.categorical(mx.log(q))
                probs.append(q[0])
            tokens.append(token)
            if j + 1 < k:
                logits = self._logits(token.reshape(1, 1).astype(mx.uint32), self.cache)[:, -1, :]
            mx.async_eval(token)
        mx.eval(tokens, probs, confidence)
        drafted = [int(t.item()) for t in tokens]
        self.cached.extend(drafted[:-1])
        return Draft(drafted, mx.stack(probs) if probs else None, confidence=[c.item() for c in confidence] or None)


# -- draft models built from the target: its embeddings, norm and output head, fewer layers -----------


def draft_skeleton(target: nn.Module, layers: int, intermediate_size: int | None = None) -> nn.Module:
    """A model of ``target``'s architecture with ``layers`` decoder layers (MLP width ``intermediate_size``,
    default the target's), sharing the target's embeddings and output head (the same arrays), its final
    norm copied; the decoder layers are freshly initialised."""
    lm = text_model(target)
    config = dict(vars(lm.args))
    total = len(lm.model.layers)
    if not 1 <= layers <= total:
        raise ValueError(f"a draft needs 1 to {total} layers, got {layers}")
    config["num_hidden_layers"] = layers
    if isinstance(config.get("layer_types"), list):
        config["layer_types"] = config["layer_types"][:layers]
    if intermediate_size is not None:
        if not 1 <= intermediate_size <= int(config.get("intermediate_size") or 0):
            raise ValueError(
                f"a draft's MLP width must be 1 to the target's ({config.get('intermediate_size')}), "
                f"got {intermediate_size}"
            )
        config["intermediate_size"] = int(intermediate_size)
    module = sys.modules[type(lm).__module__]
    draft = module.Model(module.ModelArgs.from_dict(config))
    draft.model.embed_tokens = lm.model.embed_tokens
    if getattr(lm, "lm_head", None) is not None:
        draft.lm_head = lm.lm_head
    draft.model.norm.update(tree_map(mx.array, lm.model.norm.parameters()))
    return draft


def draft_own_tensors(draft: nn.Module) -> dict[str, mx.array]:
    """The tensors a draft (``draft_skeleton``'s layers and norm) does not share with its target."""
    params = dict(tree_flatten(draft.parameters()))
    return {k: v for k, v in params.items() if k.startswith(("model.layers.", "model.norm."))}


def load_draft_model(target: nn.Module, path: str | Path) -> nn.Module:
    """The draft model stored at ``path`` (``draft_own_tensors``, its ``layers`` and optional
    ``intermediate_size`` metadata) for ``target``, in the target's dtype."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no draft model file at {path}")
    weights, meta = mx.load(str(path), return_metadata=True)
    if "layers" not in meta:
        raise ValueError(f"{path}: not a draft model file (its metadata has no 'layers')")
    width = int(meta["intermediate_size"]) if meta.get("intermediate_size") else None
    draft = draft_skeleton(target, int(meta["layers"]), width)
    own = draft_own_tensors(draft)
    if set(weights) != set(own):
        raise ValueError(f"{path}: its tensors do not match a {meta['layers']}-layer draft of this model")
    if wrong := [k for k, v in weights.items() if tuple(v.shape) != tuple(own[k].shape)]:
        raise ValueError(f"{path}: tensor shapes do not fit this model (e.g. {wrong[0]}): a draft of another model?")
    dtype = text_model(target).model.norm.weight.dtype
    draft.load_weights([(k, v.astype(dtype)) for k, v in weights.items()], strict=False)
    return ready(draft)


def draft_metadata(
    layers: int, model_name: str, extra: dict[str, Any] | None = None, intermediate_size: int | None = None
) -> dict[str, str]:
    """The metadata ``load_draft_model`` reads (all values as strings, as safetensors stores them)."""
    meta = {"layers": str(layers), "model": model_name}
    if intermediate_size is not None:
        meta["intermediate_size"] = str(intermediate_size)
    return {**meta, **{k: json.dumps(v) for k, v in (extra or {}).items()}}


def shipped_draft_model(target: nn.Module, model_name: str | None) -> nn.Module:
    """The draft model shipped for the embedded model ``model_name``; FileNotFoundError when none is."""
    path = shipped_draft_path(model_name)
    if path is None:
        raise FileNotFoundError(
            f"no draft model is shipped for {model_name or 'this model'}: pass one (--draft-model PATH or a name; "
            "DraftModel(model) in Python) or train one with scripts/gpu/drafters.py"
        )
    return load_draft_model(target, path)


def resolve_draft_model(spec: str | Path, target: nn.Module, model_name: str | None = None) -> nn.Module:
    """A draft model for ``target`` from a command-line value: a draft file (``.safetensors`` written by
    scripts/gpu/drafters.py), "shipped" (the one shipped for ``model_name``), else anything
    ``specbench.models.load`` takes (a short name, an mlx-lm folder, a Hugging Face id)."""
    text = str(spec)
    if text == "shipped":
        return shipped_draft_model(target, model_name)
    if text.endswith(".safetensors"):
        return load_draft_model(target, text)
    from specbench.models.load import load

    return load(text)[0]


@register_drafter(
    "draft-model",
    "a small model sharing the target's tokenizer (the one shipped for it by default)",
    needs=("model", "draft model"),
)
def _draft_model(inputs: DrafterInputs) -> DraftModel:
    draft = inputs.draft_model
    if draft is None:
        draft = shipped_draft_model(inputs.model, inputs.model_name)
    return DraftModel(draft, target=inputs.model)
