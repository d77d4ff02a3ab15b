"""Measuring cost profiles: verifications and plain steps timed through the engine's own code.

Raw verifications run the verify mode's verifier (``specbench.exact.verifier_for``);
plain steps and whole speculative steps run the engine (``specbench.core.engine``).
"""

from __future__ import annotations

import statistics
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.generate import generation_stream, wired_limit
from mlx_lm.models.cache import make_prompt_cache

from specbench.common import distributed
from specbench.common.identity import device_name, display_name, model_key, utc_now, versions
from specbench.common.per_key import per_key
from specbench.core.draft import Drafter
from specbench.core.forward import context_length, prefill, text_model, vocab_size
from specbench.core.verify import CacheRollback, Verifier, as_draft, check_verify_mode
from specbench.cost import timing
from specbench.cost.profile import Profile, level, load_profile, median_interval, noise
from specbench.cost.timing import CacheRestore, rollback_for, time_verify
from specbench.exact import verifier_for

QUICK_WIDTHS = (1, 2, 3, 5, 9)  # what quick_profile times, as time allows


# -- timing -------------------------------------------------------------------------------------


def _time_engine_step(
    model: nn.Module,
    cache: list[Any],
    first: int,
    steps: int,
    width: int,
    verifier: Verifier,
    restore: CacheRestore,
) -> tuple[float, float]:
    """(seconds per speculative engine step of ``width``, of which drafting), from ``steps``
    steps whose random drafts are rejected."""
    gen = timing.rejected_drafts(model, cache, first, width, steps + 1, verifier)
    per_token = timing.seconds_per_token(gen)
    restore()
    decode = [r for r in gen.log if r.kind != "prefill"]
    verifies = [r for r in decode if r.kind == "verify"]
    seconds = per_token * (len(gen.tokens) - 1) / len(decode)
    return seconds, statistics.median(r.draft_s for r in verifies) if verifies else 0.0


def from_rounds(
    plain_s: Sequence[float], seconds: dict[str, list[list[float]]]
) -> tuple[float, dict[str, list[float]], dict[str, list[float]], dict[str, list[list[float]]]]:
    """From timing rounds (each round's plain step, and each width's seconds in each round): the median plain step,
    per mode c(w) (the median over the rounds of each round's width seconds over its plain step: paired, so a drift
    between rounds cancels), the median seconds, and c(w)'s interval over the same ratios
    (``median_interval``), which always holds c(w)."""
    plain = statistics.median(plain_s)
    medians = {m: [statistics.median(per_round) for per_round in per_width] for m, per_width in seconds.items()}
    ratios = {m: [[s / p for s, p in zip(rounds, plain_s)] for rounds in per_width] for m, per_width in seconds.items()}
    costs = {m: [statistics.median(r) for r in per_width] for m, per_width in ratios.items()}
    intervals = {m: [list(median_interval(r)) for r in per_width] for m, per_width in ratios.items()}
    return plain, costs, medians, intervals


def with_rounds(profile: Profile, plain_s: Sequence[float], rounds: dict[str, list[list[float]]]) -> Profile:
    """``profile`` with c(w), its seconds and intervals made from these timing rounds (``from_rounds``), and the
    checks of ``noise``."""
    plain, costs, seconds, intervals = from_rounds(plain_s, rounds)
    return replace(
        profile,
        plain_step_s=plain,
        costs=costs,
        seconds=seconds,
        rounds={"plain": list(plain_s), **rounds},
        intervals=intervals,
        interval_level=level(len(plain_s)),
        noise={m: noise(profile.widths[m], costs[m], intervals[m], profile.overhead.get(m, 0.0)) for m in costs},
    )


def _profile(
    model: nn.Module,
    plain_s: Sequence[float],
    widths: dict[str, list[int]],
    rounds: dict[str, list[list[float]]],
    **fields: Any,
) -> Profile:
    """The profile of ``model`` on this device and library versions, made now from its timing rounds."""
    made = Profile(
        model=model_key(model),
        name=display_name(model),
        device=device_name(),
        versions=versions(),
        plain_step_s=0.0,
        widths=widths,
        costs={},
        seconds={},
        created=utc_now(),
        **fields,
    )
    return with_rounds(made, plain_s, rounds)


# -- full profiles ------------------------------------------------------------------------------


def _widths(widths: int | Iterable[int]) -> list[int]:
    ws = list(range(1, widths + 1)) if isinstance(widths, int) else sorted({int(w) for w in widths})
    if not ws or ws[0] < 1:
        raise ValueError(f"widths must be a positive integer W (for 1..W) or positive widths, got {widths!r}")
    if ws[0] != 1:
        ws = [1, *ws]
    return ws


