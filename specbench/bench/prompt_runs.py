"""The methods of the prompt benchmark, and one timed generation of each.

A method is one way to generate: mlx-lm's ``stream_generate`` (the baseline), mlx-lm's
draft-model speculation, specbench's plain ``generate``, or specbench with a drafter and a draft
policy. ``run_mlx_lm`` and ``run_specbench`` time one generation and count what its target
forwards did; ``MethodRunner`` runs methods on prompts for ``specbench.bench.prompt_bench``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

import mlx.core as mx
from mlx_lm import stream_generate

from specbench.bench.timing import Clocked, clocked, exact_widths, timed_generation
from specbench.core.draft import Drafter
from specbench.core.log import StepLog, StepRecord
from specbench.core.options import GenerateOptions
from specbench.core.policies import DraftPolicy, as_policy
from specbench.core.verify import check_verify_mode
from specbench.drafters import NO_DRAFTER, drafter_kinds, is_drafter_name, make_drafter
from specbench.exact.calibration import calibrate

PROMPT_BASELINE = "mlx-lm"

#: What a specbench run keeps of each step: what the speedup predictor (``specbench.cost.predict``) and the
#: drafting cost (``specbench.bench.predictions.drafting_cost``) read.
STEP_COLUMNS = tuple(
    "step position kind k_drafted accepted emitted verify_width tree_nodes draft_s draft_tokens".split()
)


@dataclass(frozen=True)
class Method:
    """One way to generate: ``engine`` "mlx-lm" or "specbench"; ``drafter`` by name ("none": plain
    decoding) and its ``policy`` (None for plain decoding); ``verify`` None for the engine's default
    (exact for greedy). The name tells the policy, so methods compare by name, engine, drafter and
    verify mode."""

    name: str
    engine: str
    drafter: str = "none"
    policy: DraftPolicy | None = field(default=None, compare=False)
    verify: str | None = None

    @property
    def policy_name(self) -> str:
        """The policy's label in tables ("none" for plain decoding)."""
        return self.policy.name if self.policy is not None else "none"

    def labels(self) -> dict[str, Any]:
        """What a run's row (``PromptRun``) says of its method."""
        verify = self.verify or ("none" if self.engine == "mlx-lm" or self.drafter == "none" else "exact")
        return dict(method=self.name, engine=self.engine, drafter=self.drafter, policy=self.policy_name, verify=verify)

    def record(self) -> dict[str, Any]:
        """The method as JSON-ready values (the policy by its name)."""
        return {**vars(self), "policy": self.policy_name}

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Method:
        """A method saved by ``record`` (its policy read back from the name)."""
        policy = record["policy"]
        return cls(**{**record, "policy": None if policy == "none" else DraftPolicy.parse(policy)})


def prompt_methods(
    drafters: Sequence[str] = ("lookup", "suffix"),
    policies: Sequence[DraftPolicy] | None = None,
    verify: Sequence[str | None] = (None,),
    draft_model: bool = False,
    k: int = 2,
) -> list[Method]:
    """The methods of a prompt benchmark, the mlx-lm baseline first; ``policies`` default to
    ``DraftPolicy.auto()`` and ``DraftPolicy.fixed(4)``; with ``draft_model``, mlx-lm's and specbench's
    draft-model speculation drafting ``k`` tokens a step."""
    if policies is None:
        policies = [DraftPolicy.auto(), DraftPolicy.fixed(4)]
    unknown = [d for d in drafters if not is_drafter_name(d) or d.strip().lower() in (*NO_DRAFTER, "")]
    if unknown:
        known = ", ".join(kind.spelling for kind in drafter_kinds())
        raise ValueError(f"unknown drafters {unknown}: choose from {known}")
    policies = [as_policy(p) for p in policies]
    for mode in verify:
        if mode is not None:
            check_verify_mode(mode)
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    fixed = DraftPolicy.fixed(k)
    pairs = [(drafter, policy) for drafter in drafters for policy in policies]
    if draft_model and ("draft-model", fixed.name) not in [(d, p.name) for d, p in pairs]:
        pairs.insert(0, ("draft-model", fixed))  # the same pair and draft length as mlx-lm's speculation
    methods = [Method(PROMPT_BASELINE, "mlx-lm")]
    if draft_model:
        methods.append(Method(f"mlx-lm draft/{fixed.name}", "mlx-lm", "draft-model", fixed))
    methods.append(Method("specbench", "specbench"))
    for drafter, policy in pairs:
        for mode in verify:
            suffix = f"/{mode}" if mode is not None else ""
            methods.append(Method(f"{drafter}/{policy.name}{suffix}", "specbench", drafter, policy, mode))
    names = [m.name for m in methods]
    if len(set(names)) != len(names):
        raise ValueError(f"methods need distinct names (give policies distinct names), got {names}")
    return methods


