"""Auto decides from what its generation measures: synthetic step logs and a fake clock, then a tiny model."""

from __future__ import annotations

import itertools
import random
import time

import pytest

from specbench.core.auto import Measured
from specbench.core.log import StepLog, StepRecord
from specbench.core.policies import AutoPolicy, DraftPolicy, Plain


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Drafter:
    preferred_k = 4
    name = "synthetic"


def run(
    policy: AutoPolicy,
    clock: FakeClock,
    tokens: int,
    plain_s: float,
    spec_s,
    right,
    break_even=None,
    draft_s=0.0,
    settle=False,
):
    """Drive ``policy`` through a synthetic generation of ``tokens`` tokens, as the decode loop does:
    a plain step costs ``plain_s`` seconds, a verification of k drafts ``spec_s(k)``, drafting
    ``draft_s``; the drafter's token at output position p is right when ``right(p)`` (a draft is
    accepted up to its first wrong token). Output token p is p; a wrong draft token is -1. With
    ``settle``, a speculative step after plain steps first takes the plain step queued past them."""
    log = StepLog()
    policy.start(Drafter(), break_even or prior)
    log.append(StepRecord(step=0, position=0, kind="prefill", emitted=1, verify_s=0.1))
    clock.now += 0.1
    done = 1

    def draft(k: int) -> list[int]:
        return [p if right(p) else -1 for p in range(done, done + k)]

    while done < tokens:
        decision = policy.decide(log, Drafter())
        if isinstance(decision, Plain):
            n = min(decision.n, tokens - done)
            shadow = draft(decision.shadow) if n > 1 else []
            clock.now += draft_s if shadow else 0.0
            for i in range(n):
                clock.now += plain_s
                record = StepRecord(step=len(log), position=done, kind="plain", emitted=1, verify_s=plain_s)
                record.tokens, record.paused = [done], True
                if i == 0 and shadow:
                    record.draft_tokens, record.draft_s = shadow, draft_s
                log.append(record)
                done += 1
        else:
            k = decision.k
            if settle and log.records[-1].kind == "plain" and tokens - done > 1:
                clock.now += plain_s
                record = StepRecord(step=len(log), position=done, kind="plain", emitted=1, verify_s=plain_s)
                record.tokens, record.k_requested = [done], k
                log.append(record)
                done += 1
            k = min(k, tokens - done)
            proposal = draft(k)
            a = next((i for i, t in enumerate(proposal) if t < 0), k)
            clock.now += draft_s + spec_s(k)
            record = StepRecord(
                step=len(log), position=done, kind="verify", k_requested=k, k_drafted=k, accepted=a, emitted=a + 1
            )
            record.verify_s, record.draft_s = spec_s(k), draft_s
            record.tokens = list(range(done, done + a + 1))
            log.append(record)
            done += a + 1
    return log


def kinds(log: StepLog) -> list[str]:
    return [r.kind for r in log.records[1:]]


def prior(k: int) -> float:
    """The break-even the synthetic runs hand Auto: a k-draft step costs 1 + k/4 plain steps."""
    return 1.0 + 0.25 * k


def at_rate(a: float, seed: int = 0):
    """Each output position's draft token right with probability ``a``."""
    rng = random.Random(seed)
    outcome: dict[int, bool] = {}
    return lambda p: outcome.setdefault(p, rng.random() < a)


def never(p: int) -> bool:
    return False


def always(p: int) -> bool:
    return True


def probes(log: StepLog) -> list[list[dict]]:
    """The verified probes: each maximal run of verifications after plain steps."""
    runs = itertools.groupby(log.records[1:], key=lambda r: r.kind)
    return [list(group) for kind, group in runs if kind == "verify"]


def loss_in_plain_steps(log: StepLog, clock: FakeClock, plain_s: float) -> float:
    """Seconds beyond plain decoding of the same tokens, in plain steps."""
    decoded = sum(r.emitted for r in log.records[1:])
    return (clock.now - 0.1 - decoded * plain_s) / plain_s


