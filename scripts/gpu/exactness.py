"""Exact verification on the device: speculative greedy output == plain greedy, and what it costs.

    python3 -m scripts.gpu.exactness           # H200, about 6 minutes (--budget 360)
    python3 -m scripts.gpu.exactness --quick   # CPU smoke run: tiny float32 models, well under a minute

Models, in this order (a model is skipped when the budget is spent): random-weight Qwen3-8B
(bfloat16) and Qwen3-30B-A3B (4-bit) shapes at --layers depth with the full workload (20
prompts x 128 tokens), the embedded SmolLM2-135M, then the Qwen3-8B 4-bit and Qwen3-30B-A3B
bfloat16 shapes with fewer prompts; then, if time is left, the full-depth Qwen3-8B shape in
4-bit for costs. Per model:

1. calibration: for widths 2..16, which exact levels are bit-identical to serial steps (at a
   short cache and across the KV buffer's 256-row step), and the cheapest
   (specbench.exact.calibrate);
2. exactness: P prompts x T tokens, mlx-lm's plain greedy decoding (``exactness.mlx_lm_greedy``) against
   speculative greedy (``verify="exact"`` and ``"fast"``) with an oracle drafter that
   proposes the plain continuation with random corruptions (drafts partly accepted), draft
   lengths cycling through --ks; prompts equal / total and first divergence positions;
3. end-to-end (primary models, first --e2e-prompts prompts): wall time of plain, exact and
   fast (fast drafting from its own output, so its acceptance is not cut by its divergences);
   "cold" is the first run of a prompt, "warm" an identical second run (on CUDA a verify of
   w > 1 queries builds a cuDNN attention graph per key length the first time it sees it,
   which dominates cold fast-mode times); and a replay of the exact run's steps at each
   mode's measured verify costs;
4. verify cost: width 1..16 forwards per level at a cache offset of --offset tokens, median of
   --repeats after warm-up, relative to a width-1 forward.

--ops also runs the op probe (which row-wise ops are row-invariant; specbench.exact.probe_ops;
slow on CUDA, where each new shape compiles kernels). specbench runs with
MLX_CUDA_USE_CUDNN_SDPA=0 unless it is set; --cudnn-sdpa sets it to 1 for the whole run (reference
included), to count what cuDNN's layout-dependent decoding attention does. Writes into $OUT (default
reports/gpu): ops.csv, calibration.csv, exactness.csv, e2e.csv, cost.csv, summary.json,
exactness.png; prints compact tables.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

if __name__ == "__main__" and "--cudnn-sdpa" in sys.argv:
    os.environ["MLX_CUDA_USE_CUDNN_SDPA"] = "1"  # read by MLX when it first dispatches attention

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import make_prompt_cache

from specbench.checks import exactness
from specbench.common.files import write_csv_atomic as write_csv
from specbench.common.files import write_figure_atomic
from specbench.common.files import write_json_atomic as write_json
from specbench.common.identity import device_name
from specbench.core.forward import vocab_size
from specbench.exact import calibrate, exact_mode, probe_ops
from specbench.models import synthetic

FULL = {
    "models": ["qwen3-8b-bf16", "qwen3-30b-a3b-4bit", "smollm2-135m", "qwen3-8b-4bit", "qwen3-30b-a3b-bf16"],
    "full_depth": ["qwen3-8b-4bit"],
    "layers": 4,
    "prompts": 20,
    "tokens": 128,
    "ks": [2, 4, 7, 15],
    "acceptance": 0.8,
    # Fewer prompts for the models after the primary dense and MoE ones; e2e and cost for the primaries.
    "secondary_prompts": {"smollm2-135m": 8, "qwen3-8b-4bit": 6, "qwen3-30b-a3b-bf16": 6},
    "primary": ["qwen3-8b-bf16", "qwen3-30b-a3b-4bit"],
    "e2e_prompts": 4,
    "widths": 16,
    "offset": 512,
    "repeats": 5,
    "warmup": 1,
    "calibration_repeats": 2,
    "cost_widths": [1, 2, 3, 4, 6, 8, 12, 16],
    "full_depth_prompts": 4,
    "full_depth_widths": [1, 2, 3, 4, 6, 8, 12, 16],
    "full_depth_repeats": 3,
    "probe_dtypes": ["bfloat16"],
    "probe_widths": [2, 8],
    # Seconds a model is expected to take at least: it is skipped when fewer are left in the budget.
    "model_need_s": 30,
    "full_depth_need_s": 90,
}
QUICK = {
    "models": ["qwen3-8b-tiny", "qwen3-30b-a3b-tiny", "smollm2-135m"],
    "full_depth": [],
    "layers": None,
    "prompts": 3,
    "tokens": 16,
    "ks": [1, 3],
    "acceptance": 0.8,
    "secondary_prompts": {},
    "primary": ["qwen3-8b-tiny", "qwen3-30b-a3b-tiny"],
    "e2e_prompts": 2,
    "widths": 4,
    "offset": 32,
    "repeats": 2,
    "warmup": 1,
    "calibration_repeats": 1,
    "cost_widths": [1, 2, 3, 4],
    "full_depth_prompts": 1,
    "full_depth_widths": [1, 2],
    "full_depth_repeats": 1,
    "probe_dtypes": ["float32"],
    "probe_widths": [2, 4],
    "model_need_s": 0,
    "full_depth_need_s": 0,
}
#: The embedded model runs a smaller workload in --quick (it decodes at a few tokens/s on the CPU).
QUICK_EMBEDDED = {"prompts": 1, "tokens": 6, "ks": [3], "widths": 4, "cost_widths": [1, 2]}


def table(rows: list[dict], keys: list[str]) -> None:
    if not rows:
        return
    width = {k: max(len(k), *(len(_fmt(r.get(k))) for r in rows)) for k in keys}
    print("  ".join(k.ljust(width[k]) for k in keys))
    for r in rows:
        print("  ".join(_fmt(r.get(k)).ljust(width[k]) for k in keys))
    print(flush=True)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
    return "" if v is None else str(v)


# -- models and prompts ----------------------------------------------------------------------


def load_model(name: str, layers: int | None, quick: bool) -> tuple[Any, list[list[int]] | None, str]:
    """(model, prompts or None for random ones, dtype label)."""
    if name == "smollm2-135m":
        from specbench.inputs.prompts import PROMPTS_DIR, render_prompt
        from specbench.models import load as models

        model, tokenizer = models.load(name)
        texts = []
        for path in sorted(PROMPTS_DIR.glob("*.jsonl")):
            texts += [json.loads(line)["turns"][0] for line in path.read_text().splitlines() if line.strip()]
        prompts = [render_prompt(tokenizer, t) for t in texts]
        return model, prompts, dtype_label(model)
    model = synthetic.build(name, layers=None if "tiny" in name else layers)
    return model, None, dtype_label(model)


def dtype_label(model) -> str:
    from mlx.utils import tree_flatten

    bits = {m.bits for _, m in model.named_modules() if hasattr(m, "bits") and hasattr(m, "group_size")}
    floats = {
        str(v.dtype).split(".")[-1] for _, v in tree_flatten(model.parameters()) if mx.issubdtype(v.dtype, mx.floating)
    }
    label = "/".join(sorted(floats))
    return f"{'/'.join(f'{b}bit' for b in sorted(bits))}+{label}" if bits else label


# -- generation ------------------------------------------------------------------------------


def plain_greedy(model, prompt: list[int], n: int) -> tuple[list[int], float]:
    """mlx-lm's own greedy decoding (the reference), and its wall time."""
    t0 = time.perf_counter()
    out = exactness.mlx_lm_greedy(model, prompt, n)
    return out, time.perf_counter() - t0


