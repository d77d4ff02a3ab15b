"""Does the default (Auto, exact greedy verification) ever lose to plain decoding? Paired runs, intervals.

    python3 -m scripts.gpu.default_policy --budget 480   # H200: dense and MoE 4-bit shapes, embedded model
    python3 -m scripts.gpu.default_policy --quick        # CPU: tiny shapes, the embedded model's miniature (< 60 s)
    python3 -m scripts.gpu.default_policy --resummarize FOLDER   # recompute an earlier run's summaries
    python3 -m scripts.gpu.default_policy --shapes '' --embedded-tokens 128 --categories qa,rag --traces ''
    python3 -m scripts.gpu.default_policy --resummarize FOLDER1 FOLDER2   # runs split over calls, summarized together

Per model, set-up first: exact-mode calibration of every width Auto may verify, Auto's quick cost profiles,
per-call verify seconds (``scripts.gpu.verify_calls.verify_call_rows``; --compile adds compiled linear chunks),
a warm-up of every method, and the steadier of free and pinned cores (``specbench.common.timing``).
1. Synthetic shapes (random weights, full depth, 4-bit): an ``Oracle`` at controlled acceptance, Auto
   with exact and fast verify; each repeat runs mlx-lm plain once, then every cell as a (plain, Auto) pair of
   per-token runs next to each other, the order alternating (``scripts.gpu.default_policy_runs``).
2. The embedded model: every prompt of the bundled categories (first turn) and the first --trace-turns turns of
   each trace in data/traces; plain, Auto with prompt lookup and with SuffixDecoding, whole calls, the order
   rotating per prompt; one drafter per method and repeat, kept across prompts.
Each model also gets an A/A cell (plain timed as an Auto cell is). Per cell the ratio, its intervals in seconds
and in plain steps, and a verdict against 0.97 (``scripts.gpu.default_policy_cells``); pooled rows; the summaries
(``scripts.gpu.ab_text``). Sizes shrink to fit --budget (what was cut is printed and kept). Writes into
$OUT (or --out): grid.csv, embedded.csv, pooled.csv, runs.csv, verify_calls.csv, default_policy.json; the runs
after every repeat (SIGTERM summarizes what finished; --resummarize recovers a run killed outright).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
from dataclasses import asdict
from pathlib import Path
from typing import Any

import mlx.core as mx

from scripts.gpu import default_policy_cells
from scripts.gpu.ab_text import summary_lines
from scripts.gpu.budget import Budget
from scripts.gpu.default_policy_phases import embedded_phase, say, shape_phase, trace_files
from specbench.common.files import write_csv_atomic
from specbench.common.identity import device_name, versions, write_result
from specbench.inputs.prompts import BUNDLED_CATEGORIES

FULL = {
    "shapes": ["qwen3-8b-4bit", "qwen3-30b-a3b-4bit"],
    "acceptances": [0.3, 0.5, 0.7, 0.9, 1.0],
    **{"tokens": 256, "min_tokens": 128, "repeats": 8, "min_repeats": 6, "prompt_len": 256},
    **{"call_widths": [1, 7, 9], "warmup_tokens": 64, "call_repeats": 10},
    **{"embedded": "smollm2-135m", "embedded_tokens": 128, "min_embedded_tokens": 64},
    "embedded_repeats": 3,  # each repeat pairs every prompt of a category once
    "min_embedded_repeats": 2,
    **{"per_category": None, "trace_turns": 3, "traces": None},  # every prompt, every trace in data/traces
    # seconds a phase spends before its first timed run on a cold H200 (first-use kernel builds, calibration;
    # measured: dense 145-191 s, MoE 179 s after the dense shape, 319 s first on a fresh machine)
    "setup_s": {"qwen3-8b-4bit": 170.0, "qwen3-30b-a3b-4bit": 320.0, "embedded": 45.0},
    "shares": {"qwen3-8b-4bit": 0.25, "qwen3-30b-a3b-4bit": 0.35, "embedded": 0.4},
}
QUICK = {
    **FULL,
    **{"shapes": ["qwen3-8b-tiny", "qwen3-30b-a3b-tiny"], "acceptances": [0.5, 1.0]},
    **{"tokens": 32, "min_tokens": 16, "repeats": 2, "min_repeats": 2, "prompt_len": 24},
    **{"call_widths": [1, 9], "call_repeats": 2, "warmup_tokens": 12, "embedded": "tiny:smollm2-135m"},
    **{"embedded_tokens": 24, "min_embedded_tokens": 12, "embedded_repeats": 2, "min_embedded_repeats": 2},
    **{"per_category": 1, "categories": ["translation", "natural_text"], "trace_turns": 1, "traces": 1},
    "setup_s": {"qwen3-8b-tiny": 5.0, "qwen3-30b-a3b-tiny": 8.0, "embedded": 8.0},
    "shares": {"qwen3-8b-tiny": 0.3, "qwen3-30b-a3b-tiny": 0.3, "embedded": 0.4},
}


class Interrupted(Exception):
    """The run was asked to stop (SIGTERM)."""


def summarize(out: dict, cuts: list[str]) -> None:
    """Each cell judged, the pooled rows, and every summary printed."""
    grid, embedded = default_policy_cells.summarize(out["runs"])
    pooled = default_policy_cells.pooled(out["runs"])
    out["grid"], out["embedded"], out["pooled"] = ([asdict(r) for r in rows] for rows in (grid, embedded, pooled))
    checks = default_policy_cells.aa_checks(pooled)
    out["a_a"] = {model: check.as_record() for model, check in checks.items()}
    for line in summary_lines(out, cuts):
        say(line)
    for model, check in checks.items():
        say(f"{model}: {check.verdict()}" + ("" if check.passed else ": this run is reported as failed"))


def arguments() -> tuple[argparse.Namespace, dict]:
    """The command line and the settings it gives (errors before any model work)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--quick", action="store_true", help="CPU: tiny shapes and the embedded model's miniature")
    add("--budget", type=float, default=480.0, help="seconds for the whole run (sizes shrink to fit)")
    add("--out", default=None, help="folder for the results (default $OUT, else reports/gpu)")
    add("--shapes", default=None, help="comma list of synthetic shapes")
    add("--no-embedded", action="store_true", help="leave out the embedded model")
    add("--compile", action="store_true", help="also time exact verify with compiled linear chunks")
    add("--categories", default=None, help="embedded model: comma list of bundled categories")
    add("--traces", default=None, help="embedded model: comma list of data/traces names ('' none)")
    add("--embedded-tokens", type=int, default=None, help="embedded model: tokens per run (the budget cuts repeats)")
    add("--acceptances", default=None, help="shapes: comma list of the drafter's acceptances (default 0.3,...,1.0)")
    add("--modes", default=None, help="shapes: verify modes, comma list of exact, fast (default both)")
    add("--repeats", type=int, default=None, help="most repeats per cell (default 8 and 3; the budget cuts them)")
    add(
        "--resummarize",
        nargs="+",
        default=None,
        help="folders of earlier runs: recompute their summaries, pooled "
        "over all of them (no model work); one folder gets its pooled.csv rewritten, several are summarized together",
    )
    args = parser.parse_args()
    cfg = dict(QUICK if args.quick else FULL)
    listed = lambda text: [item for item in text.split(",") if item]  # noqa: E731
    if args.resummarize and (missing := [f for f in args.resummarize if not Path(f, "default_policy.json").is_file()]):
        parser.error(f"no default_policy.json in {', '.join(missing)}: give folders this script wrote")
    if args.shapes is not None:
        cfg["shapes"] = listed(args.shapes)
    if args.categories is not None:
        cfg["categories"] = listed(args.categories)
        if (unknown := sorted(set(cfg["categories"]) - set(BUNDLED_CATEGORIES))) or not cfg["categories"]:
            parser.error(f"--categories: unknown {unknown or 'none given'}; bundled: {', '.join(BUNDLED_CATEGORIES)}")
    if args.traces is not None:
        cfg["trace_names"], cfg["traces"] = listed(args.traces), None
        known = [p.stem for p in trace_files({"traces": None})]
        if unknown := sorted(set(cfg["trace_names"]) - set(known)):
            parser.error(f"--traces: unknown {unknown}; in data/traces: {', '.join(known)}")
    if args.acceptances is not None:
        try:
            cfg["acceptances"] = [float(a) for a in listed(args.acceptances)]
        except ValueError:
            cfg["acceptances"] = []
        if not cfg["acceptances"] or not all(0.0 <= a <= 1.0 for a in cfg["acceptances"]):
            parser.error(f"--acceptances: give numbers in [0, 1] separated by commas, got {args.acceptances!r}")
    if args.modes is not None:
        cfg["modes"] = listed(args.modes)
        if not cfg["modes"] or set(cfg["modes"]) - {"exact", "fast"}:
            parser.error(f"--modes: give exact, fast or both (comma list), got {args.modes!r}")
    if args.repeats is not None:
        if args.repeats < 2:
            parser.error(f"--repeats must be at least 2 (a cell's interval needs pairs), got {args.repeats}")
        for key in ("repeats", "embedded_repeats"):
            cfg[key], cfg["min_" + key] = args.repeats, min(cfg["min_" + key], args.repeats)
    if args.embedded_tokens is not None:
        if args.embedded_tokens < 2:
            parser.error(f"--embedded-tokens must be at least 2, got {args.embedded_tokens}")
        cfg["embedded_tokens"] = cfg["min_embedded_tokens"] = args.embedded_tokens
    if args.compile:  # compiling each width's linear chunks: about a minute more per shape on the H200
        cfg["setup_s"] = {k: v + (0.0 if k == "embedded" else 60.0) for k, v in cfg["setup_s"].items()}
    cfg["phases"] = [*cfg["shapes"], *([] if args.no_embedded else ["embedded"])]
    return args, cfg


