"""The default-policy benchmark's phases (``scripts.gpu.default_policy`` drives them): per synthetic shape and for
the embedded model, set-up first (calibration, profiles, per-call verify timings, warm-up, affinity), then paired
runs sized to the phase's share of the budget, each repeat saved as it finishes."""

from __future__ import annotations

import gc
import time
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from scripts.gpu import default_policy_runs
from scripts.gpu.budget import Budget
from scripts.gpu.verify_calls import verify_call_rows
from specbench import GenerateOptions, generate, load, speculative_generate
from specbench.bench.paired import seconds_ratio
from specbench.bench.trace_bench import bench_trace
from specbench.common.timing import steadier_affinity
from specbench.core.forward import vocab_size
from specbench.core.policies import DraftPolicy
from specbench.cost import profile_for
from specbench.drafters import make_drafter
from specbench.drafters.oracle import Oracle
from specbench.exact import calibrate
from specbench.inputs.importers import load_traces
from specbench.inputs.prompts import bundled_questions, render_prompt
from specbench.models import synthetic

ROOT = Path(__file__).resolve().parents[2]
AA = "plain (A/A)"


def say(text: str) -> None:
    print(text, flush=True)


def allot(budget: Budget, cfg: dict, phase: str) -> float:
    """Seconds for ``phase``'s timed runs: its share of what is left once later phases' set-up is kept back."""
    later = cfg["phases"][cfg["phases"].index(phase) + 1 :]
    share = cfg["shares"].get(phase, 0.3) / sum(cfg["shares"].get(p, 0.3) for p in [phase, *later])
    return budget.allot(share, sum(cfg["setup_s"].get(p, 30.0) for p in later) + 10.0)


def fitted_sizes(
    seconds: float, per_token_run_s: float, runs_per_repeat: float, tokens: tuple[int, int], repeats: tuple[int, int]
) -> tuple[int, int]:
    """(tokens per run, repeats) that fit ``seconds``, each run costing ``per_token_run_s`` per token and a repeat
    ``runs_per_repeat`` runs: the most tokens at the most repeats, then fewer tokens (down to the least of
    ``tokens`` = (most, least)), then fewer repeats (down to the least of ``repeats``); the least of both when
    nothing fits."""
    (most_tokens, least_tokens), (most_repeats, least_repeats) = tokens, repeats
    for count in range(most_repeats, least_repeats - 1, -1):
        fit = int(seconds / (per_token_run_s * runs_per_repeat * count))
        if fit >= least_tokens:
            return min(most_tokens, fit), count
    return least_tokens, least_repeats


def sizes(budget: Budget, cfg: dict, name: str, seconds: float, per_token_s: float, runs: float, key: str) -> tuple:
    """(tokens, repeats) of a phase within ``seconds``, the cut recorded (``key``: tokens or embedded_tokens)."""
    repeats_key = key.replace("tokens", "repeats")
    tokens, repeats = fitted_sizes(
        seconds, per_token_s, runs, (cfg[key], cfg["min_" + key]), (cfg[repeats_key], cfg["min_" + repeats_key])
    )
    if (tokens, repeats) != (cfg[key], cfg[repeats_key]):
        budget.cut(f"{name}: {repeats} repeats x {tokens} tokens instead of {cfg[repeats_key]} x {cfg[key]}")
    return tokens, repeats


