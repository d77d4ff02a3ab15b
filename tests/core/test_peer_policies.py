"""Other engines' draft-length policies: each one's decisions on constructed step logs."""

from __future__ import annotations

import itertools

import pytest

from specbench.core.draft import Draft, Drafter
from specbench.core.log import StepLog, StepRecord
from specbench.core.peer_policies import ConfidencePolicy, OllamaControllerPolicy, SglangEmaPolicy, VllmTablePolicy
from specbench.core.policies import DraftPolicy, Plain, Speculate
from specbench.core.policy_args import MAX_DRAFT_LENGTH
from specbench.simulate.simulate import Recorded, simulate


def _verify(k: int, accepted: int) -> StepRecord:
    return StepRecord(step=0, position=0, kind="verify", k_drafted=k, accepted=accepted)


def _plain(paused: bool = True) -> StepRecord:
    return StepRecord(step=0, position=0, kind="plain", paused=paused)


def test_vllm_table_looks_up_the_batch_size_with_gaps_inheriting_and_k_clamped():
    policy = DraftPolicy.parse("vllm:1-16=3,64-128=2,256-4096=0")
    assert isinstance(policy, VllmTablePolicy)
    assert [policy.k_at(b) for b in (1, 16, 17, 63, 64, 200, 256, 9999)] == [3, 3, 3, 3, 2, 2, 0, 0]
    clamped = VllmTablePolicy({"1-8": 6, 9: 4}, max_k=5)
    assert [clamped.k_at(b) for b in (1, 8, 9)] == [5, 5, 4]
    policy.start(Drafter())
    policy.set_batch_size(64)
    assert policy.decide(StepLog(), Drafter()) == Speculate(2)
    policy.set_batch_size(300)
    assert isinstance(policy.decide(StepLog(), Drafter()), Plain)
    assert DraftPolicy.parse(policy.name).table == policy.table
    with pytest.raises(ValueError, match="vllm:B=K"):
        DraftPolicy.parse("vllm:1-16")


def test_sglang_ema_moves_tiers_up_and_down_by_its_thresholds():
    policy = SglangEmaPolicy({1: (1, 3, 5, 7)}, initial=3, ema_alpha=1.0, update_interval=1, warmup_batches=0)
    log, drafter = StepLog(), Drafter()
    policy.start(drafter)
    assert policy.decide(log, drafter) == Speculate(3)
    log.append(_verify(3, 3))  # EMA 3 > 3 - 0.5 but not 5 - 0.5: up one tier
    assert policy.decide(log, drafter) == Speculate(5)
    log.append(_verify(5, 5))  # EMA 5 > 4.5: up to 7
    assert policy.decide(log, drafter) == Speculate(7)
    log.append(_verify(7, 0))  # EMA 0: at most 5 - 0.75, 3 - 0.75 and 1 - 0.75: down to 1
    assert policy.decide(log, drafter) == Speculate(1)


def test_sglang_ema_smooths_waits_out_warmup_and_probes_back_from_tier_zero():
    policy = SglangEmaPolicy({1: (0, 1, 3)}, initial=1, update_interval=2, warmup_batches=2, down_hysteresis=0.0)
    log, drafter = StepLog(), Drafter()
    policy.start(drafter)
    for _ in range(2):  # warmup: no tier change whatever the acceptance
        log.append(_verify(1, 0))
        assert policy.decide(log, drafter) == Speculate(1)
    assert policy.slot.ema == pytest.approx(0.0 * 0.8 * 0.8)  # started at 1 - 1 = 0
    log.append(_verify(1, 0))
    assert policy.decide(log, drafter) == Speculate(1)  # not an update batch
    log.append(_verify(1, 0))  # batch 4: EMA 0 <= 0.5: tier 0
    decision = policy.decide(log, drafter)
    assert decision == Plain(2)  # plain until the next recomputation
    log.append(_plain())
    log.append(_plain())
    assert policy.decide(log, drafter) == Speculate(1)  # the next tier probed


def test_sglang_slots_follow_the_batch_size():
    policy = SglangEmaPolicy()
    policy.start(Drafter())
    assert policy.decide(StepLog(), Drafter()) == Speculate(5)  # the middle of 1, 3, 5, 7
    policy.set_batch_size(64)
    assert isinstance(policy.decide(StepLog(), Drafter()), Plain)


PAST_THE_BOUND = [
    ("vllm text", lambda: DraftPolicy.parse("vllm:1=1000")),
    ("vllm text, a later range", lambda: DraftPolicy.parse("vllm:1-16=3,64=129")),
    ("vllm table", lambda: VllmTablePolicy({"1-8": MAX_DRAFT_LENGTH + 1})),
    ("vllm max_k", lambda: VllmTablePolicy({1: 3}, max_k=MAX_DRAFT_LENGTH + 1)),
    ("sglang text", lambda: DraftPolicy.parse("sglang:1,3,1000")),
    ("sglang tiers", lambda: SglangEmaPolicy({1: (1, 3), 8: (0, MAX_DRAFT_LENGTH + 1)})),
    ("ollama text", lambda: DraftPolicy.parse(f"ollama:{MAX_DRAFT_LENGTH + 1}")),
    ("confidence text", lambda: DraftPolicy.parse(f"confidence:0.5:{MAX_DRAFT_LENGTH + 1}")),
]


