"""The measured batch grid: batched speculative against plain batched decoding at controlled acceptance, each cell
beside the one predictor's prediction for the steps its runs took (``specbench.cost.predict``) and the residual."""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any

import mlx.nn as nn
import numpy as np

from specbench.core.batch import BatchGeneration, generate_batch
from specbench.core.forward import vocab_size
from specbench.core.options import GenerateOptions
from specbench.core.policies import DraftPolicy
from specbench.core.verify import Verifier, check_verify_mode
from specbench.cost.batch import BatchProfile, recorded_oracles
from specbench.cost.grid import grid_cells
from specbench.cost.predict import noise_floor, predicted_batch_speedup
from specbench.drafters.oracle import Oracle
from specbench.exact import batch_verifier


def _request_seconds_per_token(gen: BatchGeneration) -> float:
    """Mean over requests of decode seconds per decode token (the latency each request sees)."""
    values = []
    for request in gen.requests:
        decode = [r for r in request.log.records if r.kind != "prefill"]
        tokens = sum(r.emitted for r in decode)
        if tokens:
            values.append(sum(r.verify_s for r in decode) / tokens)
    return float(np.mean(values))


def _seconds_per_token(gen: BatchGeneration) -> float:
    """Decode seconds of a batch run per decode token (verify and bookkeeping; drafting left out: the oracle
    drafter's bookkeeping is no drafter's cost)."""
    return sum(s.verify_s + s.other_s for s in gen.batch_log) / sum(len(r.tokens) - 1 for r in gen.requests)


@dataclass(frozen=True)
class _Pair:
    """One plain and one speculative run of the same batch: the speedup (throughput and each request's latency),
    the one predicted for the steps taken, the acceptance measured, seconds per token of each, and the requests
    whose output left the oracles' recording."""

    measured: float
    measured_latency: float
    predicted_from_log: float
    acceptance_measured: float
    plain_s: float
    spec_s: float
    diverged: int

    @classmethod
    def median(cls, pairs: list[_Pair]) -> _Pair:
        """Each figure's median over ``pairs``."""
        return cls(*(statistics.median(getattr(p, f.name) for p in pairs) for f in fields(cls)))


def _timed_pair(
    model: nn.Module,
    prompts: list[list[int]],
    oracles: list[Oracle],
    k: int,
    options: GenerateOptions,
    warm: GenerateOptions | None,
    profile: BatchProfile,
    verifier: Verifier,
) -> _Pair:
    """One plain run and one speculative run of the same batch, each right after an untimed one of its kind."""
    if warm is not None:
        generate_batch(model, prompts, warm, verifier=verifier).run()
    plain = generate_batch(model, prompts, options, verifier=verifier)
    plain.run()
    if warm is not None:
        BatchGeneration(model, prompts, warm, list(oracles), DraftPolicy.fixed(k), verifier=verifier).run()
    gen = BatchGeneration(model, prompts, options, list(oracles), DraftPolicy.fixed(k), verifier=verifier)
    gen.run()
    plain_s, spec_s = _seconds_per_token(plain), _seconds_per_token(gen)
    drafted = [r.stats()["acceptance_rate"] for r in gen.requests if r.stats()["drafted"]]
    return _Pair(
        plain_s / spec_s,
        _request_seconds_per_token(plain) / _request_seconds_per_token(gen),
        predicted_batch_speedup(gen, plain, profile),
        float(np.mean(drafted or [0])),
        plain_s,
        spec_s,
        sum(o.diverged_at is not None for o in oracles),
    )


def batch_speedup_grid(
    model: nn.Module,
    profile: BatchProfile,
    batch_sizes: Sequence[int] = (1, 4, 16, 32),
    acceptances: Sequence[float] = (0.5, 0.8, 1.0),
    ks: Sequence[int] = (1, 2, 4),
    prompt_len: int = 32,
    max_tokens: int = 64,
    seed: int = 0,
    budget_s: float | None = None,
    progress: Callable[[dict[str, Any]], None] | None = None,
    warmup_tokens: int = 8,
    repeats: int = 1,
    verify: str = "fast",
) -> list[dict[str, Any]]:
    """One row per (B, a, k): batched speculative over plain batched decoding measured end to end at controlled
    acceptance (an ``Oracle`` per request drafting the plain run's recorded output, ``DraftPolicy.fixed(k)``), the
    median of ``repeats`` adjacent pairs, each run after an untimed one of ``warmup_tokens``, beside the prediction
    at the nominal a and for the steps taken (``residual``). Cells past ``budget_s`` are left out; ``verify``: the
    batch engine's mode for both runs (the profile's costs are fast mode's)."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    verifier = batch_verifier(model, check_verify_mode(verify))
    acceptances, ks = grid_cells(acceptances, ks)
    rng = np.random.default_rng(seed)
    options = GenerateOptions(max_tokens=max_tokens, ignore_eos=True)
    warm = GenerateOptions(max_tokens=max(2, min(warmup_tokens, max_tokens)), ignore_eos=True)
    rows: list[dict[str, Any]] = []
    start = time.perf_counter()

    def spent() -> bool:
        return budget_s is not None and bool(rows) and time.perf_counter() - start > budget_s

    for b in batch_sizes:
        if spent():
            break
        prompts = rng.integers(0, vocab_size(model), size=(b, prompt_len)).tolist()
        oracles = recorded_oracles(model, prompts, options, 1.0, seed, verifier)
        for a, k in itertools.product(acceptances, ks):
            if spent():
                return rows
            for i, o in enumerate(oracles):
                o.acceptance, o.seed = a, seed + 1000 * k + i
            if warmup_tokens > 0:  # every [B', w'] block the cell's runs reach, used once untimed
                BatchGeneration(model, prompts, options, list(oracles), DraftPolicy.fixed(k), verifier=verifier).run()
            warmed = warm if warmup_tokens > 0 else None
            pairs = [
                _timed_pair(model, prompts, oracles, k, options, warmed, profile, verifier) for _ in range(repeats)
            ]
            cell = _Pair.median(pairs)
            measured, from_log = cell.measured, cell.predicted_from_log
            nominal = profile.predicted(a, k, b)["throughput"]
            row = {
                "batch_size": b,
                "acceptance": a,
                "k": k,
                "measured": measured,
                "measured_latency": cell.measured_latency,
                "predicted": nominal,
                "predicted_from_log": from_log,
                "error": measured / nominal - 1,
                "error_from_log": measured / from_log - 1,
                "residual": measured / from_log - 1,
                "acceptance_measured": cell.acceptance_measured,
                "plain_tokens_per_s": 1 / cell.plain_s,
                "spec_tokens_per_s": 1 / cell.spec_s,
                "diverged": max(p.diverged for p in pairs),
                "repeats": repeats,
                "measured_runs": [p.measured for p in pairs],
                "noise_floor": noise_floor([p.measured for p in pairs]),
                "verify": verify,
            }
            rows.append(row)
            if progress:
                progress(row)
    return rows


__all__ = ["batch_speedup_grid"]