def shape_phase(name: str, cfg: dict, budget: Budget, out: dict, compiled: bool, checkpoint: Any) -> None:
    if budget.left() < cfg["setup_s"].get(name, 30.0) * 0.5 + 20 and not name.endswith("tiny"):
        return budget.cut(f"{name}: not run ({budget.left():.0f} s left)")
    started, stages, last = time.perf_counter(), {}, [time.perf_counter()]

    def done(stage: str) -> None:  # set-up seconds by stage, each from the end of the one before
        stages[stage], last[0] = time.perf_counter() - last[0], time.perf_counter()

    model = synthetic.build(name)
    done("build")
    say(f"\n== {name}")
    calibration = calibrate(model, list(range(2, 10)), progress=lambda text: say(f"  {text}"))
    done("calibration")
    profiles = {mode: profile_for(model, mode, progress=lambda text: say(f"  {text}")) for mode in ("exact", "fast")}
    for mode, p in profiles.items():
        say(f"  Auto's prior c(w) {mode}: " + " ".join(f"{w}:{p.c(w, mode):.2f}" for w in range(1, 10)))
    done("profiles")
    args = (cfg["call_widths"], calibration.level_for, cfg["call_repeats"], cfg["prompt_len"], compiled, say)
    out["verify_calls"] += verify_call_rows(model, name, *args)
    done("per-call timings")
    prompt = np.random.default_rng(0).integers(0, vocab_size(model), size=cfg["prompt_len"]).tolist()
    drafter = Oracle.from_model(model, prompt, cfg["tokens"], 1.0, keep_drafting=True)
    modes = cfg.get("modes", ["exact", "fast"])
    cells = [("plain", "a/a"), *((mode, a) for a in cfg["acceptances"] for mode in modes)]
    for mode in modes:  # warm-up: every width's kernels built before timing
        for a in (1.0, 0.3):
            drafter.acceptance = a
            default_policy_runs.auto_run(model, prompt, cfg["warmup_tokens"], mode, drafter, profiles[mode], say)
    default_policy_runs.mlx_lm_seconds_per_token(model, prompt, 16)
    done("warm-up")
    if "affinity" not in out:
        probe = lambda m=model: default_policy_runs.plain_seconds(m, prompt, cfg["warmup_tokens"])  # noqa: E731
        out["affinity"] = steadier_affinity(probe, say=say).as_dict()
    plain_s = default_policy_runs.plain_seconds(model, prompt, cfg["warmup_tokens"])
    done("affinity and plain speed")
    out.setdefault("setup", {})[name] = stages
    say("  set-up by stage: " + ", ".join(f"{stage} {s:.0f} s" for stage, s in stages.items()))
    seconds = allot(budget, cfg, name)
    runs = 1 + 1.8 * len(cells)  # a repeat: mlx-lm, then per cell a plain run and an Auto run (~0.8 plain)
    tokens, repeats = sizes(budget, cfg, name, seconds, plain_s * 1.1, runs, "tokens")
    say(
        f"  set-up (calibration, profiles, calls, warm-up) {time.perf_counter() - started:.0f} s; plain "
        f"{1e3 * plain_s:.1f} ms/token; {seconds:.0f} s for {repeats} repeats x {len(cells)} cells x {tokens} tokens"
    )
    truth, deadline, repeat_s = drafter.recorded[:tokens], time.perf_counter() + seconds * 1.15, 0.0
    for repeat in range(repeats):
        if repeat >= cfg["min_repeats"] and time.perf_counter() > deadline or budget.left() < repeat_s + 10:
            budget.cut(f"{name}: repeat {repeat + 1} not run (time)")
            break
        repeat_started, mlx_lm = (
            time.perf_counter(),
            default_policy_runs.mlx_lm_seconds_per_token(model, prompt, tokens),
        )
        previous = None
        for cell, (mode, a) in enumerate(cells):
            # each cell's Auto run is paired with a plain run next to it, the order alternating
            drafter.acceptance, drafter.seed = (1.0 if mode == "plain" else float(a)), 1000 * repeat + cell
            plain_first = (repeat + cell) % 2 == 0
            plain = default_policy_runs.plain_run(model, prompt, tokens) if plain_first else None
            mine = default_policy_runs.auto_run(model, prompt, tokens, mode, drafter, profiles.get(mode), say)
            plain = plain or default_policy_runs.plain_run(model, prompt, tokens)
            what = "plain a/a" if mode == "plain" else f"{mode} a={a}"
            base = {"model": name, "what": what, "repeat": repeat, "tokens": tokens}
            base["order"] = "plain first" if plain_first else "Auto first"
            checked = {"equal_plain": mine.tokens == truth if mode == "exact" else None}
            checked["method"] = "plain" if mode == "plain" else "auto"
            out["runs"].append(default_policy_runs.shape_pair_row(base, plain, mine, mlx_lm, previous, checked))
            previous = plain.spt
        mine_now = [r for r in out["runs"] if r["model"] == name and r["repeat"] == repeat]
        say(
            f"  repeat {repeat + 1}/{repeats}: Auto/plain "
            + " ".join(f"{r['what']}:{r['vs_plain']:.2f}" for r in mine_now)
        )
        checkpoint()
        repeat_s = time.perf_counter() - repeat_started
    del model, drafter
    gc.collect()
    mx.clear_cache()


