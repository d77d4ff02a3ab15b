"""Auto decides from what its generation measures: synthetic step logs and a fake clock, then a tiny model."""

from __future__ import annotations

import itertools
import time

import pytest

from specbench.core.log import StepLog, StepRecord
from specbench.core.policies import AutoPolicy, DraftPolicy


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Drafter:
    preferred_k = 4
    name = "synthetic"


def run(policy: AutoPolicy, clock: FakeClock, tokens: int, plain_s: float, spec_s, accepted, break_even=None):
    """Drive ``policy`` through a synthetic generation of ``tokens`` tokens: a plain step costs
    ``plain_s`` seconds, a verification of k drafts ``spec_s(k)`` and accepts ``accepted(k, step)``."""
    log = StepLog()
    policy.start(Drafter(), break_even or (lambda k: 1.0 + 0.25 * k))
    log.append(StepRecord(step=0, position=0, kind="prefill", emitted=1, verify_s=0.1))
    clock.now += 0.1
    done, step = 1, 0
    while done < tokens:
        k = policy.next_k(log, Drafter())
        if k == 0:
            for _ in range(min(policy.plain_run(), tokens - done)):
                clock.now += plain_s
                log.append(StepRecord(step=len(log), position=done, kind="plain", emitted=1, verify_s=plain_s))
                done += 1
        else:
            a = min(accepted(k, step), k)
            clock.now += spec_s(k)
            record = StepRecord(
                step=len(log), position=done, kind="verify", k_requested=k, k_drafted=k, accepted=a, emitted=a + 1
            )
            record.verify_s = spec_s(k)
            log.append(record)
            done += a + 1
            step += 1
    return log


def kinds(log: StepLog) -> list[str]:
    return [r["kind"] for r in log.records[1:]]


def prior(k: int) -> float:
    """The break-even the synthetic runs hand Auto: a k-draft step costs 1 + k/4 plain steps."""
    return 1.0 + 0.25 * k


def test_auto_falls_back_to_plain_when_its_speculative_seconds_per_token_exceed_plain():
    clock = FakeClock()
    policy = DraftPolicy.auto(clock=clock, pause_tokens=32)
    # Measured, a step costs 2.5x what the prior says, and yields 2 tokens: never worth it.
    log = run(policy, clock, 200, plain_s=0.004, spec_s=lambda k: 0.01 * prior(k), accepted=lambda k, s: 1)
    assert policy.plain_seconds_per_token() == pytest.approx(0.004)
    assert kinds(log)[:8] == ["plain"] * 8  # plain decoding timed first
    verifies = kinds(log).count("verify")
    assert policy.pauses >= 2 and verifies <= 2 * policy.pauses + 2  # each probe: min_verifies steps
    assert kinds(log).count("plain") > 170


def test_auto_keeps_speculating_when_measured_cheaper_per_token():
    clock = FakeClock()
    policy = DraftPolicy.auto(clock=clock)
    log = run(policy, clock, 300, plain_s=0.004, spec_s=lambda k: 0.002 * prior(k), accepted=lambda k, s: k)
    assert policy.pauses == 0
    assert kinds(log).count("plain") == policy.probe_tokens  # the one plain stretch, which timed plain decoding
    assert policy.k == 8  # every draft accepted: drafts lengthened to the longest
    assert policy.speculative_seconds_per_token() < policy.plain_seconds_per_token()


def test_prior_would_pause_but_measurement_keeps_speculating():
    """The profile's break-even says drafting costs 4.5 plain steps, yet measured a step costs 1.5."""
    clock = FakeClock()
    policy = DraftPolicy.auto(clock=clock)
    run(policy, clock, 200, plain_s=0.004, spec_s=lambda k: 0.006, accepted=lambda k, s: 1, break_even=lambda k: 4.5)
    assert policy.k >= 4 and policy.pauses == 0


def test_auto_probes_speculation_again_after_the_pause_and_pauses_grow():
    clock = FakeClock()
    policy = DraftPolicy.auto(clock=clock, pause_tokens=16, max_pause_tokens=64)
    # Speculation fails for the first 12 verifications, then the workload turns repetitive.
    log = run(policy, clock, 700, 0.004, lambda k: 0.004 * prior(k), accepted=lambda k, s: 0 if s < 12 else k)
    pauses = [len(list(g)) for kind, g in itertools.groupby(kinds(log)) if kind == "plain"]
    assert pauses[:6] == [8, 16, 32, 64, 64, 64]  # the plain probe, then doubling pauses
    tail = kinds(log)[-40:]
    assert tail.count("verify") == len(tail)  # it speculates again once that pays
    assert policy.pause == 16  # a window that paid resets the pause


