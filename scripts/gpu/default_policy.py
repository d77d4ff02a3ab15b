"""Does the default (Auto, exact greedy verification) ever lose to plain decoding? Paired runs, intervals.

    python3 scripts/gpu/default_policy.py --budget 480   # H200: dense and MoE 4-bit shapes, embedded model
    python3 scripts/gpu/default_policy.py --quick        # CPU: tiny shapes, the embedded model's miniature (< 60 s)
    python3 scripts/gpu/default_policy.py --resummarize FOLDER   # recompute an earlier run's summaries
    python3 scripts/gpu/default_policy.py --shapes '' --embedded-tokens 128 --categories qa,rag --traces ''
    python3 scripts/gpu/default_policy.py --resummarize FOLDER1 FOLDER2   # runs split over calls, summarized together

Everything that is not a timed run comes first, per model: exact-mode calibration of every width Auto may
verify (2..9; 2..17 with SuffixDecoding), Auto's quick cost profiles, per-call seconds of one verify forward
at 1, 7 and 9 rows (fast, exact at the calibrated level, attention split alone, linear layers in chunks alone;
with --compile the exact level with its linear chunks mx.compile'd too), and a warm-up run of every method.

1. Synthetic shapes (random weights, full depth, 4-bit): a controlled-acceptance drafter (``OracleDrafter``) at
   a in {0.3, 0.5, 0.7, 0.9, 1.0}, Auto with exact and with fast verify, against specbench plain decoding of the
   same prompt. Each repeat runs mlx-lm plain once, then every cell as a pair of runs next to each other,
   specbench plain and Auto, the order alternating between cells and repeats, so drift in the machine's speed
   falls on both runs of a pair.
2. The embedded model (SmolLM2-135M): every prompt of every bundled category (first turn) and the first
   --trace-turns turns of each trace in data/traces; plain, Auto with prompt lookup and Auto with
   SuffixDecoding, in an order rotating per prompt; one drafter per method and repeat, kept across prompts.

Each model also gets an A/A cell: specbench plain timed exactly as an Auto cell is, paired with plain. Per
cell: plain's seconds over Auto's summed over every pair, with a 95 % expanded percentile bootstrap interval
(resampling pairs; none below 6 pairs). The machine's speed drifts between runs by far more than the 3 %
asked about, so each cell also gets the same ratio in plain steps: each run's seconds over its own speed,
the median of its steady plain steps (less its drafter's per-token ``observe`` seconds, which stay charged
to Auto); verifications, drafting, probes and restarted stretches stay in Auto's seconds. The A/A cell
checks it (plain against plain in plain steps should be 1 within its interval; on the H200 it came out
0.96-1.02). An Auto run that speculated throughout has no steady plain steps, so no speed of its own: its
pair enters at plain's speed for both runs, which is its seconds ratio (never dropped: those are the runs
where speculation paid); the cell prints how many pairs did. A pair in which neither run has a speed (an
output too short for one, the same length in both) is left out. Each estimate gets a verdict against 0.97,
the one on seconds first: "holds" (the interval is above), "ok" (the ratio is above, the interval reaches
below), "inconclusive" (the ratio is below, the interval reaches 0.97) or "LOSES" (the interval is below,
and a one-sided t-test of the pairs' log ratios against 0.97 stays under 2.5 % after Holm's correction
over the run's cells: a run judges 10-24 cells at once); also the median over repeats. Pooled intervals
over cells follow: the runs in which Auto fell back, those in which it speculated, the A/A runs. Each Auto
run also records its verify steps' median seconds by width, printed against the per-call timings, and each
shape pair where Auto's seconds beyond plain's went, in plain steps (speculation, stretch starts, steady
steps, outside the log, slower steps), and how many of each run's steady steps took over 1.5x its median,
and how many of those came right after a decision (a verification, a stretch's start).
Timed runs run with Python's garbage collector paused (collected before each run); before the first timed
run the script times plain decoding with the process free to move and pinned to four cores, and keeps the
steadier of the two for the whole run (printed). Exact outputs are checked against plain greedy on every
run. Sizes (tokens, repeats) shrink to fit --budget: what was cut is printed and kept in
default_policy.json. Writes into $OUT (or --out): grid.csv, embedded.csv, pooled.csv, runs.csv,
verify_calls.csv, default_policy.json; the runs after every repeat, so a run stopped early keeps what
finished (SIGTERM, as `timeout` sends, also summarizes it; --resummarize recovers one killed outright).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import signal
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import mlx.core as mx
import numpy as np
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import make_prompt_cache

from specbench import GenerateOptions, generate, speculative_generate
from specbench.bench import paired
from specbench.bench.paired import MIN_UNITS, bootstrap, holm
from specbench.bench.run_speed import (
    MIN_STEADY,
    NEAR,
    SLOW,
    mean_speed,
    speed_state,
    time_split,
    verify_ms_by_width,
)
from specbench.common.files import write_csv_atomic, write_json_atomic
from specbench.common.identity import device_name, versions
from specbench.core.forward import vocab_size
from specbench.core.policies import DraftPolicy
from specbench.cost import profile_for
from specbench.cost.measure import seconds_per_token
from specbench.drafters.oracle import OracleDrafter
from specbench.exact import ExactPlan, calibrate, exact_mode
from specbench.inputs.prompts import BUNDLED_CATEGORIES
from specbench.models import synthetic

ROOT = Path(__file__).resolve().parents[2]
OK = 0.97
#: One-sided level of a "LOSES" verdict: what an interval of 95 % wholly below 0.97 says of one cell.
ALPHA = 0.025
MIN_PAIRS = MIN_UNITS  # fewest (plain, Auto) pairs a cell's interval is computed from
AA = "plain (A/A)"
FULL = {
    "shapes": ["qwen3-8b-4bit", "qwen3-30b-a3b-4bit"],
    "acceptances": [0.3, 0.5, 0.7, 0.9, 1.0],
    "tokens": 256,
    "min_tokens": 128,
    "repeats": 8,
    "min_repeats": 6,
    "prompt_len": 256,
    "call_widths": [1, 7, 9],
    "warmup_tokens": 64,
    "call_repeats": 10,
    "embedded": "smollm2-135m",
    "embedded_tokens": 128,
    "min_embedded_tokens": 64,
    "embedded_repeats": 3,  # each repeat pairs every prompt of a category once
    "min_embedded_repeats": 2,
    "per_category": None,  # every prompt
    "trace_turns": 3,
    "traces": None,  # every trace in data/traces
    # seconds a phase spends before its first timed run on a cold H200 (first-use kernel builds, calibration;
    # measured: dense 145-191 s, MoE 179 s after the dense shape, 319 s first on a fresh machine)
    "setup_s": {"qwen3-8b-4bit": 170.0, "qwen3-30b-a3b-4bit": 320.0, "embedded": 45.0},
    "shares": {"qwen3-8b-4bit": 0.25, "qwen3-30b-a3b-4bit": 0.35, "embedded": 0.4},
}
QUICK = {
    **FULL,
    "shapes": ["qwen3-8b-tiny", "qwen3-30b-a3b-tiny"],
    "acceptances": [0.5, 1.0],
    "tokens": 32,
    "min_tokens": 16,
    "repeats": 2,
    "min_repeats": 2,
    "prompt_len": 24,
    "call_widths": [1, 9],
    "call_repeats": 2,
    "warmup_tokens": 12,
    "embedded": "tiny:smollm2-135m",
    "embedded_tokens": 24,
    "min_embedded_tokens": 12,
    "embedded_repeats": 2,
    "min_embedded_repeats": 2,
    "per_category": 1,
    "categories": ["translation", "natural_text"],
    "trace_turns": 1,
    "traces": 1,
    "setup_s": {"qwen3-8b-tiny": 5.0, "qwen3-30b-a3b-tiny": 8.0, "embedded": 8.0},
    "shares": {"qwen3-8b-tiny": 0.3, "qwen3-30b-a3b-tiny": 0.3, "embedded": 0.4},
}


class Interrupted(Exception):
    """The run was asked to stop (SIGTERM)."""


def say(text: str) -> None:
    print(text, flush=True)


class Budget:
    """The run's seconds: each phase gets its share of what is left for timed runs, plus what earlier
    phases did not use."""

    def __init__(self, seconds: float, cfg: dict, embedded: bool = True):
        self.seconds, self.start, self.cuts = seconds, time.perf_counter(), []
        self.phases = [*cfg["shapes"], *(["embedded"] if embedded else [])]
        self.setup = {p: cfg["setup_s"].get(p, 30.0) for p in self.phases}
        self.shares = {p: cfg["shares"].get(p, 0.3) for p in self.phases}

    def left(self) -> float:
        return self.seconds - (time.perf_counter() - self.start)

    def allot(self, phase: str) -> float:
        """Seconds for ``phase``'s timed runs, decided when its set-up is done."""
        later = self.phases[self.phases.index(phase) + 1 :]
        reserve = sum(self.setup[p] for p in later) + 10.0
        timed_left = max(0.0, self.left() - reserve)
        share = self.shares[phase] / sum(self.shares[p] for p in [phase, *later])
        return timed_left * share

    def cut(self, what: str) -> None:
        self.cuts.append(what)
        say(f"  reduced: {what}")


