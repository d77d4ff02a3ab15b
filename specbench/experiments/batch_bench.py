"""Batched decoding benchmark: speculative batched vs plain batched vs mlx-lm's ``BatchGenerator``
(what ``batch_generate`` runs) on the same prompts at the same batch size, in one run.

Each engine decodes every prompt greedily with at most ``batch_size`` requests decoding together
(continuous batching: a waiting prompt joins when one finishes). Reported per engine: total tokens,
wall seconds, total tokens/s, and each request's mean latency (seconds from joining to its last
token; for mlx-lm, from the start of the run to the request's last token).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.generate import BatchGenerator

from specbench.core.batch import BatchGeneration, generate_batch
from specbench.core.draft import Drafter
from specbench.core.options import GenerateOptions
from specbench.core.policies import DraftPolicy, as_policy
from specbench.drafters import make_drafter


def mlx_lm_batch(
    model: nn.Module, prompts: Sequence[list[int]], batch_size: int, max_tokens: int, eos: Sequence[int] = ()
) -> dict[str, Any]:
    """mlx-lm's continuous batching (``BatchGenerator``, greedy) over ``prompts``: tokens, wall seconds,
    per-request latencies, and the outputs."""
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
    return {
        "outputs": [outputs[u] for u in uids],
        "wall_s": wall,
        "latencies": [done.get(u, wall) for u in uids],
    }


def _row(engine: str, batch_size: int, outputs: list[list[int]], wall: float, latencies: list[float]) -> dict:
    tokens = sum(len(o) for o in outputs)
    return {
        "engine": engine,
        "batch_size": batch_size,
        "requests": len(outputs),
        "tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / wall if wall > 0 else 0.0,
        "mean_latency_s": sum(latencies) / len(latencies),
    }


def bench_batch(
    model: nn.Module,
    prompts: Sequence[list[int]],
    batch_size: int,
    drafter: str | Callable[[int], Drafter] = "lookup",
    policy: DraftPolicy | str | int = "fixed:4",
    max_tokens: int = 64,
    tokenizer: Any = None,
    warmup: bool = True,
) -> dict[str, Any]:
    """One run of the three engines on ``prompts`` at ``batch_size`` (``drafter``: a name, or a factory
    request index -> drafter): rows (engine, tokens, wall,
    tokens/s, mean latency), the ratios speculative / plain and speculative / mlx-lm (throughput and
    latency), whether the outputs agree, and the speculative run's acceptance."""
    if batch_size < 1:
        raise ValueError(f"batch size must be >= 1, got {batch_size}")
    prompts = [list(p) for p in prompts]
    if not prompts:
        raise ValueError("no prompts to benchmark")
    policy = as_policy(policy)
    if not callable(drafter) and make_drafter(drafter, model=model) is None:
        raise ValueError(f"--batch needs a drafter to speculate with, got {drafter!r}")
    eos = sorted(getattr(tokenizer, "eos_token_ids", None) or [])
    options = GenerateOptions(max_tokens=max_tokens, eos_token_ids=eos)
    if warmup:
        generate_batch(model, prompts[:batch_size], GenerateOptions(max_tokens=4)).run()
        mlx_lm_batch(model, prompts[:batch_size], batch_size, 4)

    def drafters(i: int) -> Drafter:
        return drafter(i) if callable(drafter) else make_drafter(drafter, model=model)

    break_even = None
    if policy.needs_break_even:
        from specbench.cost import profile_for
        from specbench.decoding import break_even_function

        break_even = break_even_function(profile_for(model, "fast"), drafters(0), "fast")

    def speculative() -> BatchGeneration:
        gen = BatchGeneration(model, prompts, options, drafters, policy, max_batch=batch_size)
        if break_even is not None:
            gen.set_break_even(break_even)
        return gen

    ours: dict[str, BatchGeneration] = {}
    rows = []
    for name, made in (
        ("plain", lambda: generate_batch(model, prompts, options, max_batch=batch_size)),
        ("speculative", speculative),
    ):
        mx.clear_cache()
        gen = made()
        gen.run()
        ours[name] = gen
        rows.append(
            _row(
                name,
                batch_size,
                [r.tokens for r in gen.requests],
                gen.stats()["wall_s"],
                [r.stats()["wall_s"] for r in gen.requests],
            )
        )
    mx.clear_cache()
    reference = mlx_lm_batch(model, prompts, batch_size, max_tokens, eos)
    rows.append(_row("mlx-lm", batch_size, reference["outputs"], reference["wall_s"], reference["latencies"]))
    by = {r["engine"]: r for r in rows}
    spec = ours["speculative"]
    drafted = sum(r.stats()["drafted"] for r in spec.requests)
    accepted = sum(r.stats()["accepted"] for r in spec.requests)
    plain_out = [r.tokens for r in ours["plain"].requests]
    return {
        "rows": rows,
        "speedup_vs_plain": by["speculative"]["tokens_per_s"] / by["plain"]["tokens_per_s"],
        "speedup_vs_mlx_lm": by["speculative"]["tokens_per_s"] / by["mlx-lm"]["tokens_per_s"],
        "plain_vs_mlx_lm": by["plain"]["tokens_per_s"] / by["mlx-lm"]["tokens_per_s"],
        "latency_vs_plain": by["plain"]["mean_latency_s"] / by["speculative"]["mean_latency_s"],
        "latency_vs_mlx_lm": by["mlx-lm"]["mean_latency_s"] / by["speculative"]["mean_latency_s"],
        "acceptance_rate": accepted / drafted if drafted else 0.0,
        "identical_to_plain": sum(r.tokens == p for r, p in zip(spec.requests, plain_out)) / len(prompts),
        "identical_to_mlx_lm": sum(p == o for p, o in zip(plain_out, reference["outputs"])) / len(prompts),
    }


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first output position where two token sequences differ (None: equal)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def agreement(outputs: dict[str, list[list[int]]], reference: str) -> list[dict[str, Any]]:
    """Per engine and request: the first position where its output leaves ``reference``'s (None: equal)."""
    return [
        {"engine": name, "request": i, "first_divergence": first_divergence(out, ref), "tokens": len(out)}
        for name, outs in outputs.items()
        if name != reference
        for i, (out, ref) in enumerate(zip(outs, outputs[reference]))
    ]