def test_a_failed_probe_costs_one_verification_at_the_cheapest_length():
    """An always-wrong drafter, a prior that prices verification truly: over 3000 tokens every verified
    probe is one verification of the cheapest envelope length, there are few of them, and the whole
    generation loses less than one plain step per probe beyond that verification's cost."""
    clock = FakeClock()
    policy = DraftPolicy.auto(clock=clock)
    curve = lambda k: 1.0 + 0.4 * k  # noqa: E731  (k = 1 costs 1.4 plain steps: rejected, it loses 0.4)
    log = run(policy, clock, 3000, 0.004, lambda k: 0.004 * curve(k), never, curve, draft_s=1e-5)
    found = probes(log)
    assert [len(p) for p in found] == [1] * len(found)  # the kill switch acts after one losing verification
    assert all(r.k_drafted == policy.costs.lengths[0] == 1 for p in found for r in p)
    assert 1 <= len(found) <= 8  # shadow drafts keep it from probing while they see nothing accepted
    loss = loss_in_plain_steps(log, clock, 0.004)
    # each probe: its verification (1.4 steps for 1 token: 0.4 lost); each draft, verified or not: 2.5e-3 steps
    shadows = sum(1 for r in log.records if r.kind == "plain" and r.draft_tokens)
    assert shadows >= 3000 // policy.pause  # one per plain stretch
    assert loss == pytest.approx(len(found) * (curve(1) - 1) + (len(found) + shadows) * 1e-5 / 0.004)
    assert loss / 3000 < 0.002


def test_no_verification_where_the_prior_says_the_measured_acceptance_cannot_pay():
    """This CPU's SmolLM2 curve (a 5-row verify ~3.8 plain steps, nothing shorter on the envelope) and a
    drafter that is always wrong: the unverified drafts show it, so not one verification is made."""
    clock = FakeClock()
    policy = DraftPolicy.auto(clock=clock)
    curve = lambda k: 3.0 + 0.2 * k  # noqa: E731
    log = run(policy, clock, 500, 0.004, lambda k: 0.004 * curve(k), never, curve, draft_s=1e-5)
    assert policy.costs.lengths[0] >= 3 and not probes(log) and policy.extensions >= 3
    assert loss_in_plain_steps(log, clock, 0.004) < 0.05  # the unverified drafts only
    # the same curve with a drafter that is right 80 % of the time: it probes, and speculates
    policy = DraftPolicy.auto(clock=clock)
    log = run(policy, clock, 500, 0.004, lambda k: 0.002 * curve(k), at_rate(0.8), curve)
    assert probes(log) and kinds(log).count("verify") > 40


def test_probes_stay_cheap_when_the_prior_pays_but_measurement_does_not():
    """The prior says drafting always pays (cost 1 per step) and the drafter is always right, but a
    verification measures 3 plain steps: the kill switch stops after one, and the remembered cost
    keeps later probes rare and short."""
    clock = FakeClock()
    policy = DraftPolicy.auto(clock=clock)
    log = run(policy, clock, 2000, 0.004, lambda k: 0.012 + 0.004 * k, never, break_even=lambda k: 1.0 + 0.01 * k)
    found = probes(log)
    assert found and all(len(p) <= 2 for p in found)
    assert sum(len(p) for p in found) <= 12
    assert loss_in_plain_steps(log, clock, 0.004) <= 3.2 * sum(len(p) for p in found)


def test_auto_falls_back_to_plain_when_its_speculative_seconds_per_token_exceed_plain():
    clock = FakeClock()
    policy = DraftPolicy.auto(clock=clock, pause_tokens=32)
    # Measured, a step costs 2.5x what the prior says; half the drafted positions are right: never worth it.
    log = run(policy, clock, 400, plain_s=0.004, spec_s=lambda k: 0.01 * prior(k), right=at_rate(0.5))
    assert policy.evidence.measured.plain_seconds_per_token() == pytest.approx(0.004)
    assert kinds(log)[:8] == ["plain"] * 8  # plain decoding timed first
    assert policy.pauses >= 1 and kinds(log).count("plain") > 370
    assert loss_in_plain_steps(log, clock, 0.004) < 8


