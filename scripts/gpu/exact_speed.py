"""Exactness at full speed, end to end: exact against fast verification, Auto, and plain against mlx-lm.

    python3 -m scripts.gpu.exact_speed                       # H200: Qwen3-8B and Qwen3-30B-A3B shapes, 4-bit
    python3 -m scripts.gpu.exact_speed --shapes qwen3-30b-a3b --repeats 6
    python3 -m scripts.gpu.exact_speed --quick               # CPU: a tiny shape, a few seconds

Per shape (random weights, full depth): the greedy continuation of a random prompt is recorded by
specbench's plain decoding; an oracle drafter then drafts it with acceptance 1.0 (the true continuation)
or each of --acceptances. Every exact width a cell may verify is calibrated before any timed run. Each repeat
runs every cell once, specbench plain first and last, the order of the others reversed on odd repeats,
so drift in the machine's speed falls on all cells alike. Cells:

- ``plain``: specbench's plain greedy decoding (exact mode: one-row products through the row-invariant kernels
  where ``one_row_choice`` found them faster, on the device and for whole plain steps; printed first);
- ``mlx-lm``: mlx-lm's ``generate_step`` (plain greedy; its output checked against plain's too);
- ``exact k=K`` / ``fast k=K``: fixed draft length K at acceptance 1.0, each verify mode;
- ``auto exact a=1`` and ``auto exact a=A`` for each A of --acceptances (default 0.3 and 0.7): the default policy
  in the default (exact) mode;
- ``plain (A/A)``: specbench plain again, timed as the other cells are: its interval must cover 1.0
  (``result_lines.AACheck``), else the run is reported as failed (printed, and under "a_a" in the file).

A cell's speedup is plain's seconds per token over the cell's, per repeat (plain: the mean of the
repeat's two plain runs); printed as the median over repeats with a 95 % expanded bootstrap interval
over repeats (``paired.bootstrap``, from 6 repeats). Every exact cell's output is checked against plain
greedy. Writes exact_speed.json into $OUT (or --out), naming the commit, versions and device.

The protocol, fixed before the runs: one random 64-token prompt per shape (seed 1), 128 tokens, 6 repeats, no
stopping rule but the repeat count; every repeat is kept. An Auto cell's verdict against plain decoding
(``auto_verdict``): "pays" when its interval lies above 1.0, "loses" when below 1.0, "no loss beyond 3 %" when
it covers 1.0 and lies above 0.97, "inconclusive" otherwise. Exact against fast end to end: exact k=K's seconds
per token over fast k=K's, per repeat, with its interval (``exact_over_fast``).

Plain against mlx-lm (tokens/s, the inverse of the mlx-lm cell's speedup per repeat), decided by a rule fixed
before the runs: "faster" when the 95 % interval lies above 1.0, "slower" when below it, "inconclusive"
otherwise; the 1.15x aim is met when the interval lies above 1.15. ``--cells mlx-lm --repeats 12`` runs only
that comparison (no calibration: plain decoding verifies nothing).
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
from mlx_lm.generate import generate_step

from scripts.result_lines import AACheck
from specbench import DraftPolicy, GenerateOptions, generate, speculative_generate
from specbench.bench.paired import MIN_UNITS, bootstrap
from specbench.common.identity import device_name, versions, write_result
from specbench.cost.timing import seconds_per_token
from specbench.drafters.oracle import Oracle
from specbench.exact import calibrate
from specbench.exact.one_row import one_row_choice
from specbench.models import synthetic

#: The A/A arm: plain decoding timed as a cell, against the repeat's plain runs.
AA = "plain (A/A)"


def say(text: str) -> None:
    print(text, flush=True)


def timed_cells(
    model, prompt: list[int], tokens: int, k: int, acceptances: list[float]
) -> tuple[dict[str, Callable[[], dict]], list[int]]:
    """Each cell: a function running it once, returning its seconds per token and its output."""
    vocab = model.args.vocab_size
    reference = list(generate(model, prompt, GenerateOptions(max_tokens=tokens, ignore_eos=True)))

    def plain() -> dict:
        gen = generate(model, prompt, GenerateOptions(max_tokens=tokens, ignore_eos=True))
        return {"spt": seconds_per_token(gen), "tokens": list(gen.tokens)}

    def mlx_lm() -> dict:
        steps = generate_step(mx.array(prompt), model, max_tokens=tokens)
        out: list[int] = []
        spt = seconds_per_token(out.append(int(token)) or token for token, _ in steps)
        return {"spt": spt, "tokens": out}

    def speculative(mode: str, policy: Callable[[], DraftPolicy], acceptance: float) -> Callable[[], dict]:
        def run() -> dict:
            # with the model, the oracle re-records the continuation where the output leaves it (fast
            # verification's rounding does): it keeps drafting the true continuation, its seconds left out
            drafter = Oracle(prompt, reference, acceptance, vocab, seed=0, preferred_k=k, model=model)
            options = GenerateOptions(max_tokens=tokens, ignore_eos=True, verify=mode)
            gen = speculative_generate(model, prompt, options, drafter=drafter, policy=policy(), progress=None)
            spt = seconds_per_token(gen, lambda: drafter.follow_s)
            stats = gen.stats()
            return {"spt": spt, "tokens": list(gen.tokens), "verifies": stats["verifies"]}

        return run

    cells: dict[str, Callable[[], dict]] = {
        "plain": plain,
        "mlx-lm": mlx_lm,
        f"exact k={k}": speculative("exact", lambda: DraftPolicy.fixed(k), 1.0),
        f"fast k={k}": speculative("fast", lambda: DraftPolicy.fixed(k), 1.0),
        "auto exact a=1": speculative("exact", DraftPolicy.auto, 1.0),
        **{f"auto exact a={a:g}": speculative("exact", DraftPolicy.auto, a) for a in acceptances},
        AA: plain,
    }
    return cells, reference


def run_shape(shape: str, args: argparse.Namespace) -> dict:
    start = time.perf_counter()
    model = synthetic.build(shape, layers=args.layers, bits=args.bits)
    say(f"\n== {shape} {args.bits}-bit on {device_name()} (built in {time.perf_counter() - start:.0f} s)")
    prompt = [
        int(t)
        for t in mx.random.randint(0, min(1000, model.args.vocab_size), (args.prompt_tokens,), key=mx.random.key(1))
    ]
    cells, reference = timed_cells(model, prompt, args.tokens, args.k, args.acceptances)
    unknown = sorted(set(args.cells or ()) - set(cells))
    if unknown:
        raise SystemExit(f"--cells: no cell named {unknown}; the cells are {list(cells)}")
    if args.cells is not None:
        cells = {n: f for n, f in cells.items() if n in ("plain", AA) or n in args.cells}
    levels = {}
    if set(cells) - {"plain", "mlx-lm", AA}:  # speculative cells: exact ones verify widths 2..k+1
        t0 = time.perf_counter()
        calibration = calibrate(model, args.k + 1, progress=say)  # seconds per width
        levels = {w: calibration.level_for(w) for w in sorted(calibration.widths)}
        say(f"calibration 2..{args.k + 1} ({time.perf_counter() - t0:.0f} s): {levels}")
    choice = one_row_choice(model)
    for t in choice.shapes:
        kernel = f"{1e6 * t.kernel_s:8.1f} us" if t.kernel_s is not None else "    none"
        say(f"one row {t.signature[:5]} x{t.layers}: device MLX {1e6 * t.mlx_s:8.1f} us, kernel {kernel}")
    if choice.step_s is not None:
        say(
            f"plain step {1e3 * choice.step_s:.2f} ms, with the faster kernels {1e3 * choice.kernel_step_s:.2f} ms -> "
            f"{'kernels' if choice.confirmed else 'MLX'}"
        )
    names = [n for n in cells if n != "plain"]
    for name in names:  # warm-up: kernels compiled, caches sized, Auto's quick profile measured
        cells[name]()
    runs: dict[str, list[dict]] = {n: [] for n in cells}
    for repeat in range(args.repeats):
        order = names if repeat % 2 == 0 else names[::-1]
        gc.collect()
        gc.disable()
        try:
            first = cells["plain"]()
            for name in order:
                runs[name].append(cells[name]())
            last = cells["plain"]()
        finally:
            gc.enable()
        runs["plain"].append({"spt": (first["spt"] + last["spt"]) / 2, "tokens": first["tokens"]})
    plain_spt = [r["spt"] for r in runs["plain"]]
    rows = {}
    say(f"{'cell':20s} {'ms/token':>9s} {'speedup':>8s}  interval        exact  verifies")
    for name, results in runs.items():
        ratios = [p / r["spt"] for p, r in zip(plain_spt, results, strict=True)]
        interval = bootstrap(ratios, statistics.median) if len(ratios) >= MIN_UNITS else None
        exact = None if results[0]["tokens"] is None else all(r["tokens"] == reference for r in results)
        if name.startswith("fast"):
            exact = None  # fast verification makes no such promise
        rows[name] = {
            "ms_per_token": 1e3 * statistics.median(r["spt"] for r in results),
            "speedup": statistics.median(ratios),
            "interval": interval,
            "ratios": ratios,
            "equals_plain": exact,
            "verifies": [r.get("verifies") for r in results],
            **({"verdict": auto_verdict(interval)} if name.startswith("auto") else {}),
        }
        shown = f"[{interval[0]:.2f}, {interval[1]:.2f}]" if interval else "(too few)"
        say(
            f"{name:20s} {rows[name]['ms_per_token']:9.2f} {rows[name]['speedup']:8.2f}x {shown:15s} "
            f"{exact!s:6s} {rows[name]['verifies'][0] or ''}"
        )
    versus_fast = None
    if f"exact k={args.k}" in runs and f"fast k={args.k}" in runs:
        versus_fast = exact_over_fast(runs[f"exact k={args.k}"], runs[f"fast k={args.k}"])
        shown = versus_fast["interval"] and "[{:.2f}, {:.2f}]".format(*versus_fast["interval"])
        say(f"exact k={args.k} / fast k={args.k} (seconds per token) = {versus_fast['ratio']:.2f} {shown or ''}")
    versus = plain_over_mlx_lm(rows["mlx-lm"]["ratios"]) if "mlx-lm" in rows else None
    a_a = AACheck.of_ratios(rows[AA]["ratios"])
    say(a_a.verdict() + ("" if a_a.passed else ": this run is reported as failed"))
    one_row = {
        "shapes": [
            {
                "layer": list(map(str, t.signature)),
                "layers": t.layers,
                "mlx_us": 1e6 * t.mlx_s,
                "kernel_us": None if t.kernel_s is None else 1e6 * t.kernel_s,
                "faster": t.uses_kernel,
            }
            for t in choice.shapes
        ],
        "step_s": choice.step_s,
        "kernel_step_s": choice.kernel_step_s,
        "used": choice.confirmed,
    }
    return {
        **{"shape": shape, "levels": levels, "one_row": one_row, "rows": rows, "plain_over_mlx_lm": versus},
        "exact_over_fast": versus_fast,
        "a_a": a_a.as_record(),
        "seconds": time.perf_counter() - start,
    }


def auto_verdict(interval: tuple[float, float] | None) -> str:
    """An Auto cell's verdict against plain decoding, by the rule fixed before the runs (module docstring)."""
    if interval is None:
        return "too few repeats"
    low, high = interval
    if low > 1.0:
        return "pays"
    if high < 1.0:
        return "loses"
    return "no loss beyond 3 %" if low >= 0.97 else "inconclusive"