def speculative(
    model, prompt: list[int], continuation: list[int], n: int, k: int, verify: str, acceptance: float, seed: int
):
    t0 = time.perf_counter()
    generation = exactness.oracle_generation(model, prompt, continuation, n, k, verify, acceptance, seed=seed)
    tokens = list(generation)
    return tokens, time.perf_counter() - t0, generation.log


# -- verify cost -----------------------------------------------------------------------------


def measure_costs(model, levels: list[str], widths: list[int], offset: int, repeats: int, warmup: int) -> dict:
    """Median seconds of a width-w forward per level ("fast": no exact mode; "exact": the
    calibrated level per width), the cache restored after each."""
    rng = np.random.default_rng(1)
    vocab = vocab_size(model)
    cache = make_prompt_cache(model)
    for i in range(0, offset, 512):
        model(mx.array(rng.integers(0, vocab, size=min(512, offset - i)))[None], cache=cache)
        mx.eval([c.state for c in cache])
    probe = mx.array(rng.integers(0, vocab, size=max(widths)))[None]
    seconds: dict[str, dict[int, list[float]]] = {lv: {w: [] for w in widths} for lv in levels}
    for round_ in range(warmup + repeats):
        for level in levels:
            ctx = exact_mode(model, "auto" if level == "exact" else level) if level != "fast" else _null()
            with ctx:
                for w in widths:
                    mx.synchronize()
                    t0 = time.perf_counter()
                    mx.eval(model(probe[:, :w], cache=cache))
                    t = time.perf_counter() - t0
                    for c in cache:
                        c.trim(w)
                    if round_ >= warmup:
                        seconds[level][w].append(t)
    return {lv: {w: statistics.median(ts) for w, ts in per.items()} for lv, per in seconds.items()}


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def replay_cost(log_records: list[dict], ratio: dict[int, float]) -> tuple[int, float]:
    """(decode tokens, cost in width-1 forwards) of a run's steps at the given cost ratios."""
    tokens, total = 0, 0.0
    for r in log_records:
        if r["kind"] == "prefill":
            continue
        tokens += r["emitted"]
        total += float(np.interp(r["verify_width"], sorted(ratio), [ratio[w] for w in sorted(ratio)]))
    return tokens, total


