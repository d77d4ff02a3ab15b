"""Cost along the batch axis: c(w, B), break-even a*(k, B), predictions, and a measured grid.

c(w, B) = seconds of a [B, w] verification forward / seconds of a [B, 1] plain batched step (mlx-lm
``BatchKVCache``, every row at the same context length). Every request drafting k tokens at acceptance a_r,
request r's latency speedup is E(a_r, k) / (c(k+1, B) + k d) and the throughput speedup their mean. Fast mode:
exact verification runs each request's rows serially (``specbench.core.batch``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from specbench.common.identity import device_name, model_key
from specbench.core.batch import BatchGeneration, check_batchable, generate_batch
from specbench.core.batch_hybrid import RowRollback, empty_batch_caches
from specbench.core.batch_policies import BatchAutoPolicy
from specbench.core.experts import ExpertCounter, expert_layers
from specbench.core.forward import vocab_size
from specbench.core.options import GenerateOptions
from specbench.core.policies import DraftPolicy
from specbench.core.verify import FAST, Verifier
from specbench.cost.bandwidth import expected_distinct_experts, routing
from specbench.cost.breakeven import best_k, break_even_acceptance, expected_tokens
from specbench.cost.profile import cost_at
from specbench.cost.timing import kept_rounds
from specbench.drafters.oracle import Oracle


@dataclass
class BatchProfile:
    """c(w, B) of one model on one device: ``costs[B]`` is c(1..W) at batch size B (c(1, B) = 1),
    ``plain_s[B]`` the seconds of a [B, 1] step; ``experts``: distinct experts per MoE layer of a
    [B, w] block (mean over layers), with the uniform-routing expectation; ``failures``: batch sizes
    whose forward did not run (the error), larger ones left out."""

    model: str
    device: str
    offset: int
    costs: dict[int, list[float]]
    plain_s: dict[int, float]
    experts: list[dict[str, float]] = field(default_factory=list)
    failures: list[dict[str, Any]] = field(default_factory=list)
    #: str(w) -> str(B) -> seconds a batched engine step of width w really takes beyond c(w, B) times the
    #: profile's [B, 1] forward: masks, per-row acceptance and rollback, bookkeeping, less what the engine's
    #: pipelining hides of the profile's synchronous forward (so it can be negative); w = 1: a plain batched
    #: step's (``measure_batch_overhead``). Empty: not measured (predictions price the forwards alone).
    overhead_s: dict[str, dict[str, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:  # batch sizes as numbers, also where JSON stored them as text
        self.costs = {int(b): list(v) for b, v in self.costs.items()}
        self.plain_s = {int(b): float(v) for b, v in self.plain_s.items()}

    def overhead(self, w: int, batch_size: int) -> float:
        """Seconds a batched step of width w over ``batch_size`` rows takes beyond c(w, B) times the [B, 1]
        forward, as measured: interpolated linearly in log B between the measured batch sizes and linearly in
        w between the measured widths (the nearest beyond either range); 0 when none was measured. Not
        clamped: a negative value is time the engine's pipelining saves on the profile's forward."""
        if not self.overhead_s:
            return 0.0
        widths = sorted(int(m) for m in self.overhead_s)
        at_width = [_interpolate_log(batch_size, self.overhead_s[str(m)]) for m in widths]
        return float(np.interp(w, widths, at_width))

    def plain_step_s(self, batch_size: int) -> float:
        """Seconds of a [B, 1] forward (interpolated between measured batch sizes)."""
        sizes = self.batch_sizes
        return float(np.interp(batch_size, sizes, [self.plain_s[b] for b in sizes]))

    @property
    def batch_sizes(self) -> list[int]:
        return sorted(self.costs)

    def curve(self, batch_size: int) -> np.ndarray:
        """c(1..W) at ``batch_size`` (interpolated linearly in log B between measured sizes)."""
        sizes = self.batch_sizes
        if batch_size in self.costs:
            return np.asarray(self.costs[batch_size], dtype=float)
        if batch_size < sizes[0] or batch_size > sizes[-1]:
            raise ValueError(f"batch size {batch_size} is outside the profile's {sizes[0]}..{sizes[-1]}: measure it")
        hi = next(s for s in sizes if s > batch_size)
        lo = max(s for s in sizes if s < batch_size)
        t = (np.log(batch_size) - np.log(lo)) / (np.log(hi) - np.log(lo))
        width = min(len(self.costs[lo]), len(self.costs[hi]))
        return (1 - t) * np.asarray(self.costs[lo][:width]) + t * np.asarray(self.costs[hi][:width])

    def c(self, w: int | float, batch_size: int) -> float:
        return cost_at(self.curve(batch_size), w)

    def break_even_tokens(self, k: int, batch_size: int, d: float = 0.0) -> float:
        """Tokens a verification of k drafts must yield per request at this batch size: c(k+1, B) + k d."""
        return self.c(k + 1, batch_size) + k * d if k else 1.0

    def break_even_acceptance(self, batch_size: int, d: float = 0.0, max_k: int | None = None) -> np.ndarray:
        """a*(k, B) for k = 1..max_k (0: pays even when all drafts are rejected; NaN: never pays)."""
        return break_even_acceptance(self.curve(batch_size), d, max_k)

    def predicted(self, acceptance: float | Sequence[float], k: int, batch_size: int, d: float = 0.0) -> dict:
        """Predicted speedups over plain batched decoding: ``throughput`` (total tokens/s) and
        ``latency`` (each request's, in request order when ``acceptance`` is one value per request)."""
        per_request = [float(acceptance)] * batch_size if np.ndim(acceptance) == 0 else list(acceptance)
        gains = [expected_tokens(a, k) / self.break_even_tokens(k, batch_size, d) for a in per_request]
        return {"throughput": float(np.mean(gains)), "latency": gains}

    def best_k(self, acceptance: float, batch_size: int, d: float = 0.0, max_k: int | None = None) -> tuple[int, float]:
        """(k, predicted speedup) best at this batch size and acceptance (k = 0: plain decoding pays best)."""
        return best_k(acceptance, self.curve(batch_size), d, max_k)

    def auto_policy(self, d: float = 0.0, **kwargs: Any) -> BatchAutoPolicy:
        """Auto planning with this profile's break-even at each batch size (``max_k``, ``window``,
        ``pause_tokens`` as for ``DraftPolicy.auto``); sizes past the measured ones use the largest."""
        largest = self.batch_sizes[-1]
        return BatchAutoPolicy(lambda k, b: self.break_even_tokens(k, min(b, largest), d), **kwargs)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BatchProfile:
        return cls(**data)

    def to_polars(self):
        """One row per (B, w): c, seconds, break-even tokens at k = w - 1."""
        import polars as pl

        rows = [
            {"batch_size": b, "width": w, "c": c, "seconds": c * self.plain_s[b], "plain_step_s": self.plain_s[b]}
            for b in self.batch_sizes
            for w, c in enumerate(self.costs[b], start=1)
        ]
        return pl.DataFrame(rows)


#: Tokens at most in one forward that fills a batch cache. MLX's CUDA kernels put some axes on a grid
#: dimension limited to 65535 blocks: the MoE gather matmul launches one block row per routed token
#: (tokens x experts per token), so a [32, 256] prefill of a top-8 MoE (65536) fails to launch
#: (``cuGraphAddKernelNode ... invalid argument``, with or without CUDA graphs). Chunks of at most
#: 2048 tokens keep every such axis far below the limit.
PREFILL_TOKENS = 2048


def _interpolate_log(batch_size: int, per_size: dict[str, float]) -> float:
    """``per_size`` (str(B) -> value) at ``batch_size``: linear in log B between measured sizes, the nearest
    beyond them."""
    sizes = sorted(int(b) for b in per_size)
    return float(np.interp(np.log(batch_size), np.log(sizes), [per_size[str(b)] for b in sizes]))


def _batch_cache(model: nn.Module, batch_size: int, offset: int, rng: np.random.Generator) -> list[Any]:
    """A batch cache holding ``offset`` random tokens in each of ``batch_size`` rows, filled in chunks of
    at most ``PREFILL_TOKENS`` tokens."""
    cache = empty_batch_caches(model, batch_size)
    ids = mx.array(rng.integers(0, vocab_size(model), size=(batch_size, offset)), dtype=mx.uint32)
    step = max(1, PREFILL_TOKENS // batch_size)
    for start in range(0, offset, step):
        model(ids[:, start : start + step], cache=cache)
        mx.eval([c.state for c in cache])
    return cache


def _undo(cache: list[Any], width: int) -> Callable[[], None]:
    """What puts ``cache`` back after a forward of ``width`` positions: key-value layers are trimmed,
    recurrent layers (hybrid models) get their state from before it back."""
    saved = {i: list(c.cache) for i, c in enumerate(cache) if not c.is_trimmable()}

    def undo() -> None:
        for i, c in enumerate(cache):
            if i in saved:
                c.cache = list(saved[i])
            else:
                c.trim(width)

    return undo


def _time_widths(
    model: nn.Module, cache: list[Any], batch_size: int, widths: list[int], repeats: int, warmup: int, rng
) -> dict[int, float]:
    """Median seconds of one [B, w] forward over ``cache`` (put back after each) for each width, timed in
    interleaved rounds so that drift and other load spread over every width alike. A hybrid model's
    verification runs as the batch engine runs it: its recurrent layers step one position at a time,
    recording each state (``RowRollback``)."""
    vocab = vocab_size(model)
    rollback = RowRollback(model, cache)

    def one_forward(w: int) -> float:
        ids = mx.array(rng.integers(0, vocab, size=(batch_size, w)), dtype=mx.uint32)
        mx.eval(ids)
        undo = _undo(cache, w)
        rollback.arm(w)
        t0 = time.perf_counter()
        mx.eval(model(ids, cache=cache))
        seconds = time.perf_counter() - t0
        rollback.rewind([w] * batch_size)  # keeps every position: only stops recording
        undo()
        return seconds

    kept = kept_rounds(warmup, repeats, lambda: [one_forward(w) for w in widths])
    return {w: statistics.median(t) for w, t in zip(widths, zip(*kept))}


def measure_batch_profile(
    model: nn.Module,
    batch_sizes: Sequence[int] = (1, 2, 4, 8, 16, 32),
    widths: int | Sequence[int] = 8,
    offset: int = 128,
    repeats: int = 5,
    warmup: int = 1,
    count_experts: bool = True,
    seed: int = 0,
    verify: str = "fast",
    budget_s: float | None = None,
    progress: Callable[[str], None] | None = None,
) -> BatchProfile:
    """Measure c(w, B) (fast verification) for each batch size; for an MoE model (``count_experts``)
    also the distinct experts a [B, w] block touches. Batch sizes past ``budget_s`` are left out."""
    if verify != "fast":
        raise ValueError(
            "the batch cost profile c(w, B) measures fast forwards only; time exact batches end to end "
            "(specbench.cost.grid.batch_speedup_grid(verify='exact'), or scripts.gpu.batch --exact)"
        )
    if not batch_sizes:
        raise ValueError("batch_sizes names no batch size: give at least one (e.g. 1, 4, 16)")
    check_batchable(model)
    widths = list(range(1, widths + 1)) if isinstance(widths, int) else sorted({1, *widths})
    if widths != list(range(1, widths[-1] + 1)):
        raise ValueError(f"widths must be 1..W without gaps (c is interpolated from them), got {widths}")
    say = progress or (lambda text: None)
    rng = np.random.default_rng(seed)
    moe = count_experts and bool(expert_layers(model))
    costs: dict[int, list[float]] = {}
    plain_s: dict[int, float] = {}
    experts: list[dict[str, float]] = []
    failures: list[dict[str, Any]] = []
    start = time.perf_counter()
    for b in sorted(batch_sizes):
        if budget_s is not None and costs and time.perf_counter() - start > budget_s:
            say(f"batch sizes from {b} left out: past the {budget_s:.0f} s budget")
            break
        try:
            cache = _batch_cache(model, b, offset, rng)
            seconds = _time_widths(model, cache, b, widths, repeats, warmup, rng)
        except RuntimeError as err:  # a kernel that does not launch at this size (larger ones fail too)
            if not costs:
                raise RuntimeError(f"no batch size could be measured: {err}") from err
            failures.append({"batch_size": b, "error": str(err)})
            say(f"B={b} failed, larger batch sizes left out: {err}")
            break
        plain_s[b] = seconds[1]
        costs[b] = [seconds[w] / seconds[1] for w in widths]
        say(f"B={b}: plain step {1e3 * seconds[1]:.2f} ms; c(w) " + " ".join(f"{c:.2f}" for c in costs[b]))
        if moe:
            experts += _block_experts(model, cache, b, widths, rng)
        del cache
    return BatchProfile(model_key(model), device_name(), offset, costs, plain_s, experts, failures)


def _block_experts(model: nn.Module, cache: list[Any], b: int, widths: list[int], rng) -> list[dict[str, float]]:
    num_experts, top_k = routing(model)
    rows = []
    with ExpertCounter(model) as counter:
        for w in widths:
            counter.take()
            ids = rng.integers(0, vocab_size(model), size=(b, w))
            undo = _undo(cache, w)
            mx.eval(model(mx.array(ids, dtype=mx.uint32), cache=cache))
            called = [c for c in counter.take() if c]
            undo()
            rows.append(
                {
                    "batch_size": b,
                    "width": w,
                    "tokens": b * w,
                    "distinct_experts": float(np.mean(called)),
                    "expected_uniform": expected_distinct_experts(num_experts, top_k, b * w),
                    "num_experts": num_experts,
                }
            )
    return rows


def recorded_oracles(
    model: nn.Module,
    prompts: list[list[int]],
    options: GenerateOptions,
    acceptance: float,
    seed: int,
    verifier: Verifier = FAST,
) -> list[Oracle]:
    """An ``Oracle`` per prompt at ``acceptance`` drafting the plain batched run's output (recorded untimed by
    ``verifier``), and drafting the recording on where a speculative run leaves it."""
    recording = generate_batch(model, prompts, options, verifier=verifier)
    recording.run()
    return [
        Oracle(p, r.tokens, acceptance, vocab_size(model), seed=seed + i, keep_drafting=True)
        for i, (p, r) in enumerate(zip(prompts, recording.requests))
    ]


#: Acceptance of the drafts in ``measure_batch_overhead``'s speculative steps: rows accept different numbers of
#: them, so they fall out of step as served rows do.
RAGGED_ACCEPTANCE = 0.5


def measure_batch_overhead(
    model: nn.Module,
    profile: BatchProfile,
    widths: Sequence[int] = (1, 3, 5),
    tokens: int = 48,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
    repeats: int = 2,
) -> BatchProfile:
    """The engine's own seconds per batched step beyond c(w, B) times the [B, 1] forward, at each of
    ``profile``'s batch sizes and ``widths`` (w > 1: drafts at ``RAGGED_ACCEPTANCE``): the mean step of runs of
    ``tokens`` per row, median of ``repeats``, into ``profile.overhead_s``. Measure at the predictions' run length."""
    if tokens < 2:
        raise ValueError(f"tokens must be >= 2 (a prefill token and a decode step), got {tokens}")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    rng = np.random.default_rng(seed)
    vocab = vocab_size(model)
    widths = sorted(set(widths))
    for b in profile.batch_sizes:
        prompts = rng.integers(0, vocab, size=(b, max(1, profile.offset))).tolist()
        recorded = GenerateOptions(max_tokens=tokens + max(widths), ignore_eos=True)
        oracles = recorded_oracles(model, prompts, recorded, RAGGED_ACCEPTANCE, seed)
        options = GenerateOptions(max_tokens=tokens, ignore_eos=True)
        for w in widths:
            policy, drafters = (DraftPolicy.fixed(w - 1), oracles) if w > 1 else (None, None)
            runs = []
            for i in range(repeats + 1):
                gen = BatchGeneration(model, prompts, options, drafters and list(drafters), policy)
                gen.run()
                if i == 0:  # untimed: every shape of its tail used once
                    continue
                timed = [s for s in gen.batch_log if s.kind != "prefill" and s.batch_size == b and s.width == w]
                if timed:
                    runs.append(sum(s.verify_s + s.other_s for s in timed) / len(timed))
            if not runs:
                continue
            seconds = statistics.median(runs)
            profile.overhead_s.setdefault(str(w), {})[str(b)] = seconds - profile.c(w, b) * profile.plain_s[b]
            if progress:
                beyond = 1e3 * profile.overhead_s[str(w)][str(b)]
                spread = (max(runs) - min(runs)) / seconds
                step = f"step {1e3 * seconds:.2f} ms ({spread:.0%} spread)"
                progress(f"B={b} w={w}: {step}, beyond the forward {beyond:.2f} ms")
    return profile


__all__ = ["BatchProfile", "measure_batch_overhead", "measure_batch_profile"]