@dataclass(frozen=True, kw_only=True)
class PromptRun:
    """One timed run of the prompt benchmark, as ``prompt_bench_runs.parquet`` keeps it (``row``; ``from_row``
    reads a stored one): the question and turn, the method, what its target forwards did, and whether its output
    equals the mlx-lm baseline's first repeat (``first_mismatch``: where it leaves it, -1 where equal).
    ``forwards``: target forwards after the prompt pass (plain steps and verifications); ``pos_drafted[i]`` /
    ``pos_accepted[i]``: verifications that drafted / accepted position i; ``steps``: ``STEP_COLUMNS`` of each step
    of a specbench run (empty for mlx-lm's, and in files of older runs). ``run_mlx_lm`` and ``run_specbench`` give
    the timing alone, without the question and method."""

    config: str = ""
    question_key: str = ""
    question_id: str = ""
    category: str = ""
    subcategory: str | None = None
    turn: int = 0
    repeat: int = 0
    method: str = ""
    engine: str = ""
    drafter: str = "none"
    policy: str = "none"
    verify: str = "none"
    prompt_tokens: int = 0
    new_tokens: int = 0
    wall_s: float = 0.0
    first_token_s: float = 0.0
    tokens_per_s: float = 0.0
    forwards: int = 0
    verifies: int = 0
    drafted: int = 0
    accepted: int = 0
    pos_drafted: list[int] = field(default_factory=list)
    pos_accepted: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    tokens: list[int] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)
    equal: bool = False
    first_mismatch: int = 0

    @property
    def speculative_specbench(self) -> bool:
        """Whether specbench ran it with a drafter (a run that gets a prediction)."""
        return self.engine == "specbench" and self.drafter != "none"

    @property
    def plain_specbench(self) -> bool:
        """Whether it is specbench's plain decoding, the baseline predictions are made against."""
        return self.engine == "specbench" and self.drafter == "none"

    def step_records(self) -> list[StepRecord]:
        """``steps`` as the engine's step records."""
        return StepLog.from_rows(self.steps).records

    def row(self) -> dict[str, Any]:
        """The run as a row of ``prompt_bench_runs.parquet``, in the stored column order."""
        return dict(self.__dict__)

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> PromptRun:
        """A run from a stored row: columns it does not know are left out; a missing or null list is empty."""
        return cls(**{k: v for k, v in row.items() if k in _COLUMNS and (v is not None or k not in _LISTS)})


_COLUMNS = frozenset(f.name for f in fields(PromptRun))
_LISTS = frozenset(f.name for f in fields(PromptRun) if f.default_factory is not MISSING)


def run_mlx_lm(
    model: Any,
    tokenizer: Any,
    prompt: Sequence[int],
    max_tokens: int,
    draft_model: Any = None,
    k: int = 2,
) -> PromptRun:
    """mlx-lm's ``stream_generate`` (greedy), or its draft-model speculation drafting ``k`` tokens a step
    (mlx-lm's ``num_draft_tokens``), timed."""
    kwargs = {} if draft_model is None else {"draft_model": draft_model, "num_draft_tokens": k}
    clock = clocked(
        lambda: (
            (int(r.token), bool(r.from_draft), r.finish_reason)
            for r in stream_generate(model, tokenizer, mx.array(prompt), max_tokens=max_tokens, **kwargs)
        )
    )
    tokens = [token for token, _, _ in clock.items]
    from_draft = [drafted for _, drafted, _ in clock.items]
    verifications: list[tuple[int, int]] = []  # (drafted, accepted) each
    done = group = 0
    if draft_model is not None:
        # Each verification emits its accepted draft tokens, then one token of the target's own;
        # the first verification also consumes the prompt's last token.
        for i, drafted_token in enumerate(from_draft):
            group += drafted_token
            if not drafted_token or i == len(from_draft) - 1:
                verifications.append((min(max_tokens - done, k), group))
                done, group = i + 1, 0
    forwards = len(verifications) if draft_model is not None else max(0, len(tokens) - 1)
    finish = clock.items[-1][2] if clock.items else None
    return _timed(tokens, clock, verifications, forwards=forwards, finish_reason=finish)


def _timed(
    tokens: list[int], clock: Clocked[Any], verifications: Sequence[tuple[int, int]], **counts: Any
) -> PromptRun:
    """A run's timing and counts, without its question and method: ``verifications``' (drafted, accepted) each
    counted in total (unless ``counts`` has the totals) and per draft position."""
    pos_drafted = [0] * max((drafted for drafted, _ in verifications), default=0)
    pos_accepted = list(pos_drafted)
    for drafted, accepted in verifications:
        for i in range(drafted):
            pos_drafted[i] += 1
            pos_accepted[i] += i < accepted
    totals = {"verifies": len(verifications), "drafted": sum(d for d, _ in verifications)}
    totals["accepted"] = sum(a for _, a in verifications)
    return PromptRun(
        tokens=tokens,
        new_tokens=len(tokens),
        wall_s=clock.wall_s,
        first_token_s=clock.first_token_s,
        tokens_per_s=len(tokens) / clock.wall_s if clock.wall_s > 0 else 0.0,
        pos_drafted=pos_drafted,
        pos_accepted=pos_accepted,
        **(totals | counts),
    )


