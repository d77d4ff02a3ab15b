"""Batched decoding: every request's output equals its own single-request plain greedy output, whatever
the batch composition and acceptances (hybrid models included); stops, lengths and joins per request;
sampling lossless on a batch; caches without a rollback per row refused before any model work."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from conftest import QWEN3_NEXT, ScriptedDrafter, build, build_tiny, word_tokenizer

from specbench import Draft, Drafter, DraftPolicy, GenerateOptions, PromptLookup, generate
from specbench.checks.lossless import histogram_test, lossless_verdict, well_filled_share
from specbench.core.batch import BatchGeneration, generate_batch
from specbench.core.batch_policies import BatchAutoPolicy, BatchTablePolicy
from specbench.decoding import speculative_generate_batch

PROMPTS = [[5, 17, 3], [9, 5, 17, 3, 9, 5, 17], [44, 2, 8, 5, 17], [3, 9], [8, 8, 5, 17, 44, 2], [17, 3, 9, 5]]
VOCAB = 97


def single_greedy(model, prompts, max_tokens, **options):
    return [list(generate(model, p, GenerateOptions(max_tokens=max_tokens, **options))) for p in prompts]


def cycling(row: int, k: int):
    """Row r's draft is wrong at position (r + step) mod (k + 1): in one step rows accept 0..k."""
    return lambda step, i: i == (row + step) % (k + 1)


@pytest.mark.parametrize("arch", ["llama", "qwen3", "qwen3_moe"])
def test_batched_speculative_greedy_equals_single_plain(arch):
    model = build_tiny(arch)
    k, n = 4, 12
    truth = single_greedy(model, PROMPTS, n)
    drafters = [ScriptedDrafter(truth[r], len(p), VOCAB, cycling(r, k)) for r, p in enumerate(PROMPTS)]
    # Five slots for six requests: the sixth joins when the first finishes; one request has a shorter
    # length and one stops on a token mid-run.
    stop = next(t for i, t in enumerate(truth[2]) if i >= 3 and t not in truth[2][:i])
    options = [GenerateOptions(max_tokens=n) for _ in PROMPTS]
    options[1] = GenerateOptions(max_tokens=7)
    options[2] = GenerateOptions(max_tokens=n, stop_token_ids=[stop])
    gen = BatchGeneration(model, PROMPTS, options, drafters, DraftPolicy.fixed(k), max_batch=5)
    out = gen.run()
    expected = [list(t) for t in truth]
    expected[1] = truth[1][:7]
    expected[2] = truth[2][: truth[2].index(stop) + 1]
    assert out == expected
    assert [r.finish_reason() for r in gen.requests] == ["length", "length", "stop", "length", "length", "length"]
    first = gen.batch_log[0]
    assert first.batch_size == 5 and first.widths == [k + 1] * 5
    accepted_first = [r.log.records[1].accepted for r in gen.requests[:5]]
    assert sorted(accepted_first) == list(range(k + 1))
    assert gen.requests[5].log.records[0].kind == "prefill"
    assert max(s.batch_size for s in gen.batch_log[1:] if 5 in s.requests) <= 5
    assert any(5 in s.requests for s in gen.batch_log)
    stats = gen.requests[0].stats()
    assert stats["tokens"] == n and stats["accepted"] > 0 and stats["finish_reason"] == "length"


def test_ragged_drafts_and_lookup_at_batch_eight():
    model = build_tiny("qwen3")
    prompts = [p * 2 for p in PROMPTS] + [[7, 7, 7], [1, 2, 3, 1, 2, 3, 1]]
    truth = single_greedy(model, prompts, 10)
    # Every row drafts its own length (0 .. 5), and a prompt-lookup drafter that often proposes nothing.
    drafters = [PromptLookup() if r % 2 else ScriptedDrafter(truth[r], len(p), VOCAB) for r, p in enumerate(prompts)]
    policies = [DraftPolicy.fixed(1 + r % 5) for r in range(len(prompts))]
    gen = BatchGeneration(model, prompts, GenerateOptions(max_tokens=10), drafters, policies)
    assert gen.run() == truth
    assert gen.batch_log[0].batch_size == 8
    assert len({tuple(s.widths) for s in gen.batch_log}) > 1