# -- one model -------------------------------------------------------------------------------


def run_model(name: str, cfg: dict, quick: bool, deadline: float, results: dict, full_depth: bool = False) -> None:
    embedded = name == "smollm2-135m"
    own = dict(cfg)
    if quick and embedded:
        own.update(QUICK_EMBEDDED)
    if full_depth:
        own.update(prompts=cfg["full_depth_prompts"])
    elif name in cfg["secondary_prompts"] and cfg["prompts"] == FULL["prompts"]:
        own.update(prompts=cfg["secondary_prompts"][name])
    primary = full_depth or name in cfg["primary"]
    depth = "" if full_depth or "tiny" in name or embedded else f"-{cfg['layers']}l"
    label = name + depth
    t_start = time.perf_counter()
    try:
        model, prompts, dtype = load_model(name, None if full_depth else cfg["layers"], quick)
    except Exception as err:  # the embedded model needs its wheel staged; report and go on
        print(f"[{label}] skipped: could not load ({type(err).__name__}: {err})", flush=True)
        results["skipped"].append({"model": label, "reason": f"{type(err).__name__}: {err}"})
        return
    moe = any("Switch" in type(m).__name__ for _, m in model.named_modules())
    print(f"[{label}] {dtype}, {'MoE' if moe else 'dense'}, built in {time.perf_counter() - t_start:.1f}s", flush=True)
    if prompts is None:
        prompts = exactness.random_prompts(model, own["prompts"], lengths=(8, 24) if quick else (96, 224))
    prompts = prompts[: own["prompts"]]
    widths = cfg["full_depth_widths"] if full_depth else own["cost_widths"]
    # The widths the workload verifies (k + 1) and the cost table measures.
    needed = sorted({w for w in widths if w > 1} | {k + 1 for k in own["ks"]})

    # 1. calibration
    t0 = time.perf_counter()
    calibration = calibrate(model, needed, repeats=cfg["calibration_repeats"])
    print(f"[{label}] calibrated widths {needed} in {time.perf_counter() - t0:.1f}s", flush=True)
    chosen = {w: calibration.level_for(w) for w in needed}
    for r in calibration.rows():
        results["calibration"].append({"model": label, "dtype": dtype, **r})
    print("  levels: " + "  ".join(f"{w}:{lv}" for w, lv in chosen.items()), flush=True)

    # 2 + 3. exactness and end-to-end on the workload
    if not full_depth or time.perf_counter() < deadline:
        workload(model, label, dtype, prompts, own, results, full_depth, e2e=own["e2e_prompts"] if primary else 0)

    # 4. verify cost
    if not primary:
        pass
    elif time.perf_counter() > deadline:
        print(f"[{label}] verify cost skipped: past the time budget", flush=True)
    else:
        levels = ["fast", "attention", "attention+linear/vector", "serial", "exact"]
        t0 = time.perf_counter()
        repeats = cfg["full_depth_repeats"] if full_depth else cfg["repeats"]
        seconds = measure_costs(model, levels, widths, cfg["offset"], repeats, cfg["warmup"])
        base = seconds["fast"][1]
        for level, per in seconds.items():
            for w, s in per.items():
                results["cost"].append(
                    {
                        "model": label,
                        "dtype": dtype,
                        "level": level,
                        "width": w,
                        "seconds": s,
                        "ratio": s / base,
                        "exact_level": chosen.get(w, "none") if level == "exact" else None,
                    }
                )
        print(
            f"[{label}] verify cost (x width-1 forward of {1e3 * base:.2f} ms) in {time.perf_counter() - t0:.1f}s",
            flush=True,
        )
        rows = [{"level": lv, **{f"w{w}": per[w] / base for w in widths}} for lv, per in seconds.items()]
        table(rows, ["level", *[f"w{w}" for w in widths]])
        replay(label, results, seconds)
    del model
    gc.collect()
    mx.clear_cache()