def size(
    allot: float, per_token_run_s: float, runs_per_repeat: float, cfg: dict, key: str, repeats_key: str = "repeats"
) -> tuple[int, int]:
    """(tokens per run, repeats) that fit ``allot`` seconds: the most tokens at the most repeats, then fewer
    tokens, then fewer repeats."""
    top, bottom = cfg[key], cfg["min_" + key]
    most, fewest = cfg[repeats_key], cfg["min_" + repeats_key]
    for repeats in range(most, fewest - 1, -1):
        tokens = int(allot / (per_token_run_s * runs_per_repeat * repeats))
        if tokens >= bottom:
            return min(top, tokens), repeats
    return bottom, fewest


def spread(values: list[float]) -> float:
    """Relative spread (max / min - 1) of positive values."""
    return max(values) / min(values) - 1.0 if values and min(values) > 0 else 0.0


def verdict(ratio: float, low: float, high: float, p_adjusted: float | None = None) -> str:
    """Against 0.97 with a 95 % interval [low, high] of Auto / plain: "holds" (low >= 0.97), "ok" (the ratio is
    >= 0.97, the interval reaches below), "inconclusive" (the ratio is below, the interval reaches 0.97, or
    its p-value corrected for the run's other cells, ``p_adjusted``, is not under 2.5 %), "LOSES" (the whole
    interval is below and so is the corrected p-value)."""
    if low >= OK:
        return "holds"
    if ratio >= OK:
        return "ok"
    loses = high < OK and (p_adjusted is None or p_adjusted < ALPHA)
    return "LOSES" if loses else "inconclusive"


def seconds_ratio(pairs: list[tuple[float, float]]) -> float:
    """Plain seconds over Auto seconds, summed over (plain, Auto) pairs."""
    return sum(p for p, _ in pairs) / sum(a for _, a in pairs)


def run_speeds(row: dict, average: str = "state") -> tuple[float | None, float | None]:
    """(plain, Auto) speeds of a run row in seconds, None where a run has none: ``speed_state``'s (``average``
    "state") or ``mean_speed``'s ("mean"; in rows written before it was recorded, the mean steady step from
    ``time_split``, with a drafter's ``observe`` seconds not taken out)."""
    if average == "state":
        return _ms(row.get("plain_state_ms")), _ms(row.get("auto_state_ms"))

    def mean(who: str) -> float | None:
        if f"{who}_mean_ms" in row:
            return _ms(row[f"{who}_mean_ms"])
        steady = row.get(f"{who}_steady_n")
        return _ms(row[f"{who}_steady_ms"] / steady) if steady and steady >= MIN_STEADY else None

    return mean("plain"), mean("auto")


def excess_in_steps(row: dict) -> dict[str, float] | None:
    """Auto's seconds beyond plain's in one pair, in plain steps, by where they went (``time_split``):
    speculation (its steps' seconds over Auto's speed, less the tokens they emitted), stretch starts,
    steady steps and seconds outside the log (each Auto's in its speed less plain's in its own), and slower
    steps (every token at Auto's speed over plain's: what the estimate in plain steps takes out, drift
    between runs or a real per-step cost). None without both runs' splits and speeds."""
    plain_speed, auto_speed = run_speeds(row)
    if not (plain_speed and auto_speed) or row.get("auto_steady_n") is None or row.get("plain_steady_n") is None:
        return None
    speeds = {"auto": 1e3 * auto_speed, "plain": 1e3 * plain_speed}

    def steps(who: str, ms: str, n: str | None) -> float:
        return row[f"{who}_{ms}"] / speeds[who] - (row[f"{who}_{n}"] if n else 0.0)

    parts = {"speculation": steps("auto", "spec_ms", "spec_tokens")}
    for part, ms, n in (("stretch starts", "starts_ms", "starts_n"), ("steady", "steady_ms", "steady_n")):
        parts[part] = steps("auto", ms, n) - steps("plain", ms, n)
    parts["outside the log"] = steps("auto", "unlogged_ms", None) - steps("plain", "unlogged_ms", None)
    parts["slower steps"] = row["tokens"] * (auto_speed / plain_speed - 1.0)
    return parts


def seconds_pair(row: dict) -> tuple[float, float]:
    """(plain, Auto) seconds of a run row: whole calls (the embedded model) or per token (shapes)."""
    return (row["plain_s"], row["auto_s"]) if "plain_s" in row else (row["plain_s_per_token"], row["auto_s_per_token"])


def in_plain_steps(rows: list[dict], average: str = "state") -> list[tuple[float, float]]:
    """(plain, Auto) seconds of each run row over its run's speed (``run_speeds``). A run without a speed
    (Auto speculating throughout) takes its pair's other run's, so the pair counts its seconds ratio; a row
    in which neither run has one (an output too short for a speed, the same in both) is left out."""
    steps = []
    for row in rows:
        (plain, auto), (plain_speed, auto_speed) = seconds_pair(row), run_speeds(row, average)
        if plain_speed or auto_speed:
            steps.append((plain / (plain_speed or auto_speed), auto / (auto_speed or plain_speed)))
    return steps


def at_one_speed(rows: list[dict], average: str = "state") -> int:
    """How many of ``in_plain_steps``'s pairs count their seconds ratio: one run with a speed, the other none."""
    return sum(1 for row in rows if sum(bool(speed) for speed in run_speeds(row, average)) == 1)