def test_plain_batch_equals_single_and_joins():
    model = build_tiny("llama")
    truth = single_greedy(model, PROMPTS, 9)
    gen = generate_batch(model, PROMPTS, GenerateOptions(max_tokens=9), max_batch=3)
    late = gen.add([4, 4, 6], GenerateOptions(max_tokens=4))
    assert gen.run() == truth + single_greedy(model, [[4, 4, 6]], 4)
    assert gen.requests[late].finish_reason() == "length"
    assert max(s.batch_size for s in gen.batch_log) == 3
    assert all(s.kind == "plain" for s in gen.batch_log)


def test_pipelined_plain_batch_keeps_stops_masks_and_joins():
    """Plain greedy rows are decoded a step ahead of reading them: a row that stops on EOS, on a stop
    string or at its length mid-stretch drops out without disturbing the others, min_tokens masks the
    step queued ahead, and waiting requests join the freed slots."""
    model, tokenizer = build_tiny("qwen3"), word_tokenizer()
    prompts = PROMPTS + [PROMPTS[0], [2, 4, 6, 8], [6, 5, 4]]
    truth = single_greedy(model, prompts, 12)
    eos = truth[0][2]
    word = tokenizer.decode([truth[1][4]]).strip()
    options = [
        GenerateOptions(max_tokens=12, eos_token_ids=[eos]),  # stops on EOS at its third token
        GenerateOptions(max_tokens=12, stop_strings=[word]),
        GenerateOptions(max_tokens=12, eos_token_ids=[eos], min_tokens=5),  # EOS masked while below 5 tokens
        GenerateOptions(max_tokens=3),
        *(GenerateOptions(max_tokens=12 - i) for i in range(len(PROMPTS) - 4)),
        GenerateOptions(max_tokens=12, eos_token_ids=[eos], min_tokens=2),  # EOS allowed at the step queued ahead
        *(GenerateOptions(max_tokens=12 - i) for i in range(2)),
    ]
    expected = [list(generate(model, p, o, tokenizer=tokenizer)) for p, o in zip(prompts, options)]
    gen = generate_batch(model, prompts, options, max_batch=4, tokenizer=tokenizer)
    assert gen.run() == expected
    assert len(expected[0]) == 3 and gen.requests[0].finish_reason() == "stop"
    assert len(expected[len(PROMPTS)]) == 3 and gen.requests[len(PROMPTS)].finish_reason() == "stop"
    assert all(s.kind == "plain" for s in gen.batch_log)
    assert sum(s.emitted for s in gen.batch_log) == sum(len(e) - 1 for e in expected)  # the first is the prefill's
    for request, tokens in zip(gen.requests, expected):
        assert [t for r in request.log for t in r.tokens] == tokens


@pytest.fixture
def queued_ahead(monkeypatch):
    """The ``ahead`` of every plain step the batch queues: 1 for a step queued before the one before it is read."""
    aheads = []
    original = BatchGeneration._queue_plain

    def spy(self, last, ahead):
        aheads.append(ahead)
        return original(self, last, ahead)

    monkeypatch.setattr(BatchGeneration, "_queue_plain", spy)
    return aheads