def trace_files(cfg: dict) -> list[Path]:
    """The traces of data/traces the embedded phase runs: those named (every one when None), the first few."""
    paths = sorted((ROOT / "data" / "traces").glob("*.jsonl"))
    if cfg.get("trace_names") is not None:
        paths = [p for p in paths if p.stem in cfg["trace_names"]]
    return paths[: cfg["traces"]]


def embedded_phase(cfg: dict, budget: Budget, out: dict, checkpoint: Any) -> None:
    if budget.left() < 30:
        return budget.cut(f"embedded model: not run ({budget.left():.0f} s left)")
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

    def run(method: str, prompt: list[int], tokens: int, repeat: int) -> default_policy_runs.CallRun:
        options = GenerateOptions(max_tokens=tokens)
        if method in ("plain", AA):
            return default_policy_runs.timed_call(lambda: generate(model, prompt, options, tokenizer=tokenizer))
        drafter = drafters.setdefault((method, repeat), make_drafter(method, model=model))
        auto = DraftPolicy.auto()
        return default_policy_runs.timed_call(
            lambda: speculative_generate(
                model, prompt, options, drafter=drafter, policy=auto, tokenizer=tokenizer, profile=profile
            )
        )

    longest = max(prompts, key=lambda p: len(p[2]))[2]
    for method in methods[:3]:  # warm-up
        run(method, longest, cfg["embedded_tokens"], -1)
    plain_s = run("plain", prompts[0][2], cfg["embedded_tokens"], -1).seconds / cfg["embedded_tokens"]
    trace_paths = trace_files(cfg)
    say(f"  set-up {time.perf_counter() - started:.0f} s; plain ~{1e3 * plain_s:.1f} ms/token with prompt pass")
    seconds = allot(budget, cfg, "embedded")
    runs = len(methods) * len(prompts) + 3 * len(trace_paths) * cfg["trace_turns"]
    tokens, repeats = sizes(budget, cfg, "embedded", seconds, plain_s * 1.15, runs, "embedded_tokens")
    say(f"  {seconds:.0f} s for {repeats} repeats x {len(prompts)} prompts, {len(trace_paths)} traces, {tokens} tokens")
    deadline = time.perf_counter() + seconds * 1.15
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
                base = {"model": cfg["embedded"], "what": f"category {category}", "prompt": qid}
                base |= {"method": AA if method == AA else f"{method}/auto", "repeat": repeat}
                out["runs"].append(default_policy_runs.call_pair_row(base, done["plain"], done[method]))
        for path in trace_paths:
            if budget.left() < 5:
                budget.cut(f"embedded: repeat {repeat + 1} stopped before trace {path.stem} (time)")
                break
            for trace in load_traces(path):
                fresh = {m: make_drafter(m, model=model) for m in methods[1:3]}
                auto = DraftPolicy.auto()
                bench = bench_trace(model, tokenizer, trace, fresh, auto, tokens, turns=cfg["trace_turns"])
                out["runs"] += default_policy_runs.trace_pair_rows(
                    cfg["embedded"], trace.id, repeat, bench, methods[1:3]
                )
        mine = [r for r in out["runs"] if r["model"] == cfg["embedded"] and r["repeat"] == repeat]
        for method in methods[1:]:
            label = AA if method == AA else f"{method}/auto"
            if rs := [r for r in mine if r["method"] == label and r["auto_s"] > 0]:
                ratio = seconds_ratio([(r["plain_s"], r["auto_s"]) for r in rs])
                say(f"  repeat {repeat + 1}/{repeats}: {label} over plain, all prompts and traces: {ratio:.2f}x")
        checkpoint()