def test_auto_keeps_speculating_when_measured_cheaper_per_token():
    clock = FakeClock()
    policy = DraftPolicy.auto(clock=clock)
    log = run(policy, clock, 300, plain_s=0.004, spec_s=lambda k: 0.002 * prior(k), right=always)
    assert policy.pauses == 0
    assert kinds(log).count("plain") == policy.probe_tokens  # the one plain stretch, which timed plain decoding
    assert policy.k == 8  # every draft accepted: drafts lengthened to the longest
    assert policy.evidence.measured.speculative_seconds_per_token() < policy.evidence.measured.plain_seconds_per_token()


def test_prior_would_pause_but_measurement_keeps_speculating():
    """The profile's break-even says drafting costs 4.5 plain steps (at 80 % acceptance nothing pays),
    yet measured a step costs 1.5."""
    clock = FakeClock()
    policy = DraftPolicy.auto(clock=clock)
    right = lambda p: p % 5 != 0  # noqa: E731
    log = run(policy, clock, 300, 0.004, lambda k: 0.006, right, break_even=lambda k: 4.5)
    assert policy.pauses == 0 and kinds(log)[-30:].count("verify") >= 10


def test_auto_probes_speculation_again_after_the_pause():
    clock = FakeClock()
    policy = DraftPolicy.auto(clock=clock, pause_tokens=16, max_pause_tokens=64)
    # Drafts are wrong for the first 300 tokens, then the workload turns repetitive.
    log = run(policy, clock, 900, 0.004, lambda k: 0.004 * prior(k), lambda p: p >= 300)
    first = [r for r in log.records if r.kind == "verify" and r.position >= 300][0].position
    assert first < 300 + 64 + 16  # shadow drafts see the change within a pause
    assert sum(1 for r in log.records if r.kind == "verify" and r.position < 300) <= 8
    tail = kinds(log)[-40:]
    assert tail.count("verify") == len(tail)  # it speculates again once that pays
    assert policy.pause == 16  # a window that paid resets the pause


def test_failed_verified_probes_double_the_pause():
    clock = FakeClock()
    policy = DraftPolicy.auto(clock=clock, pause_tokens=16, max_pause_tokens=64, shadow=False)
    # Without shadow drafts, every probe is a verification: pauses double after each failed one.
    log = run(policy, clock, 400, 0.004, lambda k: 0.004 * prior(k), never)
    pauses = [len(list(g)) for kind, g in itertools.groupby(kinds(log)) if kind == "plain"]
    assert pauses[:5] == [8, 16, 32, 64, 64]
    assert all(len(p) <= 3 and p[0].k_drafted == 1 for p in probes(log))


def test_auto_takes_a_wider_draft_that_costs_less_on_the_envelope():
    # dense H200 shape: a 9-row verify is cheaper than a 5-row one
    curve = {1: 1.9, 2: 2.6, 3: 3.2, 4: 4.0, 5: 4.6, 6: 5.0, 7: 5.4, 8: 3.3}
    policy = DraftPolicy.auto(measured=False)
    policy.start(Drafter(), curve.__getitem__)
    assert policy.costs.lengths == [1, 2, 3, 8]
    assert policy.k == 8  # the preferred 4 moved onto the envelope
    # measured: lengths come from the envelope only, the longest once drafts are accepted
    clock = FakeClock()
    policy = DraftPolicy.auto(clock=clock)
    log = run(policy, clock, 200, 0.004, lambda k: 0.003 * curve[k], always, break_even=curve.__getitem__)
    ks = [r.k_requested for r in log if r.kind == "verify"]
    assert set(ks) <= {1, 2, 3, 8} and policy.k == 8
    # where every wider draft costs more the preferred length stays
    policy = DraftPolicy.auto(measured=False)
    policy.start(Drafter(), lambda k: 1.0 + 0.3 * k)
    assert policy.k == 4 and policy.costs.lengths == list(range(1, 9))
    # a length even a full acceptance cannot pay for is left out; none at all: plain throughout
    policy = DraftPolicy.auto(clock=clock)
    policy.start(Drafter(), lambda k: k + 1.5)
    decision = policy.decide(StepLog(), Drafter())
    assert policy.k == 0 and (decision.n, decision.shadow) == (1 << 30, 0)
    assert decision.reason.startswith("auto-never-pays: no draft length pays")