@pytest.mark.parametrize("make", [c[1] for c in PAST_THE_BOUND], ids=[c[0] for c in PAST_THE_BOUND])
def test_peer_policies_refuse_a_draft_past_the_engines_bound_when_made(make):
    with pytest.raises(ValueError, match=rf"{MAX_DRAFT_LENGTH}"):
        make()


def test_peer_policies_at_the_bound_say_so_as_their_longest_draft():
    drafter = Drafter()
    assert DraftPolicy.parse(f"vllm:1={MAX_DRAFT_LENGTH},64=2").longest_draft(drafter) == MAX_DRAFT_LENGTH
    assert DraftPolicy.parse(f"sglang:0,{MAX_DRAFT_LENGTH}").longest_draft(drafter) == MAX_DRAFT_LENGTH
    assert DraftPolicy.parse(f"ollama:{MAX_DRAFT_LENGTH}").longest_draft(drafter) == MAX_DRAFT_LENGTH
    assert DraftPolicy.parse(f"confidence:0.5:{MAX_DRAFT_LENGTH}").longest_draft(drafter) == MAX_DRAFT_LENGTH


def _brute_force_best(rates: list[float], costs: dict[int, float], max_k: int) -> int:
    def value(k: int) -> float:
        survive = [1.0, *itertools.accumulate(rates[:k], lambda a, b: a * b)]
        return sum(survive) / (costs[k] if k else 1.0)

    return max(range(max_k + 1), key=lambda k: (value(k), -k))


@pytest.mark.parametrize("costs", [{k: 1.0 + 0.1 * k for k in range(1, 5)}, {k: 1.0 + 0.5 * k for k in range(1, 5)}])
def test_ollama_controller_takes_the_argmax_of_expected_tokens_per_cost(costs):
    # accepted 0, 1, 2 and 4 of 4: position 1 accepted 3 of 4 times, 2 2 of 3, 3 1 of 2, 4 1 of 1
    log, drafter = StepLog(), Drafter()
    policy = OllamaControllerPolicy(max_k=4, prior=0.0)
    policy.start(drafter, lambda k: costs[k])
    for accepted in (0, 1, 2, 4):
        log.append(_verify(4, accepted))
    rates = [3 / 4, 2 / 3, 1 / 2, 1 / 1]
    decision = policy.decide(log, drafter)
    assert policy.acceptance.rates() == pytest.approx(rates)
    best = _brute_force_best(rates, costs, 4)
    assert decision == (Speculate(best) if best else Plain(policy.backoff))
    assert best == (4 if costs[1] == 1.1 else 1)  # cheap verifications pay for the whole draft, dear ones for one


def test_ollama_controller_backs_off_then_probes_and_keeps_its_evidence():
    log, drafter = StepLog(), Drafter()
    policy = DraftPolicy.parse("ollama:4")
    policy.start(drafter, lambda k: 1.0 + 0.6 * k)
    for _ in range(6):
        log.append(_verify(4, 0))
    assert policy.decide(log, drafter) == Plain(policy.backoff)
    for _ in range(policy.backoff):
        log.append(_plain())
    assert isinstance(policy.decide(log, drafter), Speculate)  # the probe
    trials = list(policy.acceptance.trials)
    policy.start(drafter, lambda k: 1.0 + 0.6 * k)  # a new generation: the evidence persists
    assert policy.acceptance.trials == trials


class _Confident(Drafter):
    """Drafts the recorded output with a given confidence per position."""

    name = "confident"

    def __init__(self, output: list[int], prompt_len: int, confidence: list[float]):
        self.output, self.prompt_len, self.confidence = output, prompt_len, confidence

    def draft(self, context, k):
        start = len(context) - self.prompt_len
        tokens = self.output[start : start + k]
        return Draft(tokens, confidence=self.confidence[: len(tokens)])


def test_confidence_threshold_cuts_the_draft_where_the_drafter_doubts():
    prompt, output = [1, 2, 3], list(range(10, 40))
    request = Recorded(prompt, output, "length")
    drafter = _Confident(output, len(prompt), [0.95, 0.9, 0.4, 0.99, 0.99, 0.99])
    log = simulate([request], drafter, DraftPolicy.parse("confidence:0.5:6"))
    verifies = [r for r in log.records if r.kind == "verify"]
    assert verifies and {r.k_drafted for r in verifies[:-1]} == {2}
    assert all(r.accepted == r.k_drafted for r in verifies)
    whole = simulate([request], drafter, ConfidencePolicy(0.3, 6))
    assert max(r.k_drafted for r in whole.records if r.kind == "verify") == 6
    assert isinstance(DraftPolicy.parse("confidence"), ConfidencePolicy)
