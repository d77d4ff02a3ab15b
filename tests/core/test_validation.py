"""Bad input is one clear error before any model work: options, prompts, policies, drafts and q."""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np
import pytest
from conftest import build_tiny
from hypothesis import given, settings
from hypothesis import strategies as st

from specbench import Draft, Drafter, DraftPolicy, GenerateOptions, Generation, generate, speculative_generate
from specbench.core.peer_policies import ConfidencePolicy
from specbench.core.target import ModelTarget
from specbench.core.verify import as_draft, check_draft

PROMPT = [5, 17, 3, 9, 5, 17, 3, 9]
VOCAB = 97  # the tiny models' vocabulary
NAN, INF = float("nan"), float("inf")


@pytest.fixture(scope="module")
def model():
    return build_tiny("llama")


@pytest.fixture
def verifications(monkeypatch):
    """Counts verification forwards: a bad draft must be reported before its verification."""
    calls = []
    original = ModelTarget.verify

    def verify(self, *args, **kwargs):
        calls.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(ModelTarget, "verify", verify)
    return calls


def test_the_guard_sees_model_work(no_forward):
    with pytest.raises(AssertionError, match="the model ran"):
        list(generate(no_forward, PROMPT, GenerateOptions(max_tokens=2)))


# -- options ----------------------------------------------------------------------------------

OPTION_CASES = [
    (dict(temperature=NAN), ValueError, r"temperature must be a finite number >= 0.*got nan"),
    (dict(temperature=INF), ValueError, r"temperature must be a finite number >= 0.*got inf"),
    (dict(temperature=-INF), ValueError, r"temperature .* got -inf"),
    (dict(temperature=-0.5), ValueError, r"temperature .* got -0\.5"),
    (dict(temperature="0.7"), TypeError, r"temperature must be a finite number.*got '0\.7' \(str\)"),
    (dict(temperature=None), TypeError, r"temperature .* got None"),
    (dict(temperature=True), TypeError, r"temperature .* got True \(bool\)"),
    (dict(top_p=NAN), ValueError, r"top_p must be .*\(0, 1\].*got nan"),
    (dict(top_p=0.0), ValueError, r"top_p must be in \(0, 1\]"),
    (dict(top_p=1.5), ValueError, r"top_p .* got 1\.5"),
    (dict(top_p="0.9"), TypeError, r"top_p .* got '0\.9'"),
    (dict(min_p=NAN), ValueError, r"min_p must be .*\[0, 1\].*got nan"),
    (dict(min_p=-0.1), ValueError, r"min_p must be in \[0, 1\]"),
    (dict(top_k=2.5), TypeError, r"top_k must be an integer >= 0 \(0 disables it\), got 2\.5 \(float\)"),
    (dict(top_k=-1), ValueError, r"top_k must be an integer >= 0.*got -1"),
    (dict(top_k=True), TypeError, r"top_k .* got True \(bool\)"),
    (dict(seed=-1), ValueError, r"seed must be an integer from 0 to .* or None, got -1"),
    (dict(seed=2**64), ValueError, r"seed must be an integer from 0 to 18446744073709551615 or None"),
    (dict(seed=1.5), TypeError, r"seed .* got 1\.5 \(float\)"),
    (dict(seed="42"), TypeError, r"seed .* got '42' \(str\)"),
    (dict(max_tokens=0), ValueError, r"max_tokens must be an integer >= 1, got 0"),
    (dict(max_tokens=-3), ValueError, r"max_tokens .* got -3"),
    (dict(max_tokens=10.0), TypeError, r"max_tokens must be an integer >= 1, got 10\.0 \(float\)"),
    (dict(max_tokens=True), TypeError, r"max_tokens .* got True \(bool\)"),
    (dict(max_tokens="8"), TypeError, r"max_tokens .* got '8' \(str\)"),
    (dict(min_tokens=-1), ValueError, r"min_tokens must be an integer >= 0, got -1"),
    (dict(min_tokens=1.5), TypeError, r"min_tokens .* got 1\.5"),
    (dict(min_tokens=False), TypeError, r"min_tokens .* got False \(bool\)"),
    (dict(prefill_step_size=0), ValueError, r"prefill_step_size must be an integer >= 1, got 0"),
    (dict(prefill_step_size=512.0), TypeError, r"prefill_step_size .* got 512\.0 \(float\)"),
    (dict(stop_strings="\n\n"), TypeError, r"stop_strings must be a list of non-empty strings.*\(str\)"),
    (dict(stop_strings=["ok", ""]), ValueError, r"stop_strings must hold non-empty strings .*would stop at once"),
    (dict(stop_strings=[3]), TypeError, r"stop_strings must hold non-empty strings, got 3 \(int\)"),
    (dict(stop_strings=None), TypeError, r"stop_strings must be a list"),
    (dict(stop_token_ids=5), TypeError, r"stop_token_ids must be a list of token ids.*got 5 \(int\)"),
    (dict(stop_token_ids="5"), TypeError, r"stop_token_ids must be a list of token ids.*\(str\)"),
    (dict(stop_token_ids=[1, "2"]), TypeError, r"stop_token_ids must hold token ids .*got '2' \(str\)"),
    (dict(stop_token_ids=[1, 2.0]), TypeError, r"stop_token_ids must hold token ids .*got 2\.0 \(float\)"),
    (dict(stop_token_ids=[True]), TypeError, r"stop_token_ids .* got True \(bool\)"),
    (dict(stop_token_ids=[-1]), ValueError, r"stop_token_ids must hold token ids \(integers >= 0\), got -1"),
    (dict(eos_token_ids=2), TypeError, r"eos_token_ids must be a list of token ids.*got 2 \(int\)"),
    (dict(eos_token_ids=[2, -5]), ValueError, r"eos_token_ids must hold token ids .*got -5"),
    (dict(eos_token_ids=[None]), TypeError, r"eos_token_ids .* got None"),
    (dict(verify="maybe"), ValueError, r"verify mode must be one of exact, fast, got 'maybe'"),
    (dict(verify=1), ValueError, r"verify mode must be one of exact, fast, got 1"),
    (dict(verify=["fast"]), ValueError, r"verify mode must be one of"),
    (dict(ignore_eos="no"), TypeError, r"ignore_eos must be True or False, got 'no'"),
    (dict(count_experts=1), TypeError, r"count_experts must be True or False, got 1"),
]


