"""`specbench profile` (verify-cost profiles) and `specbench check-exact`."""

from __future__ import annotations

import argparse
from pathlib import Path

from specbench.cli.registry import add_model_argument, command, drafter_names, integers, names, verify_modes
from specbench.common.files import check_writable, home
from specbench.drafters import drafter_choices

#: The widest verification `specbench profile` measures (each width is timed over several rounds).
MAX_PROFILE_WIDTH = 256


# -- profile (verify-cost profiles) -------------------------------------------------------------
@command("profile", "measure a model's verify cost c(w) and break-even acceptance, and store the profile")
def _profile(parser: argparse.ArgumentParser):
    add_model_argument(parser, synthetic="e.g. synthetic:qwen3-8b-4bit")
    parser.add_argument("--widths", type=int, default=16, help="measure verification widths 1..W")
    parser.add_argument("--verify", default="fast,exact", help="comma list of verify modes: fast, exact")
    parser.add_argument("--offset", type=int, default=512, help="tokens in the cache while timing")
    parser.add_argument("--repeats", type=int, default=10, help="timed rounds (medians kept)")
    parser.add_argument("--drafters", default="", help=f"comma list of drafters to time: {drafter_choices()}")
    parser.add_argument(
        "--lengths", default="", help="comma list of further context lengths to time c(w) at, e.g. 2048,8192"
    )
    parser.add_argument(
        "--components",
        nargs="?",
        const="1,2,5,9",
        default="",
        help=f"split a speculative step's cost into parts at these widths (default 1,2,5,9; up to {MAX_PROFILE_WIDTH})",
    )
    parser.add_argument("--no-save", action="store_true", help="print only; do not store under SPECBENCH_HOME")
    parser.add_argument("--plot", default=None, help="folder for costs.png and break_even.png")

    def run(args):
        from specbench.common.identity import device_name, display_name
        from specbench.cost import measure, save_profile
        from specbench.drafters import make_drafter
        from specbench.models.load import load

        modes = verify_modes(args.verify)
        if not 2 <= args.widths <= MAX_PROFILE_WIDTH:
            raise ValueError(
                f"--widths must be in [2, {MAX_PROFILE_WIDTH}] (a verification of k drafts has width k + 1), "
                f"got {args.widths}"
            )
        if args.repeats < 1 or args.offset < 1:
            raise ValueError(f"--repeats and --offset must be >= 1, got {args.repeats} and {args.offset}")
        drafter_names(args.drafters)
        lengths = integers(args.lengths, "--lengths", positive=True)
        stack_widths = integers(args.components, "--components", positive=True, maximum=MAX_PROFILE_WIDTH)
        if not args.no_save:
            check_writable(home() / "profiles", folder=True, name="the profiles folder")
        if args.plot:
            check_writable(args.plot, folder=True, name="--plot")
        model, tokenizer = load(args.model, layers=args.layers, shard=args.shard)
        drafters = [d for d in (make_drafter(n, model=model, model_name=args.model) for n in names(args.drafters)) if d]
        print(
            f"profiling {display_name(model)} on {device_name()}: widths 1..{args.widths}, "
            f"verify {', '.join(modes)}, cache offset {args.offset}"
        )
        profile = measure(
            model,
            widths=args.widths,
            verify=modes,
            offset=args.offset,
            repeats=args.repeats,
            drafters=drafters,
            context=_profile_context(tokenizer, args.offset),
            progress=lambda text: print(f"  {text}"),
            lengths=lengths,
            components=stack_widths,
        )
        print_profile(profile, model)
        if profile.components:
            print_components(profile.components)
        if not args.no_save:
            print(f"profile: {save_profile(profile)}")
        if args.plot:
            from specbench.report import figures

            folder = Path(args.plot)
            print(f"figure: {figures.save_figure(figures.verify_costs([profile]), folder / 'costs.png')}")
            fig = figures.break_even([profile], max_k=args.widths - 1)
            print(f"figure: {figures.save_figure(fig, folder / 'break_even.png')}")

    return run


