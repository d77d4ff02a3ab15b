"""The paired A/B experiment on any machine: two methods (plain decoding, or a drafter under a policy) decode
the same prompts as whole calls next to each other, the order alternating between prompts and repeats so that
drift in the machine's speed falls on both runs of a pair; the result is B's speed over A's with a 95 %
interval (resampling pairs) and a verdict: B pays, loses, or the interval cannot tell. An A/A run (one
method against itself) measures the machine's own noise: a difference inside its interval is none.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from specbench.bench.paired import MIN_UNITS, bootstrap, seconds_ratio
from specbench.bench.timing import Clocked, timed_generation
from specbench.core.draft import Drafter
from specbench.core.engine import Generation
from specbench.core.options import GenerateOptions
from specbench.core.policies import DraftPolicy
from specbench.drafters import is_drafter_name, make_drafter


@dataclass(frozen=True)
class Arm:
    """Plain decoding (``drafter`` None) or a drafter under a policy ("lookup", "suffix/fixed:4")."""

    drafter: str | None = None
    policy: str = "auto"

    @classmethod
    def parse(cls, text: str, argument: str = "method") -> Arm:
        """ "plain", "DRAFTER" (under Auto) or "DRAFTER/POLICY" (a policy ``DraftPolicy.parse`` reads); anything
        else, plain decoding under a policy included, is one ValueError naming ``argument``."""
        forms = "give plain, a drafter name (under Auto) or DRAFTER/POLICY (e.g. lookup/fixed:4)"
        name, slash, policy = text.strip().partition("/")
        name, policy = name.strip(), policy.strip()
        if name.lower() in ("plain", "none") and not slash:
            return cls()
        if not name:
            raise ValueError(f"{argument} {text!r} names no drafter: {forms}")
        if name.lower() in ("plain", "none"):
            raise ValueError(f"{argument} {text!r}: plain decoding takes no policy: {forms}")
        if not is_drafter_name(name):
            raise ValueError(f"{argument}: unknown method {text!r}: {forms}")
        if slash and not policy:
            raise ValueError(f"{argument} {text!r} names no policy after the '/': {forms}")
        try:
            DraftPolicy.parse(policy or "auto")  # a bad policy fails here, before any model work
        except ValueError as err:
            raise ValueError(f"{argument} {text!r}: {err}") from None
        return cls(name, policy or "auto")

    def __str__(self) -> str:
        return "plain" if self.drafter is None else f"{self.drafter}/{self.policy}"

    def run(
        self, model: Any, tokenizer: Any, prompt: list[int], options: GenerateOptions, drafter: Drafter
    ) -> Clocked[Generation]:
        """One call of this method timed from the call to its last token (``drafter``: this method's drafter, None
        for plain)."""
        policy = None if self.drafter is None else DraftPolicy.parse(self.policy)
        return timed_generation(model, prompt, options, drafter, policy, tokenizer)


def ab_verdict(ratio: float, interval: tuple[float, float] | None) -> str:
    """B against A at a ``ratio`` of B's speed over A's with its 95 % interval: "pays" (the interval is above 1),
    "loses" (below 1), "inconclusive" (it holds 1, or there is no interval)."""
    if interval is None:
        return "inconclusive"
    low, high = interval
    return "pays" if low > 1.0 else "loses" if high < 1.0 else "inconclusive"


@dataclass
class ABResult:
    """B against A over paired whole calls: (A seconds, B seconds) per prompt and repeat."""

    a: str
    b: str
    pairs: list[tuple[float, float]] = field(default_factory=list)
    equal: list[bool] = field(default_factory=list)
    tokens: int = 0

    @property
    def ratio(self) -> float:
        """B's speed over A's: A's seconds over B's, summed over the pairs (NaN with no pairs)."""
        return seconds_ratio(self.pairs) if self.pairs else float("nan")

    @property
    def interval(self) -> tuple[float, float] | None:
        """95 % expanded percentile bootstrap interval of ``ratio`` (None under ``MIN_UNITS`` pairs)."""
        return bootstrap(self.pairs, seconds_ratio) if len(self.pairs) >= MIN_UNITS else None

    @property
    def verdict(self) -> str:
        """ "pays", "loses" or "inconclusive" (``ab_verdict``); "no pairs" when none ran."""
        return ab_verdict(self.ratio, self.interval) if self.pairs else "no pairs"

    def lines(self) -> list[str]:
        """The result in words: the ratio, its interval, the verdict, outputs equal (greedy)."""
        if not self.pairs:
            return [f"{self.b} over {self.a}: no pairs ran (no prompts or no repeats), so there is no ratio"]
        interval = self.interval
        shown = f"[{interval[0]:.3f}-{interval[1]:.3f}]" if interval else "[too few pairs for an interval]"
        aa = self.a == self.b
        what = "A/A (the machine's noise)" if aa else f"{self.b} over {self.a}"
        lines = [f"{what}: {self.ratio:.3f}x {shown} over {len(self.pairs)} pairs of {self.tokens} tokens at most"]
        if aa:
            lines.append("a B/A ratio inside this interval is no difference on this machine")
        else:
            lines.append(f"verdict: {self.b} {self.verdict}" + ("" if self.verdict != "inconclusive" else f" {shown}"))
        if self.equal:
            lines.append(f"outputs equal in every pair: {all(self.equal)}")
        return lines


def run_ab(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[list[int]],
    a: Arm,
    b: Arm,
    options: GenerateOptions,
    repeats: int,
    say: Callable[[str], None] = lambda text: None,
) -> ABResult:
    """``repeats`` rounds over ``prompts``, each prompt decoded by A and by B next to each other (the order
    alternating by prompt and repeat), after one warm-up call of each; each method keeps one drafter per
    repeat across prompts (as a server would)."""
    if not prompts:
        raise ValueError("run_ab needs at least one prompt")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an integer >= 1, got {repeats!r}")
    result = ABResult(str(a), str(b), tokens=options.max_tokens)
    longest = max(prompts, key=len)
    for method in (a, b):  # warm-up: kernels built, calibrations made, before any timed call
        method.run(model, tokenizer, list(longest), options, _drafter(method, model))
    for repeat in range(repeats):
        drafters = (_drafter(a, model), _drafter(b, model))
        for i, prompt in enumerate(prompts):
            done = {}
            for side in (0, 1) if (i + repeat) % 2 == 0 else (1, 0):
                done[side] = (a, b)[side].run(model, tokenizer, list(prompt), options, drafters[side])
            run_a, run_b = done[0], done[1]
            result.pairs.append((run_a.wall_s, run_b.wall_s))
            if options.temperature == 0:
                result.equal.append(run_a.items == run_b.items)
        say(f"  repeat {repeat + 1}/{repeats}: {b} over {a} {seconds_ratio(result.pairs[-len(prompts) :]):.3f}x")
    return result


def _drafter(method: Arm, model: Any) -> Any:
    return None if method.drafter is None else make_drafter(method.drafter, model=model)
