"""The words for a verify cost split into its parts (``specbench.cost.components``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from specbench.cost.components import deciding_part


def deciding_parts(stacks: Mapping[str, Sequence[dict[str, Any]]]) -> str:
    """Per model with stacks at two widths or more: the part whose growth decides c(w), its share of what a wider
    verification adds, and how far the parts, timed apart, are from the measured step ("" without stacks)."""
    text = ""
    for name, rows in stacks.items():
        if len({r["width"] for r in rows}) > 1:
            part, share = deciding_part(rows)
            off = max(abs(r["error"]) for r in rows)
            text += f" For {name}, {part} decides: {share:.0%} of what a wider verification adds"
            text += (
                f" (the parts, timed apart, add up to the measured step within {off:.0%})."
                if off <= 0.1
                else f", but the parts, timed apart, miss the measured step by up to {off:.0%}: each module waits"
                " for its inputs and outputs, which costs more than small modules or a busy machine leave room"
                " for, so this split is rough."
            )
    return text
