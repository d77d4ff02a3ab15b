"""The paired A/B experiment (``specbench ab``): methods parsed before model work, pairs in alternating order,
B over A with its interval and a verdict; A/A for the machine's noise."""

from __future__ import annotations

import pytest
from conftest import build_tiny, word_tokenizer

from specbench.bench.ab import ab_verdict
from specbench.bench.ab_experiment import ABResult, Method, run_ab
from specbench.core.options import GenerateOptions


def test_methods_read_plain_a_drafter_or_a_drafter_under_a_policy():
    assert str(Method.parse("plain")) == "plain" and Method.parse("plain").drafter is None
    assert str(Method.parse("lookup")) == "lookup/auto"
    assert Method.parse("suffix/fixed:4") == Method("suffix", "fixed:4")
    with pytest.raises(ValueError, match="unknown method"):
        Method.parse("nope")
    with pytest.raises(ValueError):
        Method.parse("lookup/sometimes")


def test_verdicts_need_the_whole_interval_on_one_side_of_one():
    assert ab_verdict(1.2, (1.05, 1.3)) == "pays"
    assert ab_verdict(0.8, (0.7, 0.95)) == "loses"
    assert ab_verdict(1.1, (0.98, 1.2)) == "inconclusive"
    assert ab_verdict(1.5, None) == "inconclusive"  # too few pairs for an interval


def test_result_lines_say_the_ratio_interval_and_verdict():
    result = ABResult("plain", "lookup/auto", [(1.0, 0.5)] * 3 + [(1.0, 0.52)] * 3, [True] * 6, 32)
    assert result.ratio == pytest.approx(6 / 3.06)
    low, high = result.interval
    assert 1.0 < low <= result.ratio <= high and result.verdict == "pays"
    text = "\n".join(result.lines())
    assert (
        "lookup/auto over plain" in text and "verdict: lookup/auto pays" in text and "equal in every pair: True" in text
    )
    few = ABResult("plain", "plain", [(1.0, 1.0)] * 2)
    assert few.interval is None and "A/A" in few.lines()[0] and "too few pairs" in few.lines()[0]


def test_a_run_pairs_every_prompt_in_every_repeat_and_outputs_match():
    model, tokenizer = build_tiny("llama"), word_tokenizer()
    prompts = [[5, 6, 7, 5, 6, 7, 5, 6], [9, 10, 11, 9, 10, 11]]
    options = GenerateOptions(max_tokens=6)
    result = run_ab(model, tokenizer, prompts, Method(), Method.parse("lookup/fixed:2"), options, repeats=3)
    assert len(result.pairs) == 6 and all(a > 0 and b > 0 for a, b in result.pairs)
    assert result.equal == [True] * 6  # greedy: speculation changes no token
    assert result.verdict in ("pays", "loses", "inconclusive")