def _case_id(case) -> str:
    return ",".join(f"{k}={v!r}" for k, v in case[0].items())


@pytest.mark.parametrize("fields, error, message", OPTION_CASES, ids=[_case_id(c) for c in OPTION_CASES])
def test_bad_option_is_one_clear_error(fields, error, message):
    with pytest.raises(error, match=message):
        GenerateOptions(**fields).check()


@pytest.mark.parametrize(
    "run",
    [
        lambda m, o: generate(m, PROMPT, o),
        lambda m, o: Generation(m, PROMPT, o, drafter=_Lookalike(), policy=DraftPolicy.fixed(2)),
        lambda m, o: speculative_generate(m, PROMPT, o, drafter=_Lookalike(), policy=DraftPolicy.fixed(2)),
    ],
    ids=["generate", "Generation", "speculative_generate"],
)
@pytest.mark.parametrize("fields, error, message", OPTION_CASES[::4], ids=[_case_id(c) for c in OPTION_CASES[::4]])
def test_bad_options_stop_every_entry_point_before_model_work(no_forward, run, fields, error, message):
    with pytest.raises(error, match=message):
        run(no_forward, GenerateOptions(**fields))


@pytest.mark.parametrize(
    "options",
    [
        GenerateOptions(max_tokens=np.int64(4), top_k=np.int32(3), temperature=np.float32(0.5), seed=np.uint32(7)),
        GenerateOptions(stop_token_ids={2, 3}, eos_token_ids=(1,), stop_strings=("\n",), top_p=1, min_p=0),
        GenerateOptions(temperature=1e6, seed=2**64 - 1, verify="exact", min_tokens=0),
    ],
)
def test_good_options_pass(options):
    options.check()


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(stop_token_ids=[500]), r"stop_token_ids \[500\] are outside the model's vocabulary \[0, 97\)"),
        (dict(eos_token_ids=[97]), r"eos_token_ids \[97\] are outside"),
    ],
)
def test_stop_ids_outside_the_vocabulary(no_forward, fields, message):
    with pytest.raises(ValueError, match=message):
        generate(no_forward, PROMPT, GenerateOptions(**fields))


def test_options_of_the_wrong_type(no_forward):
    with pytest.raises(TypeError, match=r"options must be a GenerateOptions.*got \{'max_tokens': 3\}"):
        generate(no_forward, PROMPT, {"max_tokens": 3})