def workload(
    model, label: str, dtype: str, prompts: list[list[int]], own: dict, results: dict, full_depth: bool, e2e: int = 0
) -> None:
    n, ks, acceptance = own["tokens"], own["ks"], own["acceptance"]
    # Warm-up: compile every kernel the runs use.
    warm = prompts[0]
    truth, _ = plain_greedy(model, warm, 8)
    for k in ks:
        for verify in ("exact", "fast"):
            speculative(model, warm, truth, 8, k, verify, acceptance, seed=0)
    t0 = time.perf_counter()
    per_k: dict[int, dict[str, Any]] = {}
    logs: dict[str, list[dict]] = {}
    for i, prompt in enumerate(prompts):
        k = ks[i % len(ks)]
        truth, plain_s = plain_greedy(model, prompt, n)
        exact_out, exact_s, exact_log = speculative(model, prompt, truth, n, k, "exact", acceptance, seed=i)
        fast_out, _, fast_log = speculative(model, prompt, truth, n, k, "fast", acceptance, seed=i)
        for mode, out, log in (("exact", exact_out, exact_log), ("fast", fast_out, fast_log)):
            div = exactness.first_divergence(out, truth)
            stats = log.stats()
            results["exactness"].append(
                {
                    "model": label,
                    "dtype": dtype,
                    "mode": mode,
                    "prompt": i,
                    "k": k,
                    "prompt_tokens": len(prompt),
                    "tokens": len(out),
                    "equal": div is None,
                    "first_divergence": div,
                    "verifies": stats["verifies"],
                    "accepted": stats["accepted"],
                    "mean_accepted_tokens": stats["mean_accepted_tokens"],
                }
            )
        logs.setdefault(str(k), []).extend(exact_log.records)
        if i >= e2e:
            continue
        # End to end: fast drafts from its own output (its acceptance is then not cut by its
        # divergences); each mode runs twice, cold then warm.
        fast_anchor, fast_cold_s, _ = speculative(model, prompt, fast_out, n, k, "fast", acceptance, seed=i)
        _, plain_warm_s = plain_greedy(model, prompt, n)
        _, exact_warm_s, _ = speculative(model, prompt, truth, n, k, "exact", acceptance, seed=i)
        _, fast_warm_s, fast_log2 = speculative(model, prompt, fast_out, n, k, "fast", acceptance, seed=i)
        t = per_k.setdefault(
            k,
            {
                "tokens": 0,
                "mat_exact": [],
                "mat_fast": [],
                **{f"{m}_{c}": 0.0 for m in ("plain", "exact", "fast") for c in ("cold", "warm")},
            },
        )
        for key, value in (
            ("plain_cold", plain_s),
            ("exact_cold", exact_s),
            ("fast_cold", fast_cold_s),
            ("plain_warm", plain_warm_s),
            ("exact_warm", exact_warm_s),
            ("fast_warm", fast_warm_s),
        ):
            t[key] += value
        t["tokens"] += len(truth)
        t["mat_exact"].append(exact_log.stats()["mean_accepted_tokens"])
        t["mat_fast"].append(fast_log2.stats()["mean_accepted_tokens"])
    results.setdefault("_logs", {})[label] = logs
    print(f"[{label}] workload {len(prompts)} prompts x {n} tokens in {time.perf_counter() - t0:.1f}s", flush=True)
    summary = []
    for mode in ("exact", "fast"):
        rows = [r for r in results["exactness"] if r["model"] == label and r["mode"] == mode]
        divs = [r["first_divergence"] for r in rows if r["first_divergence"] is not None]
        summary.append(
            {
                "model": label,
                "dtype": dtype,
                "mode": mode,
                "equal": f"{sum(r['equal'] for r in rows)}/{len(rows)}",
                "first_div_min": min(divs) if divs else None,
                "first_div_median": statistics.median(divs) if divs else None,
                "first_div_max": max(divs) if divs else None,
                "accepted_per_verify": sum(r["accepted"] for r in rows) / max(1, sum(r["verifies"] for r in rows)),
            }
        )
    results["exactness_summary"] += summary
    table(
        summary,
        [
            "model",
            "dtype",
            "mode",
            "equal",
            "first_div_min",
            "first_div_median",
            "first_div_max",
            "accepted_per_verify",
        ],
    )
    rows = []
    for k, t in sorted(per_k.items()):
        for c in ("cold", "warm"):
            row = {
                "model": label,
                "dtype": dtype,
                "kind": f"measured-{c}",
                "k": k,
                "tokens": t["tokens"],
                "plain_s": t[f"plain_{c}"],
                "exact_s": t[f"exact_{c}"],
                "fast_s": t[f"fast_{c}"],
                "speedup_exact": t[f"plain_{c}"] / t[f"exact_{c}"],
                "speedup_fast": t[f"plain_{c}"] / t[f"fast_{c}"],
                "mat_exact": statistics.mean(t["mat_exact"]),
                "mat_fast": statistics.mean(t["mat_fast"]),
            }
            row["exact_over_fast"] = row["speedup_exact"] / row["speedup_fast"]
            rows.append(row)
    results["e2e"] += rows
    table(rows, ["model", "kind", "k", "speedup_exact", "speedup_fast", "exact_over_fast", "mat_exact", "mat_fast"])