@contextlib.contextmanager
def quiet() -> Any:
    """A timed run: garbage collected before, the collector paused during."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


class SetupStages:
    """Seconds of a shape's set-up by stage, each from the end of the one before (a cold machine compiles
    its kernels in whichever stage first needs them)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._last = time.perf_counter()

    def done(self, stage: str) -> None:
        now = time.perf_counter()
        self.seconds[stage] = now - self._last
        self._last = now

    def __str__(self) -> str:
        return ", ".join(f"{stage} {s:.0f} s" for stage, s in self.seconds.items())


def steadier_affinity(plain: Any, runs: int = 6) -> dict:
    """Time ``plain()`` ``runs`` times free to move between cores and pinned to four; keep the steadier
    (lower coefficient of variation). Returns what was measured and chosen."""
    if not hasattr(os, "sched_setaffinity"):
        return {"chosen": "free (no affinity control)"}
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 8:
        return {"chosen": f"free ({len(cores)} cores)"}

    def cv() -> float:
        times = [plain() for _ in range(runs)]
        return statistics.stdev(times) / statistics.mean(times)

    free = cv()
    pinned_cores = set(cores[-4:])
    os.sched_setaffinity(0, pinned_cores)
    pinned = cv()
    chosen = f"pinned to cores {sorted(pinned_cores)}" if pinned < free else "free"
    if pinned >= free:
        os.sched_setaffinity(0, set(cores))
    say(f"  plain decoding's run-to-run variation: free {100 * free:.1f}%, pinned {100 * pinned:.1f}% -> {chosen}")
    return {"free_cv": free, "pinned_cv": pinned, "chosen": chosen}


# -- per-call verify timings ---------------------------------------------------------------------------


def time_call(model: Any, cache: list[Any], tokens: mx.array, level: Any, repeats: int, **exact: Any) -> float:
    """Median seconds of one synchronised forward of ``tokens``, fast (``level`` None) or in exact mode."""
    width = tokens.shape[1]
    times = []
    for i in range(repeats + 2):
        mx.synchronize()
        t0 = time.perf_counter()
        if level is None:
            out = model(tokens, cache=cache)
        else:
            with exact_mode(model, level, **exact):
                out = model(tokens, cache=cache)
        mx.eval(out)
        if i >= 2:
            times.append(time.perf_counter() - t0)
        for c in cache:
            c.trim(width)
    return statistics.median(times)


def verify_calls(model: Any, name: str, cfg: dict, calibration: Any, compiled: bool) -> list[dict]:
    rng = np.random.default_rng(3)
    vocab = vocab_size(model)
    cache = make_prompt_cache(model)
    model(mx.array(rng.integers(0, vocab, size=cfg["prompt_len"]).tolist())[None], cache=cache)
    mx.eval([c.state for c in cache])
    probe = mx.array(rng.integers(0, vocab, size=max(cfg["call_widths"])).tolist())[None]
    rows = []
    for w in cfg["call_widths"]:
        tokens, level = probe[:, :w], calibration.level_for(w)
        row: dict[str, Any] = {"shape": name, "width": w, "exact_level": level}
        row["fast_s"] = time_call(model, cache, tokens, None, cfg["call_repeats"])
        row["exact_s"] = time_call(model, cache, tokens, "auto", cfg["call_repeats"])
        line = f"  {w} rows: fast {1e3 * row['fast_s']:.1f} ms, exact {1e3 * row['exact_s']:.1f} ms ({level})"
        if w > 1:
            rows_per_call = ExactPlan.parse(level).linear
            chunk = rows_per_call if isinstance(rows_per_call, int) else 1
            row["attention_split_s"] = time_call(model, cache, tokens, "attention", cfg["call_repeats"])
            row["linear_chunks"] = chunk
            row["linear_split_s"] = time_call(model, cache, tokens, f"linear/{chunk}", cfg["call_repeats"])
            line += (
                f"; attention split alone {1e3 * row['attention_split_s']:.1f} ms, linear in chunks of {chunk} "
                f"alone {1e3 * row['linear_split_s']:.1f} ms"
            )
            if compiled:
                row["exact_compiled_s"] = time_call(model, cache, tokens, "auto", cfg["call_repeats"], compiled=True)
                line += f"; exact with compiled linear chunks {1e3 * row['exact_compiled_s']:.1f} ms"
        row["exact_over_fast"] = row["exact_s"] / row["fast_s"]
        rows.append(row)
        say(line + f" -> exact/fast {row['exact_over_fast']:.2f}")
    return rows


# -- the shapes -------------------------------------------------------------------------------------------


def mlx_lm_seconds_per_token(model: Any, prompt: list[int], tokens: int) -> float:
    with quiet():
        return seconds_per_token(token for token, _ in generate_step(mx.array(prompt), model, max_tokens=tokens))


def plain_run(model: Any, prompt: list[int], tokens: int, detail: bool = False) -> Any:
    """Seconds per token of specbench plain decoding; with ``detail``, a dict of it ("spt"), the run's speed
    ("state", ``speed_state``) and where its seconds went ("split", ``time_split``)."""
    gen = generate(model, prompt, GenerateOptions(max_tokens=tokens, ignore_eos=True))
    with quiet():
        spt = seconds_per_token(gen)
    if not detail:
        return spt
    records = gen.log.records
    split = time_split(records, spt * (len(gen.tokens) - 1))
    return {"spt": spt, "state": speed_state(records), "mean": mean_speed(records), "split": split}


def auto_run(model: Any, prompt: list[int], tokens: int, mode: str, drafter: OracleDrafter, profile: Any) -> dict:
    options = GenerateOptions(max_tokens=tokens, ignore_eos=True, verify=mode)
    if mode == "plain":  # the A/A cell: plain decoding timed as an Auto cell is
        return {
            **plain_run(model, prompt, tokens, detail=True),
            "tokens": None,
            "verifies": 0,
            "paused": 0,
            "pauses": 0,
            "extensions": 0,
            "shadows": 0,
            "ks": "",
        }
    gen = speculative_generate(model, prompt, options, drafter, DraftPolicy.auto(), profile=profile, progress=say)
    with quiet():
        spt = seconds_per_token(gen, lambda: drafter.follow_s)
    stats, policy = gen.stats(), gen.policy
    plain_steps = [r["verify_s"] for r in gen.log if r["kind"] == "plain"]
    return {
        "spt": spt,
        "state": speed_state(gen.log.records, stats["observe_s"]),
        "mean": mean_speed(gen.log.records, stats["observe_s"]),
        "split": time_split(gen.log.records, spt * (len(gen.tokens) - 1)),
        "verify_ms": verify_ms_by_width(gen.log.records),
        "plain_step_ms": 1e3 * statistics.median(plain_steps) if plain_steps else None,
        "tokens": list(gen.tokens),
        "verifies": stats["verifies"],
        "paused": stats["pauses"],
        "pauses": policy.pauses,
        "extensions": policy.extensions,
        "shadows": policy.evidence.shadows,
        "ks": " ".join(map(str, sorted({r["k_requested"] for r in gen.log if r["kind"] == "verify"}))),
    }