def main() -> int:
    args, cfg = arguments()
    if args.resummarize:
        folders = [Path(f) for f in args.resummarize]
        out = default_policy_cells.merged(
            [json.loads((folder / "default_policy.json").read_text()) for folder in folders]
        )
        summarize(out, [])
        if len(folders) == 1:
            write_csv_atomic(folders[0] / "pooled.csv", out["pooled"])
        return 0
    out_dir = Path(args.out or os.environ.get("OUT") or "reports/gpu")
    out_dir.mkdir(parents=True, exist_ok=True)
    budget = Budget(args.budget, say=say)
    say(f"device {device_name()}  mlx {mx.__version__}  budget {args.budget:.0f} s  out {out_dir}")
    out: dict[str, list] = {"runs": [], "verify_calls": [], "grid": [], "embedded": []}

    def save() -> None:
        for name in ("runs", "verify_calls", "grid", "embedded", "pooled"):
            write_csv_atomic(out_dir / f"{name}.csv", out.get(name, []))
        settings = {k: v for k, v in cfg.items() if k != "phases"}  # the phases follow from the settings
        info = {"device": device_name(), **versions(), "settings": settings, "reduced": budget.cuts}
        write_result(out_dir / "default_policy.json", {**info, **out})

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
    summarize(out, budget.cuts)
    save()
    say(f"\ntotal {budget.elapsed():.1f} s; results in {out_dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