def print_components(rows: list[dict]) -> None:
    """The component stack: each part's cost per width in plain steps, their sum against the whole step
    measured, how far off the sum is, and the part whose growth with the width decides c(w)."""
    from specbench.cost.components import PARTS, deciding_part, phase_stack

    widths = sorted({r["width"] for r in rows})
    at = {(r["width"], r["part"]): r for r in rows}

    def line(label: str, cells: list[float], spec: str = "9.3f") -> None:
        print("  " + label.ljust(11) + "".join(f"{c:{spec}}" for c in cells))

    print("  verify cost by component, in plain steps (a speculative step of width w, drafts rejected):")
    print("  " + "part".ljust(11) + "".join(f"{'w=' + str(w):>9s}" for w in widths))
    for part in PARTS:
        if any(at[w, part]["seconds"] > 0 for w in widths):
            line(part, [at[w, part]["c"] for w in widths])
    line("sum", [sum(at[w, p]["c"] for p in PARTS) for w in widths])
    whole = [at[w, PARTS[0]] for w in widths]  # the whole step's measures, on each width's first part
    line("measured", [r["c_step"] for r in whole])
    line("off by", [r["error"] for r in whole], "+9.1%")
    if all("closure" in r for r in whole):  # the forward's parts against the forward itself
        line("closure", [r["closure"] for r in whole], "+9.1%")
    counted = phase_stack(rows)  # on a GPU: each part's host work, the wait for the device a part of its own
    if counted is not None:
        by_phase = {(r["width"], r["part"]): r for r in counted}
        line("wait", [by_phase[w, "wait"]["c"] for w in widths])
        line("by phase", [by_phase[w, PARTS[0]]["error"] for w in widths], "+9.1%")
    if len(widths) > 1:
        part, share = deciding_part(rows)
        print(f"  deciding part: {part} ({share:.0%} of the growth from w={widths[0]} to w={widths[-1]})")