def step_summary(gen: Any) -> dict:
    """What one generation did, from its log: verifications, accepted drafts, paused tokens, and the seconds
    of its prefill, speculative steps (drafting, verifying, bookkeeping) and plain steps."""
    log = list(gen.log)
    observe_s = gen.stats()["observe_s"]
    verifies = [r for r in log if r["kind"] == "verify"]
    plain = [r for r in log if r["kind"] == "plain"]
    return {
        "verifies": len(verifies),
        "accepted": sum(r["accepted"] for r in verifies),
        "paused": sum(r["emitted"] for r in plain if r["paused"]),
        "prefill_ms": 1e3 * sum(r["verify_s"] for r in log if r["kind"] == "prefill"),
        "speculative_ms": 1e3 * sum(r["draft_s"] + r["verify_s"] + r["other_s"] for r in verifies),
        "plain_ms": 1e3 * sum(r["draft_s"] + r["verify_s"] for r in plain),
        "plain_steps": len(plain),
        "state_ms": speed_in_ms(speed_state(log, observe_s)),
        "mean_ms": speed_in_ms(mean_speed(log, observe_s)),
        "verify_ms": verify_ms_by_width(log),
    }


def shape_phase(name: str, cfg: dict, budget: Budget, out: dict, compiled: bool, checkpoint: Callable) -> None:
    if budget.left() < budget.setup[name] * 0.5 + 20 and not name.endswith("tiny"):
        budget.cut(f"{name}: not run ({budget.left():.0f} s left)")
        return
    started = time.perf_counter()
    stages = SetupStages()
    model = synthetic.build(name)
    stages.done("build")
    say(f"\n== {name}")
    calibration = calibrate(model, list(range(2, 10)), progress=lambda text: say(f"  {text}"))
    stages.done("calibration")
    profiles = {mode: profile_for(model, mode, progress=lambda text: say(f"  {text}")) for mode in ("exact", "fast")}
    for mode, p in profiles.items():
        say(f"  Auto's prior c(w) {mode}: " + " ".join(f"{w}:{p.c(w, mode):.2f}" for w in range(1, 10)))
    stages.done("profiles")
    out["verify_calls"] += verify_calls(model, name, cfg, calibration, compiled)
    stages.done("per-call timings")
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, vocab_size(model), size=cfg["prompt_len"]).tolist()
    drafter = OracleDrafter.from_model(model, prompt, cfg["tokens"], 1.0, keep_drafting=True)
    modes = cfg.get("modes", ["exact", "fast"])
    cells = [("plain", "a/a"), *((mode, a) for a in cfg["acceptances"] for mode in modes)]
    for mode in modes:  # warm-up: every width's kernels built before timing
        for a in (1.0, 0.3):
            drafter.acceptance = a
            auto_run(model, prompt, cfg["warmup_tokens"], mode, drafter, profiles[mode])
    mlx_lm_seconds_per_token(model, prompt, 16)
    stages.done("warm-up")
    if "affinity" not in out:
        out["affinity"] = steadier_affinity(lambda m=model: plain_run(m, prompt, cfg["warmup_tokens"]))
    plain_s = plain_run(model, prompt, cfg["warmup_tokens"])
    stages.done("affinity and plain speed")
    setup = time.perf_counter() - started
    out.setdefault("setup", {})[name] = stages.seconds
    say(f"  set-up by stage: {stages}")
    allot = budget.allot(name)
    # a repeat: mlx-lm, plain before and after every two cells, the cells (Auto ~0.8 plain runs on average)
    runs = 1 + 1.8 * len(cells)  # a repeat: mlx-lm, then per cell a plain run and an Auto run (~0.8 plain)
    tokens, repeats = size(allot, plain_s * 1.1, runs, cfg, "tokens")
    say(
        f"  set-up (calibration, profiles, calls, warm-up) {setup:.0f} s; plain {1e3 * plain_s:.1f} ms/token; "
        f"{allot:.0f} s for {repeats} repeats x {len(cells)} cells x {tokens} tokens"
    )
    if (tokens, repeats) != (cfg["tokens"], cfg["repeats"]):
        budget.cut(f"{name}: {repeats} repeats x {tokens} tokens instead of {cfg['repeats']} x {cfg['tokens']}")
    truth = drafter.recorded[:tokens]
    deadline = time.perf_counter() + allot * 1.15
    repeat_s = 0.0
    for repeat in range(repeats):
        if repeat >= cfg["min_repeats"] and time.perf_counter() > deadline or budget.left() < repeat_s + 10:
            budget.cut(f"{name}: repeat {repeat + 1} not run (time)")
            break
        repeat_started = time.perf_counter()
        mlx_lm = mlx_lm_seconds_per_token(model, prompt, tokens)
        previous = None
        for cell, (mode, a) in enumerate(cells):
            # each cell's Auto run is paired with a plain run next to it, the order alternating
            drafter.acceptance, drafter.seed = (1.0 if mode == "plain" else float(a)), 1000 * repeat + cell
            plain_first = (repeat + cell) % 2 == 0
            plain = plain_run(model, prompt, tokens, detail=True) if plain_first else None
            r = auto_run(model, prompt, tokens, mode, drafter, profiles.get(mode))
            plain = plain or plain_run(model, prompt, tokens, detail=True)
            base, base_state = plain["spt"], plain["state"]
            out["runs"].append(
                {
                    "model": name,
                    "what": "plain a/a" if mode == "plain" else f"{mode} a={a}",
                    "repeat": repeat,
                    "tokens": tokens,
                    "order": "plain first" if plain_first else "Auto first",
                    "plain_s_per_token": base,
                    "auto_s_per_token": r["spt"],
                    "mlx_lm_s_per_token": mlx_lm,
                    "vs_plain": base / r["spt"],
                    "plain_state_ms": 1e3 * base_state if base_state else None,
                    "auto_state_ms": 1e3 * r["state"] if r["state"] else None,
                    "plain_mean_ms": 1e3 * plain["mean"] if plain["mean"] else None,
                    "auto_mean_ms": 1e3 * r["mean"] if r["mean"] else None,
                    "plain_spread": spread([previous, base]) if previous else 0.0,
                    "equal_plain": r["tokens"] == truth if mode == "exact" else None,
                    "method": "plain" if mode == "plain" else "auto",
                    **{k: r[k] for k in ("verifies", "paused", "pauses", "extensions", "shadows", "ks")},
                    **{k: r.get(k) for k in ("verify_ms", "plain_step_ms")},
                    **{f"plain_{k}": v for k, v in plain["split"].items()},
                    **{f"auto_{k}": v for k, v in r["split"].items()},
                }
            )
            previous = base
        line = " ".join(
            f"{r['what']}:{r['vs_plain']:.2f}" for r in out["runs"] if r["model"] == name and r["repeat"] == repeat
        )
        say(f"  repeat {repeat + 1}/{repeats}: Auto/plain {line}")
        checkpoint()
        repeat_s = time.perf_counter() - repeat_started
    del model, drafter
    gc.collect()
    mx.clear_cache()


# -- the embedded model ---------------------------------------------------------------------------------


def trace_files(cfg: dict) -> list[Path]:
    """The traces of data/traces the embedded phase runs: those named in ``trace_names`` (every one when
    None), the first ``traces`` of them."""
    paths = sorted((ROOT / "data" / "traces").glob("*.jsonl"))
    if cfg.get("trace_names") is not None:
        paths = [p for p in paths if p.stem in cfg["trace_names"]]
    return paths[: cfg["traces"]]


