"""`specbench` command line: each subcommand parses, calls the library, prints."""

from __future__ import annotations

import argparse
import sys
from typing import Callable

COMMANDS: dict[str, Callable[[argparse.Namespace], int | None]] = {}


def command(name: str, help: str):
    """Register ``fn(args)`` as subcommand ``name``; ``fn.configure(parser)`` adds its arguments."""

    def wrap(configure: Callable[[argparse.ArgumentParser], Callable]):
        COMMANDS[name] = (help, configure)
        return configure

    return wrap


# -- setup -------------------------------------------------------------------------------------
@command("setup", "convert the embedded models into the cache directory (SPECBENCH_HOME)")
def _setup(parser: argparse.ArgumentParser):
    parser.add_argument("--force", action="store_true", help="rebuild even if a complete build exists")

    def run(args):
        from specbench.models.load import setup

        for path in setup(force=args.force):
            print(f"ready: {path}")

    return run


# -- generate ----------------------------------------------------------------------------------
@command("generate", "generate text from a prompt, speculatively or plainly, and print its stats")
def _generate(parser: argparse.ArgumentParser):
    parser.add_argument("--model", default="smollm2-135m", help="short name, local folder or mlx-lm id")
    parser.add_argument("--prompt", required=True)
    parser.add_argument("--drafter", default="lookup", help="lookup, suffix, mtp or none")
    parser.add_argument("--policy", default="auto", help="auto, fixed:N or adaptive:N")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--temp", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--min-p", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--verify", choices=["exact", "fast"], default=None)
    parser.add_argument("--raw", action="store_true", help="do not apply the chat template")
    parser.add_argument("--log", default=None, help="write the per-step log here (parquet)")

    def run(args):
        from specbench import GenerateOptions, load, speculative_generate
        from specbench.drafters import make_drafter
        from specbench.core.policies import DraftPolicy
        from specbench.experiments.prompts import render_prompt

        policy = DraftPolicy.parse(args.policy)
        model, tokenizer = load(args.model)
        drafter = make_drafter(args.drafter, model=model, model_name=args.model)
        prompt = render_prompt(tokenizer, args.prompt, chat=not args.raw)
        options = GenerateOptions(
            max_tokens=args.max_tokens, temperature=args.temp, top_p=args.top_p, top_k=args.top_k,
            min_p=args.min_p, seed=args.seed, verify=args.verify,
        )
        gen = speculative_generate(model, prompt, options, drafter, policy if drafter else None, tokenizer=tokenizer)
        for _ in gen:
            pass
        print(gen.text())
        print()
        print_stats(gen.stats())
        print_step_summary(gen.log)
        if args.log:
            print(f"log: {gen.log.save(args.log)}")

    return run


# -- bench -------------------------------------------------------------------------------------
def _names(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


@command("bench", "benchmark drafters and policies against mlx-lm on prompt sets (--prompts) or traces (--trace)")
def _bench(parser: argparse.ArgumentParser):
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompts", help="a Spec-Bench/MT-bench question.jsonl, or 'bundled' for the project's prompts")
    source.add_argument("--trace", help="a trace file to replay turn by turn")
    parser.add_argument("--model", default="smollm2-135m", help="short name, local folder or mlx-lm id")
    parser.add_argument("--drafters", "--drafter", default="lookup,suffix", help="comma list: lookup, suffix, mtp")
    parser.add_argument("--policies", "--policy", default="auto,fixed:4", help="comma list: auto, fixed:N, adaptive:N")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=1, help="timed runs of every method per prompt")
    parser.add_argument("--out", default=None, help="folder for parquet, table and figure (resumes there)")
    parser.add_argument("--categories", default=None, help="prompts: comma list of categories to run")
    parser.add_argument("--limit", type=int, default=None, help="prompts: at most N questions per category")
    parser.add_argument("--draft-model", default=None, help="prompts: also run mlx-lm's draft-model speculation")
    parser.add_argument("--num-draft-tokens", type=int, default=2, help="prompts: mlx-lm's draft length")
    parser.add_argument("--verify", default=None, help="prompts: comma list of exact, fast (default: the engine's)")
    parser.add_argument("--fresh", action="store_true", help="prompts: start over instead of resuming in --out")
    parser.add_argument("--turns", type=int, default=None, help="trace: replay only the first N turns of each trace")
    parser.add_argument("--trace-format", default=None,
                        help="trace: trace, openai, sharegpt, tau-bench, swe-agent or questions (default: detected)")
    parser.add_argument("--share-store", action="store_true",
                        help="trace: keep each drafter (SuffixDecoding's store) across the file's traces")

    def run(args):
        if args.trace is not None:
            return _bench_trace(args)
        from specbench import load
        from specbench.experiments.bench import bench_prompts
        from specbench.experiments.prompts import questions_from

        categories = _names(args.categories) if args.categories else None
        questions = questions_from(args.prompts, categories, args.limit)
        model, tokenizer = load(args.model)
        draft_model = load(args.draft_model)[0] if args.draft_model else None
        result = bench_prompts(
            model, tokenizer, questions, drafters=_names(args.drafters), policies=_names(args.policies),
            max_tokens=args.max_tokens, repeats=args.repeats, draft_model=draft_model,
            num_draft_tokens=args.num_draft_tokens, verify=_names(args.verify) if args.verify else (None,),
            model_name=args.model, out=args.out, fresh=args.fresh,
        )
        print()
        print(result.table())
        if args.out:
            print(f"\nresults: {args.out}")

    return run


