"""Paired A/B runs: a baseline (plain decoding) and a method (Auto with a drafter) timed next to each other, each
run recorded with its speed (``run_speed.speed_state``, ``mean_speed``) and where its seconds went
(``time_split``), as the rows ``scripts.gpu.default_policy_cells`` summarizes.

Per-token runs (synthetic shapes, ``shape_pair_row``) time decoding after the first token; whole-call runs
(prompts, ``call_pair_row``; trace turns, ``trace_pair_rows``) time the call from start to last token.
Every timed run has the garbage collector paused (``specbench.common.timing.quiet``).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

import mlx.core as mx
from mlx_lm.generate import generate_step

from scripts.gpu.default_policy_cells import speed_in_ms, spread
from scripts.gpu.run_speed import mean_speed, speed_state, time_split, verify_ms_by_width
from specbench.bench.timing import clocked
from specbench.core.draft import Drafter
from specbench.core.engine import Generation, plain_generation
from specbench.core.log import StepRecord
from specbench.core.options import GenerateOptions
from specbench.core.policies import DraftPolicy
from specbench.cost.timing import seconds_per_token
from specbench.decoding import speculative_generate


def mlx_lm_seconds_per_token(model: Any, prompt: list[int], tokens: int) -> float:
    """mlx-lm's own plain decoding, seconds per token after the first."""
    return seconds_per_token(token for token, _ in generate_step(mx.array(prompt), model, max_tokens=tokens))


@dataclass(frozen=True)
class AutoActivity:
    """What Auto did in a run: verifications, paused tokens, its policy's pauses and extensions, plain stretches
    started with an unverified draft (``shadows``), the draft lengths it asked for (``ks``), and the median
    seconds of a verify step by width and of a plain step (None for an A/A run)."""

    verifies: int = 0
    paused: int = 0
    pauses: int | None = 0
    extensions: int | None = 0
    shadows: int = 0
    ks: str = ""
    verify_ms: str | None = None
    plain_step_ms: float | None = None


@dataclass
class PerTokenRun:
    """One per-token run: seconds per token, its speeds (seconds of a steady plain step; None without one),
    where its seconds went, and (a method's run) its tokens and what it did."""

    spt: float
    state: float | None
    mean: float | None
    split: dict[str, float]
    tokens: list[int] | None = None
    did: AutoActivity = AutoActivity()


def _shadows(gen: Generation) -> int:
    """Plain stretches that started with an unverified draft (Auto's watch on acceptance while paused)."""
    return sum(1 for r in gen.log if r.kind == "plain" and r.draft_tokens)


def plain_run(model: Any, prompt: list[int], tokens: int) -> PerTokenRun:
    """specbench plain decoding of ``tokens`` tokens (end of sequence ignored), timed."""
    gen = plain_generation(model, prompt, GenerateOptions(max_tokens=tokens, ignore_eos=True))
    spt = seconds_per_token(gen)
    records = gen.log.records
    return PerTokenRun(spt, speed_state(records), mean_speed(records), time_split(records, spt * (len(gen.tokens) - 1)))


def plain_seconds(model: Any, prompt: list[int], tokens: int) -> float:
    """Seconds per token of plain decoding (``steadier_affinity``'s probe)."""
    return plain_run(model, prompt, tokens).spt