def run_specbench(
    model: Any,
    tokenizer: Any,
    prompt: Sequence[int],
    max_tokens: int,
    drafter: Drafter | None = None,
    policy: DraftPolicy | None = None,
    verify: str | None = None,
) -> PromptRun:
    """specbench's ``plain_generation`` (no drafter) or ``speculative_generate``, greedy, timed."""
    clock = timed_generation(
        model, list(prompt), GenerateOptions(max_tokens=max_tokens, verify=verify), drafter, policy, tokenizer
    )
    gen = clock.run
    stats = gen.stats()
    return _timed(
        list(gen.tokens),
        clock,
        [(record.k_drafted, record.accepted) for record in gen.log.records if record.kind == "verify"],
        **{name: stats[name] for name in ("verifies", "drafted", "accepted")},
        forwards=stats["steps"],
        finish_reason=gen.finish_reason(),
        steps=[{c: getattr(record, c) for c in STEP_COLUMNS} for record in gen.log.records],
    )


#: Plain tokens decoded before a warm-up to time a step, for its announced estimate.
WARM_UP_PROBE_TOKENS = 4
#: Exact calibration's cost per unit of width, in plain steps: each tested level runs a width-w forward once
#: for exactness and 3 times timed, against w serial steps (measured on the CPU: about 12 steps per unit).
CALIBRATION_STEPS_PER_WIDTH = 12


class MethodRunner:
    """Runs methods on prompts; keeps one drafter per (method, repeat), as a server keeps one
    drafter across requests, so that no repeat sees another repeat's outputs."""

    def __init__(self, model: Any, tokenizer: Any, model_name: str, draft_model: Any, k: int, max_tokens: int):
        self.model, self.tokenizer, self.model_name = model, tokenizer, model_name
        self.draft_model, self.k, self.max_tokens = draft_model, k, max_tokens
        self.drafters: dict[tuple[str, int], Drafter | None] = {}

    def drafter(self, method: Method, repeat: int) -> Drafter | None:
        key = (method.name, repeat)
        if key not in self.drafters:
            self.drafters[key] = make_drafter(
                method.drafter, model=self.model, model_name=self.model_name, draft_model=self.draft_model
            )
        return self.drafters[key]

    def run(self, method: Method, prompt: Sequence[int], repeat: int, max_tokens: int | None = None) -> PromptRun:
        n = max_tokens or self.max_tokens
        if method.engine == "mlx-lm":
            draft = self.draft_model if method.drafter == "draft-model" else None
            return run_mlx_lm(self.model, self.tokenizer, prompt, n, draft, self.k)
        drafter = self.drafter(method, repeat)  # None for plain decoding
        return run_specbench(self.model, self.tokenizer, prompt, n, drafter, method.policy, method.verify)

    def verify_widths(self, methods: Sequence[Method]) -> list[int]:
        """Verification widths the methods can use (for calibrating exact verification up front): up to the longest
        draft and the last token, within what a run of ``max_tokens`` tokens drafts."""
        drafters = [(m.policy, self.drafter(m, -1)) for m in methods if m.engine == "specbench" and m.verify != "fast"]
        return exact_widths([(p, d) for p, d in drafters if p is not None and d is not None], self.max_tokens)

    def warm_up(
        self, methods: Sequence[Method], first: list[int], longest: list[int], say: Callable[[str], None]
    ) -> None:
        """Untimed: calibrate exact verification for the widths in use, run every method on the first
        prompt for the full ``max_tokens``, and plain decoding on the longest prompt, so that the
        kernels for every verify width and the cache sizes the run reaches are built before timing
        (on a GPU the first call at a new shape compiles kernels)."""
        t0 = time.perf_counter()
        widths = self.verify_widths(methods)
        probe = run_specbench(self.model, self.tokenizer, first, WARM_UP_PROBE_TOKENS)  # also builds the kernels
        step = (probe.wall_s - probe.first_token_s) / max(len(probe.tokens) - 1, 1)
        # the announced estimate: calibration at most CALIBRATION_STEPS_PER_WIDTH steps per unit of width, each
        # method's generation as many steps as tokens (an upper bound for methods that speculate)
        calibration = CALIBRATION_STEPS_PER_WIDTH * sum(widths) * step
        what = f"{len(methods)} methods x {self.max_tokens} tokens on the first prompt"
        if widths:
            what = f"exact calibration at widths {widths[0]}-{widths[-1]} (up to ~{calibration:.0f} s), then {what}"
        total = calibration + len(methods) * self.max_tokens * step
        say(f"warm-up (untimed): {what}; about {total:.0f} s at {step:.2f} s per plain step")
        if widths:
            calibrate(self.model, widths, progress=say)
        for method in methods:
            self.run(method, first, repeat=-1)
            say(f"  warm-up: {method.name} ({time.perf_counter() - t0:.0f} s)")
        if longest != first:
            self.run(methods[0], longest, repeat=-1)
        self.drafters = {k: v for k, v in self.drafters.items() if k[1] >= 0}
        say(
            f"warm-up: {len(methods)} methods, exact widths {widths[-1] if widths else 1}, "
            f"{time.perf_counter() - t0:.1f} s"
        )
