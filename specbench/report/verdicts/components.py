"""The words for a verify cost split into its parts (``specbench.cost.components``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from specbench.cost.components import deciding_part


def deciding_parts(stacks: Mapping[str, Sequence[dict[str, Any]]]) -> str:
    """Per model with stacks at two widths or more: the part whose growth decides c(w), its share of what a wider
    verification adds, how far the forward's components (by subtraction) are from adding up to the forward
    (their ``closure``, when the rows hold it) and how far the whole stack is from the measured step ("" without
    stacks)."""
    text = ""
    for name, rows in stacks.items():
        if len({r["width"] for r in rows}) > 1:
            part, share = deciding_part(rows)
            off = max(abs(r["error"]) for r in rows)
            closures = [abs(r["closure"]) for r in rows if r.get("closure") is not None]
            text += f" For {name}, {part} decides: {share:.0%} of what a wider verification adds"
            closure = (
                f"the forward's components, each subtracted from the whole forward, add up to it within"
                f" {max(closures):.0%}"
                if closures
                else ""
            )
            if off <= 0.1:
                step = f"the parts add up to the measured step within {off:.0%}"
                text += f" ({closure}; {step})." if closure else f" ({step})."
            else:
                text += f" ({closure})," if closure else ","
                text += f" but the parts miss the measured step by up to {off:.0%}"
                spread = max((r["step_spread"] for r in rows if r.get("step_spread") is not None), default=None)
                if spread is not None and spread >= off:
                    text += (
                        f", within the measured step's own spread ({spread:.0%} interquartile range over its median):"
                        " inconclusive at this noise."
                    )
                else:
                    text += (
                        ": the step overlaps work the parts count apart, or the machine was busy while they were"
                        " timed, so this split is rough."
                    )
    return text