def auto_run(
    model: Any,
    prompt: list[int],
    tokens: int,
    mode: str,
    drafter: Drafter,
    profile: Any,
    progress: Callable[[str], None] | None = None,
) -> PerTokenRun:
    """Auto with ``drafter`` at verify ``mode``; "plain" times plain decoding as an Auto cell is (an A/A cell).
    The drafter's ``follow_s`` (an oracle's bookkeeping) is taken out of the seconds."""
    if mode == "plain":
        return plain_run(model, prompt, tokens)
    options = GenerateOptions(max_tokens=tokens, ignore_eos=True, verify=mode)
    gen = speculative_generate(
        model, prompt, options, drafter=drafter, policy=DraftPolicy.auto(), profile=profile, progress=progress
    )
    spt = seconds_per_token(gen, lambda: getattr(drafter, "follow_s", 0.0))
    stats, records = gen.stats(), gen.log.records
    plain_steps = [r.verify_s for r in records if r.kind == "plain"]
    did = AutoActivity(
        verifies=stats["verifies"],
        paused=stats["pauses"],
        pauses=stats.get("policy_pauses"),
        extensions=stats.get("policy_extensions"),
        shadows=_shadows(gen),
        ks=" ".join(map(str, sorted({r.k_requested for r in records if r.kind == "verify"}))),
        verify_ms=verify_ms_by_width(records),
        plain_step_ms=1e3 * statistics.median(plain_steps) if plain_steps else None,
    )
    return PerTokenRun(
        spt,
        speed_state(records, stats["observe_s"]),
        mean_speed(records, stats["observe_s"]),
        time_split(records, spt * (len(gen.tokens) - 1)),
        list(gen.tokens),
        did,
    )


def _ms(seconds: float | None) -> float | None:
    """A per-token row's speed: milliseconds, None where the run has none."""
    return 1e3 * seconds if seconds else None


def shape_pair_row(
    base: dict[str, Any],
    plain: PerTokenRun,
    method: PerTokenRun,
    mlx_lm: float,
    previous_plain: float | None,
    checked: dict[str, Any],
) -> dict[str, Any]:
    """A per-token pair's results row (``base``: model, what, repeat, tokens, order; ``checked``: equal_plain,
    method)."""
    return {
        **base,
        "plain_s_per_token": plain.spt,
        "auto_s_per_token": method.spt,
        "mlx_lm_s_per_token": mlx_lm,
        "vs_plain": plain.spt / method.spt,
        "plain_state_ms": _ms(plain.state),
        "auto_state_ms": _ms(method.state),
        "plain_mean_ms": _ms(plain.mean),
        "auto_mean_ms": _ms(method.mean),
        "plain_spread": spread([previous_plain, plain.spt]) if previous_plain else 0.0,
        **checked,
        **asdict(method.did),
        **{f"plain_{k}": v for k, v in plain.split.items()},
        **{f"auto_{k}": v for k, v in method.split.items()},
    }


@dataclass(frozen=True)
class StepSummary:
    """What one generation did, from its log (``step_summary``): verifications, accepted drafts, paused tokens,
    the milliseconds of its prefill, speculative steps (drafting, verifying, bookkeeping) and plain steps, and its
    speeds (``state_ms``, ``mean_ms``: NaN without one) and verify steps by width."""

    verifies: int
    accepted: int
    paused: int
    prefill_ms: float
    speculative_ms: float
    plain_ms: float
    plain_steps: int
    state_ms: float
    mean_ms: float
    verify_ms: str


def step_summary(gen: Generation) -> StepSummary:
    """``StepSummary`` of a finished generation."""
    log = list(gen.log)
    observe_s = gen.stats()["observe_s"]
    verifies = [r for r in log if r.kind == "verify"]
    plain = [r for r in log if r.kind == "plain"]
    return StepSummary(
        verifies=len(verifies),
        accepted=sum(r.accepted for r in verifies),
        paused=sum(r.emitted for r in plain if r.paused),
        prefill_ms=1e3 * sum(r.verify_s for r in log if r.kind == "prefill"),
        speculative_ms=1e3 * sum(r.draft_s + r.verify_s + r.other_s for r in verifies),
        plain_ms=1e3 * sum(r.draft_s + r.verify_s for r in plain),
        plain_steps=len(plain),
        state_ms=speed_in_ms(speed_state(log, observe_s)),
        mean_ms=speed_in_ms(mean_speed(log, observe_s)),
        verify_ms=verify_ms_by_width(log),
    )


