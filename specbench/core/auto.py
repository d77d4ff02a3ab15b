"""Auto: a draft length from what the generation measures, or plain decoding where no draft pays.

``AutoSettings``: Auto's settings, checked. ``AutoDecisions``: what Auto decides each step, from a ``CostEnvelope``
and the ``Evidence`` measured (with its ``Measured`` windows); ``specbench.core.policies.AutoPolicy`` is these
decisions as a ``DraftPolicy`` (``DraftPolicy.auto()``).

How Auto decides (for users: docs/auto-policy.md). Each decision (a speculative step, a stretch of plain steps) is
timed end to end with ``clock``. It starts with ``probe_tokens`` plain tokens, timing plain decoding; each plain
stretch starts with an unverified draft (``Plain.shadow``, ``_shadow_k``) measuring acceptance. The break-even (k ->
plain steps a k-draft step costs, from the cost profile) is the prior, scaled to the seconds measured; lengths come
from its monotone envelope (``CostEnvelope``), the best predicted at the measured acceptance. Probes (speculation
starting, or resuming after a pause) draft the envelope's cheapest length, lengthened as whole drafts are accepted
(``ramp``), and only where some length is predicted to pay (``LENIENT_SPEEDUP`` before any cost is measured and
after ``LENIENT_AFTER`` extensions), else plain decoding goes on for ``pause_tokens``. After each speculative step
(once ``min_verifies`` are in the window) the kill switch compares seconds per token of the last ``window``
speculative steps with plain's: when speculation is dearer and no length is predicted to pay, the next ``pause``
tokens are plain (``pause_tokens``, doubling after each failed probe up to ``max_pause_tokens``). Untimed steps (a
simulated run) are costed by the prior. With ``measured=False`` (the default with a fixed ``break_even``) nothing is
timed or drafted unverified: the drafter's preferred length moved onto the envelope, paused ``pause_tokens`` when
the last ``window`` verifications yield less than their break-evens.
"""

from __future__ import annotations

import bisect
import math
import statistics
import time
from collections import deque
from collections.abc import Callable

from specbench.core.decision import Decision, Plain, Speculate
from specbench.core.draft import Drafter
from specbench.core.log import StepLog, StepRecord
from specbench.core.policy_args import check_break_even, check_k, whole

#: Auto looks this far for a wider draft that costs less than the drafter's preferred one.
ENVELOPE_K = 8
#: Before any verification is timed, and after ``LENIENT_AFTER`` extended pauses, Auto probes where at least this
#: speedup is predicted: only measured steps correct a cost estimate that is too pessimistic.
LENIENT_SPEEDUP = 0.5
LENIENT_AFTER = 4
#: Plain stretches and cost scales kept: the machine's recent speed, not the whole generation's.
PLAIN_STRETCHES = 4
SCALES = 8