def test_drafts_lengthen_only_as_whole_drafts_are_accepted():
    clock = FakeClock()
    curve = {k: 1.2 + 0.2 * k for k in range(1, 9)}
    # without shadow drafts the first verification is the cheapest length, then lengths double
    policy = DraftPolicy.auto(clock=clock, shadow=False)
    log = run(policy, clock, 200, 0.004, lambda k: 0.003 * curve[k], always, break_even=curve.__getitem__)
    ks = [r.k_requested for r in log if r.kind == "verify"]
    assert ks[:3] == [1, 2, 4] and ks[3] > 4 and policy.k == 8
    # an unverified draft accepted whole counts too: the first verification is already long
    policy = DraftPolicy.auto(clock=clock)
    log = run(policy, clock, 200, 0.004, lambda k: 0.003 * curve[k], always, break_even=curve.__getitem__)
    assert policy.evidence.shadows == 1 and [r.k_requested for r in log if r.kind == "verify"][0] >= 7
    # every other position wrong: short drafts
    policy = DraftPolicy.auto(clock=clock)
    run(policy, clock, 200, 0.004, lambda k: 0.003 * curve[k], lambda p: p % 2 == 0, break_even=curve.__getitem__)
    assert policy.k <= 2


def test_a_drafter_that_costs_shadows_only_what_a_probe_would_draft():
    """An unverified draft before a plain stretch is as long as the envelope for a free drafter; for one that
    costs (an MTP head, a draft model: sequential steps) as long as a probe's, lengthening as probes do."""
    curve = {k: 1.2 + 0.2 * k for k in range(1, 9)}

    class Costly(Drafter):
        cost_per_token = 0.05

    free, costly = DraftPolicy.auto(clock=FakeClock()), DraftPolicy.auto(clock=FakeClock())
    free.start(Drafter(), curve.__getitem__)
    costly.start(Costly(), curve.__getitem__)
    assert free.decide(StepLog(), Drafter()).shadow == 8
    # the first stretch's unverified draft of 1 token is accepted whole: the next one may be twice as long
    log = StepLog([StepRecord(step=0, position=0, kind="prefill", emitted=1, verify_s=0.1)])
    first = costly.decide(log, Costly())
    assert isinstance(first, Plain) and first.shadow == costly.costs.lengths[0] == 1
    for i in range(first.n):
        record = StepRecord(step=i + 1, position=i + 1, kind="plain", emitted=1, verify_s=0.01, paused=True)
        record.tokens = [100 + i]
        if i == 0:
            record.draft_tokens, record.draft_s = [100], 0.001
        log.append(record)
    costly.decide(log, Costly())
    assert costly.evidence.ramp == 2  # the length of its next unverified draft (and of a probe)


def test_with_break_even_rule_tokens_are_held_to_their_break_even():
    """measured=False (the default with a fixed break-even): tokens vs break-even over a window."""
    clock = FakeClock()
    policy = DraftPolicy.auto(window=4, pause_tokens=5, break_even=1.5)
    assert not policy.measured
    log = run(policy, clock, 60, plain_s=0.004, spec_s=lambda k: 0.001, right=never)
    assert kinds(log)[:9] == ["verify"] * 4 + ["plain"] * 5
    assert policy.k == 4  # the preferred length: acceptance only moves k when measured


