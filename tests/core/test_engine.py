"""Exactness (speculative greedy == plain greedy), stops, policies, logs and bad input."""

from __future__ import annotations

import itertools

import mlx.core as mx
import pytest
from conftest import ScriptedDrafter, build_tiny, plain_greedy

from specbench import (
    DraftPolicy,
    GenerateOptions,
    Generation,
    PromptLookup,
    StepLog,
    StepRecord,
    generate,
    speculative_generate,
)
from specbench.core.draft import Draft
from specbench.cost import Profile

PROMPT = [5, 17, 3, 9, 5, 17, 3, 9, 5, 17, 44, 2, 8]
N = 40


@pytest.mark.parametrize("verify", ["fast", "exact"])
@pytest.mark.parametrize(
    "policy",
    [DraftPolicy.fixed(1), DraftPolicy.fixed(4), DraftPolicy.adaptive(3), DraftPolicy.auto(break_even=1.3)],
    ids=lambda p: p.name,
)
def test_prompt_lookup_greedy_equals_plain(tiny_model, policy, verify):
    ref = plain_greedy(tiny_model, PROMPT, N)
    gen = speculative_generate(
        tiny_model, PROMPT, GenerateOptions(max_tokens=N, verify=verify), drafter=PromptLookup(), policy=policy
    )
    assert list(gen) == ref
    assert gen.finish_reason() == "length"


@pytest.mark.parametrize("k", [1, 3, 6])
def test_every_acceptance_count(tiny_model, k):
    """Corrupt draft position (step mod (k+1)), so verifications accept 0..k tokens in turn."""
    ref = plain_greedy(tiny_model, PROMPT, N)
    drafter = ScriptedDrafter(ref, len(PROMPT), 97, wrong_at=lambda step, i: i == step % (k + 1))
    gen = speculative_generate(
        tiny_model, PROMPT, GenerateOptions(max_tokens=N, verify="fast"), drafter=drafter, policy=DraftPolicy.fixed(k)
    )
    assert list(gen) == ref
    verifies = [r for r in gen.log if r.kind == "verify"]
    seen = {r.accepted for r in verifies if r.k_drafted == k}
    assert seen == set(range(k + 1))
    for r in verifies:
        assert r.accepted_positions == list(range(r.accepted))
        assert r.emitted == r.accepted + 1 or gen.log.records[-1] is r
        assert r.verify_width == r.k_drafted + 1
    stats = gen.stats()
    assert stats["tokens"] == N
    assert stats["accepted"] == sum(r.accepted for r in verifies)
    # The cache holds exactly prompt + emitted tokens but the last (pending) one.
    assert gen.cache[0].offset >= len(PROMPT) + N - 1


def test_cache_rolled_back_exactly():
    model = build_tiny("llama")
    ref = plain_greedy(model, PROMPT, 30)
    drafter = ScriptedDrafter(ref, len(PROMPT), 97, wrong_at=lambda step, i: i == 1)
    gen = speculative_generate(
        model, PROMPT, GenerateOptions(max_tokens=30, verify="fast"), drafter=drafter, policy=DraftPolicy.fixed(5)
    )
    for _ in gen:
        pass
    last = gen.log.records[-1]
    # After each step the cache holds every token but the newest.
    if last.kind == "verify":
        assert gen.cache[0].offset == len(PROMPT) + len(gen.tokens) - 1


def test_full_drafts_and_drafts_past_max_tokens():
    model = build_tiny("qwen3")
    ref = plain_greedy(model, PROMPT, 23)
    drafter = ScriptedDrafter(ref, len(PROMPT), 97)
    gen = speculative_generate(
        model, PROMPT, GenerateOptions(max_tokens=23), drafter=drafter, policy=DraftPolicy.fixed(8)
    )
    assert list(gen) == ref
    assert gen.finish_reason() == "length"
    assert all(r.k_drafted <= 23 - r.position - 1 for r in gen.log if r.kind == "verify")