FIELD_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=3),
    st.lists(st.one_of(st.integers(-3, 200), st.text(max_size=2), st.floats(), st.none()), max_size=3),
    st.tuples(st.integers(-3, 200)),
    st.sampled_from(["exact", "fast"]),
)
FIELDS = [
    "max_tokens",
    "stop_token_ids",
    "stop_strings",
    "eos_token_ids",
    "ignore_eos",
    "min_tokens",
    "temperature",
    "top_p",
    "min_p",
    "top_k",
    "seed",
    "verify",
    "prefill_step_size",
    "count_experts",
]


@settings(max_examples=300, deadline=None, database=None)
@given(st.dictionaries(st.sampled_from(FIELDS), FIELD_VALUES, max_size=5))
def test_check_passes_or_raises_a_clear_error(fields):
    options = GenerateOptions(**fields)
    try:
        options.check()
    except (ValueError, TypeError) as err:
        assert str(err)
        return
    # Options that pass are usable: a verify mode, a sampler, a finite temperature.
    assert options.verify_mode in ("exact", "fast")
    assert math.isfinite(options.temperature) and options.temperature >= 0
    options.sampling.sampler()


# -- prompts ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "prompt, error, message",
    [
        ([1, 2.5], TypeError, r"prompt token ids must be integers, got 2\.5 \(float\)"),
        ([1, 2.0], TypeError, r"prompt token ids must be integers, got 2\.0 \(float\)"),
        ([True, 2], TypeError, r"prompt token ids must be integers, got True \(bool\)"),
        ([1, "2"], TypeError, r"got '2' \(str\)"),
        (mx.array([1.0, 2.0]), TypeError, r"the prompt is an mx.array of .*float32: token ids must be integers"),
        (np.array([1.5, 2.0]), TypeError, r"prompt token ids must be integers, got .*1\.5"),
        (None, TypeError, r"the prompt must be text, an mx.array or a list of token ids, got NoneType"),
        (7, TypeError, r"the prompt must be .* got int"),
        (b"hi", TypeError, r"the prompt must be .* got bytes"),
        ([1, -1], ValueError, r"prompt token ids \[-1\] are outside the model's vocabulary \[0, 97\)"),
        ([1, 97, 500], ValueError, r"prompt token ids \[97, 500\] are outside"),
        ([], ValueError, r"the prompt is empty"),
        ("some text", ValueError, r"no tokenizer was given"),
    ],
    ids=repr,
)
def test_bad_prompt_is_one_clear_error(no_forward, prompt, error, message):
    with pytest.raises(error, match=message):
        generate(no_forward, prompt, GenerateOptions(max_tokens=2))


@pytest.mark.parametrize("prompt", [np.array(PROMPT, dtype=np.int64), mx.array(PROMPT), tuple(PROMPT)], ids=repr)
def test_prompt_forms(model, prompt):
    assert list(generate(model, prompt, GenerateOptions(max_tokens=3))) == list(
        generate(model, PROMPT, GenerateOptions(max_tokens=3))
    )


# -- policies ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make, error, message",
    [
        (lambda: DraftPolicy.fixed(0), ValueError, r"draft length must be an integer >= 1, got 0"),
        (lambda: DraftPolicy.fixed(2.5), TypeError, r"draft length must be an integer >= 1, got 2\.5 \(float\)"),
        (lambda: DraftPolicy.fixed("4"), TypeError, r"draft length .* got '4' \(str\)"),
        (lambda: DraftPolicy.fixed(True), TypeError, r"draft length .* got True \(bool\)"),
        (lambda: DraftPolicy.adaptive(-2), ValueError, r"draft length .* got -2"),
        (lambda: DraftPolicy.adaptive(3, max_pause=0), ValueError, r"max_pause must be an integer >= 1, got 0"),
        (lambda: DraftPolicy.adaptive(3, max_pause=2.0), TypeError, r"max_pause .* got 2\.0 \(float\)"),
        (lambda: DraftPolicy.auto(max_k=0), ValueError, r"max_k must be an integer >= 1, got 0"),
        (lambda: DraftPolicy.auto(max_k=1.5), TypeError, r"max_k .* got 1\.5"),
        (lambda: DraftPolicy.auto(window=0), ValueError, r"window must be an integer >= 1, got 0"),
        (lambda: DraftPolicy.auto(window="8"), TypeError, r"window .* got '8' \(str\)"),
        (lambda: DraftPolicy.auto(pause_tokens=-1), ValueError, r"pause_tokens must be an integer >= 1, got -1"),
        (lambda: DraftPolicy.auto(pause_tokens=None), TypeError, r"pause_tokens .* got None"),
        (lambda: DraftPolicy.auto(break_even=NAN), ValueError, r"break_even must be a number of tokens >= 0, got nan"),
        (lambda: DraftPolicy.auto(break_even=-1.0), ValueError, r"break_even .* got -1\.0"),
        (lambda: DraftPolicy.auto(break_even="2"), TypeError, r"break_even .* got '2' \(str\)"),
        (lambda: DraftPolicy.parse("fixed:x"), ValueError, r"unknown policy 'fixed:x': use auto, fixed:K"),
        (lambda: DraftPolicy.parse("sometimes"), ValueError, r"unknown policy"),
        (lambda: DraftPolicy.parse(None), TypeError, r"a policy must be text: .* got None \(NoneType\)"),
    ],
)
def test_bad_policy_is_one_clear_error(make, error, message):
    with pytest.raises(error, match=message):
        make()