def embedded_phase(cfg: dict, budget: Budget, out: dict, checkpoint: Callable) -> None:
    if budget.left() < 30:
        budget.cut(f"embedded model: not run ({budget.left():.0f} s left)")
        return
    from specbench import load
    from specbench.bench.trace_bench import bench_trace
    from specbench.drafters import make_drafter
    from specbench.inputs.importers import load_traces
    from specbench.inputs.prompts import bundled_questions, render_prompt

    started = time.perf_counter()
    model, tokenizer = load(cfg["embedded"])
    say(f"\n== {cfg['embedded']} (embedded model)")
    widest = max(DraftPolicy.auto().longest_draft(make_drafter(m)) for m in ("lookup", "suffix")) + 1
    calibrate(model, list(range(2, widest + 1)), progress=lambda text: say(f"  {text}"))
    profile = profile_for(model, "exact", progress=lambda text: say(f"  {text}"))
    say("  Auto's prior c(w) exact: " + " ".join(f"{w}:{profile.c(w, 'exact'):.2f}" for w in range(1, widest + 1)))
    questions = bundled_questions(cfg.get("categories"), cfg["per_category"])
    prompts = [(q.category, str(q.question_id), render_prompt(tokenizer, q.turns[0])) for q in questions]
    methods = ["plain", "lookup", "suffix", AA]  # AA: plain again, timed as the drafters are
    drafters: dict[tuple[str, int], Any] = {}

    def run(method: str, prompt: list[int], tokens: int, repeat: int) -> tuple[float, list[int], dict, dict]:
        """Seconds from the call to the last token (set-up, prompt pass and decoding), the tokens, what Auto
        did (verifications, paused tokens, seconds in speculative steps and in plain steps), and where the
        seconds went (``time_split``: set-up and the prompt pass fall outside the log)."""
        options = GenerateOptions(max_tokens=tokens)
        with quiet():
            t0 = time.perf_counter()
            if method in ("plain", AA):
                gen = generate(model, prompt, options, tokenizer=tokenizer)
            else:
                drafter = drafters.setdefault((method, repeat), make_drafter(method, model=model))
                gen = speculative_generate(
                    model, prompt, options, drafter, DraftPolicy.auto(), tokenizer, profile=profile
                )
            tokens_out = list(gen)
            seconds = time.perf_counter() - t0
        return seconds, tokens_out, step_summary(gen), time_split(gen.log.records, seconds)

    longest = max(prompts, key=lambda p: len(p[2]))[2]
    for method in methods[:3]:  # warm-up
        run(method, longest, cfg["embedded_tokens"], -1)
    plain_s = run("plain", prompts[0][2], cfg["embedded_tokens"], -1)[0] / cfg["embedded_tokens"]
    trace_paths = trace_files(cfg)
    say(f"  set-up {time.perf_counter() - started:.0f} s; plain ~{1e3 * plain_s:.1f} ms/token with prompt pass")
    allot = budget.allot("embedded")
    runs = len(methods) * len(prompts) + 3 * len(trace_paths) * cfg["trace_turns"]
    tokens, repeats = size(allot, plain_s * 1.15, runs, cfg, "embedded_tokens", "embedded_repeats")
    say(f"  {allot:.0f} s for {repeats} repeats x {len(prompts)} prompts, {len(trace_paths)} traces, {tokens} tokens")
    if (tokens, repeats) != (cfg["embedded_tokens"], cfg["embedded_repeats"]):
        budget.cut(
            f"embedded: {repeats} repeats x {tokens} tokens instead of {cfg['embedded_repeats']} x "
            f"{cfg['embedded_tokens']}"
        )
    deadline = time.perf_counter() + allot * 1.15
    for repeat in range(repeats):
        if repeat >= cfg["min_embedded_repeats"] and time.perf_counter() > deadline:
            budget.cut(f"embedded: repeat {repeat + 1} not run (time)")
            break
        for i, (category, qid, prompt) in enumerate(prompts):
            if budget.left() < 5:
                budget.cut(f"embedded: repeat {repeat + 1} stopped before prompt {i + 1} of {len(prompts)} (time)")
                break
            shift = (i + repeat) % len(methods)
            done = {m: run(m, prompt, tokens, repeat) for m in methods[shift:] + methods[:shift]}
            for method in methods[1:]:
                out["runs"].append(
                    {
                        "model": cfg["embedded"],
                        "what": f"category {category}",
                        "prompt": qid,
                        "method": AA if method == AA else f"{method}/auto",
                        "repeat": repeat,
                        "tokens": len(done[method][1]),
                        "plain_s": done["plain"][0],
                        "auto_s": done[method][0],
                        "vs_plain": done["plain"][0] / done[method][0],
                        "equal_plain": done[method][1] == done["plain"][1],
                        **done[method][2],
                        "plain_prefill_ms": done["plain"][2]["prefill_ms"],
                        "plain_steps_ms": done["plain"][2]["plain_ms"],
                        "plain_state_ms": done["plain"][2]["state_ms"],
                        "auto_state_ms": done[method][2]["state_ms"],
                        "plain_mean_ms": done["plain"][2]["mean_ms"],
                        "auto_mean_ms": done[method][2]["mean_ms"],
                        **{f"plain_{k}": v for k, v in done["plain"][3].items()},
                        **{f"auto_{k}": v for k, v in done[method][3].items()},
                    }
                )
        for path in trace_paths:
            if budget.left() < 5:
                budget.cut(f"embedded: repeat {repeat + 1} stopped before trace {path.stem} (time)")
                break
            for trace in load_traces(path):
                fresh = {m: make_drafter(m, model=model) for m in methods[1:3]}
                bench = bench_trace(
                    model, tokenizer, trace, fresh, DraftPolicy.auto(), tokens, turns=cfg["trace_turns"]
                )
                rows = {(r["turn"], r["method"]): r for r in bench.turns.to_dicts()}
                steps: dict[tuple[int, str], list[dict]] = {}
                for record in bench.steps.records:
                    steps.setdefault((record["turn"], record["method"]), []).append(record)

                state = {key: speed_in_ms(speed_state(steps[key], row["observe_s"])) for key, row in rows.items()}
                mean = {key: speed_in_ms(mean_speed(steps[key], row["observe_s"])) for key, row in rows.items()}
                split = {key: time_split(steps[key], row["decode_s"]) for key, row in rows.items()}

                for turn, method in sorted(key for key in rows if key[1] in methods[1:3]):
                    mine, plain = rows[turn, method], rows[turn, "plain"]
                    out["runs"].append(
                        {
                            "model": cfg["embedded"],
                            "what": f"trace {trace.id}",
                            "prompt": f"{trace.id}/{turn}",
                            "method": f"{method}/auto",
                            "repeat": repeat,
                            "tokens": mine["tokens"],
                            "plain_s": plain["decode_s"],
                            "auto_s": mine["decode_s"],
                            "vs_plain": plain["decode_s"] / mine["decode_s"] if mine["decode_s"] else 0.0,
                            "equal_plain": mine["identical"],
                            "verifies": mine["verifies"],
                            "accepted": mine["accepted"],
                            "verify_ms": verify_ms_by_width(steps[turn, method]),
                            "plain_state_ms": state[turn, "plain"],
                            "auto_state_ms": state[turn, method],
                            "plain_mean_ms": mean[turn, "plain"],
                            "auto_mean_ms": mean[turn, method],
                            **{f"plain_{k}": v for k, v in split[turn, "plain"].items()},
                            **{f"auto_{k}": v for k, v in split[turn, method].items()},
                        }
                    )
        mine = [r for r in out["runs"] if r["model"] == cfg["embedded"] and r["repeat"] == repeat]
        for method in methods[1:]:
            label = AA if method == AA else f"{method}/auto"
            rs = [r for r in mine if r["method"] == label and r["auto_s"] > 0]
            if not rs:
                continue
            ratio = sum(r["plain_s"] for r in rs) / sum(r["auto_s"] for r in rs)
            say(f"  repeat {repeat + 1}/{repeats}: {label} over plain, all prompts and traces: {ratio:.2f}x")
        checkpoint()


