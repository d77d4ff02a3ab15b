"""What a generation measured of its own decoding: Auto's evidence.

Seconds per token of its recent speculative decisions and plain stretches, and how far speculation's seconds
strayed from what the cost curve predicted (the scale Auto applies to the curve).
"""

from __future__ import annotations

import math
import statistics
from collections import deque

#: Plain stretches and cost scales kept: the machine's recent speed, not the whole generation's.
PLAIN_STRETCHES = 4
SCALES = 8


class Measured:
    """Windows of one generation's decisions: ``speculative`` the last ``window`` speculative ones (seconds,
    None when untimed; tokens; break-even units, the plain steps the cost curve predicts), ``plain`` the last
    plain stretches (seconds, tokens), ``scales`` measured over predicted seconds of the last timed
    speculative ones."""

    def __init__(self, window: int):
        self.speculative: deque[tuple[float | None, int, float]] = deque(maxlen=window)
        self.plain: deque[tuple[float, int]] = deque(maxlen=PLAIN_STRETCHES)
        self.scales: deque[float] = deque(maxlen=SCALES)
        self._sum()

    def add_plain(self, seconds: float, tokens: int) -> None:
        self.plain.append((seconds, tokens))
        self._sum()

    def add_speculative(self, seconds: float | None, tokens: int, units: float) -> None:
        self.speculative.append((seconds, tokens, units))
        self._sum()
        plain = self.plain_seconds_per_token()
        if seconds is not None and math.isfinite(plain) and units:
            self.scales.append(seconds / (plain * units))

    def forget_speculative(self) -> None:
        """A pause: speculation starts measuring afresh (the cost scales stay)."""
        self.speculative.clear()
        self._sum()

    def timed(self) -> bool:
        """Whether every speculative decision in the window was timed (none of a simulated run's)."""
        return all(seconds is not None for seconds, _, _ in self.speculative)

    def full(self) -> bool:
        return len(self.speculative) == self.speculative.maxlen

    def below_break_even(self) -> bool:
        """Whether the window's decisions yielded fewer tokens than their break-evens."""
        return sum(t for _, t, _ in self.speculative) < sum(u for _, _, u in self.speculative)

    def cost_scale(self) -> float:
        """Measured seconds of the window's speculative decisions over the cost curve's; with none timed,
        the median of the last scales measured; 1 before any."""
        plain = self.plain_seconds_per_token()
        seconds, _, units = self._speculative
        if units and math.isfinite(plain):
            return seconds / (plain * units)
        return statistics.median(self.scales) if self.scales else 1.0

    def plain_seconds_per_token(self) -> float:
        """Seconds per token of the recent plain stretches (inf when none was timed)."""
        seconds, tokens = self._plain
        return seconds / tokens if tokens else float("inf")

    def speculative_seconds_per_token(self) -> float:
        """Seconds per emitted token of the window's timed speculative decisions (inf when none)."""
        seconds, tokens, _ = self._speculative
        return seconds / tokens if tokens else float("inf")

    def _sum(self) -> None:
        """The windows' sums, once per decision: seconds, tokens and break-even units."""
        timed = [entry for entry in self.speculative if entry[0] is not None]
        self._speculative = (sum(e[0] for e in timed), sum(e[1] for e in timed), sum(e[2] for e in timed))
        self._plain = (sum(s for s, _ in self.plain), sum(t for _, t in self.plain))
