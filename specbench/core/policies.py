"""Draft-length policies: how many tokens to draft at each step.

Policies see only the log and what they were handed (a break-even, for Auto): they never measure,
load or run a model.

How Auto decides. Each decision (a speculative step, a stretch of plain steps) is timed end to end with ``clock``.
It starts with ``probe_tokens`` plain tokens, timing plain decoding. Each plain stretch starts with an unverified
draft (``Plain.shadow``; as long as a probe's when drafting costs, see ``cost_per_token``): compared with the tokens
decoded, it measures acceptance for the cost of drafting. Probes (speculation starting, or resuming after a pause)
draft the envelope's cheapest length, lengthening only as whole drafts are seen accepted (``ramp``), and are made
only where the acceptance and cost measured so far predict some length pays (``LENIENT_SPEEDUP`` before any cost is
measured and after ``LENIENT_AFTER`` extensions), else plain decoding goes on for ``pause_tokens``. After each
speculative step (once ``min_verifies`` are in the window) the kill switch compares seconds per token of the last
``window`` speculative steps with plain's: when speculation is dearer and no length is predicted to pay, the next
``pause`` tokens are plain (``pause_tokens``, doubling after each failed probe up to ``max_pause_tokens``). The
break-even (k -> plain steps a k-draft step costs, from the cost profile) is the prior, scaled to the seconds
measured; lengths come from the monotone envelope of that curve (a wider draft that costs no more is taken; none a
full acceptance cannot pay for), the best predicted at the measured per-position acceptance (one accepted and one
rejected position assumed). Plain steps a speculative decision takes before its draft (the step a pause queued past
its end) count as plain decoding, not speculation. Untimed steps (a simulated run) are costed by the prior. With
``measured=False`` (the default with a fixed ``break_even``) nothing is timed or drafted unverified: the drafter's
preferred length moved onto the envelope, paused ``pause_tokens`` when the last ``window`` verifications yield less
than their break-evens.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from specbench.common.deprecation import renamed_arguments, renamed_attribute
from specbench.core.auto import CostEnvelope, Evidence
from specbench.core.log import StepLog, StepRecord
from specbench.core.policy_args import at_least_one, check_break_even, check_k

#: Auto looks this far for a wider draft that costs less than the drafter's preferred one.
ENVELOPE_K = 8
#: Before any verification is timed, and after ``LENIENT_AFTER`` extended pauses, Auto probes where at least this
#: speedup is predicted: only measured steps correct a cost estimate that is too pessimistic.
LENIENT_SPEEDUP = 0.5
LENIENT_AFTER = 4


@dataclass(frozen=True)
class Speculate:
    """Draft ``k`` tokens and verify them; ``probing``: a probe whose drafts are expected to be rejected
    (a pipelined target then queues the plain step after a full rejection while it verifies);
    ``min_confidence``: cut the draft before its first token the drafter gave a lower probability."""

    k: int
    probing: bool = False
    min_confidence: float = 0.0


@dataclass(frozen=True)
class Plain:
    """Decode ``n`` plain steps; ``shadow``: tokens to draft first and not verify, logged on the stretch's
    first step (``draft_tokens``, ``draft_s``) for the policy to compare with the tokens decoded."""

    n: int
    shadow: int = 0


#: What a policy answers once per step.
Decision = Speculate | Plain

#: Policies of other engines by text name (``NAME`` or ``NAME:ARGS``): name -> a DraftPolicy class with
#: ``from_text(args)``; filled by ``specbench.core.peer_policies`` (imported with ``specbench.core``).
PEERS: dict[str, Any] = {}


class DraftPolicy:
    """Decides each step from the step log: ``decide`` answers ``Speculate(k)`` or ``Plain(n)``.

    Construct with ``DraftPolicy.fixed(n)``, ``.adaptive(n)`` or ``.auto()``.
    """

    name = "policy"
    #: Whether ``start`` needs the break-even function (tokens a verification of k drafts must yield).
    needs_break_even = False

    def start(self, drafter: Any, break_even: Callable[[int], float] | None = None) -> None:
        """Reset for a new generation; ``break_even(k)``: tokens a verification of k drafts must yield."""
        self._seen = 0

    def decide(self, log: StepLog, drafter: Any) -> Decision:
        """The next step, from the records logged since the last decision."""
        for record in log.records[self._seen :]:
            self._observe(record)
        self._seen = len(log.records)
        k = self._k(drafter)
        return Speculate(k) if k > 0 else Plain(self._plain_run())

    def _plain_run(self) -> int:
        """How many plain steps to take when ``_k`` returned 0."""
        return 1

    def longest_draft(self, drafter: Any) -> int:
        """The longest draft this policy may ask of ``drafter`` (the widths a verifier must be ready for)."""
        return max(1, int(getattr(drafter, "preferred_k", 4)))

    def _observe(self, record: StepRecord) -> None:
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
    def vllm_table(table: Any, max_k: int | None = None) -> DraftPolicy:
        """vLLM's draft length by batch size (``specbench.core.peer_policies.vllm``)."""
        return PEERS["vllm"](table, max_k)

    @staticmethod
    def sglang_ema(**settings: Any) -> DraftPolicy:
        """SGLang's EMA-adaptive tiers (``specbench.core.peer_policies.sglang``)."""
        return PEERS["sglang"](**settings)

    @staticmethod
    def ollama_controller(**settings: Any) -> DraftPolicy:
        """ollama's MLX runner: expected committed tokens per cost (``specbench.core.peer_policies.ollama``)."""
        return PEERS["ollama"](**settings)

    @staticmethod
    def confidence(threshold: float = 0.5, max_k: int = 8) -> DraftPolicy:
        """Stop a draft where the drafter's probability falls under ``threshold``
        (``specbench.core.peer_policies.threshold``)."""
        return PEERS["confidence"](threshold, max_k)

    @staticmethod
    def parse(spec: str) -> DraftPolicy:
        """Build a policy from text: ``auto``, ``fixed:4``, ``adaptive:8``, or another engine's policy by name
        (``PEERS``: ``vllm:1-16=3,64=2``, ``sglang``, ``ollama``, ``confidence:0.6``)."""
        known = "auto, fixed:K, adaptive:K, " + ", ".join(f"{name}[:...]" for name in PEERS)
        if not isinstance(spec, str):
            raise TypeError(f"a policy must be text: {known}, got {spec!r} ({type(spec).__name__})")
        name, _, arg = spec.strip().partition(":")
        if name == "auto" and not arg:
            return DraftPolicy.auto()
        if name in ("fixed", "adaptive") and arg.isdigit():
            return getattr(DraftPolicy, name)(int(arg))
        if name in PEERS:
            return PEERS[name].from_text(arg)
        raise ValueError(f"unknown policy {spec!r}: use {known} (K >= 1)")


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

    def _observe(self, record: StepRecord) -> None:
        if record.kind == "verify":
            if record.accepted == 0:
                self.remaining = self.pause
                self.pause = min(2 * self.pause, self.max_pause)
            else:
                self.pause = 1
        elif record.paused:
            self.remaining = max(0, self.remaining - 1)

    def _k(self, drafter: Any) -> int:
        return 0 if self.remaining > 0 else self.k

    def _plain_run(self) -> int:
        return max(1, self.remaining)

    def longest_draft(self, drafter: Any) -> int:
        return self.k

    n = renamed_attribute("n", "k")