def _bench_trace(args):
    """``bench --trace``: replay traces turn by turn, plain decoding against each drafter."""
    from specbench import GenerateOptions, load
    from specbench.experiments.bench import format_turns, run_trace

    verify = _names(args.verify) if args.verify else []
    if len(verify) > 1:
        raise ValueError("--trace takes one --verify mode (exact or fast)")
    model, tokenizer = load(args.model)
    options = GenerateOptions(max_tokens=args.max_tokens, verify=verify[0] if verify else None)
    result = run_trace(
        model, tokenizer, args.trace, drafters=_names(args.drafters), policies=_names(args.policies),
        max_tokens=args.max_tokens, options=options, turns=args.turns, out=args.out, format=args.trace_format,
        share_store=args.share_store, model_name=args.model,
    )
    print()
    print(format_turns(result.turns))
    print()
    print(result.table())
    if not result.identical:
        print("\nWARNING: some drafter output differed from plain decoding (see the 'identical' column)")
    if args.out:
        print(f"\nresults: {args.out}")
    return 0 if result.identical else 1


# -- mtp: train-mtp, extract-mtp ----------------------------------------------------------------
@command("train-mtp", "train an MTP head for a frozen model by self-distillation (offline data)")
def _train_mtp(parser: argparse.ArgumentParser):
    parser.add_argument("--model", default="smollm2-135m", help="short name, local folder or mlx-lm id")
    parser.add_argument("--out", required=True, help="folder for mtp.safetensors (the head) and mtp.json (recipe, metrics)")
    parser.add_argument("--quick", action="store_true", help="a short smoke run (tiny data, 30 steps)")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--time-budget", type=float, default=None, help="seconds of training (the schedule follows time)")
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--seq-len", type=int, default=None)
    parser.add_argument("--dtype", default=None, help="the frozen model's dtype: float32, bfloat16 or float16 (default: float32 on CPU, as stored elsewhere)")
    parser.add_argument("--seed", type=int, default=0)

    def run(args):
        from specbench import load
        from specbench.experiments.mtp_training import TrainConfig, summary_lines, train_mtp

        config = TrainConfig.quick() if args.quick else TrainConfig()
        for key, value in (("steps", args.steps), ("time_budget_s", args.time_budget), ("batch_size", args.batch_size),
                           ("seq_len", args.seq_len)):
            if value is not None:
                setattr(config, key, value)
        config.seed = args.seed
        model, tokenizer = load(args.model, dtype=args.dtype)
        result = train_mtp(model, tokenizer, args.out, config, model_name=args.model)
        print("\n".join(summary_lines(result)))
        print(f"head: {args.out}/{result['head']}  (attach with specbench.attach_mtp(model, path))")

    return run


