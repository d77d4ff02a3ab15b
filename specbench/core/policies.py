"""Draft-length policies: how many tokens to draft at each step.

Policies see only the log and what they were handed (a break-even, for Auto): they never measure,
load or run a model.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from specbench.common.deprecation import renamed_arguments, renamed_attribute
from specbench.core.log import StepLog
from specbench.core.measured import Measured
from specbench.core.policy_args import at_least_one, check_break_even, check_k

#: Auto looks this far for a wider draft that costs less than the drafter's preferred one.
ENVELOPE_K = 8
#: Before any verification is timed, and after ``LENIENT_AFTER`` extended pauses, Auto probes where at least this
#: speedup is predicted: only measured steps correct a cost estimate that is too pessimistic.
LENIENT_SPEEDUP = 0.5
LENIENT_AFTER = 4


class DraftPolicy:
    """Decides the draft length of each step from the step log.

    ``next_k`` returns the number of tokens to draft (0: decode the next steps plainly, for
    ``plain_run()`` steps). Construct with ``DraftPolicy.fixed(k)``, ``.adaptive(k)`` or ``.auto()``.
    """

    name = "policy"
    #: Whether ``start`` needs the break-even function (tokens a verification of k drafts must yield).
    needs_break_even = False

    def start(self, drafter: Any, break_even: Callable[[int], float] | None = None) -> None:
        """Reset for a new generation; ``break_even(k)``: tokens a verification of k drafts must yield."""
        self._seen = 0

    def next_k(self, log: StepLog, drafter: Any) -> int:
        for record in log.records[self._seen :]:
            self._observe(record)
        self._seen = len(log.records)
        return self._k(drafter)

    def plain_run(self) -> int:
        """How many plain steps to take after ``next_k`` returned 0."""
        return 1

    def shadow_k(self) -> int:
        """Tokens to draft unverified before the plain stretch ``next_k`` asked for (0: none); logged on
        its first step (``draft_tokens``, ``draft_s``), compared with the tokens decoded."""
        return 0

    def probing(self) -> bool:
        """Whether the verification ``next_k`` just asked for is a probe whose drafts are expected to be
        rejected: the target then queues the plain step after a full rejection while it verifies."""
        return False

    def longest_draft(self, drafter: Any) -> int:
        """The longest draft this policy may ask of ``drafter`` (the widths a verifier must be ready for)."""
        return max(1, int(getattr(drafter, "preferred_k", 4)))

    def _observe(self, record: dict[str, Any]) -> None:
        pass

    def _k(self, drafter: Any) -> int:
        raise NotImplementedError

    @staticmethod
    @renamed_arguments(n="k")
    def fixed(k: int) -> FixedPolicy:
        return FixedPolicy(k)

    @staticmethod
    @renamed_arguments(n="k")
    def adaptive(k: int, max_pause: int = 16) -> AdaptivePolicy:
        return AdaptivePolicy(k, max_pause)

    @staticmethod
    def auto(
        max_k: int | None = None,
        window: int = 16,
        pause_tokens: int = 64,
        break_even: float | None = None,
        **measuring: Any,
    ) -> AutoPolicy:
        """See ``AutoPolicy`` (``measuring``: probe_tokens, min_verifies, max_pause_tokens, measured, shadow, clock)."""
        return AutoPolicy(max_k, window, pause_tokens, break_even, **measuring)

    @staticmethod
    def parse(spec: str) -> DraftPolicy:
        """Build a policy from text: ``auto``, ``fixed:4``, ``adaptive:8``."""
        if not isinstance(spec, str):
            raise TypeError(f"a policy must be text: auto, fixed:K or adaptive:K, got {spec!r} ({type(spec).__name__})")
        name, _, arg = spec.strip().partition(":")
        if name == "auto" and not arg:
            return DraftPolicy.auto()
        if name in ("fixed", "adaptive") and arg.isdigit():
            return getattr(DraftPolicy, name)(int(arg))
        raise ValueError(f"unknown policy {spec!r}: use auto, fixed:K or adaptive:K (K >= 1)")


def as_policy(policy: DraftPolicy | str | int) -> DraftPolicy:
    """A policy object: text (``"fixed:4"``, ``"auto"``) parsed here, an int k as ``DraftPolicy.fixed(k)``."""
    if isinstance(policy, DraftPolicy):
        return policy
    if isinstance(policy, str):
        return DraftPolicy.parse(policy)
    if isinstance(policy, int) and not isinstance(policy, bool):
        return DraftPolicy.fixed(policy)
    raise TypeError(f"a policy is a DraftPolicy, its text (e.g. 'fixed:4', 'auto') or a draft length, got {policy!r}")


class FixedPolicy(DraftPolicy):
    """Up to ``k`` tokens every step."""

    @renamed_arguments(n="k")
    def __init__(self, k: int):
        self.k = check_k(k)
        self.name = f"fixed:{k}"

    def _k(self, drafter: Any) -> int:
        return self.k

    def longest_draft(self, drafter: Any) -> int:
        return self.k

    n = renamed_attribute("n", "k")


class AdaptivePolicy(DraftPolicy):
    """Up to ``k`` tokens; after a fully rejected draft, pause 1, 2, 4, ... ``max_pause`` steps."""

    @renamed_arguments(n="k")
    def __init__(self, k: int, max_pause: int = 16):
        self.k = check_k(k)
        self.max_pause = at_least_one("max_pause", max_pause)
        self.name = f"adaptive:{k}"

    def start(self, drafter: Any, break_even: Callable[[int], float] | None = None) -> None:
        super().start(drafter, break_even)
        self.pause = 1
        self.remaining = 0

    def _observe(self, record: dict[str, Any]) -> None:
        if record["kind"] == "verify":
            if record["accepted"] == 0:
                self.remaining = self.pause
                self.pause = min(2 * self.pause, self.max_pause)
            else:
                self.pause = 1
        elif record["paused"]:
            self.remaining = max(0, self.remaining - 1)

    def _k(self, drafter: Any) -> int:
        return 0 if self.remaining > 0 else self.k

    def plain_run(self) -> int:
        return max(1, self.remaining)

    def longest_draft(self, drafter: Any) -> int:
        return self.k

    n = renamed_attribute("n", "k")


class AutoPolicy(DraftPolicy):
    """Speculates while this generation's own measurements say it pays, else decodes plainly.

    Each decision (a speculative step, a stretch of plain steps) is timed end to end with ``clock``. It
    starts with ``probe_tokens`` plain tokens, timing plain decoding. Each plain stretch starts with an
    unverified draft (``shadow_k``; as long as a probe's when drafting costs, see ``cost_per_token``):
    compared with the tokens decoded, it measures acceptance for the cost of drafting. Probes (speculation
    starting, or resuming after a pause) draft the envelope's cheapest length, lengthening only as whole
    drafts are seen accepted (``ramp``), and are made only where the
    acceptance and cost measured so far predict some length pays (``LENIENT_SPEEDUP`` before any cost is
    measured and after ``LENIENT_AFTER`` extensions), else plain decoding goes on for ``pause_tokens``.
    After each speculative step (once ``min_verifies`` are in the window) the kill switch compares seconds
    per token of the last ``window`` speculative steps with plain's: when speculation is dearer and no
    length is predicted to pay, the next ``pause`` tokens are plain (``pause_tokens``, doubling after each
    failed probe up to ``max_pause_tokens``). The break-even (k -> plain steps a k-draft step costs, from
    the cost profile) is the prior, scaled to the seconds measured; lengths come from the monotone
    envelope of that curve (a wider draft that costs no more is taken; none a full acceptance cannot pay
    for), the best predicted at the measured per-position acceptance (one accepted and one rejected
    position assumed). Plain steps a speculative decision takes before its draft (the step a pause
    queued past its end) count as plain decoding, not speculation. Untimed steps (a simulated run)
    are costed by the prior. With ``measured=False``
    (the default with a fixed ``break_even``) nothing is timed or drafted unverified: the drafter's
    preferred length moved onto the envelope, paused ``pause_tokens`` when the last ``window``
    verifications yield less than their break-evens.
    """

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
        self.window = at_least_one("window", window)
        self.pause_tokens = at_least_one("pause_tokens", pause_tokens)
        self.fixed_break_even = check_break_even(break_even, "break_even") if break_even is not None else None
        self.probe_tokens = at_least_one("probe_tokens", probe_tokens)
        self.min_verifies = min(at_least_one("min_verifies", min_verifies), self.window)
        self.max_pause_tokens = max(self.pause_tokens, at_least_one("max_pause_tokens", max_pause_tokens))
        self.measured = self.fixed_break_even is None if measured is None else bool(measured)
        self.shadow = bool(shadow)
        if not callable(clock):
            raise TypeError(f"clock must be a function returning seconds, got {clock!r}")
        self.clock = clock

    @property
    def needs_break_even(self) -> bool:
        return self.fixed_break_even is None

    def start(self, drafter: Any, break_even: Callable[[int], float] | None = None) -> None:
        super().start(drafter, break_even)
        if break_even is not None and not callable(break_even):
            raise TypeError(f"break_even must be a function k -> tokens, got {break_even!r}")
        if break_even is None and self.fixed_break_even is None:
            raise ValueError(
                "DraftPolicy.auto() needs a break-even: run it through specbench.speculative_generate (which "
                "hands it the model's cost profile), or give DraftPolicy.auto(break_even=TOKENS)"
            )
        self._break_even_of = break_even
        self._break_evens: dict[int, float] = {}
        #: This generation's recent speculative decisions and plain stretches, timed.
        self.measured_so_far = Measured(self.window)
        #: Draft positions accepted and rejected, verified or not (halved at each pause: old evidence fades).
        self.accepted = self.rejected = 0.0
        self.pause = self.pause_tokens
        self.pauses = self.extensions = self.shadows = self._waited = 0
        self._wasted = False
        self._decision: str | None = None
        self._since = self.clock()
        self.envelope = self.cost_envelope(drafter)
        self._drafting_costs = float(getattr(drafter, "cost_per_token", 0.0) or 0.0) > 0.0
        #: The longest draft a probe may use now: the envelope's cheapest, lengthened as drafts are accepted.
        self.ramp = self.envelope[0] if self.envelope else 0
        if self.measured:
            self.k = self._best_k() if self.envelope else 0
            self.remaining = self.probe_tokens if self.envelope else 0
        else:
            self.k = self._initial_k(drafter)
            self.remaining = 0
        self.break_even = self._break_even_for(self.k) if self.k else float("inf")

    # -- the prior: the cost curve ----------------------------------------------------------------
    def _break_even_for(self, k: int) -> float:
        if self.fixed_break_even is not None:
            return self.fixed_break_even
        if k not in self._break_evens:
            self._break_evens[k] = check_break_even(self._break_even_of(k), f"the break-even of k = {k}")
        return self._break_evens[k]

    def preferred_k(self, drafter: Any) -> int:
        k = max(1, int(getattr(drafter, "preferred_k", 4)))
        return min(k, self.max_k) if self.max_k else k

    def longest_draft(self, drafter: Any) -> int:
        """The longest draft this policy may ask of ``drafter``."""
        return self.max_k or max(self.preferred_k(drafter), ENVELOPE_K)

    def choose_node_budget(self, tokens_per_verify: dict[int, float], break_even: Callable[[int], float]) -> int:
        """Tree drafters, before start: max_k := the node budget whose measured tokens per verification best
        beat its break-even (``specbench.cost.trees.tree_break_even``). Returns it."""
        if not tokens_per_verify:
            raise ValueError("choose_node_budget needs tokens per verification for at least one node budget")
        self.max_k = max((t / break_even(int(n)), int(n)) for n, t in tokens_per_verify.items())[1]
        return self.max_k

    def cost_envelope(self, drafter: Any) -> list[int]:
        """Draft lengths on the monotone envelope of the cost curve, up to ``longest_draft``: those
        no wider length undercuts and that a fully accepted draft can pay for (k + 1 > break-even)."""
        ks = range(1, self.longest_draft(drafter) + 1)
        costs = {k: self._break_even_for(k) for k in ks}
        cheapest_wider = float("inf")
        envelope = []
        for k in reversed(ks):
            if costs[k] <= cheapest_wider and costs[k] < k + 1:
                envelope.append(k)
            cheapest_wider = min(cheapest_wider, costs[k])
        return envelope[::-1]

    def _initial_k(self, drafter: Any) -> int:
        """The drafter's preferred length moved onto the envelope: the narrowest envelope length at
        least as long that costs no more, else the longest shorter one; 0 if the envelope is empty."""
        preferred = self.preferred_k(drafter)
        cost = self._break_even_for(preferred)
        wider = [k for k in self.envelope if k >= preferred and self._break_even_for(k) <= cost]
        if wider:
            return wider[0]
        shorter = [k for k in self.envelope if k <= preferred]
        return shorter[-1] if shorter else 0

    def acceptance(self) -> float:
        """Per-position acceptance measured so far, with one accepted and one rejected position assumed."""
        return (self.accepted + 1.0) / (self.accepted + self.rejected + 2.0)

    def predicted_speedup(self, k: int) -> float:
        """Speedup over plain decoding predicted for drafting k: tokens expected at the measured
        acceptance over the break-even, scaled by how far the measured seconds stray from it."""
        return self._speedups([k])[0][0]

    def _speedups(self, ks: list[int]) -> list[tuple[float, int]]:
        a, scale = self.acceptance(), self.measured_so_far.cost_scale()
        return [(_expected_tokens(a, k) / (self._break_even_for(k) * scale), k) for k in ks]

    def _best_k(self) -> int:
        """The best predicted length on the envelope up to the ramp (the envelope's cheapest at least)."""
        allowed = [k for k in self.envelope if k <= self.ramp] or self.envelope[:1]
        return max(self._speedups(allowed))[1]

    def _pays(self, speedup: float = 1.0) -> bool:
        return max(self._speedups(self.envelope))[0] >= speedup

    def _lengthen(self, accepted: int) -> None:
        """A whole draft of ``accepted`` tokens was accepted: drafts may be twice as long."""
        if self.envelope:
            self.ramp = max(self.ramp, min(self.envelope[-1], 2 * accepted))

    # -- the measurements -------------------------------------------------------------------------
    def next_k(self, log: StepLog, drafter: Any) -> int:
        now = self.clock()
        new = log.records[self._seen :]
        self._seen = len(log.records)
        self._account(new, now - self._since)
        k = self._k(drafter)
        self._decision = "speculative" if k > 0 else "plain"
        self._since = self.clock()
        return k

    def probing(self) -> bool:
        """A measured probe (speculation starting, or resuming after a pause) while the acceptance measured so
        far is at most one half: the plain step after its full rejection is queued while it verifies, so
        falling back costs no pipeline restart (a draft accepted after all leaves that step unused)."""
        return self.measured and not self.measured_so_far.speculative and self.acceptance() <= 0.5

    def shadow_k(self) -> int:
        """While measuring (none with ``shadow=False`` or ``measured=False``): the longest envelope length for
        a drafter that drafts for free, else the length a probe would draft now (``ramp``), so that a model
        drafter (an MTP head, a draft model) pays for few sequential steps while its drafts are rejected."""
        if not (self.measured and self.shadow and self.envelope):
            return 0
        return self.ramp if self._drafting_costs else self.envelope[-1]

    def _account(self, records: list[dict[str, Any]], seconds: float) -> None:
        """File the records of the last decision (one speculative step or one plain stretch)."""
        decoded = [r for r in records if r["kind"] != "prefill"]
        if not decoded or self._decision is None:
            return
        tokens = sum(r["emitted"] for r in decoded)
        # Untimed records (a simulated run) are costed by the prior, in plain steps.
        timed = any(r["draft_s"] + r["verify_s"] + r["other_s"] > 0 for r in decoded)
        if self._decision == "plain":
            self.remaining = max(0, self.remaining - tokens)
            seconds -= self._file_shadow(decoded)
            if timed and len(decoded) > 1:  # steady state: the first step pays for filling the pipeline
                seconds, tokens = seconds - decoded[0]["verify_s"], tokens - decoded[0]["emitted"]
            if self.measured and tokens:
                self.measured_so_far.add_plain(seconds if timed else float(tokens), tokens)
            return
        # plain steps before this decision's draft (the step a pause queued past its end) are plain decoding's
        lead = next((i for i, r in enumerate(decoded) if r["kind"] != "plain" or r["draft_s"]), len(decoded))
        seconds -= sum(r["verify_s"] for r in decoded[:lead])
        tokens -= sum(r["emitted"] for r in decoded[:lead])
        if not (decoded := decoded[lead:]):
            return
        verifies = [r for r in decoded if r["kind"] == "verify"]
        if not self.measured and not verifies:
            return  # the break-even rule holds verifications to their break-even
        units = 0.0
        self._wasted = all(r["accepted"] == 0 for r in verifies)
        for r in decoded:
            if r["kind"] == "verify":
                units += self._break_even_for(r["k_drafted"])
                deepest = r.get("tree_depth") or r["k_drafted"]  # a tree's path is at most its depth long
                self.accepted += r["accepted"]
                self.rejected += int(r["accepted"] < deepest)
                if r["accepted"] == deepest:
                    self._lengthen(r["accepted"])
            else:
                units += 1.0
        spent = (seconds if timed else units) if self.measured else None
        self.measured_so_far.add_speculative(spent, tokens, units)
        self._check()

    def _file_shadow(self, records: list[dict[str, Any]]) -> float:
        """Acceptance from the unverified draft a plain stretch started with; its drafting seconds."""
        drafted = records[0].get("draft_tokens") or []
        if records[0]["kind"] != "plain" or not drafted:
            return 0.0
        decoded = [t for r in records for t in r["tokens"]]
        n = min(len(drafted), len(decoded))
        hits = next((i for i in range(n) if drafted[i] != decoded[i]), n)
        self.accepted += hits
        self.rejected += int(hits < n)
        self.shadows += 1
        if hits == len(drafted):
            self._lengthen(hits)
        return float(records[0]["draft_s"])

    def _check(self) -> None:
        """The kill switch, after each speculative decision."""
        seen = self.measured_so_far
        if seen.timed():
            if len(seen.speculative) < self.min_verifies:
                return
            if not seen.plain:
                self.remaining = self.probe_tokens  # time plain decoding in this generation too
                return
            losing = seen.speculative_seconds_per_token() > seen.plain_seconds_per_token()
            if losing and len(seen.speculative) < 2 and not self._wasted:
                return  # one timing alone (a first call's kernel build, say) pauses no accepted draft
            if losing and not self._pays():
                self._pause(self.pause)
                self.pause = min(2 * self.pause, self.max_pause_tokens)
            elif not losing and seen.full():
                self.pause = self.pause_tokens
        elif seen.full() and seen.below_break_even():
            self._pause(self.pause_tokens)

    def _pause(self, tokens: int) -> None:
        self.remaining = tokens
        self.pauses += 1
        self.measured_so_far.forget_speculative()
        self._fade()

    def _fade(self) -> None:
        """Halve the acceptance evidence so far and start probes short again."""
        self.accepted /= 2
        self.rejected /= 2
        self.ramp = self.envelope[0] if self.envelope else 0

    def plain_seconds_per_token(self) -> float:
        return self.measured_so_far.plain_seconds_per_token()

    def speculative_seconds_per_token(self) -> float:
        return self.measured_so_far.speculative_seconds_per_token()

    def _k(self, drafter: Any) -> int:
        if self.remaining > 0 or self.k == 0:
            return 0
        if self.measured:
            if not self.measured_so_far.speculative:  # a probe: only where what was measured says a draft pays
                lenient = not self.measured_so_far.scales or self._waited >= LENIENT_AFTER
                if not self._pays(LENIENT_SPEEDUP if lenient else 1.0):
                    self.remaining = self.pause_tokens  # plain on, the next unverified draft watching acceptance
                    self.extensions += 1
                    self._waited += 1
                    self._fade()
                    return 0
                self._waited = 0
            self.k = self._best_k()
        return self.k

    def plain_run(self) -> int:
        return max(1, self.remaining) if self.k else 1 << 30


def _expected_tokens(a: float, k: int) -> float:
    """Tokens a verification of k drafts yields when each is accepted with probability a."""
    return float(k + 1) if a >= 1.0 else (1.0 - a ** (k + 1)) / (1.0 - a)