def measure(
    model: nn.Module,
    widths: int | Iterable[int] | dict[str, int | Iterable[int]] = 16,
    verify: Sequence[str] = ("fast",),
    offset: int = 512,
    repeats: int = 10,
    warmup: int = 2,
    plain_tokens: int = 16,
    overhead_widths: Sequence[int] | None = None,
    drafters: Sequence[Drafter] = (),
    draft_k: int = 4,
    context: Sequence[int] | None = None,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
    lengths: Sequence[int] = (),
    components: Sequence[int] = (),
) -> Profile:
    """A cost profile: c(w) per width and verify mode (``widths``: W for 1..W, a list, or either per mode), timed
    round-robin after ``plain_tokens`` plain steps per round over a cache of ``offset`` tokens (``context``, else
    random), medians of ``repeats`` rounds; the engine's overhead at ``overhead_widths`` (default: 2, the middle
    and the widest); each drafter's d; further context ``lengths`` and ``components`` widths when asked."""
    modes = [check_verify_mode(m) for m in ([verify] if isinstance(verify, str) else verify)]
    ws = per_key(widths, modes, _widths, "widths gives no widths for verify mode(s) {}")
    if repeats < 1 or warmup < 0 or offset < 1 or plain_tokens < 1:
        raise ValueError("repeats, offset and plain_tokens must be >= 1 and warmup >= 0")
    limit = context_length(model)
    longest = max([offset, *lengths]) + max([*(max(w) for w in ws.values()), *components])
    if any(n < 1 for n in lengths) or (limit is not None and longest > limit):
        raise ValueError(f"context lengths must be >= 1 and, with the widest verification, within {limit} tokens")
    rng = np.random.default_rng(seed)
    vocab = vocab_size(model)
    if context is None:
        context = rng.integers(0, vocab, size=offset).tolist()
    context = list(context)[-offset:]
    probe = mx.array(rng.integers(0, vocab, size=max(max(w) for w in ws.values())).tolist(), dtype=mx.uint32)[None]
    first = int(probe[0, 0].item())
    # exact mode: every width calibrated before anything is timed
    verifiers = {m: verifier_for(model, m, widths=ws[m], progress=progress, context=longest) for m in modes}
    say = progress or (lambda text: None)

    def time_rounds(
        cache: list[Any], restore: CacheRestore, rollback: CacheRollback | None
    ) -> tuple[list[float], dict[str, list[list[float]]]]:
        """Timing rounds over ``cache``: ``plain_tokens`` plain steps, then every width in every verify mode.
        (seconds per plain step of each kept round, mode -> per width, its seconds in each kept round)."""

        def one_round() -> tuple[float, dict[str, list[float]]]:
            plain_step = timing.time_plain(model, cache, first, plain_tokens, restore)
            return plain_step, {
                m: [time_verify(verifiers[m], model, cache, probe[:, :w], restore, rollback) for w in mode_ws]
                for m, mode_ws in ws.items()
            }

        def report(kept: list[tuple[float, dict[str, list[float]]]]) -> bool:
            say(f"round {len(kept)}/{repeats}: plain step {1e3 * kept[-1][0]:.2f} ms")
            return False

        kept = timing.kept_rounds(warmup, repeats, one_round, report)
        return [p for p, _ in kept], {m: [list(s) for s in zip(*(v[m] for _, v in kept))] for m in ws}

    with wired_limit(model, [generation_stream]), mx.stream(generation_stream):
        cache = prefill(model, context)
        restore = CacheRestore(cache)
        rollback = rollback_for(model, cache)
        plain_s, raw = time_rounds(cache, restore, rollback)
        plain, _, seconds, _ = from_rounds(plain_s, raw)
        by_length = {}
        for length in sorted(set(lengths) - {len(context)}):
            say(f"context length {length}")
            long = prefill(model, (context * (length // len(context) + 1))[:length])
            plain_at, raw_at = time_rounds(long, CacheRestore(long), rollback_for(model, long))
            plain_at_s, costs_at, seconds_at, _ = from_rounds(plain_at, raw_at)
            by_length[str(length)] = {"plain_step_s": plain_at_s, "costs": costs_at, "seconds": seconds_at}
            del long
        overhead = {}
        for mode in modes if rollback is not None else ():
            default = (2, ws[mode][len(ws[mode]) // 2], ws[mode][-1])
            chosen = sorted(set(overhead_widths or default) & set(ws[mode]) - {1})
            excess = []
            try:
                for w in chosen:
                    runs = [
                        _time_engine_step(model, cache, first, plain_tokens, w, verifiers[mode], restore)
                        for _ in range(1 + max(1, len(plain_s) // 3))
                    ][1:]
                    step_s = statistics.median(step for step, _ in runs)
                    draft_s = statistics.median(draft for _, draft in runs)
                    excess.append((step_s - draft_s - seconds[mode][ws[mode].index(w)]) / plain)
            except ValueError as err:  # the engine cannot decode this model speculatively
                restore()
                say(f"{mode}: engine overhead not measured ({err})")
                continue
            overhead[mode] = max(0.0, statistics.median(excess)) if excess else 0.0
            say(f"{mode}: engine overhead {overhead[mode]:.3f} plain steps per speculative step")
        drafter_costs = {
            d.name: measure_drafter(model, d, context, draft_k, plain, repeats=max(3, len(plain_s))) for d in drafters
        }
        stack = []
        if components:
            from specbench.cost.components import measure_components

            stack = measure_components(model, components, len(context), max(1, repeats // 2), progress=say)
    return _profile(
        model,
        plain_s,
        ws,
        raw,
        overhead=overhead,
        drafters=drafter_costs,
        offset=len(context),
        repeats=len(plain_s),
        lengths=by_length,
        components=stack,
    )


def measure_drafter(
    model: nn.Module,
    drafter: Drafter,
    context: Sequence[int],
    k: int,
    plain_step_s: float,
    repeats: int = 5,
) -> dict[str, float]:
    """Time ``drafter.draft(context, k)`` in steady state, as the engine calls it: the drafter
    begins on all but the last ``repeats + 1`` context tokens, then observes them one at a time
    (with their hidden states when it needs them), drafting after each.
    d = median seconds per requested token / plain step."""
    context = list(context)
    if len(context) < repeats + 3:
        raise ValueError(f"timing a drafter needs a context of at least {repeats + 3} tokens, got {len(context)}")
    start = len(context) - repeats - 1
    hidden = None
    if drafter.needs_hidden:
        hidden = text_model(model).model(mx.array(context)[None], cache=make_prompt_cache(model))
        mx.eval(hidden)
    drafter.begin(context[:start], hidden[:, : start - 1] if hidden is not None else None)
    times, drafted = [], []
    try:
        for i in range(start, len(context)):
            drafter.observe([context[i]], hidden[:, i - 1 : i] if hidden is not None else None)
            t0 = time.perf_counter()
            proposal = as_draft(drafter.draft(context[: i + 1], k), k)
            if proposal.probs is not None:
                mx.eval(proposal.probs)
            if i > start:  # the first draft warms up
                times.append(time.perf_counter() - t0)
                drafted.append(len(proposal.tokens))
    finally:
        drafter.end()
    draft_s = statistics.median(times)
    return {"k": k, "drafted": statistics.mean(drafted), "draft_s": draft_s, "d": draft_s / k / plain_step_s}


# -- quick profiles, and the profile to plan with -------------------------------------------------


def quick_profile(model: nn.Module, verify: str = "fast", budget_s: float = 2.5, offset: int = 8) -> Profile:
    """A rough profile within about ``budget_s`` seconds: widths 1, 2, 5, 3, 9 while time is left (at least 1, 2,
    5), again while a third of it is (medians kept); the plain step a serial width-1 step (c(1) = 1); the engine
    overhead at width 5 when there is time."""
    verify = check_verify_mode(verify)
    started = time.perf_counter()
    rng = np.random.default_rng(0)
    vocab = vocab_size(model)
    probe = mx.array(rng.integers(0, vocab, size=max(QUICK_WIDTHS)).tolist(), dtype=mx.uint32)[None]
    verifier = verifier_for(model, verify, widths=QUICK_WIDTHS)  # exact mode: calibrated before timing
    # GPUs compile kernels on first use: warm each width up there before timing it.
    warm = mx.default_device().type == mx.DeviceType.gpu
    timed: dict[int, list[float]] = {}
    with wired_limit(model, [generation_stream]), mx.stream(generation_stream):
        cache = prefill(model, rng.integers(0, vocab, size=offset).tolist())
        restore = CacheRestore(cache)
        rollback = rollback_for(model, cache)

        def time_width(w: int) -> float:
            return time_verify(verifier, model, cache, probe[:, :w], restore, rollback)

        time_width(1)
        for w in (1, 2, 5, 3, 9):
            spent = time.perf_counter() - started
            if len(timed) >= 3 and spent + (2 if warm else 1) * timed[1][0] * w > budget_s:
                break
            if warm and w > 1:
                time_width(w)
            timed[w] = [time_width(w)]
        # Fast models: more rounds while a good part of the budget is left (medians kept).
        round_s = sum(s[0] for s in timed.values())
        for _ in range(6):
            if time.perf_counter() - started + round_s > 0.6 * budget_s:
                break
            for w in timed:
                timed[w].append(time_width(w))
        seconds = {w: statistics.median(s) for w, s in timed.items()}
        plain = seconds[1]
        overhead = {}
        if rollback is not None and time.perf_counter() - started + 12 * seconds[5] < budget_s:
            try:
                step_s, draft_s = _time_engine_step(model, cache, int(probe[0, 0].item()), 4, 5, verifier, restore)
                overhead[verify] = max(0.0, (step_s - draft_s - seconds[5]) / plain)
            except ValueError:
                restore()
    ws = sorted(seconds)
    return _profile(
        model,
        timed[1],  # the plain step: a serial width-1 step, timed in every round
        {verify: ws},
        {verify: [timed[w] for w in ws]},
        overhead=overhead,
        offset=offset,
        repeats=1,
        quick=True,
    )


_MEMORY: dict[tuple[int, str], Profile] = {}


def _remember(model: nn.Module, verify: str, profile: Profile) -> None:
    key = (id(model), verify)
    if key not in _MEMORY:
        weakref.finalize(model, _MEMORY.pop, key, None)
    _MEMORY[key] = profile


def forget(model: nn.Module) -> None:
    """Drop the profiles ``profile_for`` keeps in memory for ``model``: its next call reads the store again."""
    for key in [k for k in _MEMORY if k[0] == id(model)]:
        _MEMORY.pop(key, None)


def profile_for(
    model: nn.Module, verify: str = "fast", budget_s: float = 2.5, progress: Callable[[str], None] | None = None
) -> Profile:
    """The cost profile to plan with: a stored one for this model, device, library versions and
    BLAS library if present (a damaged one is moved aside with a warning), else ``quick_profile``
    (about ``budget_s`` seconds, announced once through ``progress``); kept in memory per model object."""
    verify = check_verify_mode(verify)
    cached = _MEMORY.get((id(model), verify))
    if cached is not None:
        return cached
    profile = load_profile(model)
    if profile is None or verify not in profile.costs:
        if progress is not None:
            progress(
                f"measuring the {verify} verify cost of {display_name(model)} (about {budget_s:g} s): "
                f"none stored for it on this device; `specbench profile` stores a full one"
            )
        profile = quick_profile(model, verify, budget_s)
    _remember(model, verify, profile)
    return profile


def lockstep_profile(
    model: nn.Module, verify: str = "fast", progress: Callable[[str], None] | None = None, repeats: int = 3
) -> Profile:
    """The profile to plan with for a model sharded over ranks, the same on every rank: rank 0's stored profile of
    this model when it has one with ``verify`` costs, else a short one measured by all ranks together (widths 1, 2,
    3, 5, 9; ``repeats`` rounds after one warm-up) and rank 0's figures broadcast, so that every rank plans with the
    same break-even. Measured with fixed counts of forwards (``measure``), not time-budgeted as ``quick_profile``:
    a sharded model's forwards need every rank, and ranks whose clocks disagreed on how many to run would wait on
    each other forever. The profile's key (``model_key``) carries the group size and backend: c(w) includes the
    sharded layers' all-reduces. Kept in memory per model object beside ``profile_for``'s (``forget`` drops it). In
    a world of one it is the same short measurement."""
    verify = check_verify_mode(verify)
    cached = _MEMORY.get((id(model), verify))
    if cached is not None:
        return cached
    stored = load_profile(model) if distributed.is_main() else None
    usable = stored is not None and verify in stored.costs
    data = distributed.broadcast({**stored.to_dict(), "source": stored.source} if usable else None)
    if data is None:
        if progress is not None and distributed.is_main():
            progress(
                f"measuring the {verify} verify cost of {display_name(model)} on {distributed.size()} ranks "
                f"({distributed.backend()}): none stored for it; `specbench profile --shard` stores a full one"
            )
        measured = measure(
            model,
            widths=list(QUICK_WIDTHS),
            verify=(verify,),
            offset=16,
            repeats=repeats,
            warmup=1,
            plain_tokens=4,
            overhead_widths=(5,),
        )
        data = distributed.broadcast(measured.to_dict())
    profile = Profile.from_dict(data)
    _remember(model, verify, profile)
    return profile
