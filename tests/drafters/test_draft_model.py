"""DraftModel: greedy exactness, its cache following the target's rollback, losslessness with its q, and
vocabulary mismatches."""

from __future__ import annotations

import mlx.core as mx
import pytest
from conftest import build_tiny, plain_greedy, word_tokenizer

from scripts.gpu.draft_training import draft_from_target
from specbench.checks.lossless import histogram_test, lossless_verdict, well_filled_share
from specbench.core.accept import SamplingSettings
from specbench.core.engine import Generation, plain_generation
from specbench.core.options import GenerateOptions
from specbench.core.policies import DraftPolicy
from specbench.drafters import DraftModel, make_drafter
from specbench.drafters.draft_model import draft_own_tensors, load_draft_model

PROMPT = [5, 17, 33, 2, 9, 41, 8]


class Recording(DraftModel):
    """A DraftModel that keeps each (context, draft) it produced."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = []

    def draft(self, context, k):
        out = super().draft(context, k)
        self.calls.append((list(context), list(out.tokens)))
        return out


@pytest.mark.parametrize("arch", ["llama"])
def test_greedy_equals_plain_decoding_and_the_cache_follows_rollback(arch):
    target = build_tiny(arch, num_hidden_layers=3)
    draft_model = draft_from_target(target, [0, 2])
    drafter = Recording(draft_model, target=target)
    options = GenerateOptions(max_tokens=40)
    gen = Generation(target, PROMPT, options, drafter=drafter, policy=DraftPolicy.fixed(3))
    assert list(gen) == list(plain_generation(target, PROMPT, options)) == plain_greedy(target, PROMPT, 40)
    stats = gen.stats()
    assert 0 < stats["accepted"] < stats["drafted"], "both accepted and rejected drafts are needed"
    # Every draft is the draft model's own greedy continuation of the context: its cache held
    # exactly the context after each rollback.
    for context, tokens in drafter.calls[::3]:
        assert tokens == plain_greedy(draft_model, context, len(tokens))
    assert 0 < drafter.cost_per_token < 1


def _samples(target, drafter_factory, n: int, seed: int, temperature: float = 1.0):
    sequences, drafted, accepted, probs_seen = [], 0, 0, 0
    for i in range(n):
        options = GenerateOptions(max_tokens=6, temperature=temperature, seed=seed + i, ignore_eos=True)
        drafter = drafter_factory() if drafter_factory is not None else None
        if drafter is None:
            sequences.append(list(plain_generation(target, PROMPT, options)))
            continue
        gen = Generation(target, PROMPT, options, drafter=drafter, policy=DraftPolicy.fixed(3))
        sequences.append(list(gen))
        stats = gen.stats()
        drafted, accepted = drafted + stats["drafted"], accepted + stats["accepted"]
        probs_seen += sum(1 for r in gen.log if r.kind == "verify" and 0 < min(r.accept_probs or [1]) < 1)
    return sequences, drafted, accepted, probs_seen


class WrongQ(DraftModel):
    """Samples from q but reports a uniform q: a biased speculative sampler (drafts accepted too often)."""

    def draft(self, context, k):
        out = super().draft(context, k)
        if out.probs is not None:
            out.probs = mx.full(out.probs.shape, 1.0 / out.probs.shape[-1])
        return out


def test_sampling_is_lossless_with_the_draft_models_q_and_biased_with_a_wrong_q():
    target = build_tiny("llama", num_hidden_layers=3, scale=1.5)
    draft_model = draft_from_target(target, [0])
    settings = SamplingSettings(temperature=1.0)
    plain, *_ = _samples(target, None, 40, seed=0)
    spec, drafted, accepted, with_q = _samples(
        target, lambda: DraftModel(draft_model, target=target, sampling=settings), 40, seed=1000
    )
    assert with_q > 0, "the acceptance rule must see q (probabilities strictly between 0 and 1)"
    _, p, _ = histogram_test(plain, spec, permutations=400)
    verdict, reason = lossless_verdict(p, accepted, well_filled_share(plain, spec))
    assert verdict == "pass", reason
    biased, _, biased_accepted, _ = _samples(
        target, lambda: WrongQ(draft_model, target=target, sampling=SamplingSettings(temperature=0.3)), 40, seed=1000
    )
    _, p_biased, _ = histogram_test(plain, biased, permutations=400)
    assert lossless_verdict(p_biased, biased_accepted, well_filled_share(plain, biased))[0] == "fail"


def test_vocabulary_mismatch_is_a_clear_error():
    target = build_tiny("llama", num_hidden_layers=2)
    wider = build_tiny("llama", num_hidden_layers=1, vocab_size=101)
    with pytest.raises(ValueError, match="vocabulary mismatch.*101.*97"):
        DraftModel(wider, target=target)
    with pytest.raises(ValueError, match="vocabulary mismatch"):
        make_drafter("draft-model", model=target, draft_model=wider)
    same_size = build_tiny("llama", num_hidden_layers=1)
    with pytest.raises(ValueError, match="tokenizer maps"):
        DraftModel(
            same_size, word_tokenizer(("user", "assistant")), target=target, target_tokenizer=word_tokenizer(("a", "b"))
        )
    narrower = DraftModel(build_tiny("llama", num_hidden_layers=1, vocab_size=40))
    with pytest.raises(ValueError, match="outside the draft model's vocabulary"):
        list(Generation(target, PROMPT, GenerateOptions(max_tokens=4), drafter=narrower, policy=DraftPolicy.fixed(2)))


def test_stored_draft_loads_with_the_targets_embeddings(tmp_path):
    target = build_tiny("qwen3", num_hidden_layers=3)
    draft = draft_from_target(target, [0, 2])
    own = draft_own_tensors(draft)
    assert own and not any("embed" in k or "lm_head" in k for k in own)
    mx.save_safetensors(str(tmp_path / "d.safetensors"), own, {"layers": "2"})
    loaded = load_draft_model(target, tmp_path / "d.safetensors")
    tokens = mx.array([PROMPT])
    assert mx.array_equal(loaded(tokens), draft(tokens))
    assert loaded.lm_head is target.lm_head


def test_a_narrow_draft_keeps_the_heaviest_mlp_channels_and_loads_as_shipped(tmp_path, monkeypatch):
    from specbench.common import files
    from specbench.drafters.draft_model import draft_metadata, shipped_draft_model
    from specbench.models import embedded

    target = build_tiny("llama", num_hidden_layers=3)
    width = target.args.intermediate_size
    full = draft_from_target(target, [0, 2], intermediate_size=width)
    tokens = mx.array([PROMPT])
    assert mx.array_equal(full(tokens), draft_from_target(target, [0, 2])(tokens))
    narrow = draft_from_target(target, [0, 2], intermediate_size=width // 2)
    mlp, source = narrow.model.layers[1].mlp, target.model.layers[2].mlp
    assert mlp.gate_proj.weight.shape == (width // 2, target.args.hidden_size)
    kept = [i for i in range(width) if any(mx.array_equal(source.up_proj.weight[i], r) for r in mlp.up_proj.weight)]
    norms = mx.linalg.norm(source.gate_proj.weight, axis=1) * mx.linalg.norm(source.up_proj.weight, axis=1)
    norms = norms * mx.linalg.norm(source.down_proj.weight, axis=0)
    assert float(norms[mx.array(kept)].min()) >= float(mx.sort(norms)[-(width // 2)])  # the heaviest channels

    # Shipped: a file in the assets' draft folder, registered for an embedded model name.
    assert embedded.shipped_draft_path("tiny-llama") is None
    (tmp_path / "draft").mkdir()
    meta = draft_metadata(2, "tiny-llama", {"source_layers": [0, 2]}, intermediate_size=width // 2)
    mx.save_safetensors(str(tmp_path / "draft" / "tiny.safetensors"), draft_own_tensors(narrow), meta)
    monkeypatch.setattr(files, "ASSETS_DIR", tmp_path)
    monkeypatch.setitem(embedded.SHIPPED_DRAFT_MODELS, "tiny-llama", "draft/tiny.safetensors")
    assert embedded.shipped_draft_path("tiny-llama") is not None
    assert mx.array_equal(shipped_draft_model(target, "tiny-llama")(tokens), narrow(tokens))
    drafter = make_drafter("draft-model", model=target, model_name="tiny-llama")
    assert isinstance(drafter, DraftModel) and 0 < drafter.cost_per_token < 1
    options = GenerateOptions(max_tokens=24)
    gen = Generation(target, PROMPT, options, drafter=drafter, policy=DraftPolicy.fixed(3))
    assert list(gen) == plain_greedy(target, PROMPT, 24)

    with pytest.raises(FileNotFoundError, match="no draft model is shipped for tiny-qwen3"):
        shipped_draft_model(target, "tiny-qwen3")
    other = build_tiny("llama", num_hidden_layers=3, hidden_size=target.args.hidden_size * 2)
    with pytest.raises(ValueError, match="shapes do not fit"):
        load_draft_model(other, tmp_path / "draft" / "tiny.safetensors")