def test_stop_token_inside_accepted_draft():
    model = build_tiny("llama")
    ref = plain_greedy(model, PROMPT, N)
    stop = ref[12]
    cut = ref.index(stop)
    drafter = ScriptedDrafter(ref, len(PROMPT), 97)
    gen = speculative_generate(
        model,
        PROMPT,
        GenerateOptions(max_tokens=N, stop_token_ids=[stop]),
        drafter=drafter,
        policy=DraftPolicy.fixed(6),
    )
    assert list(gen) == ref[: cut + 1]
    assert gen.finish_reason() == "stop"
    plain = generate(model, PROMPT, GenerateOptions(max_tokens=N, stop_token_ids=[stop]))
    assert list(plain) == ref[: cut + 1]


def test_min_tokens_suppresses_eos():
    model = build_tiny("llama")
    ref = plain_greedy(model, PROMPT, N)
    eos = ref[3]
    opts = GenerateOptions(max_tokens=N, eos_token_ids=[eos], min_tokens=10)
    plain = list(generate(model, PROMPT, opts))
    assert eos not in plain[:10]
    drafter = ScriptedDrafter(plain, len(PROMPT), 97)
    spec = speculative_generate(model, PROMPT, opts, drafter=drafter, policy=DraftPolicy.fixed(4))
    assert list(spec) == plain
    ignored = list(generate(model, PROMPT, GenerateOptions(max_tokens=N, eos_token_ids=[eos], ignore_eos=True)))
    assert ignored == ref


def test_plain_generate_matches_mlx_lm(tiny_model):
    gen = generate(tiny_model, PROMPT, GenerateOptions(max_tokens=N))
    assert list(gen) == plain_greedy(tiny_model, PROMPT, N)
    stats = gen.stats()
    assert stats["steps"] == N - 1 and stats["verifies"] == 0 and stats["mean_accepted_tokens"] == 1.0


def test_adaptive_pauses_after_full_rejection():
    model = build_tiny("llama")
    ref = plain_greedy(model, PROMPT, 60)
    drafter = ScriptedDrafter(ref, len(PROMPT), 97, wrong_at=lambda step, i: True)
    gen = speculative_generate(
        model, PROMPT, GenerateOptions(max_tokens=60), drafter=drafter, policy=DraftPolicy.adaptive(3)
    )
    assert list(gen) == ref
    kinds = [("V" if r.kind == "verify" else "p" if r.paused else ".") for r in gen.log.records[1:]]
    # pauses of 1, 2, 4, 8, 16 steps after consecutive fully rejected drafts
    runs, count = [], 0
    for kind in kinds:
        if kind == "p":
            count += 1
        elif count:
            runs.append(count)
            count = 0
    assert runs[:5] == [1, 2, 4, 8, 16]


def test_auto_kill_switch_pauses_64_tokens():
    model = build_tiny("llama")
    ref = plain_greedy(model, PROMPT, 100)
    drafter = ScriptedDrafter(ref, len(PROMPT), 97, wrong_at=lambda step, i: True)
    gen = speculative_generate(
        model, PROMPT, GenerateOptions(max_tokens=100), drafter=drafter, policy=DraftPolicy.auto(break_even=1.5)
    )
    assert list(gen) == ref
    records = gen.log.records[1:]
    assert [r.kind for r in records[:16]] == ["verify"] * 16
    assert all(r.paused for r in records[16 : 16 + 64])
    # the step the pause queued past its end is decoded on the way to the next verification, not paused
    assert records[80].kind == "plain" and not records[80].paused and records[80].k_requested > 0
    assert [r.kind for r in records[81:97]] == ["verify"] * 16
    # prefill 1 + 16 verifies + 64 paused + 1 + 16 verifies = 98 tokens; the kill switch fires again.
    assert gen.stats()["pauses"] == 64 + 2