def test_paused_rows_decode_pipelined_and_resume_speculating(queued_ahead):
    """When every row's policy pauses (drafts keep failing), the batch decodes the pause's plain steps as plain
    batches do, each step queued before the one before it is read; the stretch ends where the shortest pause
    does, and the rows speculate again. Output stays each request's plain greedy output."""
    model = build_tiny("llama")
    prompts = PROMPTS[:3]
    truth = single_greedy(model, prompts, 40)
    drafters = [ScriptedDrafter(t, len(p), VOCAB, lambda step, i: True) for t, p in zip(truth, prompts)]
    gen = BatchGeneration(model, prompts, GenerateOptions(max_tokens=40), drafters, DraftPolicy.adaptive(3))
    assert gen.run() == truth
    kinds = [s.kind for s in gen.batch_log]
    assert kinds.count("verify") >= 4  # pauses of 1, 2, 4, 8 ... steps, each followed by a verification
    assert queued_ahead.count(1) >= 10  # steps of the pauses queued before the step before them was read
    paused = [r for request in gen.requests for r in request.log.records if r.kind == "plain" and r.paused]
    assert len(paused) >= 3 * 10


def test_rows_without_a_drafter_follow_the_paused_rows_stretch(queued_ahead):
    """A row decoding plainly (no drafter) beside a row whose policy pauses: the pause's steps are one
    pipelined stretch for both rows, not a step at a time."""
    model = build_tiny("llama")
    prompts = PROMPTS[:2]
    truth = single_greedy(model, prompts, 40)
    drafters = [ScriptedDrafter(truth[0], len(prompts[0]), VOCAB, lambda step, i: True), None]
    gen = BatchGeneration(model, prompts, GenerateOptions(max_tokens=40), drafters, DraftPolicy.adaptive(3))
    assert gen.run() == truth
    # pauses of 1, 2, 4, 8, 16 steps: within each, every step after the first queued before the one before it
    assert queued_ahead.count(1) >= 25  # 17 when a row without a drafter held every stretch to one step


class ProposesNothing(Drafter):
    name = "nothing"

    def draft(self, tokens, k):
        return []


def test_steps_where_no_row_drafts_are_pipelined(queued_ahead):
    """Rows whose drafters propose nothing (prompt lookup without a match): each such step is a plain step
    with the next one queued before it is read, as a single request queues it, not a synchronous step; rows
    finishing and waiting requests joining in between keep every output its own plain greedy output."""
    model = build_tiny("qwen3")
    lengths = [24, 9, 17, 24]
    options = [GenerateOptions(max_tokens=n) for n in lengths]
    truth = [list(generate(model, p, o)) for p, o in zip(PROMPTS[:4], options)]
    drafters = [ProposesNothing() for _ in range(4)]
    gen = BatchGeneration(model, PROMPTS[:4], options, drafters, DraftPolicy.fixed(3), max_batch=3)
    assert gen.run() == truth
    assert {s.kind for s in gen.batch_log} == {"plain"}
    # about every second step queued before the one before it was read; before, none was
    assert queued_ahead.count(1) >= len(gen.batch_log) // 3
    for request in gen.requests:
        decoded = [r for r in request.log.records if r.kind == "plain"]
        assert all(r.k_requested == 3 for r in decoded)  # each step logged with the draft it asked for


def test_min_tokens_and_eos_per_request():
    model = build_tiny("qwen3")
    truth = single_greedy(model, PROMPTS[:3], 8)
    eos = truth[0][1]
    options = [GenerateOptions(max_tokens=8, eos_token_ids=[eos], min_tokens=m) for m in (0, 4, 0)]
    expected = [list(generate(model, p, o)) for p, o in zip(PROMPTS[:3], options)]
    drafters = [PromptLookup() for _ in range(3)]
    assert BatchGeneration(model, PROMPTS[:3], options, drafters, DraftPolicy.fixed(3)).run() == expected


def test_stop_strings_per_request():
    model, tokenizer = build_tiny("llama"), word_tokenizer()
    truth = single_greedy(model, PROMPTS[:2], 10)
    word = tokenizer.decode([truth[0][3]]).strip()
    options = [GenerateOptions(max_tokens=10, stop_strings=[word]), GenerateOptions(max_tokens=10)]
    expected = [list(generate(model, p, o, tokenizer=tokenizer)) for p, o in zip(PROMPTS[:2], options)]
    drafters = [ScriptedDrafter(t, len(p), VOCAB) for t, p in zip(truth, PROMPTS[:2])]
    gen = BatchGeneration(model, PROMPTS[:2], options, drafters, DraftPolicy.fixed(3), tokenizer=tokenizer)
    assert gen.run() == expected
    assert gen.requests[0].finish_reason() == "stop" and len(expected[0]) <= 4


