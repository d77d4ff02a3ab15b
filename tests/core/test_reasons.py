"""A reason on every decision: each plain step and each draft shorter than the policy's longest carries a reason
code in the step log, summed in ``stats()``."""

from __future__ import annotations

import pytest
from conftest import build_tiny

from specbench import DraftPolicy, GenerateOptions, generate, speculative_generate
from specbench.core.log import main_reason, reason_counts
from specbench.drafters import PromptLookup

PROMPT = [5, 9, 13, 5, 9, 13, 5, 9, 21, 33, 40, 7, 5, 9, 13, 5, 9]


@pytest.fixture(scope="module")
def model():
    return build_tiny("qwen3", seed=3)


@pytest.mark.parametrize("policy", ["fixed:4", "adaptive:4", "auto", "sglang", "confidence:0.6:4"])
def test_every_plain_step_and_every_short_draft_says_why(model, policy):
    drafter = PromptLookup()
    chosen = DraftPolicy.parse(policy)
    gen = speculative_generate(
        model, PROMPT, GenerateOptions(max_tokens=24, verify="fast"), drafter=drafter, policy=chosen, progress=None
    )
    list(gen)
    longest = chosen.longest_draft(drafter)
    decoded = [r for r in gen.log.records if r.kind != "prefill"]
    explained = [r for r in decoded if r.kind == "plain" or r.k_drafted < longest]
    assert explained, "the run took no plain step and no short draft"
    assert all(r.reason for r in explained), [(r.kind, r.k_drafted) for r in explained if not r.reason]
    assert all(":" not in r.reason.split(":", 1)[0] for r in explained)
    counts = gen.stats()["reasons"]
    assert sum(counts.values()) == sum(1 for r in decoded if r.reason) and counts == reason_counts(decoded)
    assert main_reason(decoded).split(":", 1)[0] == next(iter(counts))


def test_plain_decoding_says_it_has_no_drafter(model):
    gen = generate(model, PROMPT, GenerateOptions(max_tokens=6))
    list(gen)
    assert gen.stats()["reasons"] == {"no-drafter": 5}


def test_auto_says_why_it_decodes_plainly(model):
    """Auto with a break-even no draft can meet: its plain stretches say that no length pays or it is waiting."""
    gen = speculative_generate(
        model,
        PROMPT,
        GenerateOptions(max_tokens=24, verify="fast"),
        drafter=PromptLookup(),
        policy=DraftPolicy.auto(break_even=50.0),
        progress=None,
    )
    list(gen)
    plain = [r for r in gen.log.records if r.kind == "plain"]
    assert plain and all(r.reason.startswith("auto-") for r in plain), {r.reason for r in plain}


def test_the_command_line_prints_the_reasons(capsys):
    from specbench.cli import main

    args = ["generate", "--model", "tiny:smollm2-135m", "--prompt", "Repeat: a b c d a b c d", "--max-tokens", "8"]
    code = main([*args, "--drafter", "lookup", "--policy", "fixed:3", "--verify", "fast"])
    out = capsys.readouterr().out
    assert code == 0 and "reasons" in out
    line = next(line for line in out.splitlines() if line.strip().startswith("reasons"))
    assert any(code in line for code in ("drafter-short", "pipelined", "tokens-left", "last-token"))