class AutoSettings:
    """Auto's settings, checked (the module docstring says what each does), and the draft lengths they allow."""

    name = "auto"

    def __init__(
        self,
        max_k: int | None = None,
        window: int = 16,
        pause_tokens: int = 64,
        break_even: float | None = None,
        *,
        probe_tokens: int = 8,
        min_verifies: int = 1,
        max_pause_tokens: int = 1024,
        measured: bool | None = None,
        shadow: bool = True,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.max_k = check_k(max_k, "max_k") if max_k is not None else None
        self.window = whole("window", window, 1)
        self.pause_tokens = whole("pause_tokens", pause_tokens, 1)
        self.fixed_break_even = check_break_even(break_even, "break_even") if break_even is not None else None
        self.probe_tokens = whole("probe_tokens", probe_tokens, 1)
        self.min_verifies = min(whole("min_verifies", min_verifies, 1), self.window)
        self.max_pause_tokens = max(self.pause_tokens, whole("max_pause_tokens", max_pause_tokens, 1))
        self.measured = self.fixed_break_even is None if measured is None else bool(measured)
        self.shadow = bool(shadow)
        if not callable(clock):
            raise TypeError(f"clock must be a function returning seconds, got {clock!r}")
        self.clock = clock

    @property
    def needs_break_even(self) -> bool:
        return self.fixed_break_even is None

    def preferred_k(self, drafter: Drafter | None) -> int:
        k = max(1, int(getattr(drafter, "preferred_k", 4)))
        return min(k, self.max_k) if self.max_k else k

    def longest_draft(self, drafter: Drafter | None) -> int:
        """The longest draft this policy may ask of ``drafter``."""
        return self.max_k or max(self.preferred_k(drafter), ENVELOPE_K)

    def choose_node_budget(self, tokens_per_verify: dict[int, float], break_even: Callable[[int], float]) -> int:
        """Tree drafters, before start: max_k := the node budget whose measured tokens per verification best
        beat its break-even (``specbench.cost.trees.tree_break_even``). Returns it."""
        if not tokens_per_verify:
            raise ValueError("choose_node_budget needs tokens per verification for at least one node budget")
        self.max_k = max((t / break_even(int(n)), int(n)) for n, t in tokens_per_verify.items())[1]
        return self.max_k


class AutoDecisions(AutoSettings):
    """What Auto decides each step, from its ``CostEnvelope`` and its ``Evidence`` (the module docstring says how)."""

    def start(self, drafter: Drafter, break_even: Callable[[int], float] | None = None) -> None:
        self._seen = 0  # records of the log filed so far
        if break_even is not None and not callable(break_even):
            raise TypeError(f"break_even must be a function k -> tokens, got {break_even!r}")
        if break_even is None and self.fixed_break_even is None:
            raise ValueError(
                "DraftPolicy.auto() needs a break-even: run it through specbench.speculative_generate (which "
                "hands it the model's cost profile), or give DraftPolicy.auto(break_even=TOKENS)"
            )
        self.pause = self.pause_tokens
        self.pauses = self.extensions = self._waited = 0
        self._why = ""  # why the current plain stretch (``_plain_reason``)
        self._decision: str | None = None
        self._since = self.clock()
        self._drafting_costs = float(getattr(drafter, "cost_per_token", 0.0) or 0.0) > 0.0
        self.plan(CostEnvelope(break_even, self.longest_draft(drafter), self.fixed_break_even), drafter, True)

    def plan(self, costs: CostEnvelope, drafter: Drafter, starting: bool = False) -> None:
        """Decide from ``costs`` (a new generation's, or a batch's new size); ``starting``: with fresh evidence."""
        self.costs = costs
        if starting:
            self.evidence = Evidence(costs, self.window)
            self.remaining = self.probe_tokens if self.measured and costs.lengths else 0
        else:
            self.evidence.envelope = costs
        if not costs.lengths:
            self.k = 0
        else:
            self.k = self._best_k() if self.measured else costs.moved_onto(self.preferred_k(drafter))
        self.break_even = costs.break_even(self.k) if self.k else float("inf")

    def _best_k(self) -> int:
        """The best predicted length on the envelope up to the ramp (the envelope's cheapest at least)."""
        allowed = [k for k in self.costs.lengths if k <= self.evidence.ramp] or self.costs.lengths[:1]
        return max(self.evidence.speedups(allowed))[1]

    def _pays(self, speedup: float = 1.0) -> bool:
        return max(self.evidence.speedups(self.costs.lengths))[0] >= speedup

    def _follow_context(self, log: StepLog, drafter: Drafter) -> None:
        """Plan with the break-even at the context length the log has reached, when the one handed over gives one
        per length (``at_length(L)``, e.g. ``specbench.cost.breakeven.BreakEven``); the evidence is kept."""
        boundaries = getattr(self.costs.break_even_of, "boundaries", ())
        if not boundaries or not log.records:
            return
        first, last = log.records[0], log.records[-1]
        prompt = first.verify_width if first.kind == "prefill" else 0
        length = prompt + last.position + last.emitted
        previous = getattr(self, "_context_length", self.costs.break_even_of.length)
        if bisect.bisect(boundaries, length) == bisect.bisect(boundaries, previous):
            return  # the same measured length is nearest: nothing to ask
        self._context_length = length
        current = self.costs.break_even_of.at_length(length)
        if current is not self.costs.break_even_of:
            self.plan(CostEnvelope(current, self.longest_draft(drafter), self.fixed_break_even), drafter)

    def decide(self, log: StepLog, drafter: Drafter) -> Decision:
        self._follow_context(log, drafter)
        now = self.clock()
        new = log.records[self._seen :]
        self._seen = len(log.records)
        self._file(new, now - self._since)
        k = self._k(drafter)
        self._decision = "speculative" if k > 0 else "plain"
        if k > 0:
            self._why = ""  # a pause's reason ends with it
            longest = self.costs.lengths[-1] if self.costs.lengths else k
            why = "" if k >= longest else f"auto-best-k: k = {k}, the best predicted at acceptance {self._a()}"
            decision: Decision = Speculate(k, self._probing(), reason=why)
        else:
            decision = Plain(self._plain_run(), self._shadow_k(), reason=self._plain_reason())
        self._since = self.clock()
        return decision

    def _a(self) -> str:
        return f"{self.evidence.acceptance():.2f}"

    def _plain_reason(self) -> str:
        """Why Auto decodes plainly now, in the step log's words (``specbench.core.reasons``)."""
        if not self.costs.lengths:
            return "auto-never-pays: no draft length pays at this cost model, even fully accepted"
        if self._why:
            return self._why
        return "auto-measuring: timing plain decoding before drafting"

    def _probing(self) -> bool:
        """A measured probe (speculation starting, or resuming after a pause) while the acceptance measured so
        far is at most one half: the plain step after its full rejection is queued while it verifies, so
        falling back costs no pipeline restart (a draft accepted after all leaves that step unused)."""
        return self.measured and not self.evidence.measured.speculative and self.evidence.acceptance() <= 0.5

    def _shadow_k(self) -> int:
        """While measuring (none with ``shadow=False`` or ``measured=False``): the longest envelope length for
        a drafter that drafts for free, else the length a probe would draft now (``ramp``), so that a model
        drafter (an MTP head, a draft model) pays for few sequential steps while its drafts are rejected."""
        if not (self.measured and self.shadow and self.costs.lengths):
            return 0
        return self.evidence.ramp if self._drafting_costs else self.costs.lengths[-1]

    def _file(self, records: list[StepRecord], seconds: float) -> None:
        """File the records of the last decision (one speculative step or one plain stretch)."""
        decoded = [r for r in records if r.kind != "prefill"]
        if not decoded or self._decision is None:
            return
        # Untimed records (a simulated run) are costed by the prior, in plain steps.
        timed = any(r.draft_s + r.verify_s + r.other_s > 0 for r in decoded)
        if self._decision == "plain":
            self.remaining = max(0, self.remaining - self.evidence.file_plain(decoded, seconds, timed, self.measured))
        elif self.evidence.file_speculative(decoded, seconds, timed, self.measured):
            self._check()

    def _check(self) -> None:
        """The kill switch, after each speculative decision."""
        seen = self.evidence.measured
        if seen.timed():
            if len(seen.speculative) < self.min_verifies:
                return
            if not seen.plain:
                self.remaining = self.probe_tokens  # time plain decoding in this generation too
                return
            losing = seen.speculative_seconds_per_token() > seen.plain_seconds_per_token()
            if losing and len(seen.speculative) < 2 and not self.evidence.wasted:
                return  # one timing alone (a first call's kernel build, say) pauses no accepted draft
            if losing and not self._pays():
                self._why = (
                    f"auto-slower: {1e3 * seen.speculative_seconds_per_token():.3g} ms a token speculating against "
                    f"{1e3 * seen.plain_seconds_per_token():.3g} plain over the last {len(seen.speculative)} drafts"
                )
                self._pause(self.pause)
                self.pause = min(2 * self.pause, self.max_pause_tokens)
            elif not losing and seen.full():
                self.pause = self.pause_tokens
        elif seen.full() and seen.below_break_even():
            self._why = (
                f"auto-below-break-even: acceptance {self._a()} yielded fewer tokens than the break-even over the last "
                f"{len(seen.speculative)} verifications"
            )
            self._pause(self.pause_tokens)

    def _pause(self, tokens: int) -> None:
        self.remaining = tokens
        self.pauses += 1
        self.evidence.measured.forget_speculative()
        self.evidence.fade()

    def _k(self, drafter: Drafter) -> int:
        if self.remaining > 0 or self.k == 0:
            return 0
        if self.measured:
            if not self.evidence.measured.speculative:  # a probe: only where what was measured says a draft pays
                lenient = not self.evidence.measured.scales or self._waited >= LENIENT_AFTER
                if not self._pays(LENIENT_SPEEDUP if lenient else 1.0):
                    self._why = f"auto-waiting: acceptance {self._a()} predicts no gain at any draft length"
                    self.remaining = self.pause_tokens  # plain on, the next unverified draft watching acceptance
                    self.extensions += 1
                    self._waited += 1
                    self.evidence.fade()
                    return 0
                self._waited = 0
            self.k = self._best_k()
        return self.k

    def _plain_run(self) -> int:
        return max(1, self.remaining) if self.k else 1 << 30


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