def format_batch_bench(result: dict[str, Any]) -> str:
    """The rows and ratios as a text table."""
    lines = [f"{'engine':<12} {'B':>3} {'tokens':>7} {'wall s':>8} {'tok/s':>8} {'latency s':>10}"]
    for r in result["rows"]:
        lines.append(
            f"{r['engine']:<12} {r['batch_size']:>3} {r['tokens']:>7} {r['wall_s']:>8.2f} "
            f"{r['tokens_per_s']:>8.1f} {r['mean_latency_s']:>10.2f}"
        )
    lines.append(
        f"speculative / plain: throughput {result['speedup_vs_plain']:.2f}x, "
        f"latency {result['latency_vs_plain']:.2f}x; "
        f"speculative / mlx-lm: throughput {result['speedup_vs_mlx_lm']:.2f}x, latency "
        f"{result['latency_vs_mlx_lm']:.2f}x; plain / mlx-lm {result['plain_vs_mlx_lm']:.2f}x; acceptance "
        f"{result['acceptance_rate']:.2f}; identical to plain {result['identical_to_plain']:.0%}, plain identical "
        f"to mlx-lm {result['identical_to_mlx_lm']:.0%}"
    )
    return "\n".join(lines)


def bench_batch_prompts(
    model_name: str,
    source: str,
    batch_size: int,
    drafter: str = "lookup",
    policy: str = "fixed:4",
    max_tokens: int = 128,
    categories: Sequence[str] | None = None,
    limit: int | None = None,
    out: str | None = None,
) -> dict[str, Any]:
    """``specbench bench --batch B``: the first turn of each question in ``source`` (a question.jsonl or
    "bundled"), decoded by the three engines at batch size B; the table printed, rows written to
    ``out``/batch_bench.csv when given."""
    from pathlib import Path

    from specbench.common.files import write_csv_atomic
    from specbench.experiments.prompts import questions_from, render_prompt
    from specbench.models.load import load

    if batch_size < 1:
        raise ValueError(f"--batch must be >= 1, got {batch_size}")
    policy = as_policy(policy)
    questions = questions_from(source, categories, limit)
    model, tokenizer = load(model_name)
    prompts = [render_prompt(tokenizer, q.turns[0]) for q in questions]
    result = bench_batch(model, prompts, batch_size, drafter, policy, max_tokens, tokenizer)
    print(format_batch_bench(result))
    if out:
        ratios = {k: v for k, v in result.items() if k != "rows"}
        rows = [{"model": model_name, "drafter": drafter, "policy": policy.name, **r, **ratios} for r in result["rows"]]
        path = write_csv_atomic(Path(out) / "batch_bench.csv", rows)
        print(f"\nresults: {path}")
    return result


__all__ = ["agreement", "bench_batch", "bench_batch_prompts", "first_divergence", "format_batch_bench", "mlx_lm_batch"]