def test_untimed_steps_are_costed_by_the_prior():
    """A simulated run (all timings 0) runs the same switch, with the prior as its clock."""
    clock = FakeClock()
    policy = DraftPolicy.auto(clock=clock, pause_tokens=16)
    log = run(policy, clock, 100, plain_s=0.0, spec_s=lambda k: 0.0, right=never)
    runs = [(kind, len(list(g))) for kind, g in itertools.groupby(kinds(log))]
    assert runs[0] == ("plain", 8) and runs[1][0] == "verify" and runs[1][1] <= 2 and runs[2][0] == "plain"
    policy = DraftPolicy.auto(clock=clock)
    log = run(policy, clock, 100, plain_s=0.0, spec_s=lambda k: 0.0, right=always)
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
        time.sleep(0.01)  # a drafter that costs several plain steps of this tiny model, on any BLAS and load
        return draft(context, k)

    drafter.draft = slow_draft
    # the prior says drafting always pays: only the measurement can stop it
    policy = DraftPolicy.auto(pause_tokens=16, break_even=1.0, measured=True)
    gen = speculative_generate(
        model, prompt, GenerateOptions(max_tokens=120), drafter=drafter, policy=policy, progress=None
    )
    assert list(gen) == truth
    records = gen.log.records
    verifies = [r for r in records if r.kind == "verify"]
    paused = [r for r in records if r.kind == "plain" and r.paused]
    shadowed = [r for r in paused if r.draft_tokens]
    assert policy.pauses >= 1 and len(paused) > 100
    # probes stay at the cheapest length (how many verifications a probe takes depends on this CPU's timings)
    assert len(verifies) <= 24 and all(r.k_drafted == 1 for r in verifies)
    assert len(shadowed) >= policy.evidence.shadows >= 2 and all(r.draft_s > 0 for r in shadowed)


@pytest.mark.parametrize(("tree_depth", "rejected"), [(3, 0), (0, 1)])
def test_a_tree_accepted_to_its_depth_counts_as_wholly_accepted(tree_depth, rejected):
    """A tree of 6 nodes and depth 3 accepted 3 deep was accepted whole; a 6-token path accepted 3 was not."""
    clock = FakeClock()
    policy = AutoPolicy(clock=clock)
    policy.start(Drafter(), prior)
    log = StepLog()
    log.append(StepRecord(step=0, position=0, kind="prefill", emitted=1, verify_s=0.1))
    policy.decide(log, Drafter())
    policy._decision = "speculative"
    record = StepRecord(
        step=1, position=1, kind="verify", k_requested=6, k_drafted=6, accepted=3, emitted=4, tree_depth=tree_depth
    )
    record.verify_s, record.tokens = 0.01, [1, 2, 3, 4]
    log.append(record)
    clock.now += 0.01
    policy.decide(log, Drafter())
    assert (policy.evidence.accepted, policy.evidence.rejected) == (3, rejected)


@pytest.mark.parametrize("right", [never, at_rate(0.5)], ids=["never", "half"])
def test_the_plain_step_taken_on_the_way_to_a_draft_is_not_counted_as_speculation(right):
    """The decode loop takes the plain step a pause queued past its end before drafting: that cheap token
    must not make speculation look cheaper than it is (Auto then decides as without it)."""
    decisions = []
    for settle in (False, True):
        clock = FakeClock()
        policy = DraftPolicy.auto(clock=clock, pause_tokens=16)
        log = run(policy, clock, 600, 0.004, lambda k: 0.004 * 2.5 * prior(k), right, settle=settle)
        decisions.append(sum(1 for r in log.records if r.kind == "verify"))
    assert abs(decisions[1] - decisions[0]) <= max(2, decisions[0] // 5)


def test_measured_windows_keep_the_cost_scale_across_a_pause():
    """Speculation's seconds over the curve's: from the window while it has timed decisions, after a pause
    from the scales measured before it, 1 before any; untimed decisions (a simulated run) are not timed."""
    seen = Measured(window=4)
    assert seen.cost_scale() == 1.0 and seen.plain_seconds_per_token() == float("inf")
    seen.add_plain(0.040, 10)  # 4 ms per plain token
    seen.add_speculative(0.012, 2, 2.0)  # predicted 2 plain steps (8 ms), took 12 ms
    seen.add_speculative(0.024, 3, 3.0)  # predicted 12 ms, took 24 ms
    assert seen.cost_scale() == pytest.approx(36 / 20)
    assert seen.speculative_seconds_per_token() == pytest.approx(0.036 / 5)
    seen.forget_speculative()
    assert not seen.speculative and seen.cost_scale() == pytest.approx(1.75)  # median of 1.5 and 2.0
    seen.add_speculative(None, 3, 2.0)
    assert not seen.timed() and not seen.full() and not seen.below_break_even()