# -- summaries ------------------------------------------------------------------------------------------


def summarize(out: dict) -> None:
    """One row per cell: Auto / plain over every (plain, Auto) pair of runs with its 95 % bootstrap interval
    (resampling pairs) and verdict; the median over repeats and its range; plain's spread."""
    cells: dict[tuple[str, str, str], list[dict]] = {}
    for r in out["runs"]:
        if r.get("auto_s", 1.0) > 0:  # a trace whose turns did not run
            cells.setdefault((r["model"], r["what"], r["method"]), []).append(r)
    for (model, what, method), rows in cells.items():
        by_repeat: dict[int, list[dict]] = {}
        for r in rows:
            by_repeat.setdefault(r["repeat"], []).append(r)
        if "plain_s" in rows[0]:  # the embedded model: a category's or trace's seconds summed per repeat
            ratios = [sum(r["plain_s"] for r in rs) / sum(r["auto_s"] for r in rs) for rs in by_repeat.values()]
            plain_by_prompt: dict[str, list[float]] = {}
            for r in rows:
                plain_by_prompt.setdefault(r["prompt"], []).append(r["plain_s"])
            noise = statistics.median(spread(v) for v in plain_by_prompt.values())
        else:
            ratios = [statistics.mean(r["vs_plain"] for r in rs) for rs in by_repeat.values()]
            noise = statistics.median(r["plain_spread"] for r in rows)
        pairs = [seconds_pair(r) for r in rows]
        # a bootstrap of fewer pairs claims more than it knows: no interval then
        low, high, p = interval_and_p(pairs, seconds_ratio) if len(pairs) >= MIN_PAIRS else (0.0, float("inf"), 1.0)
        steps = in_plain_steps(rows)
        if len(steps) >= MIN_PAIRS:
            in_steps, (steps_low, steps_high, steps_p) = seconds_ratio(steps), interval_and_p(steps, seconds_ratio)
        else:
            in_steps, steps_low, steps_high, steps_p = None, 0.0, float("inf"), 1.0
        in_means = in_plain_steps(rows, "mean")
        if len(in_means) >= MIN_PAIRS:
            in_mean, (mean_low, mean_high, _) = seconds_ratio(in_means), interval_and_p(in_means, seconds_ratio)
        else:
            in_mean, mean_low, mean_high = None, 0.0, float("inf")
        equal = [r["equal_plain"] for r in rows if r["equal_plain"] is not None]
        row = {
            "model": model,
            "what": what,
            "method": method,
            "repeats": len(ratios),
            "pairs": len(pairs),
            "ratio": seconds_ratio(pairs),
            "low": low,
            "high": high,
            "auto_over_plain": statistics.median(ratios),
            "lowest": min(ratios),
            "highest": max(ratios),
            "plain_noise": noise,
            "in_steps": in_steps,
            "steps_low": steps_low,
            "steps_high": steps_high,
            "steps_pairs": len(steps),
            "steps_in_seconds": at_one_speed(rows),
            "in_mean_steps": in_mean,
            "mean_steps_low": mean_low,
            "mean_steps_high": mean_high,
            "p_loses": p,
            "steps_p_loses": steps_p,
            "equal_plain": all(equal) if equal else None,
        }
        if "ks" in rows[0]:
            row["ks"] = " | ".join(r["ks"] or "-" for r in rows)
            row["verifies"] = statistics.median(r["verifies"] for r in rows)
            row["paused"] = statistics.median(r["paused"] for r in rows)
            row["vs_mlx_lm"] = statistics.median(r["mlx_lm_s_per_token"] / r["auto_s_per_token"] for r in rows)
        (out["grid"] if "ks" in rows[0] else out["embedded"]).append(row)
    judge(out["grid"] + out["embedded"])


def judge(rows: list[dict]) -> None:
    """Each cell's verdicts, on seconds and in plain steps. A run judges many cells at once: "LOSES" needs
    the cell's p-value under 2.5 % after Holm's correction over the run's cells (A/A cells aside), so that
    a run of cells that all hold has under 2.5 % chance of showing any "LOSES"."""
    judged = [r for r in rows if r["method"] not in ("plain", AA)]
    for key, estimate in (("", "ratio"), ("steps_", "in_steps")):
        mine = [r for r in judged if r[estimate] is not None]
        for r, p_adjusted in zip(mine, holm([r[f"{key}p_loses"] for r in mine])):
            r[f"{key}p_loses_holm"] = p_adjusted
    for r in rows:
        if r["method"] in ("plain", AA):
            r["verdict"], r["verdict_in_steps"] = "a/a", None
            continue
        r["verdict"] = verdict(r["ratio"], r["low"], r["high"], r["p_loses_holm"])
        r["verdict_in_steps"] = (
            None
            if r["in_steps"] is None
            else verdict(r["in_steps"], r["steps_low"], r["steps_high"], r["steps_p_loses_holm"])
        )


def speed_in_ms(seconds: float | None) -> float:
    """A run's speed as a row keeps it: milliseconds, NaN where the run has none (``_ms`` reads it back)."""
    return 1e3 * seconds if seconds else float("nan")


def _ms(value: Any) -> float | None:
    """A speed in ms from a row (None, NaN or missing: None), in seconds."""
    return value / 1e3 if isinstance(value, (int, float)) and math.isfinite(value) and value > 0 else None


def p_below(pairs: list[tuple[float, float]]) -> float:
    """``paired.p_below`` against 0.97: the p-value of "Auto / plain is below 0.97"."""
    return paired.p_below(pairs, OK)


def interval_and_p(pairs: list[tuple[float, float]], statistic: Any) -> tuple[float, float, float]:
    """(low, high, p): ``statistic``'s 95 % expanded percentile bootstrap interval over ``pairs`` and ``p_below``."""
    low, high = bootstrap(pairs, statistic)
    return low, high, p_below(pairs)


def pooled_row(model: str, what: str, items: list, statistic: Any, ratio: Any) -> list[dict]:
    """The pooled row of ``items`` (none under 2): ``statistic`` with its 95 % bootstrap interval, and the
    lowest single ``ratio(item)``."""
    if len(items) < 2:
        return []
    low, high = bootstrap(items, statistic)
    return [
        {"model": model, "what": what, "n": len(items), "ratio": statistic(items)}
        | {"low": low, "high": high, "lowest": min(map(ratio, items))}
    ]


