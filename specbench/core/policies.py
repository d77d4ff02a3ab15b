"""Draft-length policies: how many tokens to draft at each step.

Policies see only the log and what they were handed (a break-even, for Auto): they never measure,
load or run a model.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from numbers import Integral
from typing import Any

from specbench.core.log import StepLog


class DraftPolicy:
    """Decides the draft length of each step from the step log.

    ``next_k`` returns the number of tokens to draft (0: decode the next steps plainly, for
    ``plain_run()`` steps). Construct with ``DraftPolicy.fixed(n)``, ``.adaptive(n)`` or ``.auto()``.
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

    def _observe(self, record: dict[str, Any]) -> None:
        pass

    def _k(self, drafter: Any) -> int:
        raise NotImplementedError

    @staticmethod
    def fixed(n: int) -> FixedPolicy:
        return FixedPolicy(n)

    @staticmethod
    def adaptive(n: int, max_pause: int = 16) -> AdaptivePolicy:
        return AdaptivePolicy(n, max_pause)

    @staticmethod
    def auto(
        max_k: int | None = None,
        window: int = 16,
        pause_tokens: int = 64,
        break_even: float | None = None,
    ) -> AutoPolicy:
        return AutoPolicy(max_k, window, pause_tokens, break_even)

    @staticmethod
    def parse(spec: str) -> DraftPolicy:
        """Build a policy from text: ``auto``, ``fixed:4``, ``adaptive:8``."""
        if not isinstance(spec, str):
            raise TypeError(f"a policy must be text: auto, fixed:N or adaptive:N, got {spec!r} ({type(spec).__name__})")
        name, _, arg = spec.strip().partition(":")
        if name == "auto" and not arg:
            return DraftPolicy.auto()
        if name in ("fixed", "adaptive") and arg.isdigit():
            return getattr(DraftPolicy, name)(int(arg))
        raise ValueError(f"unknown policy {spec!r}: use auto, fixed:N or adaptive:N (N >= 1)")


def as_policy(policy: DraftPolicy | str | int) -> DraftPolicy:
    """A policy object: text (``"fixed:4"``, ``"auto"``) parsed here, an int k as ``DraftPolicy.fixed(k)``."""
    if isinstance(policy, DraftPolicy):
        return policy
    if isinstance(policy, str):
        return DraftPolicy.parse(policy)
    if isinstance(policy, int) and not isinstance(policy, bool):
        return DraftPolicy.fixed(policy)
    raise TypeError(f"a policy is a DraftPolicy, its text (e.g. 'fixed:4', 'auto') or a draft length, got {policy!r}")


def _check_k(n: int) -> int:
    return _at_least_one("draft length", n)


def _at_least_one(name: str, n: object) -> int:
    """``n`` if it is an integer >= 1 (not a bool), else a TypeError/ValueError naming ``name``."""
    if not isinstance(n, Integral) or isinstance(n, bool):
        raise TypeError(f"{name} must be an integer >= 1, got {n!r} ({type(n).__name__})")
    if n < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {n!r}")
    return int(n)


def _check_break_even(value: object, source: str) -> float:
    """A break-even (tokens a verification must yield): a number >= 0, not NaN (inf: never draft)."""
    try:
        if isinstance(value, (bool, str, bytes)):
            raise TypeError
        number = float(value)  # numbers, and scalar arrays
    except (TypeError, ValueError):
        raise TypeError(f"{source} must be a number of tokens >= 0, got {value!r} ({type(value).__name__})") from None
    if math.isnan(number) or number < 0:
        raise ValueError(f"{source} must be a number of tokens >= 0, got {value!r}")
    return number


class FixedPolicy(DraftPolicy):
    """Up to ``n`` tokens every step."""

    def __init__(self, n: int):
        self.n = _check_k(n)
        self.name = f"fixed:{n}"

    def _k(self, drafter: Any) -> int:
        return self.n


class AdaptivePolicy(DraftPolicy):
    """Up to ``n`` tokens; after a fully rejected draft, pause 1, 2, 4, ... ``max_pause`` steps."""

    def __init__(self, n: int, max_pause: int = 16):
        self.n = _check_k(n)
        self.max_pause = _at_least_one("max_pause", max_pause)
        self.name = f"adaptive:{n}"

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
        return 0 if self.remaining > 0 else self.n

    def plain_run(self) -> int:
        return max(1, self.remaining)


class AutoPolicy(DraftPolicy):
    """The drafter's preferred length, with a kill switch.

    The draft length is shortened while even a fully accepted draft could not pay for its
    verification (on a machine where a wide forward costs many plain steps, none is drafted).

    When the tokens the last ``window`` verifications yielded (accepted + 1 each) fall below
    their break-even (each one's verification and drafting cost in plain steps, at the length
    it drafted, from the model's measured cost profile), the next ``pause_tokens`` tokens are
    decoded plainly; then drafting resumes with a fresh window.
    """

    name = "auto"

    def __init__(self, max_k: int | None, window: int, pause_tokens: int, break_even: float | None):
        self.max_k = _at_least_one("max_k", max_k) if max_k is not None else None
        self.window = _at_least_one("window", window)
        self.pause_tokens = _at_least_one("pause_tokens", pause_tokens)
        self.fixed_break_even = _check_break_even(break_even, "break_even") if break_even is not None else None

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
        self.recent: deque[tuple[int, float]] = deque(maxlen=self.window)
        self._break_even_of = break_even
        self._break_evens: dict[int, float] = {}
        self.remaining = 0
        # Shorten the draft while even a fully accepted one (k + 1 tokens) could not pay for its
        # verification; at k = 0 speculation cannot pay on this machine at all.
        self.k = self.preferred_k(drafter)
        self.break_even = self._break_even_for(self.k)
        while self.k > 0 and self.break_even >= self.k + 1:
            self.k -= 1
            self.break_even = self._break_even_for(self.k) if self.k else float("inf")

    def _break_even_for(self, k: int) -> float:
        if self.fixed_break_even is not None:
            return self.fixed_break_even
        if k not in self._break_evens:
            self._break_evens[k] = _check_break_even(self._break_even_of(k), f"the break-even of k = {k}")
        return self._break_evens[k]

    def preferred_k(self, drafter: Any) -> int:
        k = max(1, int(getattr(drafter, "preferred_k", 4)))
        return min(k, self.max_k) if self.max_k else k

    def _observe(self, record: dict[str, Any]) -> None:
        if record["kind"] == "verify":
            # Each verification is held to the break-even of the length actually drafted.
            self.recent.append((record["accepted"] + 1, self._break_even_for(record["k_drafted"])))
            if len(self.recent) == self.window and sum(t for t, _ in self.recent) < sum(b for _, b in self.recent):
                self.remaining = self.pause_tokens
                self.recent.clear()
        elif record["paused"]:
            self.remaining = max(0, self.remaining - record["emitted"])

    def _k(self, drafter: Any) -> int:
        return 0 if self.remaining > 0 or self.k == 0 else self.k

    def plain_run(self) -> int:
        return max(1, self.remaining) if self.k else 1 << 30