def test_auto_takes_a_wider_draft_that_costs_less_on_the_envelope():
    # dense H200 shape: a 9-row verify is cheaper than a 5-row one
    curve = {1: 1.9, 2: 2.6, 3: 3.2, 4: 4.0, 5: 4.6, 6: 5.0, 7: 5.4, 8: 3.3}
    policy = DraftPolicy.auto(measured=False)
    policy.start(Drafter(), curve.__getitem__)
    assert policy.envelope == [1, 2, 3, 8]
    assert policy.k == 8  # the preferred 4 moved onto the envelope
    # measured: lengths come from the envelope only, the longest once drafts are accepted
    clock = FakeClock()
    policy = DraftPolicy.auto(clock=clock)
    log = run(policy, clock, 200, 0.004, lambda k: 0.003 * curve[k], lambda k, s: k, break_even=curve.__getitem__)
    ks = [r["k_requested"] for r in log if r["kind"] == "verify"]
    assert set(ks) <= {1, 2, 3, 8} and ks[-1] == 8
    # where every wider draft costs more the preferred length stays
    policy = DraftPolicy.auto(measured=False)
    policy.start(Drafter(), lambda k: 1.0 + 0.3 * k)
    assert policy.k == 4 and policy.envelope == list(range(1, 9))
    # a length even a full acceptance cannot pay for is left out; none at all: plain throughout
    policy = DraftPolicy.auto(clock=clock)
    policy.start(Drafter(), lambda k: k + 1.5)
    assert policy.k == 0 and policy.next_k(StepLog(), Drafter()) == 0 and policy.plain_run() > 10**6


def test_auto_moves_along_the_envelope_with_measured_acceptance():
    clock = FakeClock()
    curve = {k: 1.2 + 0.2 * k for k in range(1, 9)}
    policy = DraftPolicy.auto(clock=clock)
    log = run(policy, clock, 200, 0.004, lambda k: 0.003 * curve[k], lambda k, s: k, break_even=curve.__getitem__)
    ks = [r["k_requested"] for r in log if r["kind"] == "verify"]
    assert ks[0] <= 2 and ks[-1] == 8 and ks == sorted(ks)  # short first, longer as drafts are accepted
    policy = DraftPolicy.auto(clock=clock)
    run(policy, clock, 200, 0.004, lambda k: 0.003 * curve[k], lambda k, s: s % 2, break_even=curve.__getitem__)
    assert policy.k <= 2  # every other draft rejected at once: short drafts


def test_with_break_even_rule_tokens_are_held_to_their_break_even():
    """measured=False (the default with a fixed break-even): tokens vs break-even over a window."""
    clock = FakeClock()
    policy = DraftPolicy.auto(window=4, pause_tokens=5, break_even=1.5)
    assert not policy.measured
    log = run(policy, clock, 60, plain_s=0.004, spec_s=lambda k: 0.001, accepted=lambda k, s: 0)
    assert kinds(log)[:9] == ["verify"] * 4 + ["plain"] * 5
    assert policy.k == 4  # the preferred length: acceptance only moves k when measured


def test_untimed_steps_are_costed_by_the_prior():
    """A simulated run (all timings 0) runs the same switch, with the prior as its clock."""
    clock = FakeClock()
    policy = DraftPolicy.auto(clock=clock, pause_tokens=16)
    log = run(policy, clock, 100, plain_s=0.0, spec_s=lambda k: 0.0, accepted=lambda k, s: 0)
    runs = [(kind, len(list(g))) for kind, g in itertools.groupby(kinds(log))]
    assert runs[:3] == [("plain", 8), ("verify", 3), ("plain", 16)]
    policy = DraftPolicy.auto(clock=clock)
    log = run(policy, clock, 100, plain_s=0.0, spec_s=lambda k: 0.0, accepted=lambda k, s: k)
    assert policy.pauses == 0 and policy.k == 8


def test_auto_rejects_bad_settings():
    with pytest.raises(ValueError, match="probe_tokens"):
        DraftPolicy.auto(probe_tokens=0)
    with pytest.raises(TypeError, match="clock"):
        DraftPolicy.auto(clock=3)
    with pytest.raises(TypeError):
        DraftPolicy.auto(speed=2)


def test_policies_say_the_longest_draft_they_may_ask():
    assert DraftPolicy.fixed(3).longest_draft(Drafter()) == 3
    assert DraftPolicy.adaptive(6).longest_draft(Drafter()) == 6
    assert DraftPolicy.auto().longest_draft(Drafter()) == 8
    assert DraftPolicy.auto(max_k=2).longest_draft(Drafter()) == 2


def test_always_wrong_drafter_drives_auto_to_plain_and_output_stays_exact():
    from conftest import ScriptedDrafter, build_tiny, plain_greedy

    from specbench import GenerateOptions, speculative_generate

    model = build_tiny("llama", seed=5)
    prompt = [3, 14, 15, 9, 26, 5, 35]
    truth = plain_greedy(model, prompt, 120)
    drafter = ScriptedDrafter(truth, len(prompt), 97, wrong_at=lambda step, i: True)
    drafter.preferred_k = 4

    def slow_draft(context, k, draft=drafter.draft):
        time.sleep(0.002)  # a drafter that costs something, as real ones do
        return draft(context, k)

    drafter.draft = slow_draft
    # the prior says drafting always pays: only the measurement can stop it
    policy = DraftPolicy.auto(pause_tokens=16, break_even=1.0, measured=True)
    gen = speculative_generate(model, prompt, GenerateOptions(max_tokens=120), drafter, policy, progress=None)
    assert list(gen) == truth
    records = gen.log.records
    verifies = [r for r in records if r["kind"] == "verify"]
    paused = [r for r in records if r["kind"] == "plain" and r["paused"]]
    assert policy.pauses >= 2 and len(paused) > 80
    assert len(verifies) <= 4 * (policy.pauses + 1)
