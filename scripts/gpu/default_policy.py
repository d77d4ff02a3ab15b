"""Does the default (Auto, exact greedy verification) ever lose? Auto vs fixed k vs plain vs mlx-lm, in one run.

    python3 scripts/gpu/default_policy.py             # H200: dense and MoE 4-bit shapes, embedded model; ~6 minutes
    python3 scripts/gpu/default_policy.py --quick     # CPU: tiny shapes, the embedded model's miniature (< 60 s)

1. Per synthetic shape (random weights, full depth): exact-mode calibration of widths 2..9 and Auto's quick
   cost profiles (exact, fast), all before anything is timed; then per-call seconds of one verify forward at
   1, 5, 7 and 9 rows: fast, exact (the calibrated level), and the two halves of the exact split alone
   (attention split; linear layers in chunks) to show which part costs what.
2. The grid: controlled-acceptance drafter (``OracleDrafter``) at a in --acceptances, fixed k in --ks and Auto,
   exact and fast verify, against specbench plain and mlx-lm plain decoding of the same prompt, back to back
   (each kernel warmed up first). Exact-mode outputs are checked against plain greedy on every run.
3. The embedded model (SmolLM2-135M): the bundled prompt categories (``specbench.experiments.prompts``,
   --limit questions each) and the traces in data/traces (first --trace-turns turns), Auto with prompt
   lookup and SuffixDecoding against specbench plain and mlx-lm.

Sizes shrink to fit --budget seconds (tokens per run, then cells; one repeat per cell): what was cut is
printed and kept in default_policy.json. Writes into $OUT (or --out, default reports/gpu): grid.csv,
verify_calls.csv, embedded.csv, default_policy.json.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import mlx.core as mx
import numpy as np
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import make_prompt_cache

from specbench import GenerateOptions, generate, speculative_generate
from specbench.common.files import write_csv_atomic, write_json_atomic
from specbench.common.identity import device_name, versions
from specbench.core.forward import vocab_size
from specbench.core.policies import DraftPolicy
from specbench.cost import profile_for
from specbench.cost.measure import seconds_per_token
from specbench.drafters.oracle import OracleDrafter
from specbench.exact import ExactPlan, calibrate, exact_mode
from specbench.models import synthetic

ROOT = Path(__file__).resolve().parents[2]
MODES = ("exact", "fast")
FULL = {
    "shapes": ["qwen3-8b-4bit", "qwen3-30b-a3b-4bit"],
    "acceptances": [0.3, 0.5, 0.7, 0.9, 1.0],
    "ks": [2, 4, 8],
    "max_tokens": 128,
    "min_tokens": 48,
    "prompt_len": 256,
    "call_widths": [1, 5, 7, 9],
    "call_repeats": 10,
    "embedded": "smollm2-135m",
    "limit": 1,
    "trace_turns": 2,
    "embedded_tokens": 128,
    "traces": None,  # all of data/traces
    "shape_share": 0.36,  # of the budget, per shape
}
QUICK = {
    "shapes": ["qwen3-8b-tiny", "qwen3-30b-a3b-tiny"],
    "acceptances": [0.5, 1.0],
    "ks": [2, 4],
    "max_tokens": 16,
    "min_tokens": 8,
    "prompt_len": 24,
    "call_widths": [1, 5, 9],
    "call_repeats": 2,
    "embedded": "tiny:smollm2-135m",
    "limit": 1,
    "trace_turns": 1,
    "embedded_tokens": 8,
    "traces": 2,
    "shape_share": 0.3,
}


def say(text: str) -> None:
    print(text, flush=True)


class Budget:
    def __init__(self, seconds: float):
        self.seconds, self.start, self.cuts = seconds, time.perf_counter(), []

    def left(self) -> float:
        return self.seconds - (time.perf_counter() - self.start)

    def cut(self, what: str) -> None:
        self.cuts.append(what)
        say(f"  reduced: {what}")


# -- per-call verify timings ---------------------------------------------------------------------------


def time_call(model: Any, cache: list[Any], tokens: mx.array, level: str | None, repeats: int) -> tuple[float, float]:
    """Median seconds of one forward of ``tokens`` (synchronised), fast (``level`` None) or in exact mode,
    and of building its graph on the host (before any of it runs: what ``mx.compile`` could save)."""
    width = tokens.shape[1]
    times, builds = [], []
    for i in range(repeats + 2):
        mx.synchronize()
        t0 = time.perf_counter()
        if level is None:
            out = model(tokens, cache=cache)
        else:
            with exact_mode(model, level):
                out = model(tokens, cache=cache)
        built = time.perf_counter()
        mx.eval(out)
        if i >= 2:
            times.append(time.perf_counter() - t0)
            builds.append(built - t0)
        for c in cache:
            c.trim(width)
    return statistics.median(times), statistics.median(builds)


def verify_calls(model: Any, name: str, cfg: dict, calibration: Any) -> list[dict]:
    rng = np.random.default_rng(3)
    vocab = vocab_size(model)
    cache = make_prompt_cache(model)
    model(mx.array(rng.integers(0, vocab, size=cfg["prompt_len"]).tolist())[None], cache=cache)
    mx.eval([c.state for c in cache])
    probe = mx.array(rng.integers(0, vocab, size=max(cfg["call_widths"])).tolist())[None]
    rows = []
    for w in cfg["call_widths"]:
        tokens = probe[:, :w]
        level = calibration.level_for(w)
        row = {"shape": name, "width": w, "exact_level": level}
        row["fast_s"], row["fast_build_s"] = time_call(model, cache, tokens, None, cfg["call_repeats"])
        row["exact_s"], row["exact_build_s"] = time_call(model, cache, tokens, "auto", cfg["call_repeats"])
        if w > 1:
            rows_per_call = ExactPlan.parse(level).linear
            chunk = rows_per_call if isinstance(rows_per_call, int) else 1
            row["attention_split_s"] = time_call(model, cache, tokens, "attention", cfg["call_repeats"])[0]
            row["linear_chunks"] = chunk
            row["linear_split_s"] = time_call(model, cache, tokens, f"linear/{chunk}", cfg["call_repeats"])[0]
        row["exact_over_fast"] = row["exact_s"] / row["fast_s"]
        rows.append(row)
        say(
            f"  {w} rows: fast {1e3 * row['fast_s']:.1f} ms (graph built in {1e3 * row['fast_build_s']:.1f}), "
            f"exact {1e3 * row['exact_s']:.1f} ms (built in {1e3 * row['exact_build_s']:.1f}; "
            f"{row['exact_over_fast']:.2f}x fast, {level})"
            + (
                f"; attention split alone {1e3 * row['attention_split_s']:.1f} ms, linear in chunks of "
                f"{row['linear_chunks']} alone {1e3 * row['linear_split_s']:.1f} ms"
                if w > 1
                else ""
            )
        )
    return rows


# -- the grid -------------------------------------------------------------------------------------------


def mlx_lm_seconds_per_token(model: Any, prompt: list[int], tokens: int) -> float:
    return seconds_per_token(token for token, _ in generate_step(mx.array(prompt), model, max_tokens=tokens))


def grid(model: Any, name: str, cfg: dict, budget: Budget, allot: float, profiles: dict) -> list[dict]:
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, vocab_size(model), size=cfg["prompt_len"]).tolist()
    started = time.perf_counter()
    plain_s = seconds_per_token(generate(model, prompt, GenerateOptions(max_tokens=16, ignore_eos=True)))
    policies: list[Any] = [*cfg["ks"], "auto"]
    cells = 2 * len(cfg["acceptances"]) * len(policies)
    # a run costs ~1.6 plain runs on average over the grid (exact k = 8 at low a: up to 6), plus two plain runs a row
    per_token = plain_s * (1.6 * cells + 2 * 2 * len(cfg["acceptances"])) + 1e-9
    tokens = int(min(cfg["max_tokens"], max(cfg["min_tokens"], 0.8 * allot / per_token)))
    if tokens < cfg["max_tokens"]:
        budget.cut(f"{name}: {tokens} tokens per run instead of {cfg['max_tokens']}")
    say(f"  plain step ~{1e3 * plain_s:.1f} ms; {cells} cells x {tokens} tokens, one repeat each")
    rows: list[dict] = []
    drafter = OracleDrafter.from_model(model, prompt, tokens, 1.0, follow=True)
    plain_tokens = list(drafter.recorded)

    def run(policy: Any, mode: str) -> Any:
        chosen = DraftPolicy.auto() if policy == "auto" else DraftPolicy.fixed(policy)
        options = GenerateOptions(max_tokens=tokens, ignore_eos=True, verify=mode)
        return speculative_generate(model, prompt, options, drafter, chosen, profile=profiles[mode], progress=say)

    for mode in MODES:  # warm-up: every width's kernels built before timing
        for policy in policies:
            drafter.acceptance = 1.0
            list(run(policy, mode))
    # the most telling acceptances first, in case time runs out
    for a in sorted(cfg["acceptances"], key=lambda a: (a != 1.0, a != min(cfg["acceptances"]), a)):
        if budget.left() < 20 or time.perf_counter() - started > allot:
            budget.cut(f"{name}: a = {a} not run (time)")
            continue
        for mode in MODES:
            base = seconds_per_token(generate(model, prompt, GenerateOptions(max_tokens=tokens, ignore_eos=True)))
            mlx_lm = mlx_lm_seconds_per_token(model, prompt, tokens)
            for cell, policy in enumerate(policies):
                drafter.acceptance, drafter.seed = float(a), cell
                gen = run(policy, mode)
                spec = seconds_per_token(gen, lambda: drafter.follow_s)
                stats = gen.stats()
                ks = sorted({r["k_requested"] for r in gen.log if r["kind"] == "verify"})
                rows.append(
                    {
                        "shape": name,
                        "mode": mode,
                        "a": a,
                        "policy": f"fixed:{policy}" if policy != "auto" else "auto",
                        "tokens": len(gen.tokens),
                        "spec_s_per_token": spec,
                        "plain_s_per_token": base,
                        "mlx_lm_s_per_token": mlx_lm,
                        "vs_plain": base / spec,
                        "vs_mlx_lm": mlx_lm / spec,
                        "verifies": stats["verifies"],
                        "pauses": stats["pauses"],
                        "ks": " ".join(map(str, ks)),
                        "equal_plain": list(gen.tokens) == plain_tokens,
                        "follows": drafter.follows,
                    }
                )
            line = " ".join(f"{r['policy']}:{r['vs_plain']:.2f}" for r in rows[-len(policies) :])
            same = all(r["equal_plain"] for r in rows[-len(policies) :])
            say(
                f"  {mode} a={a:.1f}: speedup over specbench plain {line}; specbench plain runs at "
                f"{mlx_lm / base:.2f}x mlx-lm's speed; exact outputs equal plain: {same}"
            )
    return rows


def shape_phase(name: str, cfg: dict, budget: Budget, out: dict) -> None:
    allot = min(cfg["shape_share"] * budget.seconds, budget.left() - 10)
    if allot < 30 and not name.endswith("tiny"):
        budget.cut(f"{name}: not run ({budget.left():.0f} s left)")
        return
    started = time.perf_counter()
    model = synthetic.build(name)
    say(f"\n== {name}: built in {time.perf_counter() - started:.1f} s")
    t0 = time.perf_counter()
    calibration = calibrate(model, list(range(2, 10)), progress=lambda text: say(f"  {text}"))
    say(f"  calibrated widths 2..9 in {time.perf_counter() - t0:.1f} s")
    profiles = {mode: profile_for(model, mode, progress=lambda text: say(f"  {text}")) for mode in ("exact", "fast")}
    for mode, p in profiles.items():
        say(f"  Auto's prior c(w) {mode}: " + " ".join(f"{w}:{p.c(w, mode):.2f}" for w in range(1, 10)))
    out["verify_calls"] += verify_calls(model, name, cfg, calibration)
    out["grid"] += grid(model, name, cfg, budget, allot - (time.perf_counter() - started), profiles)
    del model
    gc.collect()
    mx.clear_cache()


# -- the embedded model ---------------------------------------------------------------------------------


def embedded_phase(cfg: dict, budget: Budget, out_dir: Path, out: dict) -> None:
    if budget.left() < 40:
        budget.cut(f"embedded model: not run ({budget.left():.0f} s left)")
        return
    from specbench import load
    from specbench.experiments.prompt_bench import bench_prompts
    from specbench.experiments.prompt_summary import throughput_ratio
    from specbench.experiments.prompts import bundled_questions
    from specbench.experiments.trace_bench import run_trace

    model, tokenizer = load(cfg["embedded"])
    say(f"\n== {cfg['embedded']} (embedded model)")
    questions = bundled_questions(None, cfg["limit"])
    result = bench_prompts(
        model,
        tokenizer,
        questions,
        drafters=("lookup", "suffix"),
        policies=[DraftPolicy.auto()],
        max_tokens=cfg["embedded_tokens"],
        model_name=cfg["embedded"],
        time_budget_s=max(10.0, 0.55 * (budget.left() - 15)),
        progress=lambda text: say(f"  {text}"),
    )
    runs = result.runs
    for category in sorted({r["category"] for r in runs}) + ["all"]:
        rows = [r for r in runs if category in ("all", r["category"])]
        base = [r for r in rows if r["method"] == "specbench"]
        mlx_lm = [r for r in rows if r["method"] == "mlx-lm"]
        for method in sorted({r["method"] for r in rows} - {"specbench", "mlx-lm"}):
            mine = [r for r in rows if r["method"] == method]
            out["embedded"].append(
                {
                    "what": f"category {category}",
                    "method": method,
                    "vs_plain": throughput_ratio(base, mine),
                    "vs_mlx_lm": throughput_ratio(mlx_lm, mine),
                    "equal": all(r["equal"] for r in mine),
                }
            )
    for path in sorted((ROOT / "data" / "traces").glob("*.jsonl"))[: cfg["traces"]]:
        if budget.left() < 15:
            budget.cut(f"traces from {path.name} on: not run (time)")
            break
        run = run_trace(
            model,
            tokenizer,
            path,
            drafters=("lookup", "suffix"),
            policies=[DraftPolicy.auto()],
            max_tokens=cfg["embedded_tokens"],
            turns=cfg["trace_turns"],
            progress=False,
        )
        for r in run.summary.to_dicts():
            if r["method"] != "plain":
                out["embedded"].append(
                    {
                        "what": f"trace {r['trace']}",
                        "method": r["method"],
                        "vs_plain": r["speedup"],
                        "vs_mlx_lm": None,
                        "equal": bool(run.identical),
                    }
                )
    for r in out["embedded"]:
        versus = f", vs mlx-lm {r['vs_mlx_lm']:.2f}x" if r["vs_mlx_lm"] is not None else ""
        say(f"  {r['what']:28s} {r['method']:18s} vs plain {r['vs_plain']:.2f}x{versus}  equal {r['equal']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="CPU: tiny shapes and the embedded model's miniature")
    parser.add_argument("--budget", type=float, default=360.0, help="seconds for the whole run (sizes shrink to fit)")
    parser.add_argument("--out", default=None, help="folder for the results (default $OUT, else reports/gpu)")
    parser.add_argument("--shapes", default=None, help="comma list of synthetic shapes")
    parser.add_argument("--no-embedded", action="store_true", help="leave out the embedded model")
    args = parser.parse_args()
    cfg = dict(QUICK if args.quick else FULL)
    if args.shapes is not None:
        cfg["shapes"] = [s for s in args.shapes.split(",") if s]
    out_dir = Path(args.out or os.environ.get("OUT") or "reports/gpu")
    out_dir.mkdir(parents=True, exist_ok=True)
    budget = Budget(args.budget)
    say(f"device {device_name()}  mlx {mx.__version__}  budget {args.budget:.0f} s  out {out_dir}")
    out: dict[str, list] = {"grid": [], "verify_calls": [], "embedded": []}

    def save() -> None:
        write_csv_atomic(out_dir / "grid.csv", out["grid"])
        write_csv_atomic(out_dir / "verify_calls.csv", out["verify_calls"])
        write_csv_atomic(out_dir / "embedded.csv", out["embedded"])
        settings = {k: v for k, v in cfg.items()}
        info = {"device": device_name(), **versions(), "settings": settings, "reduced": budget.cuts}
        write_json_atomic(out_dir / "default_policy.json", {**info, **out})

    for name in cfg["shapes"]:
        shape_phase(name, cfg, budget, out)
        save()
    if not args.no_embedded:
        embedded_phase(cfg, budget, out_dir, out)
        save()
    summarize(out, budget)
    say(f"\ntotal {time.perf_counter() - budget.start:.1f} s; results in {out_dir}")
    return 0


def summarize(out: dict, budget: Budget) -> None:
    grid_rows = out["grid"]
    if grid_rows:
        say("\n== Auto vs plain (and the best fixed k) per cell")
        for shape in dict.fromkeys(r["shape"] for r in grid_rows):
            for mode in ("exact", "fast"):
                for a in dict.fromkeys(r["a"] for r in grid_rows):
                    cell = [r for r in grid_rows if (r["shape"], r["mode"], r["a"]) == (shape, mode, a)]
                    auto = next((r for r in cell if r["policy"] == "auto"), None)
                    if auto is None:
                        continue
                    best = max((r for r in cell if r["policy"] != "auto"), key=lambda r: r["vs_plain"])
                    say(
                        f"  {shape:22s} {mode:5s} a={a:.1f}: auto {auto['vs_plain']:.2f}x plain "
                        f"({auto['vs_mlx_lm']:.2f}x mlx-lm; ks {auto['ks'] or '-'}, {auto['pauses']} paused), "
                        f"best fixed {best['policy']} {best['vs_plain']:.2f}x"
                    )
        autos = [r for r in grid_rows if r["policy"] == "auto"]
        worst = min(autos, key=lambda r: r["vs_plain"])
        exact_equal = all(r["equal_plain"] for r in grid_rows if r["mode"] == "exact")
        say(
            f"Auto's worst cell: {worst['vs_plain']:.2f}x plain ({worst['shape']} {worst['mode']} a={worst['a']}); "
            f"exact mode equal to plain greedy on every run: {exact_equal}"
        )
        for shape in dict.fromkeys(r["shape"] for r in grid_rows):
            pick = {
                m: next(
                    (
                        r
                        for r in grid_rows
                        if (r["shape"], r["mode"], r["a"], r["policy"]) == (shape, m, 1.0, "fixed:8")
                    ),
                    None,
                )
                for m in ("exact", "fast")
            }
            if all(pick.values()):
                say(
                    f"{shape} k=8 a=1.0: exact {pick['exact']['vs_plain']:.2f}x, fast {pick['fast']['vs_plain']:.2f}x "
                    f"(exact/fast {pick['exact']['vs_plain'] / pick['fast']['vs_plain']:.2f})"
                )
    if out["embedded"]:
        autos = [r for r in out["embedded"] if r["vs_plain"] is not None]
        worst = min(autos, key=lambda r: r["vs_plain"])
        say(f"embedded model: worst Auto {worst['vs_plain']:.2f}x plain ({worst['what']}, {worst['method']})")
    for cut in budget.cuts:
        say(f"reduced: {cut}")


if __name__ == "__main__":
    raise SystemExit(main())