def replay(label: str, results: dict, seconds: dict) -> None:
    """The exact runs' steps priced at each mode's measured verify cost (same steps for both)."""
    logs = results.get("_logs", {}).get(label)
    if not logs:
        return
    base = seconds["fast"][1]
    rows = []
    for k, records in logs.items():
        ratios = {mode: {w: s / base for w, s in seconds[mode].items()} for mode in ("fast", "exact")}
        if max(r["verify_width"] for r in records if r["kind"] != "prefill") > max(ratios["fast"]):
            continue
        tokens, fast_cost = replay_cost(records, ratios["fast"])
        _, exact_cost = replay_cost(records, ratios["exact"])
        row = {
            "model": label,
            "kind": "replay",
            "k": int(k),
            "tokens": tokens,
            "speedup_exact": tokens / exact_cost,
            "speedup_fast": tokens / fast_cost,
        }
        row["exact_over_fast"] = row["speedup_exact"] / row["speedup_fast"]
        rows.append(row)
    results["e2e"] += rows
    table(rows, ["model", "kind", "k", "speedup_exact", "speedup_fast", "exact_over_fast"])


# -- figure ----------------------------------------------------------------------------------

COLORS = {
    "fast": "black",
    "exact": "tab:red",
    "attention": "tab:blue",
    "attention+linear/vector": "tab:orange",
    "attention+linear": "tab:green",
    "attention+linear+experts": "tab:purple",
    "serial": "tab:brown",
}