def test_log_roundtrip(tmp_path):
    model = build_tiny("llama")
    gen = speculative_generate(
        model, PROMPT, GenerateOptions(max_tokens=20), drafter=PromptLookup(), policy=DraftPolicy.fixed(3)
    )
    list(gen)
    df = gen.log.to_polars()
    assert df.height == len(gen.log) and {"step", "kind", "accepted", "draft_s", "verify_s"} <= set(df.columns)
    path = gen.log.save(tmp_path / "log.parquet")
    back = StepLog.load(path)
    assert back.to_polars().equals(df) and back.rows() == gen.log.rows()
    assert all(isinstance(r, StepRecord) for r in back) and back.records[1].kind == gen.log.records[1].kind
    assert back.stats()["tokens"] == 20


def test_labelled_records_keep_their_columns_through_a_stored_log(tmp_path):
    """A log of many generations: each record's labels are columns after its own, read back as labels."""
    model = build_tiny("llama")
    log = StepLog()
    for request in range(2):
        gen = speculative_generate(
            model, PROMPT, GenerateOptions(max_tokens=8), drafter=PromptLookup(), policy=DraftPolicy.fixed(3)
        )
        list(gen)
        for record in gen.log:
            log.append(record.labelled(request=request, method="lookup"))
    frame = log.to_polars()
    assert frame.columns[-2:] == ["request", "method"] and "extra" not in frame.columns
    back = StepLog.load(log.save(tmp_path / "steps.parquet"))
    assert back.to_polars().equals(frame)
    assert [r.labels for r in back] == [r.labels for r in log] and back.records[-1].labels["request"] == 1
    with pytest.raises(ValueError, match="kind"):
        log.records[0].labelled(kind="other")
    with pytest.raises(TypeError, match="StepRecord"):
        log.append({"step": 0, "kind": "plain"})


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda m: generate(m, [], GenerateOptions()), "empty"),
        (lambda m: generate(m, [1, 2], GenerateOptions(max_tokens=0)), "max_tokens"),
        (lambda m: generate(m, [1, 2], GenerateOptions(max_tokens=-3)), "max_tokens"),
        (lambda m: generate(m, [1, 500], GenerateOptions()), "vocabulary"),
        (lambda m: generate(m, [-1], GenerateOptions()), "vocabulary"),
        (lambda m: generate(m, [1] * 2048, GenerateOptions()), "context"),
        (
            lambda m: speculative_generate(
                m, [1, 2], GenerateOptions(), drafter=PromptLookup(), policy=DraftPolicy.fixed(0)
            ),
            "draft length",
        ),
        (lambda m: generate(m, [1, 2], GenerateOptions(temperature=-1)), "temperature"),
        (lambda m: generate(m, [1, 2], GenerateOptions(verify="maybe")), "verify"),
        (lambda m: generate(m, "text", GenerateOptions()), "tokenizer"),
        (lambda m: DraftPolicy.parse("greedy"), "unknown policy"),
    ],
)
def test_bad_input_is_one_clear_error(call, message):
    model = build_tiny("llama")
    with pytest.raises(ValueError, match=message):
        call(model)


def test_non_trimmable_cache_is_a_clear_error():
    from mlx_lm.models.cache import ArraysCache

    model = build_tiny("llama")
    with pytest.raises(ValueError, match="cannot roll back"):
        speculative_generate(
            model, PROMPT, GenerateOptions(), drafter=PromptLookup(), prompt_cache=[ArraysCache(2), ArraysCache(2)]
        )


def _linear_profile(model, slope: float) -> Profile:
    """A cost profile with c(w) = 1 + slope (w - 1) in both verify modes."""
    widths = list(range(1, 10))
    costs = [1 + slope * (w - 1) for w in widths]
    return Profile(
        model="m",
        name="m",
        device="cpu",
        versions={},
        plain_step_s=0.01,
        widths={"exact": widths, "fast": widths},
        costs={"exact": costs, "fast": costs},
        seconds={"exact": costs, "fast": costs},
    )


