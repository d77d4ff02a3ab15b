"""A run's speed from its step log (its steady plain steps) and where its seconds went."""

from __future__ import annotations

import statistics
from dataclasses import replace

import pytest
from conftest import auto_run_log, log_seconds, plain_run_log, step_record

from scripts.gpu.run_speed import MIN_STEADY, mean_speed, speed_state, time_split, verify_ms_by_width


def test_speed_is_the_median_steady_plain_step():
    run = plain_run_log(0.01)
    run[5].verify_s = 0.5  # one hiccup moves a mean, not the median
    assert speed_state(run) == pytest.approx(0.01)
    # steps that start a stretch with a draft, verifications and the prefill are not steady steps
    assert speed_state(auto_run_log(0.01)) == pytest.approx(0.01)
    assert speed_state(plain_run_log(0.01, n=MIN_STEADY - 1)) is None


def test_steps_a_speculative_decision_took_are_not_steady():
    """Probes whose drafter proposes nothing: each takes the token queued past the stretch before (read long
    after it was computed, so nearly free) and one plain step with its draft attempt; neither is a steady step."""
    run = plain_run_log(0.01, n=MIN_STEADY + 1)  # a stretch's first step is not steady
    for _ in range(3 * MIN_STEADY):
        run += [step_record("plain", 0.0001, k_requested=3), step_record("plain", 0.01, 0.0005, k_requested=3)]
    assert speed_state(run) == pytest.approx(0.01)
    split = time_split(run, log_seconds(run[1:]))
    assert split["steady_n"] == MIN_STEADY


def test_a_drafters_observe_seconds_stay_charged():
    run = auto_run_log(0.01)
    calls = sum(1 for r in run if r.emitted)
    assert speed_state(run, observe_s=0.001 * calls) == pytest.approx(0.009)


def test_in_loop_verify_seconds_by_width():
    """Each width's median verify seconds, ascending widths; plain steps and the prefill left out."""
    run = auto_run_log(0.01)
    for r, width in zip((r for r in run if r.kind == "verify"), (3, 2)):
        r.verify_width = width
    run.append(replace(step_record("verify", 0.05), verify_width=3))
    assert verify_ms_by_width(run) == "2:25.0 3:37.5"
    assert verify_ms_by_width(plain_run_log(0.01)) == ""


def test_a_real_generations_log_gives_a_speed_and_a_split_that_adds_up():
    """On a tiny model's own logs: plain decoding has a speed (its steady steps' median), a speculative
    generation that verified drafts has its verify steps by width, and each split accounts for every logged
    step and its seconds."""
    from conftest import build_tiny

    from specbench import GenerateOptions, generate, speculative_generate
    from specbench.core.policies import DraftPolicy
    from specbench.drafters import PromptLookup

    model = build_tiny("llama", num_hidden_layers=1)
    prompt = [5, 6, 7, 8, 9, 10, 5, 6, 7, 8, 9, 10, 5, 6, 7, 8]
    plain = generate(model, prompt, GenerateOptions(max_tokens=MIN_STEADY + 4, ignore_eos=True))
    list(plain)
    records = plain.log.records
    assert records[0].kind == "prefill" and all(r.kind == "plain" for r in records[1:])
    # every plain step after the stretch's first is steady
    assert speed_state(records) == pytest.approx(statistics.median(r.verify_s for r in records[2:]))
    logged_s = sum(r.draft_s + r.verify_s + r.other_s for r in records[1:])
    split = time_split(records, logged_s)
    assert split["steady_n"] + split["starts_n"] == len(records) - 1 and split["spec_tokens"] == 0
    assert split["unlogged_ms"] == pytest.approx(0.0, abs=1e-6)

    spec = speculative_generate(
        model,
        prompt,
        GenerateOptions(max_tokens=24, ignore_eos=True),
        drafter=PromptLookup(),
        policy=DraftPolicy.fixed(3),
    )
    emitted = list(spec)
    verifies = [r for r in spec.log.records if r.kind == "verify"]
    assert verifies, "prompt lookup drafts on a repeating prompt"
    widths = {r.verify_width for r in verifies}
    assert [int(part.split(":")[0]) for part in verify_ms_by_width(spec.log.records).split()] == sorted(widths)
    split = time_split(spec.log.records, 1.0)
    assert split["spec_tokens"] + split["steady_n"] + split["starts_n"] == len(emitted) - 1


def test_the_mean_steady_step_counts_a_burst_of_slow_steps_as_steps():
    """Two plain runs of the same tokens, one with a burst of 10 steps at 3x and its steps in two modes: in
    mean steps both count the same work; in median steps the burst and the modes move the count. Auto's
    verifications stay charged in mean steps too."""
    calm = plain_run_log(0.01, n=60)
    bursty = plain_run_log(0.01, n=60)
    for r in bursty[20:30]:
        r.verify_s = 0.03
    for r in bursty[31::2]:
        r.verify_s = 0.012  # every other steady step in a slower mode
    in_mean = [log_seconds(run[1:]) / mean_speed(run) for run in (calm, bursty)]
    in_median = [log_seconds(run[1:]) / speed_state(run) for run in (calm, bursty)]
    assert in_mean[1] == pytest.approx(in_mean[0], rel=0.02)
    assert in_median[1] > 1.2 * in_median[0]
    auto = auto_run_log(0.01, n=60)
    assert log_seconds(auto[1:]) / mean_speed(auto) > log_seconds(calm[1:]) / mean_speed(calm) + 2.5
    assert mean_speed(plain_run_log(0.01, n=MIN_STEADY - 1)) is None
