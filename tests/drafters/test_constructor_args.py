"""Drafters and policies check their arguments when made (types, ranges, the vocabulary); draft lengths are
bounded before any calibration; a draft model made without its target checks the target before any work."""

from __future__ import annotations

import pytest
from conftest import ScriptedDrafter, build_tiny, plain_greedy

from specbench import DraftPolicy, GenerateOptions, speculative_generate
from specbench.core.policy_args import MAX_DRAFT_LENGTH
from specbench.decoding import with_estimate
from specbench.drafters import DraftModel, EarlyExit, MtpHead, PromptLookup, SuffixDecoding
from specbench.drafters.oracle import Oracle
from specbench.exact import ExactVerifier
from specbench.exact import verifier as exact_verifier
from specbench.models.mtp import build_head

MODEL = build_tiny("llama", num_hidden_layers=2)  # vocabulary 97

# (what, make, error type, text the error holds)
CASES = [
    ("mtp tree_width not an integer", lambda: MtpHead(MODEL, tree_width=2.5), TypeError, "tree_width"),
    ("mtp top_k not an integer", lambda: MtpHead(MODEL, top_k=1.5), TypeError, "top_k"),
    ("mtp top_k over the vocabulary", lambda: MtpHead(MODEL, top_k=98), ValueError, "from 0 to 97"),
    ("mtp tree_width over the vocabulary", lambda: MtpHead(MODEL, tree_width=200), ValueError, "from 1 to 97"),
    ("mtp temperature text", lambda: MtpHead(MODEL, temperature="hot"), TypeError, "temperature"),
    ("mtp temperature NaN", lambda: MtpHead(MODEL, temperature=float("nan")), ValueError, "finite"),
    ("mtp preferred_k huge", lambda: MtpHead(MODEL, preferred_k=10**6), ValueError, "preferred_k"),
    ("lookup max_ngram float", lambda: PromptLookup(max_ngram=2.0), TypeError, "max_ngram"),
    ("lookup preferred_k zero", lambda: PromptLookup(preferred_k=0), ValueError, "preferred_k"),
    ("lookup max_candidates bool", lambda: PromptLookup(max_candidates=True), TypeError, "max_candidates"),
    ("suffix max_spec_tokens float", lambda: SuffixDecoding(max_spec_tokens=4.5), TypeError, "max_spec_tokens"),
    ("suffix max_spec_tokens huge", lambda: SuffixDecoding(max_spec_tokens=10**5), ValueError, "max_spec_tokens"),
    ("suffix min_token_prob NaN", lambda: SuffixDecoding(min_token_prob=float("nan")), ValueError, "min_token_prob"),
    ("suffix factor text", lambda: SuffixDecoding(max_spec_factor="1"), TypeError, "max_spec_factor"),
    ("suffix max_tokens float", lambda: SuffixDecoding(max_tokens=1.5), TypeError, "max_tokens"),
    ("draft model preferred_k float", lambda: DraftModel(MODEL, preferred_k=2.0), TypeError, "preferred_k"),
    ("early exit preferred_k", lambda: EarlyExit(MODEL, 1, preferred_k=-1), ValueError, "preferred_k"),
    ("oracle acceptance NaN", lambda: Oracle([1], [2], float("nan"), 97), ValueError, "acceptance"),
    ("oracle vocab float", lambda: Oracle([1], [2], 0.5, 97.0), TypeError, "vocab_size"),
    ("fixed beyond the bound", lambda: DraftPolicy.parse("fixed:100000"), ValueError, "longest draft"),
    ("adaptive beyond the bound", lambda: DraftPolicy.adaptive(MAX_DRAFT_LENGTH + 1), ValueError, "longest draft"),
    ("auto max_k beyond the bound", lambda: DraftPolicy.auto(max_k=10**6), ValueError, "max_k"),
    ("fixed float", lambda: DraftPolicy.fixed(2.5), TypeError, "draft length"),
]


@pytest.mark.parametrize("what, make, kind, text", CASES, ids=[c[0] for c in CASES])
def test_bad_arguments_are_one_clear_error_at_construction(what, make, kind, text):
    with pytest.raises(kind, match=text):
        make()