def test_auto_shortens_drafts_that_cannot_pay():
    """Auto drafts only lengths whose full acceptance beats the verify cost of the profile it is handed."""
    model = build_tiny("llama")
    ref = plain_greedy(model, PROMPT, 30)

    def run(slope: float):
        drafter = ScriptedDrafter(ref, len(PROMPT), 97)
        profile = _linear_profile(model, slope)
        gen = speculative_generate(
            model, PROMPT, GenerateOptions(max_tokens=30), drafter=drafter, policy=DraftPolicy.auto(), profile=profile
        )
        assert list(gen) == ref
        return gen

    # c(w) = 1 + 1.5 (w - 1): k tokens pay only if k + 1 > 1 + 1.5 k, never.
    gen = run(1.5)
    assert gen.stats()["verifies"] == 0 and gen.stats()["pauses"] == 29
    # c(w) = 1 + 0.5 (w - 1): every length pays when accepted: it speculates (how long, its timings decide).
    gen = run(0.5)
    assert gen.stats()["verifies"] >= 2


def test_auto_is_handed_its_break_even_and_never_measures(fresh_calibrations):
    """A policy never runs the model: without a break-even Auto refuses to start; speculative_generate
    measures a missing profile once, before the first token, and says so."""
    model = build_tiny("llama")
    ref = plain_greedy(model, PROMPT, 12)
    with pytest.raises(ValueError, match="break-even"):
        list(
            Generation(model, PROMPT, GenerateOptions(max_tokens=12), drafter=PromptLookup(), policy=DraftPolicy.auto())
        )
    said: list[str] = []
    gen = speculative_generate(
        model,
        PROMPT,
        GenerateOptions(max_tokens=12),
        drafter=ScriptedDrafter(ref, len(PROMPT), 97),
        progress=said.append,
    )
    assert any("measur" in s for s in said) and len(gen.log) == 0  # measured up front, not inside the run
    before = list(said)
    assert list(gen) == ref and said == before


def test_expert_counts_in_the_log():
    model = build_tiny("qwen3_moe")
    ref = plain_greedy(model, PROMPT, 20)
    drafter = ScriptedDrafter(ref, len(PROMPT), 97)
    gen = speculative_generate(
        model, PROMPT, GenerateOptions(max_tokens=20, count_experts=True), drafter=drafter, policy=DraftPolicy.fixed(4)
    )
    assert list(gen) == ref
    for r in gen.log:
        counts = r.extra["experts"]
        assert len(counts) == 2
        # top-2 of 8 experts: a 1-row step touches exactly 2, a width-w verify 2..min(8, 2w)
        width = r.verify_width if r.kind != "prefill" else len(PROMPT)
        assert all(min(2, 8) <= c <= min(8, 2 * width) for c in counts)
    assert any(max(r.extra["experts"]) > 2 for r in gen.log if r.kind == "verify")
    off = speculative_generate(
        model,
        PROMPT,
        GenerateOptions(max_tokens=5),
        drafter=ScriptedDrafter(ref, len(PROMPT), 97),
        policy=DraftPolicy.fixed(2),
    )
    list(off)
    assert all(not r.extra for r in off.log)


def test_prompt_cache_holding_a_prefix_is_extended():
    """A cache that already holds the prompt's history is prefilled only with the new part."""
    from mlx_lm.models.cache import make_prompt_cache

    model = build_tiny("llama")
    history = PROMPT[:9]
    cache = make_prompt_cache(model)
    model(mx.array([history]), cache=cache)
    gen = speculative_generate(
        model,
        PROMPT,
        GenerateOptions(max_tokens=20),
        drafter=PromptLookup(),
        policy=DraftPolicy.fixed(3),
        prompt_cache=cache,
    )
    assert list(gen) == plain_greedy(model, PROMPT, 20)
    assert gen.stats()["cached_prompt_tokens"] == 9
    # A cache holding at least the prompt's length is a context the prompt continues.
    context = make_prompt_cache(model)
    model(mx.array([PROMPT]), cache=context)
    continued = generate(model, PROMPT[-3:], GenerateOptions(max_tokens=5), prompt_cache=context)
    assert list(continued) == plain_greedy(model, PROMPT + PROMPT[-3:], 5)