def pooled(out: dict) -> list[dict]:
    """Pooled over cells, with 95 % bootstrap intervals: per shape, the runs in which Auto fell back (paused
    for >= 90 % of the tokens), the runs in which it speculated, and the A/A runs (mean Auto / plain); for
    the embedded model, each method's seconds summed over every prompt and trace turn (plain / method,
    resampling prompts). A pooled interval is what a per-cell verdict of "inconclusive" lacks: power."""
    rows = []
    for model in dict.fromkeys(r["model"] for r in out["runs"]):
        runs = [r for r in out["runs"] if r["model"] == model]
        if "plain_s_per_token" in runs[0]:  # a shape
            a_a = [r for r in runs if r["method"] == "plain"]
            fell_back = [r for r in runs if r["method"] == "auto" and r["paused"] >= 0.9 * r["tokens"]]
            speculated = [r for r in runs if r["method"] == "auto" and r["paused"] < 0.9 * r["tokens"]]
            for what, group in (
                ("A/A (plain against plain)", a_a),
                ("Auto fell back", fell_back),
                ("Auto speculated", speculated),
            ):
                rows += pooled_row(model, what, [r["vs_plain"] for r in group], statistics.mean, float)
            for what, group in (("A/A, in plain steps", a_a), ("Auto fell back, in plain steps", fell_back)):
                rows += pooled_row(model, what, [p / a for p, a in in_plain_steps(group)], statistics.mean, float)
            for what, group in (("A/A, in mean steps", a_a), ("Auto fell back, in mean steps", fell_back)):
                pairs = in_plain_steps(group, "mean")
                rows += pooled_row(model, what, [p / a for p, a in pairs], statistics.mean, float)
            continue
        for method in dict.fromkeys(r["method"] for r in runs):
            mine = [r for r in runs if r["method"] == method and r["auto_s"] > 0]
            for what, pairs in (
                (f"{method}, every prompt and trace", [seconds_pair(r) for r in mine]),
                (f"{method}, in plain steps", in_plain_steps(mine)),
                (f"{method}, in mean steps", in_plain_steps(mine, "mean")),
            ):
                rows += pooled_row(model, what, pairs, seconds_ratio, lambda pair: pair[0] / pair[1])
    return rows


def cell_means(runs: list[dict], parts: Callable[[dict], dict[str, float] | None]) -> dict[tuple, dict[str, float]]:
    """Per cell (model, what, method), the mean over its pairs of ``parts(row)``, for the pairs that have it."""
    cells: dict[tuple[str, str, str], list[dict[str, float]]] = {}
    for row in runs:
        if (found := parts(row)) is not None:
            cells.setdefault((row["model"], row["what"], row["method"]), []).append(found)
    return {key: {part: statistics.mean(p[part] for p in rows) for part in rows[0]} for key, rows in cells.items()}


def where_excess_went(runs: list[dict]) -> dict[tuple[str, str, str], dict[str, float]]:
    """Per cell, ``excess_in_steps`` averaged over the pairs that have it."""
    return cell_means(runs, excess_in_steps)


def slow_counts(row: dict) -> dict[str, float] | None:
    """A pair's slow steady steps per run (``time_split``): Auto's, those of them near a decision, plain's;
    None when a run lacks them (runs saved before they were counted)."""
    counts = {"auto": row.get("auto_slow_n"), "near": row.get("auto_slow_near_n"), "plain": row.get("plain_slow_n")}
    return counts if all(isinstance(c, (int, float)) for c in counts.values()) else None


def merged(saved: list[dict]) -> dict:
    """Runs of several calls (``default_policy.json`` each) as one run to summarize: each call's repeats
    numbered after the calls before it, so that no two calls' repeats are taken for one."""
    out: dict = {"runs": [], "verify_calls": [], "grid": [], "embedded": [], "affinity": {}}
    for one in saved:
        offset = 1 + max((r["repeat"] for r in out["runs"]), default=-1)
        out["runs"] += [{**r, "repeat": r["repeat"] + offset} for r in one["runs"]]
        out["verify_calls"] += one["verify_calls"]
        out["affinity"] = out["affinity"] or one.get("affinity", {})
    return out