class AutoSettings(DraftPolicy):
    """Auto's settings, checked (``AutoPolicy`` says what each does), and the draft lengths they allow."""

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


class AutoPolicy(AutoSettings):
    """Speculates while this generation's own measurements say it pays, else decodes plainly.

    Decides from its cost envelope (``CostEnvelope``: the lengths the cost curve lets pay) and its evidence
    (``Evidence``: acceptance seen, the ramp, the timed windows), both in ``specbench.core.auto``; the module
    docstring says how. ``measured=False`` (the default with a fixed ``break_even``) times and shadows nothing.
    """

    def start(self, drafter: Any, break_even: Callable[[int], float] | None = None) -> None:
        super().start(drafter, break_even)
        if break_even is not None and not callable(break_even):
            raise TypeError(f"break_even must be a function k -> tokens, got {break_even!r}")
        if break_even is None and self.fixed_break_even is None:
            raise ValueError(
                "DraftPolicy.auto() needs a break-even: run it through specbench.speculative_generate (which "
                "hands it the model's cost profile), or give DraftPolicy.auto(break_even=TOKENS)"
            )
        self.pause = self.pause_tokens
        self.pauses = self.extensions = self._waited = 0
        self._decision: str | None = None
        self._since = self.clock()
        self._drafting_costs = float(getattr(drafter, "cost_per_token", 0.0) or 0.0) > 0.0
        self.plan(CostEnvelope(break_even, self.longest_draft(drafter), self.fixed_break_even), drafter, True)

    def plan(self, costs: CostEnvelope, drafter: Any, starting: bool = False) -> None:
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

    def _follow_context(self, log: StepLog, drafter: Any) -> None:
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

    def decide(self, log: StepLog, drafter: Any) -> Decision:
        self._follow_context(log, drafter)
        now = self.clock()
        new = log.records[self._seen :]
        self._seen = len(log.records)
        self._file(new, now - self._since)
        k = self._k(drafter)
        self._decision = "speculative" if k > 0 else "plain"
        decision = Speculate(k, self._probing()) if k > 0 else Plain(self._plain_run(), self._shadow_k())
        self._since = self.clock()
        return decision

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
                self._pause(self.pause)
                self.pause = min(2 * self.pause, self.max_pause_tokens)
            elif not losing and seen.full():
                self.pause = self.pause_tokens
        elif seen.full() and seen.below_break_even():
            self._pause(self.pause_tokens)

    def _pause(self, tokens: int) -> None:
        self.remaining = tokens
        self.pauses += 1
        self.evidence.measured.forget_speculative()
        self.evidence.fade()

    def _k(self, drafter: Any) -> int:
        if self.remaining > 0 or self.k == 0:
            return 0
        if self.measured:
            if not self.evidence.measured.speculative:  # a probe: only where what was measured says a draft pays
                lenient = not self.evidence.measured.scales or self._waited >= LENIENT_AFTER
                if not self._pays(LENIENT_SPEEDUP if lenient else 1.0):
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
