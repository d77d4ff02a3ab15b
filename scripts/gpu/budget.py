"""A run's time budget: seconds from its start, what is left, whether a phase fits, and what was skipped or cut
to fit (kept for the run's results, so that a shortened run says so).

Every GPU driver (scripts/gpu/) runs within ``--budget`` seconds; this is their one implementation.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Skipped:
    """A phase left out: what, the seconds it was expected to need (None: the time was simply up) and the
    seconds that were left."""

    what: str
    need_s: float | None
    left_s: float

    def __str__(self) -> str:
        if self.need_s is None:
            return f"{self.what} ({self.left_s:.0f} s left)"
        return f"{self.what} (needs ~{self.need_s:.0f} s, {self.left_s:.0f} s left)"


@dataclass
class Budget:
    """``seconds`` from ``start`` (``time.perf_counter()``; now by default); None for no limit.

    ``fits`` and ``over`` decide, and record what they leave out in ``skipped``; ``cut`` records a size
    reduced to fit (fewer tokens, fewer repeats) in ``cuts``. ``say`` prints each decision."""

    seconds: float | None
    start: float = field(default_factory=time.perf_counter)
    say: Callable[[str], None] = field(default=lambda text: print(text, flush=True), repr=False)
    skipped: list[Skipped] = field(default_factory=list)
    cuts: list[str] = field(default_factory=list)

    @property
    def deadline(self) -> float:
        """The ``time.perf_counter()`` at which the budget ends (infinite without a limit)."""
        return math.inf if self.seconds is None else self.start + self.seconds

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def left(self) -> float:
        """Seconds left (infinite without a limit; negative once overrun)."""
        return self.deadline - time.perf_counter()

    def until(self, fraction: float) -> float:
        """The ``time.perf_counter()`` at ``fraction`` of the budget: a phase's own deadline."""
        return math.inf if self.seconds is None else self.start + fraction * self.seconds

    def fits(self, what: str, need_s: float, until: float | None = None) -> bool:
        """Whether ``what``, expected to take ``need_s`` seconds, ends before the deadline (or ``until``);
        if not it is recorded as skipped."""
        left = (self.deadline if until is None else until) - time.perf_counter()
        if need_s <= left:
            return True
        self.skip(what, need_s, left)
        return False

    def over(self, what: str, until: float | None = None) -> bool:
        """Whether the deadline (or ``until``) has passed; if so ``what`` is recorded as skipped."""
        left = (self.deadline if until is None else until) - time.perf_counter()
        if left > 0:
            return False
        self.skip(what, None, left)
        return True

    def skip(self, what: str, need_s: float | None = None, left_s: float | None = None) -> None:
        """Record ``what`` as left out (for want of time)."""
        skipped = Skipped(what, need_s, self.left() if left_s is None else left_s)
        self.skipped.append(skipped)
        self.say(f"skip {skipped}")

    def cut(self, what: str) -> None:
        """Record a reduction made to fit the budget."""
        self.cuts.append(what)
        self.say(f"  reduced: {what}")

    def skipped_names(self) -> list[str]:
        """What was skipped, by name only."""
        return [s.what for s in self.skipped]

    def skipped_lines(self) -> list[str]:
        """What was skipped, each with the seconds it needed and the seconds left."""
        return [str(s) for s in self.skipped]

    def allot(self, share: float, reserve_s: float = 0.0) -> float:
        """``share`` of the seconds left once ``reserve_s`` (later phases' set-up, saving) is kept back."""
        return max(0.0, self.left() - reserve_s) * share