def test_batch_policies():
    table = BatchTablePolicy({1: 4, 4: 2, 8: 0})
    assert [table.k_at(b) for b in (1, 3, 4, 7, 8, 32)] == [4, 4, 2, 2, 0, 0]
    with pytest.raises(ValueError, match="batch size 1"):
        BatchTablePolicy({2: 3})
    assert table.longest_draft(None) == 4  # the table's longest, whatever the drafter prefers
    assert BatchTablePolicy({1: 0}).longest_draft(None) == 1
    with pytest.raises(ValueError, match=r"draft length 129 is over the longest draft specbench verifies \(128"):
        BatchTablePolicy({1: 4, 8: 129})
    auto = BatchAutoPolicy(lambda k, b: 1.0 + 0.4 * k * b)
    auto.start(ScriptedDrafter([], 0, VOCAB))
    assert auto.costs.lengths and auto.k > 0
    auto.set_batch_size(4)  # 1 + 1.6 k >= k + 1 for every k: no draft pays
    assert auto.costs.lengths == [] and auto.k == 0
    auto.set_batch_size(2)
    assert auto.costs.lengths and auto.k > 0
    model = build_tiny("llama")
    prompts = PROMPTS[:4]
    truth = single_greedy(model, prompts, 8)
    drafters = [ScriptedDrafter(t, len(p), VOCAB) for t, p in zip(truth, prompts)]
    gen = BatchGeneration(model, prompts, GenerateOptions(max_tokens=8), drafters, BatchTablePolicy({1: 3, 3: 0}))
    assert gen.run() == truth
    assert all(s.width == 1 for s in gen.batch_log if s.batch_size >= 3)
    drafters = [ScriptedDrafter(t, len(p), VOCAB) for t, p in zip(truth, prompts)]
    auto = BatchAutoPolicy(lambda k, b: 1.0 + 0.1 * k * b, probe_tokens=1)
    gen = BatchGeneration(model, prompts, GenerateOptions(max_tokens=8), drafters, auto)
    assert gen.run() == truth
    assert {r.policy.name for r in gen.requests} == {"auto-batch"} and any(s.width > 1 for s in gen.batch_log)


def test_bad_input():
    model = build_tiny("llama")
    with pytest.raises(ValueError, match="different verify modes .exact for requests 1; fast for requests 0"):
        speculative_generate_batch(
            model,
            PROMPTS[:2],
            [GenerateOptions(verify="fast"), GenerateOptions(verify="exact")],
            drafters=lambda i: PromptLookup(),
        )
    with pytest.raises(ValueError, match="one drafter per prompt"):
        BatchGeneration(model, PROMPTS[:2], None, PromptLookup())
    with pytest.raises(ValueError, match="3 entries for 2 prompts"):
        BatchGeneration(model, PROMPTS[:2], [GenerateOptions()] * 3)
    with pytest.raises(ValueError, match="no prompts"):
        generate_batch(model, [])
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        generate_batch(model, [[1, 2], [500]])