def test_the_bound_itself_is_accepted():
    assert DraftPolicy.fixed(MAX_DRAFT_LENGTH).k == MAX_DRAFT_LENGTH
    with_head = build_tiny("llama", num_hidden_layers=2)
    with_head.mtp = build_head(with_head)
    assert MtpHead(with_head, top_k=97).top_k == 97


def test_a_draft_longer_than_the_context_is_an_error_before_any_model_work():
    short = build_tiny("llama", num_hidden_layers=1, max_position_embeddings=16)
    with pytest.raises(ValueError, match="context of 16 tokens"):
        speculative_generate(
            short, [1, 2, 3], GenerateOptions(max_tokens=4), drafter=PromptLookup(), policy=DraftPolicy.fixed(20)
        )


@pytest.mark.parametrize("max_tokens, widest", [(1, None), (2, 2), (4, 4), (9, 9)])
def test_exact_calibration_covers_only_the_widths_a_generation_of_max_tokens_can_verify(
    max_tokens, widest, fresh_calibrations, monkeypatch
):
    """fixed:128 for a few tokens calibrates widths up to max_tokens (a draft of max_tokens - 1 and the last
    token), not 127 widths; the engine never verifies a width it did not calibrate ahead."""
    prompt = [1, 2, 3]
    truth = plain_greedy(MODEL, prompt, max_tokens)
    prepared: list[int] = []
    monkeypatch.setattr(ExactVerifier, "prepare", _recording(ExactVerifier.prepare, prepared))
    options = GenerateOptions(max_tokens=max_tokens, verify="exact")
    drafter = ScriptedDrafter(truth, len(prompt), 97)
    gen = speculative_generate(MODEL, prompt, options, drafter=drafter, policy=DraftPolicy.fixed(MAX_DRAFT_LENGTH))
    assert prepared == (list(range(2, widest + 1)) if widest else [])
    assert list(gen) == truth
    widths = [r.verify_width for r in gen.log.records if r.kind == "verify"]
    assert all(w <= (widest or 1) for w in widths)
    assert max_tokens < 4 or widths  # a long enough generation does verify


def _recording(prepare, prepared):
    def record(self, widths, progress=None, context=None):
        prepared.extend(widths)
        return prepare(self, widths, progress, context)

    return record


class _Boundless(DraftPolicy):
    """A user's policy that says it may draft more than the engine verifies."""

    name = "boundless"

    def longest_draft(self, drafter):
        return MAX_DRAFT_LENGTH + 1

    def _k(self, drafter):
        return 2


def test_a_policy_past_the_longest_draft_is_an_error_before_any_calibration(fresh_calibrations, monkeypatch):
    def fail(*args, **kwargs):
        pytest.fail("calibrated for a policy past the bound")

    monkeypatch.setattr(exact_verifier, "calibrate", fail)
    with pytest.raises(ValueError, match=r"policy boundless may draft 129 tokens .*over the longest draft"):
        speculative_generate(
            MODEL, [1, 2, 3], GenerateOptions(max_tokens=4, verify="exact"), drafter=PromptLookup(), policy=_Boundless()
        )


def test_a_draft_model_without_target_checks_the_vocabulary_before_any_work():
    wider_target = build_tiny("llama", num_hidden_layers=1, vocab_size=200)
    drafter = DraftModel(MODEL)
    assert drafter.target_checked is False
    with pytest.raises(ValueError, match="vocabulary mismatch.*97.*200"):
        speculative_generate(
            wider_target, [1, 2, 3], GenerateOptions(max_tokens=4), drafter=drafter, policy=DraftPolicy.fixed(2)
        )
    ok = DraftModel(MODEL)
    speculative_generate(MODEL, [1, 2, 3], GenerateOptions(max_tokens=2), drafter=ok, policy=DraftPolicy.fixed(2))
    assert ok.target_checked is True


def test_calibration_progress_carries_the_time_left():
    said: list[str] = []
    say = with_estimate(said.append)
    say("calibrating exact verification for widths 2..5")
    say("exact calibration 1/4: width 2 runs none (0.1 s)")
    say("exact calibration 4/4: width 5 runs none (0.1 s)")
    assert "left" not in said[0] and "about 0:00 left" in said[1] and "left" not in said[2]