def report(out: dict, budget: Budget) -> None:
    say(
        "\n== Auto / specbench plain per cell: seconds ratio over every (plain, Auto) pair [95 % bootstrap interval]; "
        "the same in plain steps (each run's seconds over its own speed, see speed_state) [interval]; in mean "
        "steps (over its mean steady step, see mean_speed: not a criterion) [interval]; verdict against 0.97 on "
        "seconds (and on plain steps)"
    )
    say(f"   (timed runs {out.get('affinity', {}).get('chosen', 'free')}; an A/A row is plain against plain)")
    for row in out["grid"] + out["embedded"]:
        extra = (
            f"; vs mlx-lm {row['vs_mlx_lm']:.2f}x; verifies {row['verifies']:.0f}, paused {row['paused']:.0f} tokens"
            if "ks" in row
            else ""
        )
        same = "" if row["equal_plain"] is None else f"; equal to plain: {row['equal_plain']}"
        say(
            f"  {row['model']:20s} {row['what']:28s} {row['method']:12s} {row['ratio']:.2f}x "
            + (f"[{row['low']:.2f}-{row['high']:.2f}]" if row["pairs"] >= MIN_PAIRS else "[too few pairs]")
            + (
                f" in plain steps {row['in_steps']:.3f}x [{row['steps_low']:.3f}-{row['steps_high']:.3f}]"
                + (f" ({row['steps_in_seconds']} in seconds)" if row.get("steps_in_seconds") else "")
                if row["in_steps"] is not None
                else " in plain steps -"
            )
            + (
                f"; in mean steps {row['in_mean_steps']:.3f}x "
                f"[{row['mean_steps_low']:.3f}-{row['mean_steps_high']:.3f}]"
                if row.get("in_mean_steps") is not None
                else ""
            )
            + f" ({row['pairs']} pairs) {row['verdict']:12s}"
            + (f" (in plain steps: {row['verdict_in_steps']})" if row["verdict_in_steps"] else "")
            + f"{extra}{same}"
        )
    rows = out["grid"] + out["embedded"]
    if rows:
        rows = [r for r in rows if r["verdict"] != "a/a"]
        worst = min(rows, key=lambda r: r["ratio"])
        counts = {v: sum(r["verdict"] == v for r in rows) for v in ("holds", "ok", "inconclusive", "LOSES")}
        exact_equal = all(r["equal_plain"] is not False for r in rows)
        say(
            f"worst cell: {worst['ratio']:.2f}x ({worst['model']} {worst['what']} {worst['method']}, "
            f"{worst['verdict']}); verdicts of {len(rows)} cells: {counts}; "
            f"outputs equal to plain greedy on every checked run: {exact_equal}"
        )
    say("\n== in the loop: median seconds of a verify step by width (ms), against the per-call timings above")
    loop: dict[tuple[str, str], dict[int, list[float]]] = {}
    for r in out["runs"]:
        for item in (r.get("verify_ms") or "").split():
            w, ms = item.split(":")
            label = r["what"].split()[0]  # a shape's verify mode; the embedded model's method (exact verify)
            label = r["method"] if label in ("category", "trace") else label
            loop.setdefault((r["model"], label), {}).setdefault(int(w), []).append(float(ms))
    for (model, mode), widths in loop.items():
        cells = " ".join(f"{w}:{statistics.median(v):.1f}" for w, v in sorted(widths.items()))
        say(f"  {model:20s} {mode:12s} {cells}")
    excess = where_excess_went(out["runs"])
    if excess:
        parts = list(next(iter(excess.values())))
        say(
            "\n== where Auto's seconds beyond plain's went, plain steps per run (mean over pairs; see "
            "excess_in_steps): " + ", ".join(parts)
        )
        for (model, what, method), mean in excess.items():
            cells = " ".join(f"{mean[part]:+6.1f}" for part in parts)
            say(f"  {model:20s} {what:28s} {method:12s} {cells}  total {sum(mean.values()):+6.1f}")
    if slow := cell_means(out["runs"], slow_counts):
        say(
            f"\n== steady steps over {SLOW}x their run's median, per run (mean over pairs): Auto (of them at most "
            f"{NEAR} steps after a step that was not steady), plain"
        )
        for (model, what, method), mean in slow.items():
            counts = f"{mean['auto']:5.1f} ({mean['near']:4.1f})  plain {mean['plain']:5.1f}"
            say(f"  {model:20s} {what:28s} {method:12s} {counts}")
    say("\n== pooled over cells, Auto / plain: mean [95 % bootstrap interval] (n runs)")
    for row in out.get("pooled", []):
        say(
            f"  {row['model']:20s} {row['what']:40s} {row['ratio']:.3f} [{row['low']:.3f}-{row['high']:.3f}] "
            f"(n = {row['n']}; lowest run {row['lowest']:.2f})"
        )
    for call in out["verify_calls"]:
        if call["width"] == 9:
            say(
                f"{call['shape']} 9 rows: exact {1e3 * call['exact_s']:.1f} ms vs fast {1e3 * call['fast_s']:.1f} ms "
                f"({call['exact_over_fast']:.2f}x)"
                + (f", compiled {1e3 * call['exact_compiled_s']:.1f} ms" if "exact_compiled_s" in call else "")
            )
    for cut in budget.cuts:
        say(f"reduced: {cut}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="CPU: tiny shapes and the embedded model's miniature")
    parser.add_argument("--budget", type=float, default=480.0, help="seconds for the whole run (sizes shrink to fit)")
    parser.add_argument("--out", default=None, help="folder for the results (default $OUT, else reports/gpu)")
    parser.add_argument("--shapes", default=None, help="comma list of synthetic shapes")
    parser.add_argument("--no-embedded", action="store_true", help="leave out the embedded model")
    parser.add_argument("--compile", action="store_true", help="also time exact verify with compiled linear chunks")
    parser.add_argument("--categories", default=None, help="embedded model: comma list of bundled categories")
    parser.add_argument("--traces", default=None, help="embedded model: comma list of data/traces names ('' none)")
    parser.add_argument(
        "--embedded-tokens", type=int, default=None, help="embedded model: tokens per run (the budget cuts repeats)"
    )
    parser.add_argument(
        "--acceptances", default=None, help="shapes: comma list of the drafter's acceptances (default 0.3,...,1.0)"
    )
    parser.add_argument("--modes", default=None, help="shapes: verify modes, comma list of exact, fast (default both)")
    parser.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="most repeats per cell, shapes and embedded model (default 8 and 3; the budget cuts them)",
    )
    parser.add_argument(
        "--resummarize",
        nargs="+",
        default=None,
        help="folders of earlier runs: recompute their summaries, pooled over all of them (no model work); "
        "one folder gets its pooled.csv rewritten, several are summarized together (runs split by category, say)",
    )
    args = parser.parse_args()
    if args.resummarize:
        folders = [Path(f) for f in args.resummarize]
        if missing := [str(f) for f in folders if not (f / "default_policy.json").is_file()]:
            parser.error(f"no default_policy.json in {', '.join(missing)}: give folders this script wrote")
        out = merged([json.loads((folder / "default_policy.json").read_text()) for folder in folders])
        summarize(out)
        out["pooled"] = pooled(out)
        if len(folders) == 1:
            write_csv_atomic(folders[0] / "pooled.csv", out["pooled"])
        report(out, Budget(0.0, {**FULL, "shapes": []}, embedded=False))
        return 0
    cfg = dict(QUICK if args.quick else FULL)
    if args.shapes is not None:
        cfg["shapes"] = [s for s in args.shapes.split(",") if s]
    if args.categories is not None:
        cfg["categories"] = [c for c in args.categories.split(",") if c]
        unknown = sorted(set(cfg["categories"]) - set(BUNDLED_CATEGORIES))
        if unknown or not cfg["categories"]:
            parser.error(f"--categories: unknown {unknown or 'none given'}; bundled: {', '.join(BUNDLED_CATEGORIES)}")
    if args.traces is not None:
        cfg["trace_names"], cfg["traces"] = [t for t in args.traces.split(",") if t], None
        known = [p.stem for p in trace_files({"traces": None})]
        if unknown := sorted(set(cfg["trace_names"]) - set(known)):
            parser.error(f"--traces: unknown {unknown}; in data/traces: {', '.join(known)}")
    if args.acceptances is not None:
        try:
            cfg["acceptances"] = [float(a) for a in args.acceptances.split(",") if a]
        except ValueError:
            cfg["acceptances"] = []
        if not cfg["acceptances"] or not all(0.0 <= a <= 1.0 for a in cfg["acceptances"]):
            parser.error(f"--acceptances: give numbers in [0, 1] separated by commas, got {args.acceptances!r}")
    if args.modes is not None:
        cfg["modes"] = [m for m in args.modes.split(",") if m]
        if not cfg["modes"] or set(cfg["modes"]) - {"exact", "fast"}:
            parser.error(f"--modes: give exact, fast or both (comma list), got {args.modes!r}")
    if args.repeats is not None:
        if args.repeats < 2:
            parser.error(f"--repeats must be at least 2 (a cell's interval needs pairs), got {args.repeats}")
        for key in ("repeats", "embedded_repeats"):
            cfg[key] = args.repeats
            cfg["min_" + key] = min(cfg["min_" + key], args.repeats)
    if args.embedded_tokens is not None:
        if args.embedded_tokens < 2:
            parser.error(f"--embedded-tokens must be at least 2, got {args.embedded_tokens}")
        cfg["embedded_tokens"] = cfg["min_embedded_tokens"] = args.embedded_tokens
    if args.compile:  # compiling each width's linear chunks: about a minute more per shape on the H200
        cfg["setup_s"] = {k: v + (0.0 if k == "embedded" else 60.0) for k, v in cfg["setup_s"].items()}
    out_dir = Path(args.out or os.environ.get("OUT") or "reports/gpu")
    out_dir.mkdir(parents=True, exist_ok=True)
    budget = Budget(args.budget, cfg, embedded=not args.no_embedded)
    say(f"device {device_name()}  mlx {mx.__version__}  budget {args.budget:.0f} s  out {out_dir}")
    out: dict[str, list] = {"runs": [], "verify_calls": [], "grid": [], "embedded": []}

    def save() -> None:
        for name in ("runs", "verify_calls", "grid", "embedded", "pooled"):
            write_csv_atomic(out_dir / f"{name}.csv", out.get(name, []))
        info = {"device": device_name(), **versions(), "settings": cfg, "reduced": budget.cuts}
        write_json_atomic(out_dir / "default_policy.json", {**info, **out})

    def stop(signum: int, frame: Any) -> None:
        raise Interrupted(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, stop)  # `timeout` and schedulers stop a run so: summarize what finished
    try:
        for name in cfg["shapes"]:
            shape_phase(name, cfg, budget, out, args.compile, save)
        if not args.no_embedded:
            embedded_phase(cfg, budget, out, save)
    except (Interrupted, KeyboardInterrupt) as stopped:
        budget.cut(f"stopped by {stopped or 'SIGINT'}: the summaries cover the {len(out['runs'])} run pairs finished")
    summarize(out)
    out["pooled"] = pooled(out)
    save()
    report(out, budget)
    say(f"\ntotal {time.perf_counter() - budget.start:.1f} s; results in {out_dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
