"""Batched speculative decoding on synthetic shapes: c(w, B), break-even a*(k, B), the measured grid,
and throughput against mlx-lm's BatchGenerator.

    python3 scripts/gpu/batch.py             # H200: Qwen3-8B and Qwen3-30B-A3B shapes, 4-bit, B up to 32
    python3 scripts/gpu/batch.py --quick     # CPU: tiny float32 shapes, < 60 s

Per model, each phase written out as soon as it is done (an interrupted run keeps what it finished) and
skipped when it would not fit in --budget: the profile c(w, B) (fast verification; distinct experts per
[B, w] block for the MoE shape), the measured grid (OracleDrafter at controlled acceptance, fixed k,
speculative vs plain batched, against the profile's prediction), and one run of speculative vs plain
batched vs mlx-lm at each bench batch size (oracle drafters at --bench-acceptance).

Writes into $OUT (or --out, default reports/gpu-batch): batch_profiles.json, batch_costs.csv,
batch_break_even.csv, batch_experts.csv, batch_grid.csv, batch_bench.csv, batch_agreement.csv (first
divergence of each greedy output from single-request greedy and from mlx-lm), batch_break_even.png.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import mlx.core as mx
import numpy as np

from specbench.common.files import write_csv_atomic as write_csv
from specbench.common.files import write_json_atomic as write_json
from specbench.common.identity import device_name
from specbench.core.batch import BatchGeneration, generate_batch
from specbench.core.engine import generate
from specbench.core.forward import vocab_size
from specbench.core.options import GenerateOptions
from specbench.cost.batch import batch_speedup_grid, measure_batch_profile
from specbench.drafters.oracle import OracleDrafter
from specbench.experiments.batch_bench import agreement, bench_batch, format_batch_bench, mlx_lm_batch
from specbench.models import synthetic

FULL = {
    "models": ["qwen3-8b-4bit", "qwen3-30b-a3b-4bit"],
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
    "k_max": 7,
}
QUICK = {
    "models": ["qwen3-8b-tiny", "qwen3-30b-a3b-tiny"],
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
    "bench_batch_sizes": [2],
    "bench_tokens": 10,
    "k_max": 3,
}


class Run:
    def __init__(self, cfg: dict, out: Path, budget: float):
        self.cfg, self.out, self.budget = cfg, out, budget
        self.start = time.perf_counter()
        self.profiles: dict[str, dict] = {}
        self.costs: list[dict] = []
        self.break_even: list[dict] = []
        self.experts: list[dict] = []
        self.grid: list[dict] = []
        self.bench: list[dict] = []
        self.agreement: list[dict] = []
        self.skipped: list[str] = []

    def left(self) -> float:
        return self.budget - (time.perf_counter() - self.start)

    def fits(self, seconds: float, what: str) -> bool:
        if seconds <= self.left():
            return True
        self.skipped.append(f"{what} (needs ~{seconds:.0f} s, {self.left():.0f} s left)")
        print(f"skip {what}: needs ~{seconds:.0f} s, {self.left():.0f} s left", flush=True)
        return False

    def model(self, name: str, share: float) -> None:
        """Profile, grid and bench of one shape within ``share`` of the time left."""
        cfg = self.cfg
        until = time.perf_counter() + share
        t0 = time.perf_counter()
        model = synthetic.build(name)
        label = model.specbench_name
        print(f"\n== {label}: built in {time.perf_counter() - t0:.1f} s on {device_name()}", flush=True)
        profile = measure_batch_profile(
            model,
            cfg["batch_sizes"],
            cfg["widths"],
            offset=cfg["offset"],
            repeats=cfg["repeats"],
            warmup=cfg["warmup"],
            budget_s=max(5.0, 0.35 * (until - time.perf_counter())),
            progress=lambda s: print("  " + s, flush=True),
        )
        self.profiles[label] = profile.to_dict()
        self.costs += [{"model": label, **r} for r in profile.to_polars().to_dicts()]
        for b in profile.batch_sizes:
            a_star = profile.break_even_acceptance(b, k_max=min(cfg["k_max"], len(profile.costs[b]) - 1))
            self.break_even += [
                {"model": label, "batch_size": b, "k": k + 1, "a_star": float(a)} for k, a in enumerate(a_star)
            ]
            print(f"  a*(k, B={b}): " + " ".join(f"{a:.2f}" for a in a_star), flush=True)
        self.experts += [{"model": label, **r} for r in profile.experts]
        self.save()
        grid_sizes = [b for b in cfg["grid_batch_sizes"] if b <= max(profile.batch_sizes)]
        if self.fits(10.0, f"{label} grid"):
            self.grid += [
                {"model": label, **row}
                for row in batch_speedup_grid(
                    model,
                    profile,
                    grid_sizes,
                    cfg["acceptances"],
                    cfg["ks"],
                    prompt_len=cfg["prompt_len"],
                    max_tokens=cfg["max_tokens"],
                    budget_s=max(5.0, 0.6 * (until - time.perf_counter())),
                    progress=lambda r: print(
                        f"  grid B={r['batch_size']} a={r['acceptance']} k={r['k']}: measured {r['measured']:.2f}x "
                        f"predicted {r['predicted']:.2f}x (from log {r['predicted_from_log']:.2f}x, error "
                        f"{r['error_from_log']:+.0%}); latency {r['measured_latency']:.2f}x",
                        flush=True,
                    ),
                )
            ]
            self.save()
        rng = np.random.default_rng(7)
        if self.fits(15.0, f"{label} agreement"):
            self.agree(model, label, rng)
        for b in cfg["bench_batch_sizes"]:
            if time.perf_counter() > until or not self.fits(8.0, f"{label} bench B={b}"):
                self.skipped.append(f"{label} bench B={b}")
                continue
            prompts = rng.integers(0, vocab_size(model), size=(b, cfg["prompt_len"])).tolist()
            recorded = generate_batch(model, prompts, GenerateOptions(max_tokens=cfg["bench_tokens"])).run()

            def oracle(i: int, prompts=prompts, recorded=recorded, model=model):
                return OracleDrafter(
                    prompts[i], recorded[i], 0.8, vocab_size(model), seed=i, preferred_k=3, model=model
                )

            result = bench_batch(model, prompts, b, oracle, "fixed:3", max_tokens=cfg["bench_tokens"])
            print(format_batch_bench(result), flush=True)
            ratios = {k: v for k, v in result.items() if k != "rows"}
            self.bench += [{"model": label, "acceptance": 0.8, "k": 3, **row, **ratios} for row in result["rows"]]
            self.save()
        del model
        gc.collect()
        mx.clear_cache()

    def agree(self, model, label: str, rng) -> None:
        """Greedy outputs of one batch (B = 4, fast verification) against single-request greedy
        decoding: plain batched, speculative batched (oracle drafter, a = 0.8, k = 3), mlx-lm."""
        n, b = self.cfg["bench_tokens"], 4
        prompts = rng.integers(0, vocab_size(model), size=(b, self.cfg["prompt_len"])).tolist()
        single = [list(generate(model, p, GenerateOptions(max_tokens=n))) for p in prompts]
        plain = generate_batch(model, prompts, GenerateOptions(max_tokens=n)).run()
        drafters = [
            OracleDrafter(p, s, 0.8, vocab_size(model), seed=i, preferred_k=3, model=model)
            for i, (p, s) in enumerate(zip(prompts, single))
        ]
        spec = BatchGeneration(model, prompts, GenerateOptions(max_tokens=n), drafters, "fixed:3").run()
        reference = mlx_lm_batch(model, prompts, b, n)["outputs"]
        outputs = {"single": single, "plain-batched": plain, "speculative-batched": spec, "mlx-lm": reference}
        rows = agreement(outputs, "single") + [
            {**r, "engine": f"{r['engine']} vs mlx-lm"} for r in agreement(outputs, "mlx-lm") if r["engine"] != "single"
        ]
        self.agreement += [{"model": label, "batch_size": b, **r} for r in rows]
        equal = {
            name: sum(r["first_divergence"] is None for r in rows if r["engine"] == name)
            for name in dict.fromkeys(r["engine"] for r in rows)
        }
        print(f"  agreement (requests equal of {b}): {equal}", flush=True)
        self.save()

    def save(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        write_json(
            self.out / "batch_profiles.json",
            {"device": device_name(), "profiles": self.profiles, "skipped": self.skipped},
        )
        for name, rows in (
            ("batch_costs", self.costs),
            ("batch_break_even", self.break_even),
            ("batch_experts", self.experts),
            ("batch_grid", self.grid),
            ("batch_bench", self.bench),
            ("batch_agreement", self.agreement),
        ):
            if rows:
                write_csv(self.out / f"{name}.csv", rows)

    def figure(self) -> None:
        if not self.break_even:
            return
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        from specbench.common.files import write_figure_atomic

        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for label in self.profiles:
            rows = [r for r in self.break_even if r["model"] == label]
            for k in sorted({r["k"] for r in rows}):
                if k not in (1, 2, 4):
                    continue
                pts = sorted((r["batch_size"], r["a_star"]) for r in rows if r["k"] == k)
                axes[0].plot(*zip(*pts), marker="o", label=f"{label} k={k}")
            grid = [r for r in self.grid if r["model"] == label]
            for a in sorted({r["acceptance"] for r in grid}):
                pts = sorted(
                    (r["batch_size"], r["measured"], r["predicted"])
                    for r in grid
                    if r["acceptance"] == a and r["k"] == max(self.cfg["ks"])
                )
                if pts:
                    b, measured, predicted = zip(*pts)
                    line = axes[1].plot(b, predicted, label=f"{label} a={a} predicted")[0]
                    axes[1].scatter(b, measured, color=line.get_color(), label=f"{label} a={a} measured")
        axes[0].set(xscale="log", xlabel="batch size B", ylabel="break-even acceptance a*(k, B)")
        axes[1].set(xscale="log", xlabel="batch size B", ylabel=f"throughput speedup (k={max(self.cfg['ks'])})")
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
    args = parser.parse_args()
    cfg = QUICK if args.quick else FULL
    run = Run(cfg, Path(args.out), args.budget)
    for i, name in enumerate(cfg["models"]):
        run.model(name, run.left() / (len(cfg["models"]) - i))
    run.figure()
    run.save()
    print(
        f"\ndone in {time.perf_counter() - run.start:.0f} s; skipped: {run.skipped or 'nothing'}; results in {run.out}"
    )


if __name__ == "__main__":
    main()