@pytest.mark.parametrize(
    "policy, break_even, error, message",
    [
        ("fixed:4", None, TypeError, r"policy must be a DraftPolicy .*got 'fixed:4'"),
        (4, None, TypeError, r"policy must be a DraftPolicy .*got 4"),
        (DraftPolicy.auto(), lambda k: NAN, ValueError, r"the break-even of k = \d+ must be a number of tokens >= 0"),
        (DraftPolicy.auto(), lambda k: "3", TypeError, r"the break-even of k = \d+ must be a number"),
        (DraftPolicy.auto(), 2.0, TypeError, r"break_even must be a function k -> tokens, got 2\.0"),
    ],
)
def test_bad_policy_in_a_generation(no_forward, policy, break_even, error, message):
    with pytest.raises(error, match=message):
        list(Generation(no_forward, PROMPT, drafter=_Lookalike(), policy=policy, break_even=break_even))


def test_not_a_drafter(no_forward):
    with pytest.raises(TypeError, match=r"drafter must be a Drafter .*got 'lookup'"):
        Generation(no_forward, PROMPT, drafter="lookup", policy=DraftPolicy.fixed(2))


# -- drafts and q -----------------------------------------------------------------------------


class _Lookalike(Drafter):
    """Drafts nothing: speculative decoding that never verifies."""

    name = "lookalike"

    def draft(self, context, k):
        return []


class QDrafter(Drafter):
    """Proposes ``tokens(k)`` with ``q(k, tokens)`` as its distributions."""

    name = "q-drafter"

    def __init__(self, tokens=lambda k: [5 + i for i in range(k)], q=None):
        self.tokens, self.q = tokens, q

    def draft(self, context, k):
        tokens = self.tokens(k)
        if self.q is None:
            return tokens
        return Draft(tokens, self.q(k, tokens))


def uniform(k: int, v: int = VOCAB) -> np.ndarray:
    return np.full((k, v), 1.0 / v, dtype=np.float32)


def zero_at_draft(k, tokens):
    q = np.full((k, VOCAB), 1.0 / (VOCAB - 1), dtype=np.float32)
    q[np.arange(k), tokens] = 0.0
    return mx.array(q)


def negative(k, tokens):
    q = uniform(k)
    q[0, 50] -= 0.02
    q[0, 51] += 0.02
    return mx.array(q)


def with_value(value):
    def make(k, tokens):
        q = uniform(k)
        q[-1, 60] = value
        return mx.array(q)

    return make


def softmax_q(k, tokens):
    logits = mx.random.normal((k, VOCAB))
    return mx.softmax(logits, axis=-1)


SAMPLING = GenerateOptions(max_tokens=10, temperature=1.0, seed=0)

