"""Draft-length policies: how many tokens to draft at each step.

What a policy answers (``Speculate``, ``Plain``) is in ``specbench.core.decision``; Auto's settings and decisions
in ``specbench.core.auto``. Policies see only the log and what they were handed (a break-even, for Auto): they
never measure, load or run a model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from specbench.common.registry import Registry
from specbench.core.auto import AutoDecisions
from specbench.core.decision import Decision, Plain, Speculate
from specbench.core.draft import Drafter
from specbench.core.log import StepLog, StepRecord
from specbench.core.policy_args import check_k, whole

#: Policies of other engines by text name (``NAME`` or ``NAME:ARGS``): name -> a DraftPolicy class with
#: ``from_text(args)``; each module of ``specbench.core.peer_policies`` registers its own.
PEERS: Registry[Any] = Registry("policy", package="specbench.core.peer_policies")


class DraftPolicy:
    """Decides each step from the step log: ``decide`` answers ``Speculate(k)`` or ``Plain(n)``.

    Construct with ``DraftPolicy.fixed(n)``, ``.adaptive(n)`` or ``.auto()``.
    """

    name = "policy"
    #: Whether ``start`` needs the break-even function (tokens a verification of k drafts must yield).
    needs_break_even = False
    #: The batch this policy's request decodes in (the batch engine sets it before every step).
    batch_size = 1

    def set_batch_size(self, batch_size: int) -> None:
        self.batch_size = batch_size

    def start(self, drafter: Drafter, break_even: Callable[[int], float] | None = None) -> None:
        """Reset for a new generation; ``break_even(k)``: tokens a verification of k drafts must yield."""
        self._seen = 0

    def decide(self, log: StepLog, drafter: Drafter) -> Decision:
        """The next step, from the records logged since the last decision."""
        for record in log.records[self._seen :]:
            self._observe(record)
        self._seen = len(log.records)
        k = self._k(drafter)
        return Speculate(k) if k > 0 else Plain(self._plain_run())

    def _plain_run(self) -> int:
        """How many plain steps to take when ``_k`` returned 0."""
        return 1

    def longest_draft(self, drafter: Drafter | None) -> int:
        """The longest draft this policy may ask of ``drafter`` (the widths a verifier must be ready for)."""
        return max(1, int(getattr(drafter, "preferred_k", 4)))

    def _observe(self, record: StepRecord) -> None:
        pass

    def _k(self, drafter: Drafter) -> int:
        raise NotImplementedError

    @staticmethod
    def fixed(k: int) -> FixedPolicy:
        return FixedPolicy(k)

    @staticmethod
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

    def __init__(self, k: int):
        self.k = check_k(k)
        self.name = f"fixed:{k}"

    def _k(self, drafter: Drafter) -> int:
        return self.k

    def longest_draft(self, drafter: Drafter | None) -> int:
        return self.k


class AdaptivePolicy(DraftPolicy):
    """Up to ``k`` tokens; after a fully rejected draft, pause 1, 2, 4, ... ``max_pause`` steps."""

    def __init__(self, k: int, max_pause: int = 16):
        self.k = check_k(k)
        self.max_pause = whole("max_pause", max_pause, 1)
        self.name = f"adaptive:{k}"

    def start(self, drafter: Drafter, break_even: Callable[[int], float] | None = None) -> None:
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

    def _k(self, drafter: Drafter) -> int:
        return 0 if self.remaining > 0 else self.k

    def _plain_run(self) -> int:
        return max(1, self.remaining)

    def longest_draft(self, drafter: Drafter | None) -> int:
        return self.k


class AutoPolicy(AutoDecisions, DraftPolicy):
    """Speculates while this generation's own measurements say it pays, else decodes plainly (``DraftPolicy.auto()``).

    Its settings and its decisions, with the cost envelope and the evidence they read, are in
    ``specbench.core.auto`` (``AutoSettings``, ``AutoDecisions``), whose docstring says how it decides.
    """