def exact_over_fast(exact: list[dict], fast: list[dict]) -> dict:
    """Exact verification's seconds per token over fast verification's at the same fixed k, per repeat (the two
    cells ran in the same repeat), with its 95 % interval: the exactness tax end to end."""
    ratios = [e["spt"] / f["spt"] for e, f in zip(exact, fast, strict=True)]
    interval = bootstrap(ratios, statistics.median) if len(ratios) >= MIN_UNITS else None
    return {"ratio": statistics.median(ratios), "interval": interval, "ratios": ratios}


def plain_over_mlx_lm(mlx_lm_speedups: list[float]) -> dict:
    """specbench's plain decoding against mlx-lm's in tokens/s, per repeat (the inverse of the mlx-lm cell's
    speedups), with the pre-registered verdict: "faster" when the 95 % interval lies above 1.0, "slower" when
    below, else "inconclusive"; the 1.15x aim is met when the interval lies above 1.15."""
    ratios = [1 / r for r in mlx_lm_speedups]
    median = statistics.median(ratios)
    interval = bootstrap(ratios, statistics.median) if len(ratios) >= MIN_UNITS else None
    if interval is None:
        verdict = "too few repeats"
    else:
        verdict = "faster" if interval[0] > 1.0 else "slower" if interval[1] < 1.0 else "inconclusive"
    aim = interval is not None and interval[0] > 1.15
    shown = f"[{interval[0]:.2f}, {interval[1]:.2f}]" if interval else ""
    say(f"plain / mlx-lm (tokens/s) = {median:.2f} {shown} over {len(ratios)} repeats: {verdict}; 1.15x aim met: {aim}")
    return {"ratio": median, "interval": interval, "repeats": len(ratios), "verdict": verdict, "aim_met": aim}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="qwen3-8b,qwen3-30b-a3b")
    parser.add_argument("--bits", type=int, default=4)
    parser.add_argument("--layers", type=int, default=None, help="default: full depth")
    parser.add_argument("--k", type=int, default=8, help="the fixed draft length")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--acceptances", default="0.3,0.7", help="the Auto cells' acceptances besides 1.0")
    parser.add_argument("--cells", default=None, help="comma list of the cells to run besides plain (default all)")
    parser.add_argument("--quick", action="store_true", help="CPU smoke run: a tiny float32 shape")
    parser.add_argument("--out", default=os.environ.get("OUT") or "reports/gpu-kernels")
    args = parser.parse_args()
    if args.quick:
        args.shapes, args.layers, args.bits, args.tokens, args.repeats, args.k = "qwen3-8b-tiny", 2, 0, 24, 2, 4
    args.cells = args.cells.split(",") if args.cells else None  # None: every cell
    args.acceptances = [float(a) for a in args.acceptances.split(",") if a]
    result = {"device": device_name(), **versions(), **vars(args), "shapes": {}}
    for shape in args.shapes.split(","):
        result["shapes"][shape] = run_shape(shape, args)
        write_result(Path(args.out) / "exact_speed.json", result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
