"""The paired A/B experiment (``specbench ab``): methods parsed before model work, pairs in alternating order,
B over A with its interval and a verdict; A/A for the machine's noise."""

from __future__ import annotations

import pytest
from conftest import build_tiny, word_tokenizer

from specbench.bench.ab_experiment import ABResult, Arm, ab_verdict, run_ab
from specbench.core.options import GenerateOptions


def test_methods_read_plain_a_drafter_or_a_drafter_under_a_policy():
    assert str(Arm.parse("plain")) == "plain" and Arm.parse("plain").drafter is None
    assert str(Arm.parse("lookup")) == "lookup/auto"
    assert Arm.parse("suffix/fixed:4") == Arm("suffix", "fixed:4")
    with pytest.raises(ValueError, match="unknown method"):
        Arm.parse("nope")
    with pytest.raises(ValueError):
        Arm.parse("lookup/sometimes")
    assert Arm.parse("none") == Arm() and Arm.parse(" plain ") == Arm()


@pytest.mark.parametrize("text", ["/auto", "plain/fixed:4", "none/auto", "", "/", "lookup/", " /fixed:4"])
def test_plain_under_a_policy_or_a_missing_part_is_an_error_naming_the_argument(text):
    """Plain decoding takes no policy: "plain/fixed:4" or "/auto" never runs plain decoding labelled as a method."""
    with pytest.raises(ValueError, match=r"^--b .*give plain, a drafter name \(under Auto\) or DRAFTER/POLICY"):
        Arm.parse(text, "--b")


def test_a_bad_policy_names_the_argument():
    with pytest.raises(ValueError, match=r"^--a 'lookup/fixed:1000': .*over the longest draft"):
        Arm.parse("lookup/fixed:1000", "--a")


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


def test_no_pairs_is_a_result_that_says_so_and_a_run_of_none_is_refused():
    from specbench.bench.paired import seconds_ratio

    empty = ABResult("plain", "lookup/auto")
    assert empty.interval is None and empty.verdict == "no pairs" and empty.ratio != empty.ratio  # NaN
    assert empty.lines() == ["lookup/auto over plain: no pairs ran (no prompts or no repeats), so there is no ratio"]
    with pytest.raises(ValueError, match="no pairs of runs"):
        seconds_ratio([])
    with pytest.raises(ValueError, match="took 0.0 s over 2 pairs"):
        seconds_ratio([(1.0, 0.0), (1.0, 0.0)])
    options = GenerateOptions(max_tokens=4)
    with pytest.raises(ValueError, match="at least one prompt"):
        run_ab(None, None, [], Arm(), Arm(), options, repeats=2)
    with pytest.raises(ValueError, match="repeats must be an integer >= 1, got 0"):
        run_ab(None, None, [[5, 6]], Arm(), Arm(), options, repeats=0)


def test_a_run_pairs_every_prompt_in_every_repeat_and_outputs_match():
    model, tokenizer = build_tiny("llama"), word_tokenizer()
    prompts = [[5, 6, 7, 5, 6, 7, 5, 6], [9, 10, 11, 9, 10, 11]]
    options = GenerateOptions(max_tokens=6)
    result = run_ab(model, tokenizer, prompts, Arm(), Arm.parse("lookup/fixed:2"), options, repeats=3)
    assert len(result.pairs) == 6 and all(a > 0 and b > 0 for a, b in result.pairs)
    assert result.equal == [True] * 6  # greedy: speculation changes no token
    assert result.verdict in ("pays", "loses", "inconclusive")