def test_observe_seconds_are_the_drafters_own():
    """``stats()["observe_s"]`` is the time spent in ``drafter.observe``: zero without a drafter, and at least
    what a drafter that sleeps in ``observe`` slept."""
    import time

    class SlowObserver(PromptLookup):
        def observe(self, tokens, hidden=None):
            time.sleep(0.002)
            super().observe(tokens, hidden)

    model = build_tiny("llama")
    prompt = [1, 2, 3, 4, 1, 2, 3]
    options = GenerateOptions(max_tokens=6)
    plain = generate(model, prompt, options)
    list(plain)
    assert plain.stats()["observe_s"] == 0.0
    gen = speculative_generate(model, prompt, options, drafter=SlowObserver(), policy=DraftPolicy.fixed(2))
    list(gen)
    calls = sum(1 for r in gen.log.records if r.emitted)
    assert gen.stats()["observe_s"] >= 0.002 * calls


class QueueWatch:
    """The plain steps the target queued (``queued``, positions in order) and, per output position, the
    furthest one queued when the drafter observed that token (``ahead_at``)."""

    def __init__(self):
        self.queued: list[int] = []
        self.ahead_at: dict[int, int] = {}


@pytest.fixture
def watch(monkeypatch) -> QueueWatch:
    from specbench.core import target as target_module

    watch = QueueWatch()
    original = target_module.ModelTarget._plain_step

    def spy(self, y, position):
        watch.queued.append(position)
        return original(self, y, position)

    monkeypatch.setattr(target_module.ModelTarget, "_plain_step", spy)
    return watch


