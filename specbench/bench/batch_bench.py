"""Batched decoding benchmark: speculative batched vs plain batched vs mlx-lm's ``BatchGenerator``
(what ``batch_generate`` runs) on the same prompts at the same batch size, in one run (``bench_batch``).

Each engine decodes every prompt greedily with at most ``batch_size`` requests decoding together
(continuous batching). A drafter ``oracle:A`` drafts, per request, the output of this run's plain batched
run at acceptance A (recorded before the speculative run starts; after a divergence, as on a GPU's fast
verify, it keeps drafting its recording at the same position, and the measured acceptance is reported).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.generate import BatchGenerator

from specbench.bench.turn_cache import first_divergence
from specbench.core.batch import BatchGeneration, check_batchable, generate_batch
from specbench.core.draft import Drafter
from specbench.core.forward import vocab_size
from specbench.core.options import GenerateOptions
from specbench.core.policies import DraftPolicy, as_policy
from specbench.core.verify import Verifier, check_verify_mode
from specbench.cost.batch import BatchProfile
from specbench.cost.predict import predicted_batch_speedup, residual
from specbench.drafters import make_drafter
from specbench.drafters.oracle import Oracle
from specbench.exact import batch_verifier

ORACLE = "oracle"


@dataclass(frozen=True)
class EngineRow:
    """One engine's run: tokens, wall seconds, tokens/s and mean request latency. A speculative row
    (``kind`` "speculative"; the others' kind is their engine) adds its drafter, policy and acceptance, and
    each row its ratios to plain batched decoding and to mlx-lm (throughput, latency, the share of outputs
    equal to theirs; None against itself); ``verify``: the batch engine's verify mode (None for mlx-lm).
    ``diverged_from_recording``: oracle requests whose output left the recording; ``predicted_vs_plain`` and
    ``residual``: with a cost profile."""

    engine: str
    kind: str
    batch_size: int
    requests: int
    tokens: int
    wall_s: float
    tokens_per_s: float
    mean_latency_s: float
    drafter: str | None = None
    policy: str | None = None
    acceptance_rate: float | None = None
    diverged_from_recording: int | None = None
    predicted_vs_plain: float | None = None
    speedup_vs_plain: float | None = None
    latency_vs_plain: float | None = None
    identical_to_plain: float | None = None
    speedup_vs_mlx_lm: float | None = None
    latency_vs_mlx_lm: float | None = None
    identical_to_mlx_lm: float | None = None
    residual: float | None = None
    verify: str | None = None


@dataclass(frozen=True)
class RequestDivergence:
    """Where one request's output from ``engine`` first leaves ``reference``'s (None: equal)."""

    engine: str
    reference: str
    request: int
    first_divergence: int | None
    tokens: int
    batch_size: int = 0
    verify: str = "fast"


@dataclass(frozen=True)
class DivergenceSummary:
    """Per (engine, reference): requests, the share identical, the median first divergence (an identical request
    counted at its length) and the minimum over diverging requests (None when every one is identical)."""

    batch_size: int
    verify: str
    engine: str
    reference: str
    requests: int
    identical: float
    median_first_divergence: float
    min_first_divergence: int | None


@dataclass(frozen=True)
class BatchBench:
    """``bench_batch``'s result: a row per engine, the outputs per engine, the first divergence per request and
    reference, and its summary."""

    rows: list[EngineRow]
    outputs: dict[str, list[list[int]]]
    divergence: list[RequestDivergence]
    divergence_summary: list[DivergenceSummary]


def mlx_lm_batch(
    model: nn.Module, prompts: Sequence[list[int]], batch_size: int, max_tokens: int, eos: Sequence[int] = ()
) -> tuple[list[list[int]], float, list[float]]:
    """mlx-lm's continuous batching (``BatchGenerator``, greedy) over ``prompts``: the outputs, wall seconds and
    per-request latencies."""
    gen = BatchGenerator(
        model,
        stop_tokens=[[t] for t in eos] or None,
        completion_batch_size=batch_size,
        prefill_batch_size=min(batch_size, 8),
    )
    start = time.perf_counter()
    uids = gen.insert([list(p) for p in prompts], [max_tokens] * len(prompts))
    outputs: dict[int, list[int]] = {uid: [] for uid in uids}
    done: dict[int, float] = {}
    try:
        while responses := gen.next_generated():
            for r in responses:
                outputs[r.uid].append(int(r.token))
                if r.finish_reason is not None:
                    done[r.uid] = time.perf_counter() - start
    finally:
        gen.close()
    wall = time.perf_counter() - start
    return [outputs[u] for u in uids], wall, [done.get(u, wall) for u in uids]


def divergence_rows(
    outputs: dict[str, list[list[int]]], reference: str, batch_size: int = 0, verify: str = "fast"
) -> list[RequestDivergence]:
    """Per engine and request: the first position where its output leaves ``reference``'s (None: equal).
    A reference may hold fewer requests than the engines (the first ones)."""
    return [
        RequestDivergence(name, reference, i, first_divergence(out, ref), len(out), batch_size, verify)
        for name, outs in outputs.items()
        if name != reference
        for i, (out, ref) in enumerate(zip(outs, outputs[reference]))
    ]


def divergence_summary(rows: Sequence[RequestDivergence]) -> list[DivergenceSummary]:
    """Per (engine, reference, batch size) of ``divergence_rows``: ``DivergenceSummary``."""
    groups: dict[tuple[str, str, int, str], list[RequestDivergence]] = {}
    for r in rows:
        groups.setdefault((r.engine, r.reference, r.batch_size, r.verify), []).append(r)
    summary = []
    for (engine, reference, batch_size, verify), group in groups.items():
        diverged = [r.first_divergence for r in group if r.first_divergence is not None]
        censored = [r.tokens if r.first_divergence is None else r.first_divergence for r in group]
        identical = 1 - len(diverged) / len(group)
        median = float(statistics.median(censored))
        low = min(diverged) if diverged else None
        summary.append(DivergenceSummary(batch_size, verify, engine, reference, len(group), identical, median, low))
    return summary


def _row(
    engine: str, batch_size: int, outputs: list[list[int]], wall: float, latencies: list[float], verify: str | None
) -> EngineRow:
    tokens = sum(len(o) for o in outputs)
    per_s, latency = tokens / wall if wall > 0 else 0.0, sum(latencies) / len(latencies)
    return EngineRow(engine, engine, batch_size, len(outputs), tokens, wall, per_s, latency, verify=verify)


def _oracle_acceptance(name: str) -> float | None:
    """A from ``oracle:A`` (None: not an oracle name)."""
    base, _, value = name.strip().lower().partition(":")
    if base != ORACLE:
        return None
    try:
        acceptance = float(value)
    except ValueError:
        raise ValueError(f"the oracle drafter takes its acceptance: oracle:A with A in [0, 1], got {name!r}") from None
    if not 0.0 <= acceptance <= 1.0:
        raise ValueError(f"oracle acceptance must be in [0, 1], got {name!r}")
    return acceptance


def oracle_drafters(
    prompts: Sequence[list[int]], recorded: Sequence[list[int]], acceptance: float, vocab: int, seed: int = 0
) -> list[Oracle]:
    """One ``Oracle`` per request, drafting its recorded output at ``acceptance``; after a
    divergence it keeps drafting the recording at the same position (it never runs the model)."""
    return [
        Oracle(p, r, acceptance, vocab, seed=seed + i, keep_drafting=True)
        for i, (p, r) in enumerate(zip(prompts, recorded))
    ]


def _methods(
    drafters: str | Callable[[int], Drafter] | Sequence[Any],
    policies: DraftPolicy | str | int | Sequence[Any],
    model: nn.Module,
) -> list[tuple[str, Any, DraftPolicy]]:
    """(label, drafter name or factory, policy) per speculative method, checked before any model work."""
    drafters = [drafters] if isinstance(drafters, str) or callable(drafters) else list(drafters)
    # plain batched decoding is always the baseline
    drafters = [d for d in drafters if not (isinstance(d, str) and d.strip().lower() in ("none", "plain", ""))]
    policies = [policies] if isinstance(policies, (str, int, DraftPolicy)) else list(policies)
    if not drafters or not policies:
        raise ValueError("the batch benchmark needs at least one drafter and one policy to speculate with")
    methods = []
    for drafter in drafters:
        if isinstance(drafter, str) and _oracle_acceptance(drafter) is None:
            if make_drafter(drafter, model=model) is None:
                raise ValueError(f"the batch benchmark needs a drafter to speculate with, got {drafter!r}")
        label = drafter if isinstance(drafter, str) else getattr(drafter, "label", "custom")
        for policy in policies:
            policy = as_policy(policy)
            methods.append((f"{label}/{policy.name}", drafter, policy))
    labels = [m[0] for m in methods]
    if len(set(labels)) != len(labels):
        raise ValueError(f"speculative methods need distinct labels, got {labels}")
    return methods


def _warm_up(model: nn.Module, prompts: list[list[int]], batch_size: int, k: int, verifier: Verifier) -> None:
    """Run each engine's kernels once at this batch size (plain steps and [B, k + 1] verifies)."""
    few = prompts[:batch_size]
    options = GenerateOptions(max_tokens=k + 6, ignore_eos=True)
    recorded = generate_batch(model, few, options, verifier=verifier).run()
    drafters = oracle_drafters(few, recorded, 0.5, vocab_size(model))
    BatchGeneration(model, few, options, drafters, k, verifier=verifier).run()
    mlx_lm_batch(model, few, batch_size, 4)


def bench_batch(
    model: nn.Module,
    prompts: Sequence[list[int]],
    batch_size: int,
    drafters: str | Callable[[int], Drafter] | Sequence[Any] = "lookup",
    policies: DraftPolicy | str | int | Sequence[Any] = "fixed:4",
    max_tokens: int = 64,
    tokenizer: Any = None,
    warmup: bool = True,
    single: Sequence[list[int]] | None = None,
    seed: int = 0,
    profile: BatchProfile | None = None,
    verify: str = "fast",
) -> BatchBench:
    """One run of plain batched, each speculative method (drafter x policy) and mlx-lm on ``prompts`` at
    ``batch_size``. ``drafters``: names (``oracle:A`` included) or factories request index -> drafter (labelled by
    their ``label`` attribute). ``single``: single-request greedy outputs of the first prompts, a further reference
    for the first divergences. ``profile``: a batch cost profile, for each speculative row's predicted speedup over
    plain batched decoding and its residual. ``verify``: the batch engine's, "fast" or "exact"."""
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch size must be an integer >= 1, got {batch_size!r}")
    prompts = [list(p) for p in prompts]
    if not prompts:
        raise ValueError("no prompts to benchmark")
    check_batchable(model)
    verify = check_verify_mode(verify)
    methods = _methods(drafters, policies, model)
    verifier = batch_verifier(model, verify)
    eos = sorted(getattr(tokenizer, "eos_token_ids", None) or [])
    options = GenerateOptions(max_tokens=max_tokens, eos_token_ids=eos)
    if warmup:
        _warm_up(model, prompts, batch_size, min(8, max(m[2].longest_draft(None) for m in methods)), verifier)

    def timed(engine: str, gen: BatchGeneration) -> EngineRow:
        mx.clear_cache()
        gen.run()
        latencies = [r.stats()["wall_s"] for r in gen.requests]
        return _row(engine, batch_size, [r.tokens for r in gen.requests], gen.stats()["wall_s"], latencies, verify)

    plain_gen = generate_batch(model, prompts, options, max_batch=batch_size, verifier=verifier)
    rows = [timed("plain", plain_gen)]
    plain_outputs = [r.tokens for r in plain_gen.requests]
    outputs = {"plain": plain_outputs}
    break_even = None
    for label, drafter, policy in methods:
        oracle = _oracle_acceptance(drafter) if isinstance(drafter, str) else None
        if oracle is not None:  # recorded from this run's plain batched output, before the timed run
            made = oracle_drafters(prompts, plain_outputs, oracle, vocab_size(model), seed)
        else:
            made = [
                drafter(i) if callable(drafter) else make_drafter(drafter, model=model) for i in range(len(prompts))
            ]
        gen = BatchGeneration(model, prompts, options, made, policy, max_batch=batch_size, verifier=verifier)
        if policy.needs_break_even:
            if break_even is None:
                from specbench.cost import profile_for
                from specbench.decoding import break_even_function

                break_even = break_even_function(profile_for(model, verify), made[0], verify)
            gen.set_break_even(break_even)
        row = timed(label, gen)
        drafted = sum(r.stats()["drafted"] for r in gen.requests)
        accepted = sum(r.stats()["accepted"] for r in gen.requests)
        predicted = None if profile is None else predicted_batch_speedup(gen, plain_gen, profile, whole=True)
        row = dataclasses.replace(
            row,
            kind="speculative",
            drafter=label.split("/")[0],
            policy=policy.name,
            acceptance_rate=accepted / drafted if drafted else 0.0,
            diverged_from_recording=sum(d.diverged_at is not None for d in made) if oracle is not None else None,
            predicted_vs_plain=predicted,
        )
        rows.append(row)
        outputs[label] = [r.tokens for r in gen.requests]
    mx.clear_cache()
    mlx_lm_outputs, wall, latencies = mlx_lm_batch(model, prompts, batch_size, max_tokens, eos)
    outputs["mlx-lm"] = mlx_lm_outputs
    rows.append(_row("mlx-lm", batch_size, mlx_lm_outputs, wall, latencies, None))
    rows = [_with_ratios(row, rows, outputs) for row in rows]
    if single is not None:
        outputs["single"] = [list(s) for s in single]
    divergence = [
        r
        for ref in ("single", "mlx-lm", "plain")
        if ref in outputs
        for r in divergence_rows(outputs, ref, batch_size, verify)
        if r.engine != "single" and not (r.reference == "plain" and r.engine == "mlx-lm")
    ]
    return BatchBench(rows, outputs, divergence, divergence_summary(divergence))


def _with_ratios(row: EngineRow, rows: list[EngineRow], outputs: dict[str, list[list[int]]]) -> EngineRow:
    """``row`` with its ratios to plain batched decoding and to mlx-lm, and the residual of its prediction."""
    ratios: dict[str, float] = {}
    for other in (r for r in rows if r.engine in ("plain", "mlx-lm") and r.engine != row.engine):
        key = other.engine.replace("-", "_")
        ratios[f"speedup_vs_{key}"] = row.tokens_per_s / other.tokens_per_s
        ratios[f"latency_vs_{key}"] = other.mean_latency_s / row.mean_latency_s
        same = sum(a == b for a, b in zip(outputs[row.engine], outputs[other.engine]))
        ratios[f"identical_to_{key}"] = same / len(outputs[row.engine])
    row = dataclasses.replace(row, **ratios)
    if row.predicted_vs_plain is not None and row.speedup_vs_plain is not None:
        row = dataclasses.replace(row, residual=residual(row.speedup_vs_plain, row.predicted_vs_plain))
    return row


def _ratio(value: float | None) -> float:
    return 1.0 if value is None else value


def format_batch_bench(result: BatchBench) -> str:
    """The rows, ratios and first-divergence summary as text."""
    lines = [
        f"{'engine':<24} {'B':>3} {'tokens':>7} {'wall s':>8} {'tok/s':>8} {'latency s':>10} {'accept':>7} "
        f"{'vs plain':>9} {'vs mlx-lm':>10} {'lat vs plain':>13} {'same as plain':>14}"
    ]
    for r in result.rows:
        accept = "-" if r.acceptance_rate is None else f"{r.acceptance_rate:.2f}"
        same = "-" if r.identical_to_plain is None else f"{r.identical_to_plain:.0%}"
        predicted = (
            f"  predicted {r.predicted_vs_plain:.2f}x, residual {r.residual:+.1%}"
            if r.residual is not None and r.predicted_vs_plain is not None
            else ""
        )
        lines.append(
            f"{r.engine:<24} {r.batch_size:>3} {r.tokens:>7} {r.wall_s:>8.2f} {r.tokens_per_s:>8.1f} "
            f"{r.mean_latency_s:>10.2f} {accept:>7} {_ratio(r.speedup_vs_plain):>8.2f}x "
            f"{_ratio(r.speedup_vs_mlx_lm):>9.2f}x {_ratio(r.latency_vs_plain):>12.2f}x {same:>14}{predicted}"
        )
    if result.divergence_summary:
        verify = result.divergence_summary[0].verify
        lines.append(f"first divergence ({verify} verify; median counts an identical request at its length):")
        for s in result.divergence_summary:
            low = "-" if s.min_first_divergence is None else s.min_first_divergence
            lines.append(
                f"  {s.engine:<24} vs {s.reference:<7} identical {s.identical:>4.0%} of {s.requests}, "
                f"median {s.median_first_divergence:.0f}, min {low}"
            )
    return "\n".join(lines)


def trace_requests(
    tokenizer: Any, traces: Sequence[Any], turns: int | None, context: int, max_tokens: int
) -> tuple[list[list[int]], list[str], int]:
    """Every turn of ``traces`` as an independent request: (prompts, labels "trace/turn", turns left out
    because prompt + ``max_tokens`` exceed ``context``). A turn's prompt holds the recorded replies
    before it (as ``specbench.inputs.trace_prompts`` renders a trace without generating)."""
    from specbench.inputs.trace_prompts import trace_prompts

    prompts, labels, too_long = [], [], 0
    for trace in traces:
        for turn, prompt, _ in trace_prompts(tokenizer, trace):
            if turns is not None and turn >= turns:
                break
            if len(prompt) + max_tokens > context:
                too_long += 1
                continue
            prompts.append(prompt)
            labels.append(f"{trace.id}/{turn}")
    return prompts, labels, too_long