@command("extract-mtp", "write only the MTP tensors of a checkpoint (folder, file or Hugging Face id) to a small file")
def _extract_mtp(parser: argparse.ArgumentParser):
    parser.add_argument("src", help="checkpoint folder (sharded with model.safetensors.index.json), .safetensors file or hub id")
    parser.add_argument("dst", help="output .safetensors file (or a folder: DST/mtp.safetensors)")

    def run(args):
        from specbench.models.mtp import extract_mtp

        path = extract_mtp(args.src, args.dst)
        print(f"wrote {path}")

    return run


# -- profile (verify-cost profiles) -------------------------------------------------------------
@command("profile", "measure a model's verify cost c(w) and break-even acceptance, and store the profile")
def _profile(parser: argparse.ArgumentParser):
    parser.add_argument("--model", default="smollm2-135m",
                        help="short name, local folder, mlx-lm id, or synthetic:NAME (e.g. synthetic:qwen3-8b-4bit)")
    parser.add_argument("--widths", type=int, default=16, help="measure verification widths 1..W")
    parser.add_argument("--verify", default="fast,exact", help="comma list of verify modes: fast, exact")
    parser.add_argument("--offset", type=int, default=512, help="tokens in the cache while timing")
    parser.add_argument("--repeats", type=int, default=10, help="timed rounds (medians kept)")
    parser.add_argument("--drafters", default="", help="comma list of drafters to time: lookup, suffix, mtp")
    parser.add_argument("--layers", type=int, default=None, help="synthetic models: number of layers")
    parser.add_argument("--no-save", action="store_true", help="print only; do not store under SPECBENCH_HOME")
    parser.add_argument("--plot", default=None, help="folder for costs.png and break_even.png")

    def run(args):
        from specbench.cost import profile as cost
        from specbench.drafters import make_drafter

        modes = _names(args.verify)
        unknown = [m for m in modes if m not in cost.VERIFY_MODES]
        if unknown or not modes:
            raise ValueError(f"--verify takes a comma list of {', '.join(cost.VERIFY_MODES)}, got {args.verify!r}")
        if args.widths < 2:
            raise ValueError(f"--widths must be >= 2 (a verification of k drafts has width k + 1), got {args.widths}")
        unavailable = [m for m in modes if m not in cost.available_modes()]
        for m in unavailable:
            print(f"note: verify mode {m!r} is not available here; skipped")
        modes = [m for m in modes if m not in unavailable]
        model, tokenizer = _profile_model(args.model, args.layers)
        drafters = [d for d in (make_drafter(n, model=model, model_name=args.model) for n in _names(args.drafters)) if d]
        context = _profile_context(tokenizer, args.offset)
        print(f"profiling {cost.display_name(model)} on {cost.device_name()}: widths 1..{args.widths}, "
              f"verify {', '.join(modes)}, cache offset {args.offset}")
        profile = cost.measure(model, widths=args.widths, verify=modes, offset=args.offset, repeats=args.repeats,
                               drafters=drafters, context=context, progress=lambda text: print(f"  {text}"))
        print_profile(profile)
        if not args.no_save:
            print(f"profile: {cost.save_profile(profile)}")
        if args.plot:
            from pathlib import Path

            from specbench.report import plots

            folder = Path(args.plot)
            print(f"figure: {plots.save(plots.verify_costs([profile]), folder / 'costs.png')}")
            print(f"figure: {plots.save(plots.break_even([profile], k_max=args.widths - 1), folder / 'break_even.png')}")

    return run


def _profile_model(name: str, layers: int | None):
    from specbench.models import synthetic

    if name.startswith(synthetic.PREFIX):
        return synthetic.build(name, layers=layers), None
    if layers is not None:
        raise ValueError("--layers applies to synthetic:NAME models only")
    from specbench import load

    model, tokenizer = load(name)
    model.specbench_name = name
    return model, tokenizer


