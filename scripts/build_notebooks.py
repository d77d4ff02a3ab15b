"""Write notebooks/*.ipynb from the cell sources below (the notebooks' source of truth).

    python scripts/build_notebooks.py           # rewrite every notebook
    python scripts/build_notebooks.py --check   # exit 1 if a notebook differs from its source

Notebooks hold no logic of their own: they call the library (specbench.sweep, .figures,
.render, .report, .cost, .plots, .bench) and show what it returns. Each has one cell tagged
``parameters`` (papermill) that ends with ``output_dir`` and ``progress``, which
``specbench report`` sets.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

NOTEBOOKS_DIR = Path(__file__).resolve().parents[1] / "notebooks"

KERNEL = {
    "kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"},
    "language_info": {"name": "python"},
}

REPORT_PARAMETERS = '''
output_dir = ""  # set by `specbench report`: figures, logs and tables are written under it
progress = True  # progress bars (the report turns them off)
'''


def md(text: str):
    return new_markdown_cell(textwrap.dedent(text).strip())


def code(*parts: str):
    return new_code_cell("\n".join(textwrap.dedent(p).strip() for p in parts))


def parameters(text: str):
    cell = code(textwrap.dedent(text).strip() + "\n" + REPORT_PARAMETERS.strip())
    cell.metadata["tags"] = ["parameters"]
    return cell


SETUP = '''
import polars as pl
from IPython.display import HTML, display

import specbench
from specbench.experiments import sweep
from specbench.report import figures, render
from specbench.experiments.capabilities import usable_drafters
from specbench.report.runner import Outputs
'''

# -- quickstart --------------------------------------------------------------------------------

QUICKSTART = [
    md("""
    # Quickstart: one speculative generation

    Load the embedded model (SmolLM2-135M-Instruct), generate once with a drafter, and look at
    what happened: the stats, the per-step log, and the output text with every token coloured by
    how it came.
    """),
    parameters('''
    model = "smollm2-135m"  # embedded name, local mlx-lm folder, Hugging Face id, or tiny:NAME
    drafter = "lookup"  # lookup, suffix, mtp
    policy = "fixed:4"  # auto, fixed:N, adaptive:N
    prompt = (
        "Fix the spelling mistakes in this paragraph and write it out again: The old lighthouse keeper climbed "
        "the spirral stairs every evening at dusk, carrying a lantern and a notebok. He wrote down the colour of "
        "the sky and the names of the ships that pased the point."
    )
    max_tokens = 64
    temperature = 0.0
    verify = ""  # "exact", "fast", or empty for the engine's default (exact when greedy)
    '''),
    code(SETUP, '''
    from specbench import DraftPolicy, GenerateOptions
    from specbench.experiments.capabilities import summary_table
    from specbench.experiments.prompts import render_prompt

    out = Outputs(output_dir, "quickstart")
    print(summary_table())
    '''),
    md("## Load the model"),
    code('''
    lm, tokenizer = sweep.load_model(model)
    prompt_ids = render_prompt(tokenizer, prompt)
    print(f"{model}: prompt of {len(prompt_ids)} tokens")
    '''),
    md("""
    ## Generate

    Plain decoding first (the reference, and the speed to beat), then speculative decoding with the
    chosen drafter and policy. Greedy speculative output must equal the plain output token for token.
    """),
    code('''
    factories, skipped = usable_drafters([drafter, "lookup"], lm, model)
    if drafter in skipped:
        out.skip(f"drafter {drafter}", skipped[drafter] + " (using lookup instead)")
        drafter = "lookup"
    options = GenerateOptions(max_tokens=max_tokens, temperature=temperature, seed=0, verify=verify or None)
    both = sweep.side_by_side(lm, tokenizer, prompt_ids, options, factories[drafter](), DraftPolicy.parse(policy))
    gen, plain = both.speculative, both.plain
    display(HTML(render.coloured_html(gen, tokenizer)))
    '''),
    md("## Stats\n\nDecode speeds are by the clock, from the first token (the prompt pass's) to the last."),
    code('''
    stats = both.stats()
    display(HTML(render.stats_html(stats)))
    print(f"plain decoding: {both.plain_tokens_per_s:.2f} tok/s; speculative: {both.speculative_tokens_per_s:.2f} tok/s; "
          f"speedup {both.speedup:.2f}x; output equal to plain: {both.equal}")
    print("token sources:", render.source_counts(gen))
    out.summary(drafter=drafter, policy=policy, tokens=stats["tokens"], acceptance_rate=stats["acceptance_rate"],
                tokens_per_verify=stats["tokens_per_verify"], speedup=both.speedup, equal_to_plain=both.equal)
    '''),
    md("## Per-step log\n\nOne record per step (`specbench.StepLog`), as a polars DataFrame; saved as parquet by the report."),
    code('''
    steps = gen.log.to_polars()
    out.log(gen.log, "speculative")
    out.log(plain.log, "plain")
    display(steps.select("step", "kind", "k_requested", "k_drafted", "accepted", "emitted", "verify_width",
                         (pl.col("verify_s") * 1e3).round(1).alias("verify_ms")).head(24))
    out.figure(figures.step_timeline(gen, title=f"{model}, {drafter} / {policy}: tokens per step"), "steps")
    '''),
]

# -- draft length sweep ------------------------------------------------------------------------

DRAFT_LENGTH_SWEEP = [
    md("""
    # Draft length sweep

    Every prompt is decoded plainly and then with each drafter and policy, in one run, so speedups
    are ratios measured side by side (decode tokens/s, prefill excluded). Greedy outputs are
    checked against plain decoding. Prompts: the project's bundled set (Spec-Bench's categories and
    prompt lookup's classic workloads) or any Spec-Bench-format `question.jsonl` (first turn).
    """),
    parameters('''
    model = "smollm2-135m"
    drafters = ["lookup", "suffix", "mtp"]
    policies = ["fixed", "adaptive", "auto"]  # fixed and adaptive at every draft length; auto picks its own
    draft_lengths = [1, 2, 4, 8]
    prompts = "bundled"  # or a path to a Spec-Bench-format question.jsonl
    categories = []  # empty: every category
    prompts_per_category = 1
    max_prompt_tokens = 0  # 0: no limit; long prompts are slow to prefill on a CPU
    max_tokens = 64
    verify = ""  # "exact", "fast", or empty for the engine's default (exact when greedy)
    '''),
    code(SETUP, '''
    out = Outputs(output_dir, "draft_length_sweep")
    lm, tokenizer = sweep.load_model(model)
    prompt_set = sweep.prompts_from(prompts, tokenizer, categories or None, prompts_per_category,
                                    max_prompt_tokens=max_prompt_tokens or None)
    specs = sweep.policy_specs(policies, draft_lengths)
    display(sweep.prompt_table(prompt_set))
    print("policies:", ", ".join(specs))
    '''),
    md("## Run the sweep"),
    code('''
    result = sweep.run_sweep(lm, tokenizer, prompt_set, drafters, specs, max_tokens=max_tokens, verify=verify or None,
                             model_name=model, progress=progress)
    for name, reason in result.skipped.items():
        out.skip(f"drafter {name}", reason)
    out.table(result.runs, "runs")
    out.log(result.steps, "steps")
    summary = result.summary(["drafter", "policy"])
    display(summary.select("drafter", "policy", "runs", "speedup", "tokens_per_verify", "mean_accepted_tokens",
                           "acceptance_rate", "all_equal_to_plain"))
    '''),
    md("## Speedup and tokens per verification against draft length"),
    code('''
    out.figure(figures.speedup_vs_k(summary, title=f"{model}: speedup over plain decoding vs draft length"), "speedup_vs_k")
    out.figure(figures.accepted_vs_k(summary, title=f"{model}: tokens per verification vs draft length"), "accepted_vs_k")
    '''),
    md("""
    ## Per-position acceptance

    The probability that draft position i is accepted given positions 1..i-1 were (at the longest
    fixed draft length, and for auto).
    """),
    code('''
    longest = [f"fixed:{max(draft_lengths)}", f"adaptive:{max(draft_lengths)}", "auto"]
    positions = result.per_position(["drafter", "policy"]).filter(pl.col("policy").is_in(longest))
    out.figure(figures.per_position(positions, title=f"{model}: per-position acceptance"), "per_position")
    '''),
    md("## By prompt category\n\nEach drafter's best policy per category."),
    code('''
    by_category = sweep.summarise(result.runs, ["category", "drafter", "policy"])
    best = sweep.best_per_group(by_category, ["category", "drafter"])
    display(best.select("category", "drafter", "policy", "speedup", "tokens_per_verify").sort("category", "drafter"))
    out.figure(figures.category_speedups(best, title=f"{model}: speedup by category (best policy per drafter)"),
               "category_speedups")
    overall = sweep.best_per_group(summary.filter(pl.col("drafter") != "none"), [])
    equal = summary["all_equal_to_plain"].drop_nulls()
    out.summary(prompts=len(prompt_set), runs=len(result.runs),
                best=f"{overall['drafter'][0]} {overall['policy'][0]}" if len(overall) else "none",
                best_speedup=overall["speedup"][0] if len(overall) else None,
                outputs_equal_to_plain=bool(equal.all()) if len(equal) else None)
    '''),
]

# -- break-even --------------------------------------------------------------------------------

BREAK_EVEN = [
    md("""
    # Break-even: verify cost, dense vs MoE

    c(w) is the time of a width-w verification over the time of one plain decode step. With
    per-position acceptance a, a draft of k tokens yields E(k) = 1 + a + ... + a^k tokens per
    verification and speeds decoding up by S(k) = E(k) / (c(k+1) + k d) (d: the drafter's cost per
    token). a*(k), where S = 1, is the acceptance a drafter needs to pay off. In a dense model a
    verify reads the weights once; in an MoE model each row routes to other experts, so c(w) grows
    faster and a*(k) is higher.
    """),
    parameters('''
    dense_model = "smollm2-135m"  # or a synthetic shape, e.g. "synthetic:qwen3-8b-4bit"
    moe_model = "smollm2-135m-moe"  # the embedded MoE twin; or e.g. "synthetic:qwen3-30b-a3b-4bit"; empty: dense only
    widths = 9  # measure c(w) for widths 1 to this
    verify_modes = ["fast", "exact"]
    repeats = 5
    offset = 256  # tokens in the cache while timing
    drafter_cost = 0.0  # d, in plain steps per draft token, for the a*(k) curves
    acceptances = [0.3, 0.6, 0.9]  # the measured grid: controlled-acceptance drafter
    draft_lengths = [2, 4]
    grid_max_tokens = 32
    grid_prompt_tokens = 16
    '''),
    code(SETUP, '''
    out = Outputs(output_dir, "break_even")
    if out.needs("cost_profiles", "cost_figures", section="break-even curves"):
        from specbench import cost
        from specbench.report import plots
    '''),
    md("## Cost profiles: c(w)"),
    code('''
    profiles, models = [], {}
    if out.needs("cost_profiles", "cost_figures", section="cost profiles"):
        modes = [m for m in verify_modes if m in cost.available_modes()]
        for name in [m for m in (dense_model, moe_model) if m]:
            try:
                lm, _ = sweep.load_model(name)
            except (FileNotFoundError, ValueError) as err:
                out.skip(f"model {name}", str(err))
                continue
            profile = cost.measure(lm, widths=widths, verify=modes, offset=offset, repeats=repeats, warmup=1)
            profile.name = name
            profiles.append(profile)
            models[name] = lm
            out.table(profile.to_polars(), f"profile-{name.replace(':', '_')}")
            print(f"{name}: plain step {1e3 * profile.plain_step_s:.1f} ms; c(w) fast: "
                  + " ".join(f"{c:.2f}" for c in profile.costs[modes[0]]))
        if not moe_model:
            out.skip("MoE curves", "no moe_model given (set moe_model, e.g. smollm2-135m-moe or a synthetic MoE shape)")
    if profiles:
        out.figure(plots.verify_costs(profiles), "verify_costs")
    '''),
    md("## Break-even acceptance a*(k)"),
    code('''
    if profiles:
        out.figure(plots.break_even(profiles, d=drafter_cost, k_max=widths - 1), "break_even")
        for p in profiles:
            a_star = cost.break_even_acceptance(p, drafter_cost, widths - 1)
            out.summary(**{f"{p.name} c(2)": p.c(2), f"{p.name} c({widths})": p.c(widths),
                           f"{p.name} a*(4)": float(a_star[3]) if len(a_star) > 3 else None})
    '''),
    md("""
    ## Measured speedups over the predicted curves

    A controlled-acceptance drafter proposes the model's own greedy continuation and corrupts each
    position with probability 1 - a; speedups are measured against plain decoding in the same run.
    """),
    code('''
    if profiles and out.needs("speedup_grid", "drafter:oracle", section="measured speedup grid"):
        rows = []
        for p in profiles:
            rows += cost.speedup_grid(models[p.name], p, acceptances=acceptances, ks=draft_lengths,
                                      verify=[m for m in verify_modes if m in p.costs][0],
                                      prompt_len=grid_prompt_tokens, max_tokens=grid_max_tokens)
        grid = pl.DataFrame(rows)
        out.table(grid, "speedup_grid")
        display(grid.select("name", "mode", "a", "k", "speedup", "predicted_nominal", "error_nominal"))
        out.figure(plots.measured_vs_predicted(rows, {p.name: p for p in profiles}), "measured_vs_predicted")
        out.summary(mean_abs_prediction_error=float(grid["error_nominal"].abs().mean()))
    '''),
]

# -- agent traces ------------------------------------------------------------------------------

AGENT_TRACES = [
    md("""
    # Agent traces

    Agents resend their whole history every turn and repeat tool calls, file contents and earlier
    answers. Each trace is replayed turn by turn: the model writes every reply (greedy), plain
    decoding first and then each drafter on the same prompt; the next turn's prompt holds the reply.
    SuffixDecoding keeps its store across turns. Every drafter must reproduce plain decoding's
    output on every turn.
    """),
    parameters('''
    model = "smollm2-135m"
    traces = ["chat-revision"]  # bundled trace names, trace files, or "bundled" for all
    max_turns = 0  # 0: every turn
    drafters = ["suffix", "lookup", "mtp"]
    policy = "auto"
    max_tokens = 64
    verify = ""  # "exact", "fast", or empty for the engine's default (exact when greedy)
    '''),
    code(SETUP, '''
    from specbench import GenerateOptions

    out = Outputs(output_dir, "agent_traces")
    ready = out.needs("traces", "trace_bench", section="agent traces")
    if ready:
        from specbench.experiments.bench import run_trace

        lm, tokenizer = sweep.load_model(model)
        trace_list = sweep.load_trace_list(traces)
        factories, skipped = usable_drafters(drafters, lm, model)
        for name, reason in skipped.items():
            out.skip(f"drafter {name}", reason)
        print(", ".join(f"{t.id} ({len(t)} turns)" for t in trace_list))
    '''),
    md("## Replay"),
    code('''
    if ready:
        run = run_trace(lm, tokenizer, trace_list, drafters=list(factories), policies=[policy],
                        options=GenerateOptions(max_tokens=max_tokens, verify=verify or None), turns=max_turns or None,
                        model_name=model, progress=progress)
        results = run.results
        turns = sweep.trace_turns(results)
        out.table(turns, "turns")
        for r in results:
            out.log(r.steps, f"steps-{r.trace}")
        summary = run.summary
        display(summary.select("trace", "method", "turns", "tokens", "tokens_per_verify", "acceptance_rate",
                               "tokens_per_s", "speedup", "identical"))
    '''),
    md("## Per turn: acceptance and speedup; tokens saved over the session"),
    code('''
    if ready:
        display(turns.select("trace", "turn", "drafter", "prompt_tokens", "tokens", "tokens_per_verify", "speedup",
                             "cum_speedup", "identical"))
        out.figure(figures.per_turn(turns, title=f"{model}: per-turn acceptance and speedup"), "per_turn")
        out.figure(figures.cumulative_saved(turns, title=f"{model}: forward passes saved over the session"),
                   "cumulative_saved")
        final = summary.filter(pl.col("method") != "plain")
        out.summary(traces=len(results), identical=bool(summary["identical"].all()),
                    **{f"{m} speedup": s for m, s in zip(final["method"], final["speedup"])},
                    **{f"{m} tokens/verify": s for m, s in zip(final["method"], final["tokens_per_verify"])})
    '''),
]

# -- sampling ----------------------------------------------------------------------------------

SAMPLING = [
    md("""
    # Sampling: acceptance vs temperature, and losslessness

    With sampling, a draft token x is accepted with probability min(1, p(x)/q(x)), and a rejection
    samples from the residual max(0, p - q): the output is distributed exactly as plain sampling's.
    Acceptance falls as the temperature rises (the model's own choice becomes less predictable).
    """),
    parameters('''
    model = "smollm2-135m"
    drafters = ["lookup", "suffix", "mtp"]
    policy = "fixed:4"
    temperatures = [0.0, 0.5, 1.0]
    prompts = "bundled"
    categories = ["repeated_paragraph", "natural_text"]
    prompts_per_category = 1
    max_prompt_tokens = 0
    max_tokens = 48
    seeds = [0]
    lossless_drafter = "lookup"
    lossless_prompt = "one two three four five, one two three four five, one two three four five, one two"
    lossless_temperature = 1.0
    lossless_samples = 32
    lossless_tokens = 8
    permutations = 2000
    verify = ""  # "exact", "fast", or empty for the engine's default (exact when greedy)
    '''),
    code(SETUP, '''
    from specbench.experiments.prompts import render_prompt

    out = Outputs(output_dir, "sampling")
    lm, tokenizer = sweep.load_model(model)
    prompt_set = sweep.prompts_from(prompts, tokenizer, categories or None, prompts_per_category,
                                    max_prompt_tokens=max_prompt_tokens or None)
    display(sweep.prompt_table(prompt_set))
    '''),
    md("## Acceptance vs temperature"),
    code('''
    result = sweep.run_sweep(lm, tokenizer, prompt_set, drafters, [policy], max_tokens=max_tokens,
                             temperatures=temperatures, seeds=seeds, verify=verify or None, model_name=model,
                             progress=progress)
    for name, reason in result.skipped.items():
        out.skip(f"drafter {name}", reason)
    out.table(result.runs, "runs")
    out.log(result.steps, "steps")
    summary = result.summary(["drafter", "policy", "temperature"])
    display(summary.select("drafter", "policy", "temperature", "acceptance_rate", "tokens_per_verify", "speedup"))
    out.figure(figures.acceptance_vs_temperature(summary, title=f"{model}: acceptance and speedup vs temperature"),
               "acceptance_vs_temperature")
    positions = result.per_position(["drafter", "temperature"])
    out.figure(figures.per_position(positions, title=f"{model}: per-position acceptance by temperature"),
               "per_position")
    '''),
    md("""
    ## Losslessness check

    Many short samples plainly and speculatively (different seeds), their pooled token histograms
    compared by a permutation test of the chi-square statistic over whole samples. A lossless
    sampler gives p-values spread uniformly over [0, 1]; a biased one gives small p-values as the
    samples grow.
    """),
    code('''
    factories, skipped = usable_drafters([lossless_drafter], lm, model)
    if lossless_drafter in skipped:
        out.skip("losslessness check", skipped[lossless_drafter])
    else:
        check = sweep.losslessness_check(
            lm, tokenizer, render_prompt(tokenizer, lossless_prompt, chat=False), drafter=lossless_drafter,
            policy=policy, temperature=lossless_temperature, samples=lossless_samples, max_tokens=lossless_tokens,
            permutations=permutations, model_name=model, progress=progress,
        )
        display(check.counts)
        out.table(check.counts, "lossless_counts")
        out.figure(figures.token_histograms(check), "lossless_histograms")
        out.summary(lossless_p_value=check.p_value, lossless_tvd=check.tvd,
                    lossless_acceptance=check.acceptance_rate)
    '''),
]

# -- explorer ----------------------------------------------------------------------------------

EXPLORER = [
    md("""
    # Explorer

    Pick a model, drafter, policy, draft length, temperature and prompt, press **Generate**, and
    watch the output arrive coloured by token source; the stats and a per-step plot follow. The
    controls need a live kernel (JupyterLab); in a static report the run below stands in.
    """),
    parameters('''
    models = ["smollm2-135m"]  # the first is selected
    drafter = "lookup"
    policy = "auto"  # auto, fixed, adaptive
    k = 4
    temperature = 0.0
    prompt = "Write a Python function that adds two numbers, then call it three times."
    max_tokens = 64
    verify = ""  # "exact", "fast", or empty for the engine's default (exact when greedy)
    '''),
    code(SETUP, '''
    from specbench.report.explorer import Explorer

    out = Outputs(output_dir, "explorer")
    app = Explorer(models=models, drafter=drafter, policy=policy, k=k, temperature=temperature, prompt=prompt,
                   max_tokens=max_tokens, verify=verify)
    app.show()
    '''),
    md("## One run with the settings above"),
    code('''
    gen = app.run()
    if gen is None:
        out.skip("explorer run", app.status.value)
    else:
        display(HTML(app.text.value))
        display(HTML(app.stats.value))
        out.log(gen.log, "explorer")
        out.figure(app.figure, "steps")
        out.summary(tokens=gen.stats()["tokens"], acceptance_rate=gen.stats()["acceptance_rate"])
    '''),
]

NOTEBOOKS = {
    "quickstart": QUICKSTART,
    "draft_length_sweep": DRAFT_LENGTH_SWEEP,
    "break_even": BREAK_EVEN,
    "agent_traces": AGENT_TRACES,
    "sampling": SAMPLING,
    "explorer": EXPLORER,
}


def build(name: str) -> nbformat.NotebookNode:
    nb = new_notebook(cells=NOTEBOOKS[name], metadata=dict(KERNEL))
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"{name.replace('_', '-')}-{i}"
    return nb


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="report notebooks that differ from their source")
    args = parser.parse_args()
    stale = []
    for name in NOTEBOOKS:
        path = NOTEBOOKS_DIR / f"{name}.ipynb"
        text = nbformat.writes(build(name)) + "\n"
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path}")
    if stale:
        print(f"out of date: {', '.join(stale)} (run python scripts/build_notebooks.py)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
