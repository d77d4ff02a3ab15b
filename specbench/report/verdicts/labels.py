"""The labels and units the index shows each key result with (``describe``)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from functools import partial
from typing import Any


def _number(value: Any, spec: str = ".2f", unit: str = "") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "not measured"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int) and spec.endswith("f"):
        return f"{value}{unit}"
    if isinstance(value, (int, float)):
        return f"{value:{spec}}{unit}"
    return str(value)


_times = partial(_number, spec=".2f", unit="x")
_short = partial(_number, spec=".3g")  # a number to 3 significant digits
_plain_steps = partial(_number, spec=".2f", unit=" plain steps")
_three = partial(_number, spec=".3f")


def _percent(value: Any) -> str:
    return _number(value, ".0%") if isinstance(value, (int, float)) and not isinstance(value, bool) else _number(value)


def _yes_no(value: Any) -> str:
    return {True: "yes", False: "NO", None: "not compared"}.get(value, str(value))


def _rules(value: Any) -> str:
    """``best_lossless``'s rows in a line: "T=0.5 block 1.39, 0.922x; ..."."""
    if not isinstance(value, list) or not all(isinstance(row, dict) for row in value):
        return _plain(value)
    return "; ".join(
        f"T={_short(row.get('temperature'))} {row.get('acceptance')} {_short(row.get('tokens_per_verify'))}, "
        f"{_short(row.get('speedup'))}x"
        for row in value
    )


def _plain(value: Any) -> str:
    """Any value in words: numbers to 3 significant digits, lists and mappings item by item."""
    if isinstance(value, dict):
        return ", ".join(f"{str(k).replace('_', ' ')} {_plain(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return "; ".join(_plain(v) for v in value)
    return _number(value, ".3g")


def _a_star(value: Any) -> str:
    return "never breaks even" if value is None else _number(value, ".2f", " per position")


_Formatter = Callable[[Any], str]

#: key -> (label, formatter)
LABELS: dict[str, tuple[str, _Formatter]] = {
    "verdict": ("verdict", str),
    "drafter": ("drafter", str),
    "policy": ("draft policy", str),
    "tokens": ("tokens generated", _number),
    "prompts": ("prompts", _number),
    "runs": ("generations timed", _number),
    "traces": ("traces replayed", _number),
    "speedup": ("decode speedup over plain decoding (tokens/s ratio over the paired runs)", _times),
    "pairs": ("pairs of runs timed (plain next to speculative)", _number),
    "best": ("best drafter and policy", str),
    "best_speedup": ("best decode speedup over plain decoding (same run)", _times),
    "tokens_per_verify": ("tokens per verification (accepted drafts + 1)", _number),
    "acceptance_rate": ("draft tokens accepted / drafted", _percent),
    "equal_to_plain": ("greedy output equal to plain decoding's", _yes_no),
    "outputs_equal_to_plain": ("every greedy output equal to plain decoding's", _yes_no),
    "identical": ("every turn's output equal to plain decoding's", _yes_no),
    "mean_abs_prediction_error": ("speedup prediction error, mean |measured / predicted - 1|", _percent),
    "lossless_verdict": ("losslessness test verdict", str),
    "lossless_p_value": ("losslessness: permutation-test p-value (small: biased)", _three),
    "lossless_tvd": ("losslessness: total variation distance, plain vs speculative token histograms", _three),
    "lossless_min_detectable_tvd": ("losslessness: smallest distance the test could detect", _three),
    "lossless_accepted_drafts": ("losslessness: accepted draft tokens tested", _number),
    "lossless_acceptance": ("losslessness: draft tokens accepted / drafted", _percent),
    "lossless_samples": ("losslessness: samples drawn on each side", _number),
    "same_tokens_runs": ("sampled by position: runs with one seed, plain and speculative", _number),
    "same_tokens_same": ("sampled by position: runs whose speculative tokens were plain sampling's", _number),
    "exact_match_measured": ("exact-match rule: accepted draft tokens measured", _number),
    "exact_match_expected": ("exact-match rule: accepted draft tokens expected from the model's own p", _short),
    "exact_match_low": ("exact-match rule: expected, 95 % interval low", _short),
    "exact_match_high": ("exact-match rule: expected, 95 % interval high", _short),
    "exact_match_reached_positions": ("exact-match rule: draft positions reached", _number),
    "best_lossless": ("best lossless rule per temperature (tokens per verification, speedup)", _rules),
    "component_stack_max_error": ("component stack: largest miss of the measured step", _percent),
    "component_stack_max_closure": ("component stack: largest miss of the measured forward", _percent),
    "mean_abs_prediction_error_from_log": (
        "speedup prediction error from each run's own log, mean |measured / predicted - 1|",
        _percent,
    ),
    "predicted_speedup": ("predicted decode speedup (cost model x replayed acceptance)", _times),
    "measured_speedup": ("measured decode speedup of the same method", _times),
    "best_predicted": ("best predicted method", str),
    "workloads": ("workloads ranked", _number),
    "confirmed": ("policies confirmed by a measured run", str),
    "mean_abs_residual": ("policy ranking: mean |measured / predicted - 1| of the confirmed", _percent),
    "turns": ("turns replayed", _number),
    "skipped_turns": ("turns left out (no text to replay)", _number),
    "best_accepted_per_verify": ("best tokens per verification", _short),
    "seconds": ("seconds the replay took", _short),
    "source": ("replies replayed from", str),
}

#: (pattern, label template, formatter): keys that carry a model or method name.
PATTERNS: list[tuple[re.Pattern[str], str, _Formatter]] = [
    (re.compile(r"^(?P<m>.+) c\((?P<w>\d+)\)$"), "{m}: verify cost c({w}), engine overhead included", _plain_steps),
    (
        re.compile(r"^(?P<m>.+) a\*\((?P<w>\d+)\)$"),
        "{m}: break-even acceptance a*({w}) for a draft of {w}",
        _a_star,
    ),
    (re.compile(r"^(?P<m>.+) overhead$"), "{m}: engine overhead per speculative step", _plain_steps),
    (re.compile(r"^(?P<m>.+) speedup$"), "{m}: decode speedup over plain decoding", _times),
    (re.compile(r"^(?P<m>.+) tokens/verify$"), "{m}: tokens per verification", _number),
    (re.compile(r"^(?P<m>.+) bandwidth$"), "{m}: memory bandwidth achieved / measured peak", _percent),
]


def describe(key: str, value: Any) -> tuple[str, str]:
    """(label, value with its unit) of a key result."""
    if key in LABELS:
        label, fmt = LABELS[key]
        return label, fmt(value)
    for pattern, template, fmt in PATTERNS:
        match = pattern.match(key)
        if match:
            return template.format(**match.groupdict()), fmt(value)
    return key.replace("_", " "), _plain(value)  # a key no label names yet: in words, numbers to 3 digits