def _profile_context(tokenizer, offset: int) -> list[int] | None:
    """Natural text (the bundled prompts) for timing drafters; None (random ids) without a tokenizer."""
    if tokenizer is None:
        return None
    from specbench.experiments.prompts import bundled_questions

    ids = list(tokenizer.encode("\n\n".join(turn for q in bundled_questions() for turn in q.turns)))
    return (ids * (offset // max(1, len(ids)) + 1))[:offset]


def print_profile(profile) -> None:
    """c(w) per verify mode, the engine overhead, a*(k), best k, drafter costs."""
    from specbench.cost import profile as cost

    print(f"  plain step {1e3 * profile.plain_step_s:.2f} ms; c(w) = verify time / plain step "
          f"(engine overhead per speculative step: "
          f"{', '.join(f'{m} {v:.2f}' for m, v in profile.overhead.items()) or 'not measured'})")
    print("  " + "w".rjust(4) + "".join(f"{m:>9s}" for m in profile.costs))
    for w in range(1, max(max(ws) for ws in profile.widths.values()) + 1):
        cells = [f"{profile.c(w, m, overhead=False):9.2f}" if w <= max(profile.widths[m]) else " " * 9 for m in profile.costs]
        print(f"  {w:4d}" + "".join(cells))
    for mode in profile.costs:
        k_max = min(8, max(profile.widths[mode]) - 1)
        a_star = cost.break_even_acceptance(profile, 0.0, k_max, mode)
        print(f"  a*(k) {mode}: " + "  ".join(f"k={k} " + ("never" if a != a else f"{a:.2f}") for k, a in enumerate(a_star, 1)))
        best = [f"a={a} k={cost.best_k(a, profile, 0.0, k_max, mode)[0]}" for a in (0.6, 0.7, 0.8, 0.9)]
        print(f"  best k {mode}: " + "  ".join(best))
    for name, entry in profile.drafters.items():
        print(f"  drafter {name}: d = {entry['d']:.4f} plain steps per draft token (k={entry['k']})")


# -- check-exact -------------------------------------------------------------------------------
@command("check-exact", "check that speculative greedy output equals mlx-lm's plain greedy output on this machine")
def _check_exact(parser: argparse.ArgumentParser):
    parser.add_argument("--model", default="smollm2-135m",
                        help="short name, local folder, mlx-lm id, or synthetic:NAME (random prompts)")
    parser.add_argument("--prompts", type=int, default=8, help="number of prompts (the bundled ones, or random ids)")
    parser.add_argument("--max-tokens", type=int, default=200,
                        help="tokens per run; enough to cross 256 cached tokens, where GPU attention kernels change")
    parser.add_argument("--draft-lengths", default="2,4,7,15", help="comma list, cycled over the prompts")
    parser.add_argument("--acceptance", type=float, default=0.8, help="per-position acceptance of the drafts")
    parser.add_argument("--verify", default="exact,fast", help="comma list of verify modes: exact, fast")
    parser.add_argument("--layers", type=int, default=None, help="synthetic models: number of layers")
    parser.add_argument("--out", default=None, help="write the per-prompt rows here (parquet)")

    def run(args):
        from specbench.experiments import exactness
        from specbench.cost.profile import device_name
        from specbench.common.files import write_parquet_atomic

        if args.prompts < 1:
            raise ValueError(f"--prompts must be >= 1, got {args.prompts}")
        if not 0.0 <= args.acceptance <= 1.0:
            raise ValueError(f"--acceptance must be in [0, 1], got {args.acceptance}")
        try:
            lengths = [int(k) for k in _names(args.draft_lengths)]
        except ValueError:
            raise ValueError(f"--draft-lengths takes a comma list of integers, got {args.draft_lengths!r}") from None
        model, tokenizer = _profile_model(args.model, args.layers)
        if tokenizer is None:
            prompts = exactness.random_prompts(model, args.prompts)
        else:
            from specbench.experiments.prompts import bundled_questions, render_prompt

            texts = [q.turns[0] for q in bundled_questions()]
            prompts = [render_prompt(tokenizer, texts[i % len(texts)]) for i in range(args.prompts)]
        print(f"checking {args.model} on {device_name()}: {len(prompts)} prompts x {args.max_tokens} tokens, "
              f"draft lengths {lengths}, acceptance {args.acceptance}")
        rows = exactness.check(
            model, prompts, args.max_tokens, lengths, args.acceptance, _names(args.verify),
            progress=lambda r: print(f"  prompt {r['prompt']} {r['mode']:5s} k={r['k']}: "
                                     + ("equal" if r["equal"] else f"differs from token {r['first_divergence']}")),
        )
        summary = exactness.summarize(rows)
        for r in summary.iter_rows(named=True):
            where = ("" if r["first_divergence_min"] is None else
                     f"; first divergence at token {r['first_divergence_min']} / {r['first_divergence_median']:g} / "
                     f"{r['first_divergence_max']} (min / median / max)")
            print(f"{r['mode']}: {r['equal']}/{r['prompts']} prompts equal to plain greedy{where}; "
                  f"{r['accepted_per_verify']:.2f} drafts accepted per verification")
        if args.out:
            print(f"rows: {write_parquet_atomic(rows, args.out)}")
        exact = summary.filter(summary["mode"] == "exact")
        return 1 if len(exact) and int(exact["equal"][0]) < int(exact["prompts"][0]) else 0

    return run


# -- report ------------------------------------------------------------------------------------
@command("report", "execute the notebooks with papermill into reports/NAME (HTML, figures, logs, index.html)")
def _report(parser: argparse.ArgumentParser):
    from specbench.report.runner import NOTEBOOKS, PROFILES

    parser.add_argument("--profile", choices=list(PROFILES), default="full",
                        help="quick: seconds, tiny models (CI); full: the embedded model, < 30 min on a 2-core CPU")
    parser.add_argument("--out", default=None, help="output folder (default reports/PROFILE)")
    parser.add_argument("-p", "--param", action="append", default=[], metavar="KEY=VALUE",
                        help="set a notebook parameter (every notebook that has it; NOTEBOOK.KEY=VALUE for one); "
                        "lists as a,b,c")
    parser.add_argument("--only", action="append", default=None, choices=list(NOTEBOOKS), metavar="NOTEBOOK",
                        help=f"run only this notebook (repeatable): {', '.join(NOTEBOOKS)}")
    parser.add_argument("--force", action="store_true", help="run notebooks again even if they finished")
    parser.add_argument("--notebooks", default=None, metavar="DIR",
                        help="folder of the notebooks (default: notebooks/ of the source checkout)")

    def run(args):
        from specbench.report.runner import parse_assignments, run_report

        result = run_report(args.profile, args.out, parse_assignments(args.param), args.only, args.force,
                            notebooks=args.notebooks)
        print(f"report: {result.index}")
        for r in result.results:
            print(f"  {r.notebook:20s} {r.status:8s} {r.seconds:7.0f} s  {r.error}")
        return 1 if result.failed else 0

    return run


def print_stats(stats: dict) -> None:
    keys = [
        "tokens", "finish_reason", "steps", "verifies", "drafted", "accepted", "pauses",
        "acceptance_rate", "mean_accepted_tokens", "tokens_per_verify", "decode_tokens_per_s",
        "prefill_s", "draft_s", "verify_s",
    ]
    for key in keys:
        value = stats.get(key)
        print(f"  {key:22s} {value:.3f}" if isinstance(value, float) else f"  {key:22s} {value}")


def print_step_summary(log, rows: int = 12) -> None:
    """A few lines: how steps went (kind, drafted, accepted, emitted)."""
    records = log.records
    if not records:
        return
    print(f"  steps (first {min(rows, len(records))} of {len(records)}): kind k_drafted accepted emitted ms")
    for r in records[:rows]:
        ms = 1000 * (r["draft_s"] + r["verify_s"] + r["other_s"])
        print(f"    {r['step']:4d} {r['kind']:7s} {r['k_drafted']:3d} {r['accepted']:3d} {r['emitted']:3d} {ms:8.1f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="specbench", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    runners = {}
    for name, (help_text, configure) in COMMANDS.items():
        runners[name] = configure(sub.add_parser(name, help=help_text, description=help_text))
    args = parser.parse_args(argv)
    try:
        return int(runners[args.command](args) or 0)
    except (ValueError, FileNotFoundError) as err:
        print(f"specbench {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