DRAFT_CASES = [
    # token ids
    (
        QDrafter(tokens=lambda k: [5, 97][:k]),
        ValueError,
        r"drafter q-drafter proposed token ids \[97\] outside \[0, 97\)",
    ),
    (QDrafter(tokens=lambda k: [-1] * k), ValueError, r"proposed token ids \[-1.*outside \[0, 97\)"),
    (QDrafter(tokens=lambda k: [5, 2.5][:k]), TypeError, r"drafter q-drafter proposed 2\.5 \(float\)"),
    (QDrafter(tokens=lambda k: [True] * k), TypeError, r"proposed True \(bool\): token ids must be integers"),
    (QDrafter(tokens=lambda k: ["7"] * k), TypeError, r"proposed '7' \(str\)"),
    (
        QDrafter(tokens=lambda k: 5),
        TypeError,
        r"drafter q-drafter returned 5 \(int\): a draft is a Draft or an ordered seq",
    ),
    (QDrafter(tokens=lambda k: {3: 0, 4: 0}), TypeError, r"drafter q-drafter returned \{3: 0, 4: 0\} \(dict\)"),
    (QDrafter(tokens=lambda k: "abc"), TypeError, r"drafter q-drafter returned 'abc' \(str\)"),
    # q
    (QDrafter(q=zero_at_draft), ValueError, r"drafter q-drafter gave q .*= 0 at a token it drafted.*min\(1, p/q\)"),
    (QDrafter(q=negative), ValueError, r"q-drafter gave q \(Draft.probs\) with negative values"),
    (QDrafter(q=with_value(NAN)), ValueError, r"q-drafter gave q \(Draft.probs\) with NaN or infinite values"),
    (QDrafter(q=with_value(INF)), ValueError, r"with NaN or infinite values"),
    (QDrafter(q=lambda k, t: mx.array(uniform(k) * 2)), ValueError, r"rows do not sum to 1 \(one sums to 2"),
    (QDrafter(q=lambda k, t: mx.array(uniform(k) * 0.9)), ValueError, r"rows do not sum to 1 \(one sums to 0\.9"),
    (
        QDrafter(q=lambda k, t: mx.array(uniform(1))),
        ValueError,
        r"q-drafter gave q .*shape \(1, 97\).*must be .*\(3, 97\)",
    ),
    (QDrafter(q=lambda k, t: mx.array(uniform(k + 2))), ValueError, r"shape \(5, 97\).*\(3, 97\)"),
    (QDrafter(q=lambda k, t: mx.array(uniform(k, VOCAB - 1))), ValueError, r"shape \(3, 96\).*\(3, 97\)"),
    (QDrafter(q=lambda k, t: mx.array(uniform(1)[0])), ValueError, r"shape \(97,\)"),
    (
        QDrafter(q=lambda k, t: uniform(k)),
        TypeError,
        r"q-drafter gave q \(Draft.probs\) as ndarray: it must be an mx.array",
    ),
    (QDrafter(q=lambda k, t: mx.zeros((k, VOCAB), dtype=mx.int32)), TypeError, r"dtype .*int32.*floating point"),
]


@pytest.mark.parametrize("drafter, error, message", DRAFT_CASES, ids=lambda x: getattr(x, "__name__", None))
def test_bad_draft_is_a_clear_error_before_its_verification(model, verifications, drafter, error, message):
    gen = speculative_generate(model, PROMPT, SAMPLING, drafter=drafter, policy=DraftPolicy.fixed(3))
    with pytest.raises(error, match=message):
        list(gen)
    assert not verifications


def test_q_is_not_read_when_greedy(model):
    """Greedy verification never reads q: a q that would be wrong for sampling is no error."""
    gen = speculative_generate(
        model,
        PROMPT,
        GenerateOptions(max_tokens=6),
        drafter=QDrafter(q=lambda k, t: mx.array(uniform(1))),
        policy=DraftPolicy.fixed(3),
    )
    assert len(list(gen)) == 6


@pytest.mark.parametrize(
    "q",
    [softmax_q, lambda k, t: softmax_q(k, t).astype(mx.bfloat16), lambda k, t: softmax_q(k, t).astype(mx.float16)],
    ids=["float32", "bfloat16", "float16"],
)
def test_a_valid_q_samples(model, verifications, q):
    gen = speculative_generate(model, PROMPT, SAMPLING, drafter=QDrafter(q=q), policy=DraftPolicy.fixed(3))
    assert len(list(gen)) == SAMPLING.max_tokens
    assert verifications