def _profile_context(tokenizer, offset: int) -> list[int] | None:
    """Natural text (the bundled prompts) for timing drafters; None (random ids) without a tokenizer."""
    if tokenizer is None:
        return None
    from specbench.inputs.prompts import bundled_questions

    ids = list(tokenizer.encode("\n\n".join(turn for q in bundled_questions() for turn in q.turns)))
    return (ids * (offset // max(1, len(ids)) + 1))[:offset]


def print_profile(profile, model=None) -> None:
    """c(w) per verify mode (engine overhead included, as the break-even math counts it), a*(k), best k,
    drafter costs; with the model, the plain step's memory bandwidth against the device's measured peak."""
    from specbench.cost import best_k, break_even_acceptance

    overhead = ", ".join(f"{m} {v:.2f}" for m, v in profile.overhead.items()) or "not measured"
    print(
        f"  plain step {1e3 * profile.plain_step_s:.2f} ms; c(w) = (verify forward + engine overhead) / plain step, "
        f"engine overhead (the engine's own time per speculative step) in plain steps: {overhead}"
    )
    if model is not None:
        from specbench.cost.bandwidth import achieved

        print(f"  plain decoding: {achieved(model, 1.0 / profile.plain_step_s).describe()}")
    print("  " + "w".rjust(4) + "".join(f"{m:>9s}" for m in profile.costs))
    for w in range(1, max(max(ws) for ws in profile.widths.values()) + 1):
        cells = [f"{profile.c(w, m):9.2f}" if w <= max(profile.widths[m]) else " " * 9 for m in profile.costs]
        print(f"  {w:4d}" + "".join(cells))
    for mode in profile.costs:
        max_k = min(8, max(profile.widths[mode]) - 1)
        a_star = break_even_acceptance(profile, 0.0, max_k, mode)
        print(
            f"  a*(k) {mode}: "
            + "  ".join(f"k={k} " + ("never" if a != a else f"{a:.2f}") for k, a in enumerate(a_star, 1))
        )
        best = [f"a={a} k={best_k(a, profile, 0.0, max_k, mode)[0]}" for a in (0.6, 0.7, 0.8, 0.9)]
        print(f"  best k {mode}: " + "  ".join(best))
    for name, entry in profile.drafters.items():
        print(f"  drafter {name}: d = {entry['d']:.4f} plain steps per draft token (k={entry['k']})")


# -- check-exact -------------------------------------------------------------------------------
@command("check-exact", "check that speculative greedy output equals mlx-lm's plain greedy output on this machine")
def _check_exact(parser: argparse.ArgumentParser):
    add_model_argument(parser, synthetic="random prompts")
    parser.add_argument(
        "--num-prompts", type=int, default=8, help="number of prompts (the bundled ones, or random ids)"
    )
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=200,
        help="tokens per run; enough to cross 256 cached tokens, where GPU attention kernels change",
    )
    parser.add_argument("--k", default="2,4,7,15", help="comma list of draft lengths, cycled over the prompts")
    parser.add_argument("--acceptance", type=float, default=0.8, help="per-position acceptance of the drafts")
    parser.add_argument("--verify", default="exact,fast", help="comma list of verify modes: exact, fast")
    parser.add_argument("--out", default=None, help="write the per-prompt rows here (parquet)")

    def run(args):
        from specbench.checks import exactness
        from specbench.common.files import write_or_keep, write_parquet_atomic
        from specbench.common.identity import device_name
        from specbench.models.load import load

        if args.num_prompts < 1:
            raise ValueError(f"--num-prompts must be >= 1, got {args.num_prompts}")
        if not 0.0 <= args.acceptance <= 1.0:
            raise ValueError(f"--acceptance must be in [0, 1], got {args.acceptance}")
        lengths = integers(args.k, "--k", positive=True)
        if not lengths:
            raise ValueError(f"--k takes a comma list of integers >= 1, got {args.k!r}")
        if args.max_tokens < 1:
            raise ValueError(f"--max-tokens must be >= 1, got {args.max_tokens}")
        modes = verify_modes(args.verify)
        if args.out:
            check_writable(args.out, name="--out")
        model, tokenizer = load(args.model, layers=args.layers, shard=args.shard)
        if tokenizer is None:
            prompts = exactness.random_prompts(model, args.num_prompts)
        else:
            from specbench.inputs.prompts import bundled_questions, render_prompt

            texts = [q.turns[0] for q in bundled_questions()]
            prompts = [render_prompt(tokenizer, texts[i % len(texts)]) for i in range(args.num_prompts)]
        print(
            f"checking {args.model} on {device_name()}: {len(prompts)} prompts x {args.max_tokens} tokens, "
            f"draft lengths {lengths}, acceptance {args.acceptance}"
        )
        rows = exactness.check(
            model,
            prompts,
            args.max_tokens,
            lengths,
            args.acceptance,
            modes,
            progress=lambda r: print(
                f"  prompt {r['prompt']} {r['mode']:5s} k={r['k']}: "
                + ("equal" if r["equal"] else f"differs from token {r['first_divergence']}")
            ),
        )
        summary = exactness.summarize(rows)
        for r in summary.iter_rows(named=True):
            where = (
                ""
                if r["first_divergence_min"] is None
                else f"; first divergence at token {r['first_divergence_min']} / {r['first_divergence_median']:g} / "
                f"{r['first_divergence_max']} (min / median / max)"
            )
            print(
                f"{r['mode']}: {r['equal']}/{r['prompts']} prompts equal to mlx-lm greedy{where}; "
                f"{r['accepted_per_verify']:.2f} drafts accepted per verification"
            )
        if args.out:
            print(f"rows: {write_or_keep(args.out, lambda path: write_parquet_atomic(rows, path), 'rows')}")
        exact = summary.filter(summary["mode"] == "exact")
        return 1 if len(exact) and int(exact["equal"][0]) < int(exact["prompts"][0]) else 0

    return run
