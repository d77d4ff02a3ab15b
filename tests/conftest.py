"""Shared fixtures: tiny random-weight models built in the test, float32."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import pytest
from mlx.utils import tree_map

from specbench.drafters.base import Draft, Drafter

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"

TINY_CONFIGS = {
    "llama": dict(
        model_type="llama", hidden_size=64, num_hidden_layers=2, intermediate_size=128,
        num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=97,
        tie_word_embeddings=True, max_position_embeddings=2048,
    ),
    "qwen3": dict(
        model_type="qwen3", hidden_size=64, num_hidden_layers=2, intermediate_size=128,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6, vocab_size=97,
        tie_word_embeddings=False, max_position_embeddings=2048, rope_theta=10000.0,
    ),
    "qwen3_moe": dict(
        model_type="qwen3_moe", hidden_size=64, num_hidden_layers=2, intermediate_size=128,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6, vocab_size=97,
        tie_word_embeddings=False, max_position_embeddings=2048, rope_theta=10000.0,
        num_experts=8, num_experts_per_tok=2, decoder_sparse_step=1, moe_intermediate_size=32,
        mlp_only_layers=[], norm_topk_prob=True,
    ),
}


def build_tiny(arch: str, seed: int = 0, scale: float = 4.0, **overrides):
    """A random-weight model of mlx-lm's ``arch`` with tiny dims, in float32.

    Weights are scaled up so that greedy continuations are varied rather than one repeated token.
    """
    import importlib

    module = importlib.import_module(f"mlx_lm.models.{arch}")
    config = {**TINY_CONFIGS[arch], **overrides}
    mx.random.seed(seed)
    model = module.Model(module.ModelArgs.from_dict(config))
    model.update(tree_map(lambda p: p * scale if p.ndim == 2 else p, model.parameters()))
    mx.eval(model.parameters())
    return model


@pytest.fixture(params=list(TINY_CONFIGS))
def tiny_model(request):
    return build_tiny(request.param)


def plain_greedy(model, prompt: list[int], n: int) -> list[int]:
    """mlx-lm's own greedy decoding, the reference for exactness."""
    from mlx_lm.generate import generate_step

    out = []
    for token, _ in generate_step(mx.array(prompt), model, max_tokens=n):
        out.append(int(token))
    return out


class ScriptedDrafter(Drafter):
    """Proposes a known continuation, wrong at chosen draft positions.

    ``wrong_at(step, position) -> bool`` decides which draft positions are corrupted, so tests
    control how many tokens each verification accepts.
    """

    name = "scripted"

    def __init__(self, truth: list[int], prompt_len: int, vocab: int, wrong_at=lambda step, i: False):
        self.truth = truth
        self.prompt_len = prompt_len
        self.vocab = vocab
        self.wrong_at = wrong_at
        self.calls = 0

    def draft(self, context, k):
        done = len(context) - self.prompt_len
        tokens = list(self.truth[done : done + k])
        # Run past the known continuation: pad with arbitrary tokens.
        tokens += [1] * (k - len(tokens))
        out = [(t + 1) % self.vocab if self.wrong_at(self.calls, i) else t for i, t in enumerate(tokens)]
        self.calls += 1
        return Draft(out)


def word_tokenizer(roles: tuple[str, ...] = ("user", "assistant")):
    """A word-level tokenizer over the tiny models' 97 ids: <unk>, <eos>, one token per chat role,
    then the words ``w{id}`` (``tokenizer_words(roles)``), with a chat template."""
    from mlx_lm.tokenizer_utils import TokenizerWrapper
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<eos>", *(f"<{r}>" for r in roles)]
    vocab = {**{t: i for i, t in enumerate(specials)}, **{w: i + len(specials) for i, w in enumerate(tokenizer_words(roles))}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    hf = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="<eos>")
    hf.chat_template = (
        "{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} {% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    return TokenizerWrapper(hf)


def tokenizer_words(roles: tuple[str, ...] = ("user", "assistant")) -> list[str]:
    """The words of ``word_tokenizer(roles)``: ``w{id}`` for the ids after the special tokens."""
    return [f"w{i}" for i in range(2 + len(roles), 97)]


@pytest.fixture
def fresh_calibrations(tmp_path, monkeypatch):
    """Exact-mode calibrations go to a temporary SPECBENCH_HOME and start empty in memory."""
    from specbench.exact import hooks as exact

    monkeypatch.setenv("SPECBENCH_HOME", str(tmp_path))
    exact._calibrations.clear()
    yield
    exact._calibrations.clear()
