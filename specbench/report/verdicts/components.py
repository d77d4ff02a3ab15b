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
            text += (
                f" For {name}, {part} decides: {share:.0%} of what a wider verification adds"
                f" (the parts, timed apart, add up to the measured step within {off:.0%})."
            )
    return text
