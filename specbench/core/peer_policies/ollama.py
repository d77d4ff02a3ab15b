"""ollama's MLX runner: the draft length that maximises expected committed tokens per measured cost.

Source: ollama/ollama pull request #16791, "mlxrunner: unify and tune speculative decoding"
(https://github.com/ollama/ollama/pull/16791): "a controller that picks the draft length to maximize
committed tokens per second, from measured per-position acceptance and forward cost. It backs off to plain
decode when no draft pays and persists across requests". The controller's code was not found in the stored
sources (x/mlxrunner/speculate.go there predates it), so this implements that description:

    k* = argmax_{k in 0..max_k} E(k) / cost(k),   E(k) = 1 + sum_{j<=k} prod_{i<=j} a_i,   cost(0) = 1

with a_i the conditional acceptance of draft position i (accepted given positions 1..i-1 were; its
successes and trials shrunk toward the pooled rate with weight ``prior``), cost(k) the plain steps a k-draft
step costs: the break-even handed to the policy (the cost profile's c(k+1) + k d), scaled by the measured
seconds of this controller's verifications over the profile's once both are timed. k* = 0 decodes
``backoff`` plain tokens, then probes the best length again. Its evidence persists across generations.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

from specbench.core.draft import Drafter
from specbench.core.log import StepRecord
from specbench.core.policies import PEERS, DraftPolicy
from specbench.core.policy_args import check_k, real, whole


class PositionAcceptance:
    """Per-position conditional acceptance counted from verifications: trials and successes per position."""

    def __init__(self, longest: int, prior: float):
        self.trials = [0] * longest
        self.successes = [0] * longest
        self.prior = prior

    def add(self, drafted: int, accepted: int) -> None:
        """A verification of ``drafted`` tokens that accepted the first ``accepted``."""
        for i in range(min(drafted, len(self.trials))):
            if i > accepted:
                break
            self.trials[i] += 1
            self.successes[i] += int(i < accepted)

    def rates(self) -> list[float]:
        """a_i per position: successes over trials, shrunk toward the pooled rate (1/2 before any trial)."""
        pooled = (sum(self.successes) + 1.0) / (sum(self.trials) + 2.0)
        return [(s + self.prior * pooled) / (n + self.prior) for s, n in zip(self.successes, self.trials)]


def expected_committed(rates: list[float], k: int) -> float:
    """E(k): tokens a verification of k drafts commits, the bonus token included."""
    total, survive = 1.0, 1.0
    for a in rates[:k]:
        survive *= a
        total += survive
    return total


class OllamaControllerPolicy(DraftPolicy):
    """Expected committed tokens per cost, maximised over draft lengths 0..``max_k`` each step."""

    needs_break_even = True

    def __init__(self, max_k: int = 8, backoff: int = 16, prior: float = 2.0, persist: bool = True):
        self.max_k = check_k(max_k, "max_k")
        self.backoff = whole("backoff", backoff, 1)
        self.prior = real("prior", prior, 0.0)
        self.persist = bool(persist)
        self.name = f"ollama:{self.max_k}"
        self.acceptance = PositionAcceptance(self.max_k, self.prior)
        self.scales: list[float] = []

    def start(self, drafter: Drafter, break_even: Callable[[int], float] | None = None) -> None:
        super().start(drafter, break_even)
        if break_even is None:
            raise ValueError("the ollama controller needs the verify cost: run it with a cost profile")
        self.break_even = break_even
        if not self.persist:
            self.acceptance, self.scales = PositionAcceptance(self.max_k, self.prior), []
        self.plain_s: list[float] = []
        self.backed_off = False

    def _observe(self, record: StepRecord) -> None:
        seconds = record.draft_s + record.verify_s
        if record.kind == "verify" and not record.tree_nodes:
            self.acceptance.add(record.k_drafted, record.accepted)
            if seconds > 0 and self.plain_s:
                plain = statistics.median(self.plain_s[-16:])
                self.scales.append(seconds / (plain * self.break_even(record.k_drafted)))
        elif record.kind == "plain" and seconds > 0:
            self.plain_s.append(seconds)

    def cost(self, k: int) -> float:
        """Plain steps a k-draft step costs: the profile's, scaled by what was measured (1 for k = 0)."""
        if k == 0:
            return 1.0
        scale = statistics.median(self.scales[-16:]) if self.scales else 1.0
        return self.break_even(k) * scale

    def best(self, shortest: int = 0) -> tuple[int, float]:
        """(k*, its expected committed tokens per plain step's cost) over k = ``shortest``..max_k (k* = 0:
        no draft pays); ties go to the shorter draft."""
        rates = self.acceptance.rates()
        lengths = range(shortest, self.max_k + 1)
        return max(((k, expected_committed(rates, k) / self.cost(k)) for k in lengths), key=lambda entry: entry[1])

    def _k(self, drafter: Drafter) -> int:
        if self.backed_off:  # after a plain stretch: probe the best draft, to measure acceptance again
            self.backed_off = False
            return self.best(1)[0]
        k = self.best()[0]
        self.backed_off = k == 0
        return k

    def _plain_run(self) -> int:
        return self.backoff

    def longest_draft(self, drafter: Drafter | None) -> int:
        return self.max_k

    @classmethod
    def from_text(cls, text: str) -> OllamaControllerPolicy:
        """``ollama`` or ``ollama:MAX_K``."""
        if text and not text.isdigit():
            raise ValueError(f"ollama:{text}: use ollama or ollama:MAX_K (the longest draft)")
        return cls(int(text)) if text else cls()


PEERS.add("ollama", OllamaControllerPolicy)