@dataclass
class CallRun:
    """One whole call: seconds from the call to its last token, its tokens, ``step_summary`` and ``time_split``
    (set-up and the prompt pass fall outside the log)."""

    seconds: float
    tokens: list[int]
    summary: StepSummary
    split: dict[str, float]


def timed_call(make: Callable[[], Generation]) -> CallRun:
    """Run the generation ``make()`` starts, timed from the call to the last token."""
    call = clocked(make)
    return CallRun(call.wall_s, call.items, step_summary(call.run), time_split(call.run.log.records, call.wall_s))


def call_pair_row(base: dict[str, Any], plain: CallRun, method: CallRun) -> dict[str, Any]:
    """A whole-call pair's results row (``base``: model, what, prompt, method, repeat)."""
    return {
        **base,
        "tokens": len(method.tokens),
        "plain_s": plain.seconds,
        "auto_s": method.seconds,
        "vs_plain": plain.seconds / method.seconds,
        "equal_plain": method.tokens == plain.tokens,
        **asdict(method.summary),
        "plain_prefill_ms": plain.summary.prefill_ms,
        "plain_steps_ms": plain.summary.plain_ms,
        "plain_state_ms": plain.summary.state_ms,
        "auto_state_ms": method.summary.state_ms,
        "plain_mean_ms": plain.summary.mean_ms,
        "auto_mean_ms": method.summary.mean_ms,
        **{f"plain_{k}": v for k, v in plain.split.items()},
        **{f"auto_{k}": v for k, v in method.split.items()},
    }


@dataclass(frozen=True)
class _Turn:
    """What a trace pair row reads of a trace benchmark's turn row (``TraceBench.turns``)."""

    turn: int
    method: str
    tokens: int
    decode_s: float
    observe_s: float
    identical: bool
    verifies: int
    accepted: int


def trace_pair_rows(model: str, trace_id: str, repeat: int, bench: Any, methods: Sequence[str]) -> list[dict[str, Any]]:
    """The pair rows of a trace benchmark (``bench_trace``'s result): per turn and method, its decode seconds
    against plain's in the same turn."""
    columns = [f.name for f in fields(_Turn)]
    rows = {(t.turn, t.method): t for t in (_Turn(*r) for r in bench.turns.select(columns).iter_rows())}
    steps: dict[tuple[int, str], list[StepRecord]] = {}
    for record in bench.steps.records:
        steps.setdefault((record.labels["turn"], record.labels["method"]), []).append(record)
    state = {key: speed_in_ms(speed_state(steps[key], row.observe_s)) for key, row in rows.items()}
    mean = {key: speed_in_ms(mean_speed(steps[key], row.observe_s)) for key, row in rows.items()}
    split = {key: time_split(steps[key], row.decode_s) for key, row in rows.items()}
    out = []
    for turn, method in sorted(key for key in rows if key[1] in methods):
        mine, plain = rows[turn, method], rows[turn, "plain"]
        out.append(
            {
                "model": model,
                "what": f"trace {trace_id}",
                "prompt": f"{trace_id}/{turn}",
                "method": f"{method}/auto",
                "repeat": repeat,
                "tokens": mine.tokens,
                "plain_s": plain.decode_s,
                "auto_s": mine.decode_s,
                "vs_plain": plain.decode_s / mine.decode_s if mine.decode_s else 0.0,
                "equal_plain": mine.identical,
                "verifies": mine.verifies,
                "accepted": mine.accepted,
                "verify_ms": verify_ms_by_width(steps[turn, method]),
                "plain_state_ms": state[turn, "plain"],
                "auto_state_ms": state[turn, method],
                "plain_mean_ms": mean[turn, "plain"],
                "auto_mean_ms": mean[turn, method],
                **{f"plain_{k}": v for k, v in split[turn, "plain"].items()},
                **{f"auto_{k}": v for k, v in split[turn, method].items()},
            }
        )
    return out
