"""Draft-length policies: how many tokens to draft at each step. Policies see only the log."""

from __future__ import annotations

from collections import deque
from typing import Any

from specbench.core.log import StepLog


class DraftPolicy:
    """Decides the draft length of each step from the step log.

    ``next_k`` returns the number of tokens to draft (0: decode the next steps plainly, for
    ``plain_run()`` steps). Construct with ``DraftPolicy.fixed(n)``, ``.adaptive(n)`` or ``.auto()``.
    """

    name = "policy"

    def start(self, model: Any, drafter: Any, verify: str = "fast") -> None:
        """Reset for a new generation (``verify``: the generation's verify mode)."""
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
    def fixed(n: int) -> "FixedPolicy":
        return FixedPolicy(n)

    @staticmethod
    def adaptive(n: int, max_pause: int = 16) -> "AdaptivePolicy":
        return AdaptivePolicy(n, max_pause)

    @staticmethod
    def auto(
        max_k: int | None = None,
        window: int = 16,
        pause_tokens: int = 64,
        break_even: float | None = None,
    ) -> "AutoPolicy":
        return AutoPolicy(max_k, window, pause_tokens, break_even)

    @staticmethod
    def parse(spec: str) -> "DraftPolicy":
        """Build a policy from text: ``auto``, ``fixed:4``, ``adaptive:8``."""
        name, _, arg = spec.strip().partition(":")
        if name == "auto" and not arg:
            return DraftPolicy.auto()
        if name in ("fixed", "adaptive") and arg.isdigit():
            return getattr(DraftPolicy, name)(int(arg))
        raise ValueError(f"unknown policy {spec!r}: use auto, fixed:N or adaptive:N (N >= 1)")


def _check_k(n: int) -> int:
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"draft length must be an integer >= 1, got {n!r}")
    return n


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
        self.max_pause = max_pause
        self.name = f"adaptive:{n}"

    def start(self, model: Any, drafter: Any, verify: str = "fast") -> None:
        super().start(model, drafter, verify)
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
        self.max_k = _check_k(max_k) if max_k is not None else None
        self.window = window
        self.pause_tokens = pause_tokens
        self.fixed_break_even = break_even

    def start(self, model: Any, drafter: Any, verify: str = "fast") -> None:
        super().start(model, drafter, verify)
        self.recent: deque[tuple[int, float]] = deque(maxlen=self.window)
        self._model, self._drafter, self._verify = model, drafter, verify
        self._break_evens: dict[int, float] = {}
        self.remaining = 0
        self.k = self.preferred_k(drafter)
        if self.fixed_break_even is not None:
            self.break_even = self.fixed_break_even
        elif drafter is None:
            self.break_even = 0.0
        else:
            from specbench.cost.profile import break_even_tokens

            # Shorten the draft while even a fully accepted one (k + 1 tokens) could not pay
            # for its verification; at k = 0 speculation cannot pay on this machine at all.
            self.break_even = break_even_tokens(model, self.k, drafter, verify=verify)
            while self.k > 0 and self.break_even >= self.k + 1:
                self.k -= 1
                self.break_even = break_even_tokens(model, self.k, drafter, verify=verify) if self.k else float("inf")

    def _break_even_for(self, k: int) -> float:
        if self.fixed_break_even is not None:
            return self.fixed_break_even
        if k not in self._break_evens:
            from specbench.cost.profile import break_even_tokens

            self._break_evens[k] = break_even_tokens(self._model, k, self._drafter, verify=self._verify)
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
