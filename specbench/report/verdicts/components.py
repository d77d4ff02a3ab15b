"""The words for a verify cost split into its parts (``specbench.cost.components``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from specbench.cost.components import ComponentRow, deciding_part, phase_reading


def deciding_parts(stacks: Mapping[str, Sequence[dict[str, Any]]]) -> str:
    """Per model with stacks at two widths or more: the part whose growth decides c(w), its share of what a wider
    verification adds, how far the forward's components (by subtraction) are from adding up to the forward
    (their ``closure``, when the rows hold it) and how far the whole stack is from the measured step ("" without
    stacks)."""
    text = ""
    for name, stored in stacks.items():
        rows = ComponentRow.rows(stored)
        if len({r.width for r in rows}) > 1:
            part, share = deciding_part(stored)
            off = max(abs(r.error) for r in rows)
            closures = [abs(r.closure) for r in rows if r.closure is not None]
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
                spread = max((r.step_spread for r in rows if r.step_spread is not None), default=None)
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
            text += _bound(stored, off)
    return text


def _bound(rows: Sequence[dict[str, Any]], off: float) -> str:
    """What sets a model's pace on a GPU (host or device, from the forward's phases) and, where the parts miss the
    step, whether the host's own phases still add up: a part's removal then moved the bottleneck ("" without
    phases, and on a CPU)."""
    reading = phase_reading(rows)
    if reading is None or any(str(r.get("device", "")).startswith("cpu") for r in rows):
        return ""  # on a CPU the host does the device's work too (MLX's CPU stream blocks its dispatch when busy)
    waits = [r["wait_share"] for r in reading.values()]
    low, high = min(waits), max(waits)
    share = f"{low:.0%}" if f"{low:.0%}" == f"{high:.0%}" else f"{low:.0%}-{high:.0%}"
    pace = (
        "host-bound: building and dispatching the graph set the pace, not the device's work"
        if high < 0.2
        else "device-bound: the device's work sets the pace"
        if low > 0.5
        else "host and device take turns setting the pace"
    )
    text = f" Its forwards wait {share} of their time for the device ({pace})."
    if off <= 0.1:
        return text
    host = max(abs(r["host_closure"]) for r in reading.values())
    if host <= 0.1:
        text += (
            f" The host's phases alone add up within {host:.0%}: the miss lies in the device's wait, which a part's"
            " removal changes by moving the bottleneck between host and device, so parts are exact as host time only."
        )
    by_phase = max(abs(r["phase_error"]) for r in reading.values())
    return text + (
        " Counted by phase (each part's host work, the wait for the device a part of its own), the step's parts"
        f" add up to the measured step within {by_phase:.0%}."
    )
