"""Words and units for the key results notebooks record (``Outputs.summary``), as the index shows them.

``describe(key, value)`` gives a label that says what the number is and the value with its unit, e.g.
``("SmolLM2-135M-MoE: verify cost c(2), engine overhead included", "3.04 plain steps")``. Keys without an
entry are shown as they are.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
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


def _times(value: Any) -> str:
    return _number(value, ".2f", "x")


def _percent(value: Any) -> str:
    return _number(value, ".0%") if isinstance(value, (int, float)) and not isinstance(value, bool) else _number(value)


def _yes_no(value: Any) -> str:
    return {True: "yes", False: "NO", None: "not compared"}.get(value, str(value))


def _plain_steps(value: Any) -> str:
    return _number(value, ".2f", " plain steps")


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
    "speedup": ("decode speedup over plain decoding (tokens/s ratio, same run)", _times),
    "best": ("best drafter and policy", str),
    "best_speedup": ("best decode speedup over plain decoding (same run)", _times),
    "tokens_per_verify": ("tokens per verification (accepted drafts + 1)", lambda v: _number(v, ".2f")),
    "acceptance_rate": ("draft tokens accepted / drafted", _percent),
    "equal_to_plain": ("greedy output equal to plain decoding's", _yes_no),
    "outputs_equal_to_plain": ("every greedy output equal to plain decoding's", _yes_no),
    "identical": ("every turn's output equal to plain decoding's", _yes_no),
    "mean_abs_prediction_error": ("speedup prediction error, mean |measured / predicted - 1|", _percent),
    "lossless_verdict": ("losslessness test verdict", str),
    "lossless_p_value": ("losslessness: permutation-test p-value (small: biased)", lambda v: _number(v, ".3f")),
    "lossless_tvd": (
        "losslessness: total variation distance, plain vs speculative token histograms",
        lambda v: _number(v, ".3f"),
    ),
    "lossless_min_detectable_tvd": (
        "losslessness: smallest distance the test could detect",
        lambda v: _number(v, ".3f"),
    ),
    "lossless_accepted_drafts": ("losslessness: accepted draft tokens tested", _number),
    "lossless_acceptance": ("losslessness: draft tokens accepted / drafted", _percent),
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
    (re.compile(r"^(?P<m>.+) tokens/verify$"), "{m}: tokens per verification", lambda v: _number(v, ".2f")),
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
    return key, _number(value, ".3g")
