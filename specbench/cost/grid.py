"""Speedups measured end to end at controlled acceptance, against the cost model's prediction: one request at a time
(``speedup_grid``), and batched speculative against plain batched decoding (``batch_speedup_grid``), each cell
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

from specbench.common import distributed
from specbench.core.batch import BatchGeneration, generate_batch
from specbench.core.engine import Generation, plain_generation
from specbench.core.forward import vocab_size
from specbench.core.options import GenerateOptions
from specbench.core.policies import DraftPolicy
from specbench.core.policy_args import check_k, real
from specbench.core.verify import Verifier, check_verify_mode
from specbench.cost.batch import BatchProfile, recorded_oracles
from specbench.cost.breakeven import speedup
from specbench.cost.predict import noise_floor, predicted_batch_speedup, predicted_speedup
from specbench.cost.profile import Profile
from specbench.cost.timing import seconds_per_token
from specbench.drafters.oracle import Oracle
from specbench.exact import batch_verifier, verifier_for


def speedup_grid(
    model: nn.Module,
    profile: Profile,
    acceptances: Sequence[float] = (0.5, 0.7, 0.8, 0.9, 1.0),
    ks: Sequence[int] = (1, 2, 4, 6, 8),
    verify: str = "fast",
    prompt_len: int | None = None,
    max_tokens: int = 128,
    repeats: int = 1,
    seed: int = 0,
    progress: Callable[[dict[str, Any]], None] | None = None,
    spread: bool | None = None,
) -> list[dict[str, Any]]:
    """One row per (a, k): a plain greedy run and a speculative run (``Oracle`` at a, ``DraftPolicy.fixed(k)``)
    of ``max_tokens`` from one random prompt, back to back, their measured speedup against the prediction at the
    nominal a and for the steps taken, with errors. With ``spread`` (default: several ranks, a model not
    sharded) each rank measures every size-th cell and every rank returns all rows in cell order."""
    verify = check_verify_mode(verify)
    profile.curve(verify)  # a profile without this mode's costs fails here, naming its file
    acceptances, ks = grid_cells(acceptances, ks)
    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, vocab_size(model), size=prompt_len or profile.offset or 64).tolist()
    verifier = verifier_for(model, verify, widths=range(2, max(ks) + 2), context=len(prompt) + max_tokens)
    plain_options = GenerateOptions(max_tokens=max_tokens, ignore_eos=True)
    spec_options = GenerateOptions(max_tokens=max_tokens, ignore_eos=True, verify=verify)
    drafter = Oracle.from_model(model, prompt, max_tokens, 1.0, seed=seed, follow=True)

    def speculative(options: GenerateOptions, k: int) -> Generation:
        return Generation(model, prompt, options, drafter=drafter, policy=DraftPolicy.fixed(k), verifier=verifier)

    if spread is None:
        spread = distributed.size() > 1 and not distributed.is_sharded(model)
    size, rank = (distributed.size(), distributed.rank()) if spread else (1, 0)
    cells = [(cell, k, a) for cell, (k, a) in enumerate((k, a) for k in ks for a in acceptances) if cell % size == rank]
    for k in dict.fromkeys(k for _, k, _ in cells):  # warm-up: compile each width's kernels before timing
        warm = GenerateOptions(max_tokens=min(max_tokens, 2 * k + 4), ignore_eos=True, verify=verify)
        seconds_per_token(speculative(warm, k))
    rows: list[tuple[int, dict[str, Any]]] = []
    for cell, k, a in cells:
        drafter.acceptance, drafter.seed = float(a), seed + cell
        plain_runs, spec_runs = [], []
        for _ in range(max(1, repeats)):
            plain_runs.append(seconds_per_token(plain_generation(model, prompt, plain_options)))
            gen = speculative(spec_options, k)
            spec_runs.append(seconds_per_token(gen, lambda: drafter.follow_s))
        plain_s, spec_s = statistics.median(plain_runs), statistics.median(spec_runs)
        stats = gen.stats()
        verifies = [r for r in gen.log if r.kind == "verify"]
        drafted = sum(r.k_drafted for r in verifies)
        accepted = sum(r.accepted for r in verifies)
        rejections = sum(1 for r in verifies if r.accepted < r.k_drafted)
        draft_s = max(0.0, sum(r.draft_s for r in verifies) - drafter.follow_s)
        d = draft_s / drafted / plain_s if drafted else 0.0
        measured = plain_s / spec_s
        nominal = speedup(a, k, profile, d, verify)
        from_log = predicted_speedup(gen.log.records, profile, d, len(prompt), verify)
        row = {
            "model": profile.model,
            "name": profile.name,
            "device": profile.device,
            "mode": verify,
            "a": float(a),
            "k": int(k),
            "tokens": len(gen.tokens),
            "verifies": len(verifies),
            "plain_s_per_token": plain_s,
            "spec_s_per_token": spec_s,
            "speedup": measured,
            "tokens_per_verify": stats["tokens_per_verify"],
            "acceptance_measured": accepted / (accepted + rejections) if accepted + rejections else 1.0,
            "d": d,
            "step_cost": profile.c(k + 1, verify),
            "predicted_nominal": nominal,
            "predicted_from_log": from_log,
            "error_nominal": measured / nominal - 1.0,
            "error_from_log": measured / from_log - 1.0 if from_log else 0.0,
            # Seconds per speculative token predicted from the profile alone, and their error:
            # free of the plain run's own variation, which the speedup errors carry.
            "predicted_spec_s_per_token": profile.plain_step_s / from_log if from_log else None,
            "error_time": spec_s * from_log / profile.plain_step_s - 1.0 if from_log else 0.0,
            "error_time_nominal": spec_s * nominal / profile.plain_step_s - 1.0,
            "plain_step_s_profile": profile.plain_step_s,
            "plain_over_profile": plain_s / profile.plain_step_s,
            "diverged_at": drafter.diverged_at,
            "follows": drafter.follows,
        }
        rows.append((cell, row))
        if progress is not None:
            progress(row)
    if size > 1:
        rows = sorted((pair for part in distributed.gather(rows) for pair in part), key=lambda pair: pair[0])
    return [row for _, row in rows]


def grid_cells(acceptances: Sequence[float], ks: Sequence[int]) -> tuple[list[float], list[int]]:
    """A grid's acceptances (each a finite number in [0, 1]) and draft lengths (each from 1 to
    ``MAX_DRAFT_LENGTH``), or one clear error before any model work."""
    checked = [real("a grid acceptance", a, 0.0, 1.0) for a in acceptances]
    return checked, [check_k(k, "a grid draft length") for k in ks]


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
