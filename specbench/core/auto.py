"""Auto's cost envelope and its evidence: what the cost curve predicts and what a generation measured.

``CostEnvelope``: the draft lengths worth drafting, from the break-even curve (k -> plain steps a k-draft
step costs). ``Measured``: seconds per token of the recent speculative decisions and plain stretches, and how
far speculation's seconds strayed from the curve's (the scale Auto applies to it). ``Evidence``: the draft
positions seen accepted and rejected (verified or not), the longest draft they allow (the ramp) and the timed
windows, filed from the step records of each decision. ``AutoPolicy`` (``specbench.core.policies``) decides
from these.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Callable

from specbench.core.log import StepRecord
from specbench.core.policy_args import check_break_even

#: Plain stretches and cost scales kept: the machine's recent speed, not the whole generation's.
PLAIN_STRETCHES = 4
SCALES = 8


class CostEnvelope:
    """The break-even per draft length (the prior), and the lengths on its monotone envelope up to
    ``longest``: those no wider length undercuts and that a fully accepted draft can pay for (k + 1 >
    break-even). ``break_even_of``: k -> tokens a verification of k drafts must yield; ``fixed``: one
    break-even for every length instead."""

    def __init__(self, break_even_of: Callable[[int], float] | None, longest: int, fixed: float | None = None):
        self.break_even_of = break_even_of
        self.fixed = fixed
        self._break_evens: dict[int, float] = {}
        ks = range(1, longest + 1)
        cheapest_wider = float("inf")
        lengths = []
        for k in reversed(ks):
            cost = self.break_even(k)
            if cost <= cheapest_wider and cost < k + 1:
                lengths.append(k)
            cheapest_wider = min(cheapest_wider, cost)
        #: The envelope's lengths, shortest first (empty: no draft can pay).
        self.lengths: list[int] = lengths[::-1]

    def break_even(self, k: int) -> float:
        """Tokens a verification of k drafts must yield to cost no more than plain decoding."""
        if self.fixed is not None:
            return self.fixed
        if k not in self._break_evens:
            self._break_evens[k] = check_break_even(self.break_even_of(k), f"the break-even of k = {k}")
        return self._break_evens[k]

    def moved_onto(self, preferred: int) -> int:
        """``preferred`` moved onto the envelope: the narrowest envelope length at least as long that costs
        no more, else the longest shorter one; 0 if the envelope is empty."""
        cost = self.break_even(preferred)
        wider = [k for k in self.lengths if k >= preferred and self.break_even(k) <= cost]
        if wider:
            return wider[0]
        shorter = [k for k in self.lengths if k <= preferred]
        return shorter[-1] if shorter else 0


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


class Evidence:
    """What one generation measured for Auto: draft positions ``accepted`` and ``rejected`` (verified or
    drafted unverified before a plain stretch; halved at each pause, so old evidence fades), the ``ramp`` (the
    longest draft a probe may use: the envelope's cheapest, lengthened as whole drafts are seen accepted) and
    the timed windows (``measured``)."""

    def __init__(self, envelope: CostEnvelope, window: int):
        self.envelope = envelope
        self.measured = Measured(window)
        self.accepted = self.rejected = 0.0
        self.shadows = 0
        #: Whether the last speculative decision's verifications all rejected every draft.
        self.wasted = False
        self.ramp = envelope.lengths[0] if envelope.lengths else 0

    def acceptance(self) -> float:
        """Per-position acceptance measured so far, with one accepted and one rejected position assumed."""
        return (self.accepted + 1.0) / (self.accepted + self.rejected + 2.0)

    def speedups(self, ks: list[int]) -> list[tuple[float, int]]:
        """(predicted speedup, k) for each k: tokens expected at the measured acceptance over the
        break-even, scaled by how far the measured seconds stray from it."""
        a, scale = self.acceptance(), self.measured.cost_scale()
        return [(expected_tokens(a, k) / (self.envelope.break_even(k) * scale), k) for k in ks]

    def file_plain(self, records: list[StepRecord], seconds: float, timed: bool, measured: bool) -> int:
        """File a plain stretch (its unverified draft's acceptance, its speed); returns the tokens it decoded."""
        decoded = tokens = sum(r.emitted for r in records)
        seconds -= self._file_shadow(records)
        if timed and len(records) > 1:  # steady state: the first step pays for filling the pipeline
            seconds, tokens = seconds - records[0].verify_s, tokens - records[0].emitted
        if measured and tokens:
            self.measured.add_plain(seconds if timed else float(tokens), tokens)
        return decoded

    def file_speculative(self, records: list[StepRecord], seconds: float, timed: bool, measured: bool) -> bool:
        """File a speculative decision (its verifications' acceptance, its cost); False when there was
        nothing to file (only plain steps, or no verification where nothing is measured)."""
        # plain steps before this decision's draft (the step a pause queued past its end) are plain decoding's
        lead = next((i for i, r in enumerate(records) if r.kind != "plain" or r.draft_s), len(records))
        seconds -= sum(r.verify_s for r in records[:lead])
        tokens = sum(r.emitted for r in records[lead:])
        if not (records := records[lead:]):
            return False
        verifies = [r for r in records if r.kind == "verify"]
        if not measured and not verifies:
            return False  # the break-even rule holds verifications to their break-even
        units = 0.0
        self.wasted = all(r.accepted == 0 for r in verifies)
        for r in records:
            if r.kind == "verify":
                units += self.envelope.break_even(r.k_drafted)
                deepest = r.tree_depth or r.k_drafted  # a tree's path is at most its depth long
                self.accepted += r.accepted
                self.rejected += int(r.accepted < deepest)
                if r.accepted == deepest:
                    self._lengthen(r.accepted)
            else:
                units += 1.0
        self.measured.add_speculative((seconds if timed else units) if measured else None, tokens, units)
        return True

    def _file_shadow(self, records: list[StepRecord]) -> float:
        """Acceptance from the unverified draft a plain stretch started with; its drafting seconds."""
        drafted = records[0].draft_tokens or []
        if records[0].kind != "plain" or not drafted:
            return 0.0
        decoded = [t for r in records for t in r.tokens]
        n = min(len(drafted), len(decoded))
        hits = next((i for i in range(n) if drafted[i] != decoded[i]), n)
        self.accepted += hits
        self.rejected += int(hits < n)
        self.shadows += 1
        if hits == len(drafted):
            self._lengthen(hits)
        return float(records[0].draft_s)

    def _lengthen(self, accepted: int) -> None:
        """A whole draft of ``accepted`` tokens was accepted: drafts may be twice as long."""
        if self.envelope.lengths:
            self.ramp = max(self.ramp, min(self.envelope.lengths[-1], 2 * accepted))

    def fade(self) -> None:
        """Halve the acceptance evidence so far and start probes short again."""
        self.accepted /= 2
        self.rejected /= 2
        self.ramp = self.envelope.lengths[0] if self.envelope.lengths else 0


def expected_tokens(a: float, k: int) -> float:
    """Tokens a verification of k drafts yields when each is accepted with probability a."""
    return float(k + 1) if a >= 1.0 else (1.0 - a ** (k + 1)) / (1.0 - a)