def test_as_draft_keeps_q_rows_with_their_tokens():
    q = mx.array(uniform(5))
    cut = as_draft(Draft([1, 2, 3, 4, 5], q), 3)
    assert cut.tokens == [1, 2, 3] and cut.probs.shape == (3, VOCAB)
    check_draft(cut, "d", VOCAB, sampling=True)
    # A q of one row for five tokens is not silently made to fit the first one.
    broadcast = as_draft(Draft([1, 2, 3, 4, 5], mx.array(uniform(1))), 1)
    assert broadcast.tokens == [1] and broadcast.probs.shape == (1, VOCAB)
    broadcast = as_draft(Draft([1, 2, 3, 4, 5], mx.array(uniform(1))), 3)
    with pytest.raises(ValueError, match=r"drafter d gave q .*shape \(1, 97\)"):
        check_draft(broadcast, "d", VOCAB, sampling=True)
    assert as_draft([4, 5, 6], 2).tokens == [4, 5]
    assert check_draft(Draft([np.int64(4)]), "d", VOCAB, sampling=False).tokens == [4]
    # Tokens as an mx.array (or None) are read as their values, not as one unusable array.
    assert as_draft(mx.array([4, 5, 6]), 2).tokens == [4, 5]
    assert as_draft(Draft(mx.array([4, 5])), 3).tokens == [4, 5] and as_draft(Draft(None), 3).tokens == []


class ConfidentDrafter(Drafter):
    """Drafts ``5, 6, ...`` with ``confidence(k)`` as its probabilities."""

    name = "confident"

    def __init__(self, confidence):
        self.confidence = confidence

    def draft(self, context, k):
        return Draft([5 + i for i in range(k)], confidence=self.confidence(k))


@pytest.mark.parametrize(
    "confidence, error, message",
    [
        (lambda k: [0.9, NAN, 0.9][:k], ValueError, r"drafter confident gave confidence .* nan at token 1: .*\[0, 1\]"),
        (lambda k: [0.9, 1.5, 0.9][:k], ValueError, r"with 1\.5 at token 1: it must be a probability in \[0, 1\]"),
        (lambda k: [-0.1] * k, ValueError, r"with -0\.1 at token 0"),
        (lambda k: [INF] * k, ValueError, r"with inf at token 0"),
        (lambda k: [0.9] * (k - 1), ValueError, r"confidence \(Draft.confidence\) of 2 values for 3 drafted tokens"),
        (lambda k: [0.9] * (k + 1), ValueError, r"of 4 values for 3 drafted tokens"),
        (lambda k: ["0.9"] * k, TypeError, r"with '0\.9' \(str\) at token 0: it must be a number"),
        (lambda k: 0.9, TypeError, r"gave confidence \(Draft.confidence\) as float"),
    ],
    ids=["nan", "above 1", "below 0", "inf", "short", "long", "text", "not a sequence"],
)
def test_bad_confidence_is_a_clear_error_before_its_verification(model, verifications, confidence, error, message):
    """A NaN, out-of-range or missing confidence would let tokens past a confidence threshold: refused instead."""
    options = GenerateOptions(max_tokens=6)
    gen = speculative_generate(
        model, PROMPT, options, drafter=ConfidentDrafter(confidence), policy=ConfidencePolicy(0.5, 3)
    )
    with pytest.raises(error, match=message):
        list(gen)
    assert not verifications


def test_a_valid_confidence_is_kept_with_its_tokens():
    draft = as_draft(Draft([1, 2, 3], confidence=[1, 0.5, 0.0]), 2, "d")
    assert draft.tokens == [1, 2] and draft.confidence == [1.0, 0.5]
    assert as_draft(Draft([1, 2], confidence=mx.array([0.25, 0.75])), 4).confidence == [0.25, 0.75]
    assert as_draft(Draft([], confidence=[]), 2).confidence == []


@settings(max_examples=200, deadline=None, database=None)
@given(
    vocab=st.integers(2, 6),
    data=st.data(),
)
def test_check_draft_passes_only_valid_q(vocab, data):
    k = data.draw(st.integers(1, 3))
    tokens = data.draw(st.lists(st.integers(0, vocab - 1), min_size=k, max_size=k))
    values = st.one_of(st.floats(-0.5, 1.5), st.sampled_from([0.0, 1.0, NAN, INF, -INF]))
    q = np.array(data.draw(st.lists(values, min_size=k * vocab, max_size=k * vocab)), dtype=np.float32)
    q = q.reshape(k, vocab)
    if data.draw(st.booleans()):  # often a normalised q, to reach the later checks
        with np.errstate(all="ignore"):
            q = q / q.sum(axis=-1, keepdims=True)
    try:
        check_draft(Draft(tokens, mx.array(q)), "d", vocab, sampling=True)
    except (ValueError, TypeError) as err:
        assert "drafter d" in str(err)
        return
    assert np.isfinite(q).all() and (q >= 0).all()
    assert np.allclose(q.sum(axis=-1), 1.0, rtol=0, atol=1e-3)
    assert (q[np.arange(k), tokens] > 0).all()