class Watching(ScriptedDrafter):
    """A scripted drafter filling ``watch.ahead_at`` as it observes tokens."""

    def __init__(self, watch: QueueWatch, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.watch = watch

    def begin(self, prompt, hidden=None):
        self.seen = 0

    def observe(self, tokens, hidden=None):
        self.seen += len(tokens)
        self.watch.ahead_at[self.seen - 1] = max(self.watch.queued, default=-1)


def test_pauses_keep_the_plain_pipeline_full(watch):
    """A paused stretch that more tokens follow queues the step after its last one before that token is read,
    as inside a stretch; the next speculative step takes that token first. Output stays plain greedy."""
    model = build_tiny("llama")
    ref = plain_greedy(model, PROMPT, 60)
    drafter = Watching(watch, ref, len(PROMPT), 97, wrong_at=lambda step, i: True)
    gen = speculative_generate(
        model, PROMPT, GenerateOptions(max_tokens=60), drafter=drafter, policy=DraftPolicy.adaptive(3)
    )
    assert list(gen) == ref
    records = gen.log.records
    ends = [r.position for r, after in zip(records, records[1:]) if r.kind == "plain" and r.paused and not after.paused]
    assert len(ends) >= 4  # pauses of 1, 2, 4, 8 ... steps, each followed by a speculative step
    assert all(watch.ahead_at[p] >= p + 1 for p in ends)
    for r, after in zip(records, records[1:]):
        if r.position in ends:  # the queued step's token, logged on the way to the verification
            assert after.kind == "plain" and not after.paused and after.k_requested == 3


def test_a_draft_that_does_not_come_keeps_the_plain_pipeline_full(watch):
    """When the drafter has nothing to propose, the plain step taken instead queues the step after it before
    its token is read, as a stretch does, so drafters that often find no match never drain the pipeline."""

    class Sometimes(Watching):
        """Drafts the truth on even output positions and nothing on odd ones."""

        def draft(self, context, k):
            return Draft([]) if (len(context) - self.prompt_len) % 2 else super().draft(context, k)

    model = build_tiny("llama")
    ref = plain_greedy(model, PROMPT, 40)
    drafter = Sometimes(watch, ref, len(PROMPT), 97)
    gen = speculative_generate(
        model, PROMPT, GenerateOptions(max_tokens=40), drafter=drafter, policy=DraftPolicy.fixed(2)
    )
    assert list(gen) == ref
    undrafted = [r.position for r in gen.log.records if r.kind == "plain" and r.k_requested and r.draft_s]
    assert len(undrafted) >= 5
    assert all(watch.ahead_at[p] >= p + 1 for p in undrafted if p < 39)  # the next step was queued before p was read


@pytest.mark.parametrize("verify", ["exact", "fast"])
def test_a_rejected_probe_leaves_the_next_plain_step_queued(watch, verify):
    """Auto's probes of a drafter that is always wrong: while each verifies, the plain step after its full
    rejection is queued, so the stretch after it goes on without a pipeline restart. Output stays greedy.
    The policy's clock ticks a second per reading: every decision takes as long, so each rejected probe
    (one token) is dearer per token than the plain stretch before it and pauses, whatever the machine's load."""
    model = build_tiny("llama")
    ref = plain_greedy(model, PROMPT, 80)
    drafter = Watching(watch, ref, len(PROMPT), 97, wrong_at=lambda step, i: True)
    ticks = itertools.count()
    policy = DraftPolicy.auto(pause_tokens=8, break_even=1.0, measured=True, clock=lambda: float(next(ticks)))
    gen = speculative_generate(
        model, PROMPT, GenerateOptions(max_tokens=80, verify=verify), drafter=drafter, policy=policy
    )
    assert list(gen) == ref
    probes = [r.position for r in gen.log.records if r.kind == "verify"]
    assert len(probes) >= 1 and all(r.accepted == 0 for r in gen.log.records if r.kind == "verify")
    assert all(watch.ahead_at[p] >= p + 1 for p in probes)  # queued before the verification's token was read


@pytest.mark.parametrize("verify", ["exact", "fast"])
def test_a_probe_accepted_after_all_drops_the_step_it_queued(monkeypatch, verify):
    """A probe whose drafts are accepted: the step queued for a full rejection is dropped and the caches are
    the verification's, rolled back as usual. Output stays greedy, every probe's queue taken back."""
    from specbench.core import target as target_module

    outcomes = []
    original = target_module.ModelTarget._queue_rejected

    def spy(self, logits, drafted, position):
        queued = original(self, logits, drafted, position)
        outcomes.append(queued is not None)
        return queued

    monkeypatch.setattr(target_module.ModelTarget, "_queue_rejected", spy)
    model = build_tiny("qwen3")
    ref = plain_greedy(model, PROMPT, 60)
    # right on the first draft position only: every verification accepts one token and rejects the rest
    drafter = ScriptedDrafter(ref, len(PROMPT), 97, wrong_at=lambda step, i: i > 0)
    policy = DraftPolicy.auto(pause_tokens=8, break_even=1.0, measured=True)
    gen = speculative_generate(
        model, PROMPT, GenerateOptions(max_tokens=60, verify=verify), drafter=drafter, policy=policy
    )
    assert list(gen) == ref
    assert outcomes and all(outcomes)
    assert all(r.accepted >= 1 for r in gen.log.records if r.kind == "verify")


@pytest.mark.parametrize("verify", ["exact", "fast"])
@pytest.mark.parametrize("right", [0, 1, 2, 3])
def test_a_queued_rejection_leaves_the_target_as_the_verification_alone_would(verify, right):
    """A 3-token draft right on its first ``right`` positions, verified with the full rejection's step queued:
    the tokens, the plain steps after it and the caches' length are those of plain greedy decoding."""
    from specbench.core.draft import Draft
    from specbench.core.options import checked_options
    from specbench.core.target import ModelTarget, Pipeline
    from specbench.exact import verifier_for

    model = build_tiny("qwen3")
    ref = plain_greedy(model, PROMPT, 12)
    options = checked_options(GenerateOptions(max_tokens=12, verify=verify))
    target = Pipeline(ModelTarget(model, options, verifier_for(model, verify), speculative=True), 12)
    with target.running():
        assert target.prefill(PROMPT, 0)[0].tokens == ref[:1]
        draft = [t if i < right else (t + 1) % 97 for i, t in enumerate(ref[1:4])]
        step = target.verify(Draft(draft), 1, probing=True)
        assert step.tokens == ref[1 : right + 2] and step.accepted == right
        after = right + 2
        rest = [s.tokens[0] for s in target.plain_steps(after, 12 - after)]
    assert rest == ref[after:]
    assert {c.offset for c in target.inner.cache} == {len(PROMPT) + 11}