def figure(cost_rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r["model"] for r in cost_rows))
    if not models:
        return
    cols = min(3, len(models))
    rows = (len(models) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
    for ax, model in zip(axes.flat, models):
        mine = [r for r in cost_rows if r["model"] == model]
        for level in dict.fromkeys(r["level"] for r in mine):
            pts = sorted((r["width"], r["ratio"]) for r in mine if r["level"] == level)
            style = {"fast": dict(lw=2), "exact": dict(lw=2.5)}.get(level, dict(lw=1, alpha=0.8))
            ax.plot(*zip(*pts), marker="o", ms=3, label=level, color=COLORS.get(level, "tab:gray"), **style)
        ax.set_title(f"{model} ({mine[0]['dtype']})", fontsize=9)
        ax.set_xlabel("verify width w")
        ax.set_ylabel("time / width-1 forward")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(models) :]:
        ax.axis("off")
    fig.suptitle(f"Verify cost per exact level ({device_name()}, mlx {mx.__version__})", fontsize=10)
    fig.tight_layout()
    write_figure_atomic(fig, path, dpi=110)


# -- main ------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny float32 models (CPU smoke run)")
    parser.add_argument("--models", default=None, help="comma-separated: synthetic names and/or smollm2-135m")
    parser.add_argument(
        "--full-depth", default=None, help="comma-separated synthetic names measured at full depth ('' for none)"
    )
    parser.add_argument("--layers", type=int, default=None, help="depth of the synthetic models (default 4)")
    parser.add_argument("--prompts", type=int, default=None)
    parser.add_argument("--tokens", type=int, default=None)
    parser.add_argument("--ops", action="store_true", help="also run the op probe (slow on CUDA)")
    parser.add_argument(
        "--cudnn-sdpa",
        action="store_true",
        help="MLX_CUDA_USE_CUDNN_SDPA=1 (cuDNN attention) for the whole run, reference included",
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=360.0,
        help="seconds; a model that would end past it, and cost sweeps starting past it, are skipped",
    )
    args = parser.parse_args()
    cfg = dict(QUICK if args.quick else FULL)
    for key in ("layers", "prompts", "tokens"):
        if getattr(args, key) is not None:
            cfg[key] = getattr(args, key)
    if args.prompts is not None:  # every model runs the number asked for
        cfg["secondary_prompts"] = {}
    if args.models is not None:
        cfg["models"] = [m for m in args.models.split(",") if m]
    if args.full_depth is not None:
        cfg["full_depth"] = [m for m in args.full_depth.split(",") if m]
    out = Path(os.environ.get("OUT") or "reports/gpu")
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    deadline = start + args.budget
    print(
        f"device {device_name()}  mlx {mx.__version__}  out {out}  budget {args.budget:.0f}s  "
        f"cuDNN attention {'off' if os.environ.get('MLX_CUDA_USE_CUDNN_SDPA') == '0' else 'on'}",
        flush=True,
    )
    results: dict[str, list] = {
        k: [] for k in ("ops", "calibration", "exactness", "exactness_summary", "e2e", "cost", "skipped")
    }

    if args.ops:
        t0 = time.perf_counter()
        for dtype in cfg["probe_dtypes"]:
            results["ops"] += probe_ops(getattr(mx, dtype), widths=cfg["probe_widths"])
        variant = sorted({(r["op"], r["dtype"]) for r in results["ops"] if not r["row_invariant"]})
        print(
            f"op probe ({time.perf_counter() - t0:.1f}s): not row-invariant: "
            f"{', '.join(f'{op}[{dt}]' for op, dt in variant) or 'none'}",
            flush=True,
        )
        write_csv(out / "ops.csv", results["ops"])

    plan = [(m, False) for m in cfg["models"]] + [(m, True) for m in cfg["full_depth"]]
    for name, full in plan:
        need = cfg["full_depth_need_s"] if full else cfg["model_need_s"]
        if time.perf_counter() + need > deadline:
            print(f"[{name}] skipped: past the time budget", flush=True)
            results["skipped"].append({"model": name + (" (full depth)" if full else ""), "reason": "time budget"})
            continue
        try:
            run_model(name, cfg, args.quick, deadline, results, full_depth=full)
        except Exception as err:  # keep what the other models give
            traceback.print_exc()
            results["skipped"].append({"model": name, "reason": f"failed: {type(err).__name__}: {err}"})
            gc.collect()
            mx.clear_cache()
        write_outputs(out, results)

    write_outputs(out, results)
    print("exactness (speculative greedy vs plain greedy):")
    table(
        results["exactness_summary"],
        ["model", "dtype", "mode", "equal", "first_div_min", "first_div_median", "first_div_max"],
    )
    print(
        "end to end (measured: wall time, cold = first run of a prompt, warm = second; "
        "replay: exact run's steps at each mode's costs):"
    )
    table(results["e2e"], ["model", "kind", "k", "speedup_exact", "speedup_fast", "exact_over_fast"])
    exact_rows = [r for r in results["exactness_summary"] if r["mode"] == "exact"]
    all_equal = all(r["equal"].split("/")[0] == r["equal"].split("/")[1] for r in exact_rows)
    for r in results["skipped"]:
        print(f"skipped {r['model']}: {r['reason']}")
    print(
        f"exact mode bit-identical to plain greedy on every prompt: {all_equal}  "
        f"({time.perf_counter() - start:.0f}s total)",
        flush=True,
    )
    return 0 if all_equal else 1


def write_outputs(out: Path, results: dict) -> None:
    write_csv(out / "calibration.csv", results["calibration"])
    write_csv(out / "exactness.csv", results["exactness"])
    write_csv(out / "e2e.csv", results["e2e"])
    write_csv(out / "cost.csv", results["cost"])
    summary = {
        "device": device_name(),
        "mlx": mx.__version__,
        "exactness": results["exactness_summary"],
        "e2e": results["e2e"],
        "skipped": results["skipped"],
        "levels": {
            model: {r["width"]: r["chosen"] for r in results["calibration"] if r["model"] == model}
            for model in dict.fromkeys(r["model"] for r in results["calibration"])
        },
        "ops_not_row_invariant": sorted({f"{r['op']}[{r['dtype']}]" for r in results["ops"] if not r["row_invariant"]}),
    }
    write_json(out / "summary.json", summary)
    if results["cost"]:
        figure(results["cost"], out / "exactness.png")


if __name__ == "__main__":
    sys.exit(main())