def test_hybrid_batched_speculative_greedy_equals_single_plain():
    """Gated DeltaNet layers (ArraysCache) roll back per row: each row keeps its own recorded state."""
    from specbench.cost.batch import measure_batch_profile

    model = build(QWEN3_NEXT)
    k, n, prompts = 3, 10, PROMPTS[:5]
    truth = single_greedy(model, prompts, n)
    drafters = [ScriptedDrafter(truth[r], len(p), 101, cycling(r, k)) for r, p in enumerate(prompts)]
    gen = BatchGeneration(model, prompts, GenerateOptions(max_tokens=n), drafters, DraftPolicy.fixed(k), max_batch=4)
    assert gen.run() == truth  # the fifth request joins when a slot frees
    assert sorted(r.log.records[1].accepted for r in gen.requests[:4]) == list(range(k + 1))
    assert generate_batch(model, prompts, GenerateOptions(max_tokens=n), max_batch=2).run() == truth
    profile = measure_batch_profile(model, (1, 2), widths=3, offset=6, repeats=1, warmup=0)
    assert profile.batch_sizes == [1, 2] and all(np.isfinite(c).all() for c in profile.costs.values())


def test_unbatchable_caches_are_refused_before_any_model_work(monkeypatch):
    """Caches with no rollback per row (here a sliding window's RotatingKVCache): one error naming the
    cache, from batched decoding, its profile and its benchmark, before the model runs."""
    from mlx_lm.models.cache import RotatingKVCache

    from specbench.bench.batch_bench import bench_batch
    from specbench.cost.batch import measure_batch_profile

    model = build_tiny("llama")
    model.make_cache = lambda: [RotatingKVCache(max_size=8) for _ in model.layers]
    calls = []
    forward = type(model).__call__
    monkeypatch.setattr(type(model), "__call__", lambda self, *a, **k: calls.append(1) or forward(self, *a, **k))
    for run in (
        lambda: generate_batch(model, PROMPTS[:2]),
        lambda: speculative_generate_batch(
            model, PROMPTS[:2], None, drafters=lambda i: PromptLookup(), policy=DraftPolicy.fixed(2)
        ),
        lambda: measure_batch_profile(model, (1, 2), widths=2),
        lambda: bench_batch(model, PROMPTS[:2], 2, "lookup", "fixed:2"),
    ):
        with pytest.raises(ValueError, match="RotatingKVCache.*speculative_generate"):
            run()
    assert calls == []


class FixedQDrafter(Drafter):
    """Drafts each token from one fixed distribution q (with q given): drafts are often but not
    always accepted, so both branches of the lossless rule run."""

    name = "fixed-q"

    def __init__(self, q: np.ndarray, seed: int):
        self.q, self.rows = q, mx.array(q.astype(np.float32))
        self.rng = np.random.default_rng(seed)

    def draft(self, context, k):
        tokens = [int(t) for t in self.rng.choice(len(self.q), size=k, p=self.q)]
        return Draft(tokens, mx.broadcast_to(self.rows, (k, len(self.q))))


def test_batched_sampling_is_lossless():
    model = build_tiny("qwen3")
    prompt, samples, n, temperature = [5, 17, 3, 9], 48, 6, 0.8
    q = np.array(mx.softmax(model(mx.array([prompt]))[0, -1] / temperature, axis=-1), dtype=np.float64) ** 0.5
    q /= q.sum()
    plain = [
        list(generate(model, prompt, GenerateOptions(max_tokens=n, temperature=temperature, seed=i, ignore_eos=True)))
        for i in range(samples)
    ]
    options = [
        GenerateOptions(max_tokens=n, temperature=temperature, seed=1000 + i, ignore_eos=True) for i in range(samples)
    ]
    gen = BatchGeneration(
        model,
        [prompt] * samples,
        options,
        lambda i: FixedQDrafter(q, i),
        DraftPolicy.fixed(3),
        max_batch=8,
    )
    spec = gen.run()
    accepted = sum(r.stats()["accepted"] for r in gen.requests)
    _, p_value, _ = histogram_test(plain, spec, permutations=500)
    verdict, reason = lossless_verdict(p_value, accepted, well_filled_share(plain, spec))
    assert verdict == "pass", reason
    # Seeded per request: the same request decodes the same in another batch composition.
    again = BatchGeneration(model, [prompt] * 3, options[:3], lambda i: FixedQDrafter(q, i), 3).run()
    assert again == spec[:3]
