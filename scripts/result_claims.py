"""The project's claims: each result under reports/ that RESULTS.md and the README state, its one metric, where it
is read and what code it measures (``scripts.result_lines.Claim``). A new run adds its claim here before it
runs; a run that replaces a file marks the claim it overwrote (``overwritten``)."""

from __future__ import annotations

from typing import Any

from scripts.result_lines import CODE, Claim, Csv, Json, Text

H200 = "NVIDIA H200, MLX CUDA (mlx 0.32.4, mlx-lm 0.32.2)"
H100 = "NVIDIA H100, MLX CUDA (mlx 0.32.4, mlx-lm 0.32.2)"
CPU = "This CPU (2 cores, mlx[cpu], SmolLM2-135M in float32)"

G = "gpu-h200/"
KERNELS = (*CODE,)
BENCH = (*CODE, "specbench/bench", "specbench/drafters")
DRAFTERS = (*CODE, "specbench/drafters", "specbench/train", "scripts/gpu/draft_training.py")
OVERWRITTEN_8B = "the second run's numbers (claim exact-speed-dense-2)"


def _default_policy(key: str, folder: str, model: str, what: str, metric: str, aa: str, headline: str = "") -> Claim:
    """A run of scripts/gpu/default_policy.py: its pooled row ``metric`` (Auto over plain, seconds), its A/A row."""
    pooled = f"{G}default-policy/{folder}/pooled.csv"
    return Claim(
        key=key,
        machine=H200,
        what=what,
        metric=f"Auto / plain tokens/s, pooled: {metric}",
        file=pooled,
        read=Csv({"model": model, "what": metric}, "ratio", "low", "high", "n"),
        fmt="{:.3f}",
        n_what="pairs",
        measures=BENCH,
        provenance=f"{G}default-policy/{folder}/default_policy.json",
        aa=Csv({"model": model, "what": aa}, "ratio", "low", "high", "n"),
        headline=headline,
    )


def _exact_speed(key: str, file: str, shape: str, cell: str, what: str, **more: Any) -> Claim:
    """A cell of scripts/gpu/exact_speed.py: its speedup over specbench plain (median over repeats)."""
    rows = ("shapes", shape, "rows", cell)
    return Claim(
        key=key,
        machine=H200,
        what=what,
        metric=f"{cell} / plain tokens/s, median over repeats",
        file=G + file,
        read=Json((*rows, "speedup"), interval=(*rows, "interval"), n=(*rows, "ratios")),
        aa=Json(
            ("shapes", shape, "a_a", "ratio"), ("shapes", shape, "a_a", "interval"), n=("shapes", shape, "a_a", "n")
        ),
        fmt="{:.2f}x",
        n_what="repeats",
        measures=KERNELS,
        **more,
    )


def _exactness(
    key: str, file: str, model: str, what: str, mode: str = "exact", folder: str = G, machine: str = H200, **more: Any
) -> Claim:
    """A row of scripts/gpu/exactness.py's summary: prompts whose output equals mlx-lm greedy."""
    return Claim(
        key=key,
        machine=machine,
        what=what,
        metric=f"prompts whose {mode} output equals mlx-lm greedy",
        file=folder + file,
        read=Json(("exactness", {"model": model, "mode": mode}, "equal")),
        fmt="{:.0f}",
        n_what="prompts",
        **more,
    )


def _passed(key: str, file: str, what: str, folder: str = G, machine: str = H200, **more: Any) -> Claim:
    """A GPU test log: the tests that passed (its ``what`` says how many failed)."""
    return Claim(
        key=key,
        machine=machine,
        what=what,
        metric="tests passed",
        file=folder + file,
        read=Text(r"^=*\s*(?:\d+ failed, )?(?P<value>\d+) passed"),  # with failures first when there are
        fmt="{:.0f}",
        **more,
    )


def _batch(key: str, file: str, model: str, what: str, **more: Any) -> Claim:
    """A batch grid of scripts/gpu/components.py: the mean |residual| of measured against predicted speedup."""
    return Claim(
        key=key,
        machine=H200,
        what=what,
        metric="mean |measured - predicted| / predicted speedup, every cell",
        file=G + file,
        read=Json(("batch_mean_abs_error", model, "all"), scale=100.0),
        fmt="{:.1f} %",
        measures=BENCH,
        **more,
    )


def _stack(key: str, file: str, model: str, what: str, **more: Any) -> Claim:
    """The component stack of scripts/gpu/components.py: the largest |parts' sum - measured step| over widths."""
    return Claim(
        key=key,
        machine=H200,
        what=what,
        metric="largest |parts' sum - measured step| / step over widths 1-16",
        file=G + file,
        read=Json(("components", model, "max_abs_error"), n=5, scale=100.0),
        fmt="{:.1f} %",
        n_what="widths",
        **more,
    )


#: The headline re-measured on one machine by one protocol fixed before the run (scripts/gpu/exact_speed.py's
#: docstring: one random prompt per shape, 128 tokens, 6 repeats, every repeat kept; the Auto verdict rule
#: ``auto_verdict``), with the long-context check and its audit (scripts/gpu/long_context.py --audit 1). Commands:
#: ``python3 -m scripts.gpu.exact_speed --shapes qwen3-8b --out $OUT/dense`` (then qwen3-30b-a3b into moe; the
#: defaults: 4-bit, full depth, k = 8, acceptances 1, 0.7 and 0.3), ``python3 -m scripts.gpu.long_context --audit 1``
#: and ``pytest -m gpu tests/kernels tests/core``.
HEADLINE = "gpu-h100/headline-5f988ad/"
#: The runs before it, stale (their code changed since), kept in RESULTS.md under keys ending in their commit; the
#: README states today's. At b9f8b49 the MoE's run was stopped by its 330 s limit before its cells
#: (moe-timed-out.txt); at 333cc65 the session's GPU time ran out after the dense run.
EARLIER = {"gpu-h100/headline-333cc65/": "-333cc65", "gpu-h100/headline/": "-b9f8b49"}
SHAPES = {"dense": ("qwen3-8b", "Qwen3-8B"), "moe": ("qwen3-30b-a3b", "Qwen3-30B-A3B")}
#: The shapes whose headline run has not been made yet.
PENDING: set[str] = set()
#: The long-context runs (scripts/gpu/long_context.py --audit 1, 32 tokens, k = 4, acceptance 0.8), as (file, shape,
#: prompt sizes, what else): at b9f8b49 the 4k prompt (its 16k ran out of GPU memory in calibration's probes; 32k and
#: the MoE were not reached), at 333cc65 16k alone (what the session's GPU time allowed), at 5f988ad every length and
#: shape in three calls (--lengths 4096,32768 and 16384 dense, 4096,16384,32768 MoE), but the MoE's 32k prompt: there
#: mlx-lm's own greedy reference ran out of GPU memory in its prefill (long_context-moe-32k-oom.txt).
LONG_CONTEXT = (
    ("gpu-h100/headline/long_context.json", "dense", "4k", " (the run's 16k prompt ran out of GPU memory)"),
    ("gpu-h100/headline-333cc65/long_context.json", "dense", "16k", ""),
    (HEADLINE + "long_context-dense-4k-32k.json", "dense", "4k and 32k", ""),
    (HEADLINE + "long_context-dense-16k.json", "dense", "16k", ""),
    (
        HEADLINE + "long_context-moe-4k-16k.json",
        "moe",
        "4k and 16k",
        " (at 32k mlx-lm's greedy reference ran out of the H100's memory in its prefill)",
    ),
)


def _headline_aa(shape: str) -> Json:
    """The run's A/A arm (plain against plain), which every headline claim of the shape carries."""
    at = ("shapes", shape, "a_a")
    return Json((*at, "ratio"), (*at, "interval"), n=(*at, "n"))


def _headline_cell(name: str, cell: str, what: str, headline: str = "", run: str = HEADLINE) -> Claim:
    shape, label = SHAPES[name]
    rows = ("shapes", shape, "rows", cell)
    return Claim(
        key=f"headline-{name}-{cell.replace(' ', '-').replace('=', '')}{_tag(run)}",
        machine=H100,
        what=f"{what}, full-depth {label} shape 4-bit, 128 tokens, 6 repeats",
        metric=f"{cell} / plain tokens/s, median over repeats",
        file=f"{run}{name}/exact_speed.json",
        read=Json((*rows, "speedup"), interval=(*rows, "interval"), n=(*rows, "ratios")),
        aa=_headline_aa(shape),
        fmt="{:.2f}x",
        n_what="repeats",
        headline=headline if run == HEADLINE else "",
        pending=name in PENDING and run == HEADLINE,
    )


def _headline_ratio(
    name: str, ratio: str, n: str, key: str, what: str, metric: str, headline: str, run: str = HEADLINE
) -> Claim:
    """A ratio the run states beside its cells (``exact_over_fast``, ``plain_over_mlx_lm``), ``n`` its repeats."""
    shape, label = SHAPES[name]
    at = ("shapes", shape, ratio)
    return Claim(
        f"headline-{name}-{key}{_tag(run)}",
        H100,
        what.format(label=label),
        metric,
        f"{run}{name}/exact_speed.json",
        Json((*at, "ratio"), interval=(*at, "interval"), n=(*at, n)),
        aa=_headline_aa(shape),
        n_what="repeats",
        pending=name in PENDING and run == HEADLINE,
        headline=headline.format(label=label) if run == HEADLINE else "",
    )


def _tag(run: str) -> str:
    """An earlier run's claims keep their keys with its commit (``EARLIER``): ``-b9f8b49``."""
    return EARLIER.get(run, "")


def _headline(name: str, run: str = HEADLINE) -> list[Claim]:
    label = SHAPES[name][1]
    return [
        *(
            _headline_cell(
                name,
                f"auto exact a={a}",
                f"the default (Auto, exact verification) against plain decoding, oracle drafter at acceptance {a}",
                headline=f"H100 {label} 4-bit, Auto (exact) over plain at acceptance {a}",
                run=run,
            )
            for a in ("1", "0.7", "0.3")
        ),
        _headline_cell(name, "exact k=8", "exact verification, fixed k = 8, perfect drafter", run=run),
        _headline_cell(name, "fast k=8", "fast verification, fixed k = 8, perfect drafter", run=run),
        _headline_ratio(
            name,
            "exact_over_fast",
            "ratios",
            "exact-over-fast",
            "exact against fast verification end to end, fixed k = 8, perfect drafter, full-depth {label} 4-bit",
            "exact / fast seconds per token, median over repeats",
            "H100 {label} 4-bit, exact / fast verify, seconds per token (k = 8)",
            run,
        ),
        _headline_ratio(
            name,
            "plain_over_mlx_lm",
            "repeats",
            "plain-vs-mlx-lm",
            "specbench plain against mlx-lm generate_step, full-depth {label} 4-bit, 128 tokens",
            "specbench / mlx-lm tokens/s, median over repeats",
            "H100 {label} 4-bit, specbench plain / mlx-lm tokens/s",
            run,
        ),
    ]


def _long_context(file: str, name: str, sizes: str, more: str) -> list[Claim]:
    """A long-context run (``LONG_CONTEXT``): its exact generations equal to mlx-lm greedy, then its audit."""
    label = SHAPES[name][1]
    now = file.startswith(HEADLINE)
    short = sizes.replace(" and ", "+")
    tag = f"{name}-{sizes.replace(' and ', '-')}{_tag(file.rsplit('/', 1)[0] + '/')}"
    equal = Claim(
        f"headline-long-context-{tag}",
        H100,
        f"exact output against mlx-lm greedy after {sizes}-token random prompts, {label} shape 4-bit, full depth, "
        f"32 tokens, k = 4, acceptance 0.8{more}",
        "exact generations equal to mlx-lm greedy",
        file,
        Json(("exact_equal",)),
        fmt="{:.0f}",
        n_what="generations",
        headline=f"H100 {label} 4-bit, {short} prompts: exact output equal to mlx-lm greedy" if now else "",
    )
    audit = Claim(
        f"headline-long-context-audit-{tag}",
        H100,
        "the same generations, every exact verification compared with serial steps (--audit 1)",
        "audited verifications that differ from serial steps",
        file,
        Json(("audit_mismatches",)),
        fmt="{:.0f}",
        n_what="verifications",
        headline=f"H100 {label} 4-bit, {short} prompts: audited verifies unlike serial steps" if now else "",
    )
    return [equal, audit]


CLAIMS: list[Claim] = [
    # -- the headline (HEADLINE): Auto, exact against fast and plain against mlx-lm, then long contexts
    *_headline("dense"),
    *_headline("moe"),
    *(claim for run in EARLIER for claim in _headline("dense", run)),
    *(claim for run in LONG_CONTEXT for claim in _long_context(*run)),
    _passed(
        "headline-pytest-gpu",
        "pytest-gpu.txt",
        "GPU tests: kernels against their references, sampling by position, batched exact verification (45 run: 2 "
        "failed, both where the attention kernel's probe for bfloat16 at head dimension 64 failed to launch: the log)",
        folder="gpu-h100/headline/",
        machine=H100,
        provenance="gpu-h100/headline/pytest-gpu.json",
    ),
    # -- verification's cost per width and how far from the memory bound (scripts/gpu/kernel_verify.py --widths
    # 1-9,12,16 --shape SHAPE: 10 timings a width at 256 cached tokens; the peak: the device's measured copy bandwidth)
    *(
        Claim(
            f"kernels-{shape}-{field.replace('_', '-')}-w{w}",
            H100,
            f"a width-{w} {mode} verify forward, full-depth {label} shape 4-bit, 256 cached tokens",
            metric,
            f"gpu-h100/kernels/kernel_widths-{shape}-4bit.json",
            Json(("widths", {"width": w}, field), n=("repeats",)),
            fmt=fmt,
            n_what="timings",
            measures=KERNELS,
        )
        for shape, label in (("qwen3-8b", "Qwen3-8B"), ("qwen3-30b-a3b", "Qwen3-30B-A3B"))
        for field, mode, metric, fmt in (
            ("c_exact", "exact", "c(w): seconds over a width-1 forward's, median", "{:.2f}"),
            ("exact_peak_fraction", "exact", "weight and cache bytes read per second over the peak, median", "{:.1%}"),
        )
        for w in (1, 9)
        if not (field == "c_exact" and w == 1)
    ),
    # -- exact batches (scripts/gpu/batch.py --exact: 6 repeats, A/A in every cell; stopped at 140 s before B = 32)
    *(
        Claim(
            f"batch-exact-over-fast-b{b}",
            H100,
            f"exact against fast batched speculation, B = {b}, oracle drafter at acceptance 0.8, k = 3, 32 tokens, "
            "full-depth Qwen3-8B shape 4-bit",
            "exact / fast milliseconds per step, median over repeats",
            "gpu-h100/batch/batch_exact.json",
            Json(("rows", {"batch_size": b}, "exact_over_fast"), ("rows", {"batch_size": b}, "interval"), n=6),
            aa=Json(
                ("rows", {"batch_size": b}, "a_a", "ratio"),
                ("rows", {"batch_size": b}, "a_a", "interval"),
                n=("rows", {"batch_size": b}, "a_a", "n"),
            ),
            n_what="repeats",
            measures=KERNELS,
        )
        for b in (1, 4, 16)
    ),
    Claim(
        "batch-exact-equal-b16",
        H100,
        "exact batched speculation, B = 16 (as above): requests whose tokens equal their own mlx-lm greedy",
        "requests equal to mlx-lm greedy",
        "gpu-h100/batch/batch_exact.json",
        Json(("rows", {"batch_size": 16}, "exact_equal"), n=("rows", {"batch_size": 16}, "batch_size")),
        fmt="{:.0f}",
        n_what="requests",
        measures=KERNELS,
    ),
    # -- the default policy (scripts/gpu/default_policy.py), 128 tokens or more per run
    _default_policy(
        "auto-dense-128",
        "dense-128",
        "qwen3-8b-4bit",
        "Auto (exact when greedy) against plain where Auto fell back, dense Qwen3-8B shape 4-bit, 6 pairs x 128 tokens",
        "Auto fell back",
        "A/A (plain against plain)",
    ),
    _default_policy(
        "auto-dense-a05-a09",
        "followup-128/dense-a05-a09",
        "qwen3-8b-4bit",
        "the same, dense shape, a in {0.5, 0.7, 0.9}, 12 pairs x 256 tokens",
        "Auto fell back",
        "A/A (plain against plain)",
    ),
    *(
        _default_policy(
            f"auto-moe-{call}",
            f"followup-moe/{call}",
            "qwen3-30b-a3b-4bit",
            f"the same, MoE Qwen3-30B-A3B shape 4-bit ({what})",
            "Auto fell back",
            "A/A (plain against plain)",
        )
        for call, what in (
            ("call-1", "first call, 4 pairs x 128 tokens"),
            ("call-2", "second call, 8 pairs x 153 tokens"),
            ("a03-exact-fast", "a = 0.3 exact and fast, 20 pairs x 136 tokens"),
        )
    ),
    *(
        _default_policy(
            f"auto-embedded-{drafter}-{folder.rsplit('/', 1)[-1]}",
            folder,
            "smollm2-135m",
            f"Auto with {drafter} against plain, embedded SmolLM2-135M, {what}, every prompt and trace",
            f"{drafter}/auto, every prompt and trace",
            "plain (A/A), every prompt and trace",
        )
        for folder, what in (
            ("embedded-128/qa-math-rag", "qa, math, rag, 3 repeats x 128 tokens"),
            ("embedded-128/translation-multi-turn-summarization", "translation, multi-turn, summarization"),
            ("embedded-128/repeated-natural-traces", "repeated paragraph, natural text, traces"),
            ("followup-128/embedded-translation-multi-turn", "translation, multi-turn, 8 repeats x 128 tokens"),
        )
        for drafter in ("lookup", "suffix")
    ),
    # -- the engine and the prompt benchmark (scripts/gpu/bench.py)
    Claim(
        "engine-vs-mlx-lm",
        H200,
        "specbench plain against mlx-lm stream_generate, embedded SmolLM2-135M, 128 tokens (min-max over rounds, "
        "no interval)",
        "specbench / mlx-lm decode tokens/s, median over rounds",
        G + "bench/engine_speed.json",
        Json(("speed", "decode_ratio", "median"), n=5),
        fmt="{:.3f}",
        n_what="rounds",
        measures=BENCH,
    ),
    Claim(
        "bench-lookup-auto",
        H200,
        "prompt lookup under Auto against mlx-lm plain, 9 bundled questions x 128 tokens, 1 repeat",
        "lookup/auto / mlx-lm plain tokens/s, every question",
        G + "bench/prompt_bench.md",
        Text(r"^\| lookup/auto \| [\d.]+ \| [\d.]+ \| (?P<value>[\d.]+)x .*\| (?P<n>\d+)/\d+ \|$"),
        fmt="{:.2f}x",
        n_what="questions",
        measures=BENCH,
        provenance=G + "bench/engine_speed.json",
    ),
    Claim(
        "bench-repeated-lookup",
        H200,
        "prompt lookup fixed:4 against mlx-lm plain, repeated paragraph and natural text, 1 question each",
        "lookup/fixed:4 / mlx-lm plain tokens/s, both questions",
        G + "bench-repeated/prompt_bench.md",
        Text(r"^\| lookup/fixed:4 \| [\d.]+ \| [\d.]+ \| (?P<value>[\d.]+)x .*\| (?P<n>\d+)/\d+ \|$"),
        fmt="{:.2f}x",
        n_what="questions",
        measures=BENCH,
        provenance=G + "bench-repeated/engine_speed.json",
    ),
    # -- exact verification with the kernels, per call (scripts/gpu/kernel_verify.py)
    Claim(
        "kernel-verify-dense-1",
        H200,
        "exact verify per call at 9 rows with the row-invariant kernel, full-depth Qwen3-8B 4-bit (2026-12-02)",
        "exact / fast seconds per 9-row verify",
        G + "kernels/kernel_verify-qwen3-8b-4bit.json",
        Json(("seconds", "exact")),
        overwritten="the third run's numbers (claim kernel-verify-dense)",
    ),
    Claim(
        "kernel-verify-moe-1",
        H200,
        "exact verify per call at 9 rows with the kernels, full-depth Qwen3-30B-A3B 4-bit (2026-12-03, first run)",
        "exact / fast seconds per 9-row verify",
        G + "kernels/kernel_verify-qwen3-30b-a3b-4bit.json",
        Json(("seconds", "exact")),
        overwritten="the third run's numbers (claim kernel-verify-moe)",
    ),
    *(
        Claim(
            f"kernel-verify-{name}",
            H200,
            f"exact verify per call at 9 rows after the host-time fix, full-depth {shape} 4-bit, 256 cached tokens",
            "exact verify ms per 9-row call (fast mode's in the file beside it)",
            G + file,
            Json(("seconds", "exact"), n=repeats, scale=1e3),
            fmt="{:.2f} ms",
            n_what="repeats",
        )
        for name, shape, file, repeats in (
            ("dense", "Qwen3-8B", "kernels/kernel_verify-qwen3-8b-4bit.json", 10),
            ("moe", "Qwen3-30B-A3B", "kernels/kernel_verify-qwen3-30b-a3b-4bit.json", 8),
        )
    ),
    Claim(
        "kernel-levels-host",
        H200,
        "exact verify at 9 rows, attention/kernel+linear/kernel, graph built inside the clock, before the "
        "host-time fix, full-depth Qwen3-8B 4-bit",
        "ms per 9-row verify",
        G + "kernels/kernel_levels-qwen3-8b-before-host-fix.txt",
        Text(r"attention/kernel\+linear/kernel\s+(?P<value>[\d.]+)"),
        fmt="{:.2f} ms",
        provenance=G + "kernels/kernel_levels-qwen3-8b-4bit-before-host-fix.json",
    ),
    # -- exact verification with the kernels, end to end (scripts/gpu/exact_speed.py)
    _exact_speed(
        "exact-speed-dense-1",
        "kernels/exact_speed.json",
        "qwen3-8b",
        "exact k=8",
        "exact k = 8, perfect drafter, full-depth Qwen3-8B 4-bit, 128 tokens (2026-12-03, first run)",
        overwritten=OVERWRITTEN_8B,
    ),
    _exact_speed(
        "exact-speed-dense-2",
        "kernels/exact_speed.json",
        "qwen3-8b",
        "exact k=8",
        "exact k = 8, perfect drafter, full-depth Qwen3-8B 4-bit, 128 tokens, after the host-time fix",
    ),
    _exact_speed(
        "exact-speed-dense-2-fast",
        "kernels/exact_speed.json",
        "qwen3-8b",
        "fast k=8",
        "the same run's fast k = 8",
    ),
    _exact_speed(
        "exact-speed-dense-2-auto",
        "kernels/exact_speed.json",
        "qwen3-8b",
        "auto exact a=1",
        "the same run's Auto (exact), acceptance 1",
    ),
    _exact_speed(
        "exact-speed-dense-2-auto-low",
        "kernels/exact_speed.json",
        "qwen3-8b",
        "auto exact a=0.3",
        "the same run's Auto (exact), acceptance 0.3",
    ),
    _exact_speed(
        "exact-speed-dense-3",
        "kernels/exact_speed-qwen3-8b-one-row.json",
        "qwen3-8b",
        "exact k=8",
        "exact k = 8, the third run (plain steps through the one-row kernels chosen per call: a slowed plain)",
    ),
    _exact_speed(
        "exact-speed-dense-3-mlx-lm",
        "kernels/exact_speed-qwen3-8b-one-row.json",
        "qwen3-8b",
        "mlx-lm",
        "the third run's mlx-lm cell: mlx-lm over that slowed plain",
    ),
    _exact_speed(
        "exact-speed-moe",
        "kernels/exact_speed-qwen3-30b-a3b.json",
        "qwen3-30b-a3b",
        "exact k=8",
        "exact k = 8, perfect drafter, full-depth Qwen3-30B-A3B 4-bit, 96 tokens",
    ),
    _exact_speed(
        "exact-speed-moe-fast",
        "kernels/exact_speed-qwen3-30b-a3b.json",
        "qwen3-30b-a3b",
        "fast k=8",
        "the same run's fast k = 8",
    ),
    Claim(
        "plain-one-row",
        H200,
        "a plain step through the one-row kernels, full-depth Qwen3-8B 4-bit (diagnosis run, not kept as a script)",
        "ms per pipelined plain step with the kernels",
        G + "kernels/plain-one-row.txt",
        Text(r"with the three faster kernels (?P<value>[\d.]+) ms"),
        fmt="{:.2f} ms",
    ),
    *(
        Claim(
            f"plain-vs-mlx-lm-{name}",
            H200,
            f"specbench plain against mlx-lm generate_step, full-depth {shape} 4-bit, 128 tokens, rule fixed before",
            "specbench / mlx-lm tokens/s, median over repeats",
            G + f"plain-vs-mlx-lm/{file}",
            Json(
                ("shapes", key, "plain_over_mlx_lm", "ratio"),
                interval=("shapes", key, "plain_over_mlx_lm", "interval"),
                n=("shapes", key, "plain_over_mlx_lm", "repeats"),
            ),
            fmt="{:.2f}",
            n_what="repeats",
        )
        for name, shape, file, key in (
            ("dense", "Qwen3-8B", "exact_speed.json", "qwen3-8b"),
            ("moe", "Qwen3-30B-A3B", "exact_speed-moe.json", "qwen3-30b-a3b"),
        )
    ),
    # -- exactness (scripts/gpu/exactness.py)
    *(
        _exactness(
            f"exactness-h100-{model}-{mode}",
            "exactness/summary.json",
            model,
            f"exact verification ({'token trees' if 'tree' in mode else 'paths'}), {shape}, 4 layers, oracle drafts "
            "partly accepted, k 2/4/7/15",
            mode=mode,
            folder="gpu-h100/",
            machine=H100,
        )
        for i, (model, shape, mode) in enumerate(
            (m, shape, mode)
            for m, shape in (
                ("qwen3-8b-bf16-4l", "Qwen3-8B shape bf16"),
                ("qwen3-30b-a3b-4bit-4l", "Qwen3-30B-A3B shape 4-bit"),
                ("qwen3-8b-4bit-4l", "Qwen3-8B shape 4-bit"),
                ("qwen3-30b-a3b-bf16-4l", "Qwen3-30B-A3B shape bf16"),
            )
            for mode in ("exact", "exact-tree")
        )
    ),
    _exactness(
        "exactness-kernels-moe",
        "exactness-kernels/exactness_summary.json",
        "qwen3-30b-a3b-4bit-4l",
        "exact verification with the kernel levels, Qwen3-30B-A3B shape 4-bit, 4 layers, 128 tokens, k 2/4/7/15",
    ),
    _exactness(
        "exactness-kernels-dense-bf16",
        "exactness-kernels/exactness_summary.json",
        "qwen3-8b-bf16-4l",
        "the same, Qwen3-8B shape bf16",
    ),
    _exactness(
        "exactness-kernels-dense-4bit",
        "exactness-kernels/exactness_summary.json",
        "qwen3-8b-4bit-4l",
        "the same, Qwen3-8B shape 4-bit",
    ),
    _exactness(
        "exactness-kernels-moe-bf16",
        "exactness-kernels/exactness_summary.json",
        "qwen3-30b-a3b-bf16-4l",
        "the same, Qwen3-30B-A3B shape bf16",
    ),
    *(
        _exactness(
            f"exactness-full-depth-{name}",
            f"exactness-full-depth/exactness_{name}_summary.json",
            model,
            f"exact verification at full depth with the kernel levels, {what}, paths k 3/7, 128 tokens",
        )
        for name, model, what in (
            ("4bit", "qwen3-8b-4bit", "Qwen3-8B 4-bit"),
            ("bf16", "qwen3-8b-bf16", "Qwen3-8B bf16"),
            ("moe4", "qwen3-30b-a3b-4bit", "Qwen3-30B-A3B 4-bit"),
            ("moe_bf16", "qwen3-30b-a3b-bf16", "Qwen3-30B-A3B bf16"),
        )
    ),
    *(
        _exactness(
            f"exactness-full-depth-{name}-tree",
            f"exactness-full-depth/exactness_{name}_summary.json",
            model,
            f"the same, token trees, {what}",
            mode="exact-tree",
        )
        for name, model, what in (
            ("4bit", "qwen3-8b-4bit", "Qwen3-8B 4-bit"),
            ("bf16", "qwen3-8b-bf16", "Qwen3-8B bf16"),
            ("moe4", "qwen3-30b-a3b-4bit", "Qwen3-30B-A3B 4-bit"),
            ("moe_bf16", "qwen3-30b-a3b-bf16", "Qwen3-30B-A3B bf16"),
        )
    ),
    *(
        _exactness(f"exactness-session5-{name}", "exactness-session5/summary.json", model, f"{what}, 4 layers")
        for name, model, what in (
            ("dense", "qwen3-8b-4bit-4l", "exact verification, Qwen3-8B shape 4-bit"),
            ("moe", "qwen3-30b-a3b-4bit-4l", "exact verification, Qwen3-30B-A3B shape 4-bit"),
        )
    ),
    Claim(
        "exactness-4-layers-bf16",
        H200,
        "exact verification with the kernel levels, Qwen3-8B shape bf16, 4 layers, 20 prompts x 128 tokens",
        "prompts whose exact output equals mlx-lm greedy",
        G + "kernels/exactness-4-layers.txt",
        Text(r"^qwen3-8b-bf16-4l\s+bfloat16\s+exact\s+(?P<value>\d+)/(?P<n>\d+)"),
        fmt="{:.0f}",
        n_what="prompts",
        provenance=G + "kernels/exactness-4-layers.json",
    ),
    *(
        _exactness(f"exactness-restructured-{model}", "restructured-engine/summary.json", model, what)
        for model, what in (
            ("qwen3-8b-4bit-4l", "exact verification after the restructuring into layers, Qwen3-8B 4-bit, 4 layers"),
            ("qwen3-30b-a3b-4bit-4l", "the same, Qwen3-30B-A3B 4-bit"),
            ("qwen3-8b-bf16-4l", "the same, Qwen3-8B bf16"),
            ("qwen3-30b-a3b-bf16-4l", "the same, Qwen3-30B-A3B bf16"),
        )
    ),
    *(
        _exactness(f"exactness-default-{model}", "exactness-default/summary.json", model, what)
        for model, what in (
            ("qwen3-8b-4bit-4l", "exact verification, cuDNN attention off, Qwen3-8B 4-bit, 4 layers"),
            ("qwen3-30b-a3b-bf16-4l", "the same, Qwen3-30B-A3B bf16, 4 layers"),
            ("smollm2-135m", "the same, SmolLM2-135M"),
            ("qwen3-8b-4bit", "the same, Qwen3-8B 4-bit, full depth"),
        )
    ),
    # -- the kernels' tests and microbenchmarks
    _passed(
        "pytest-kernels-1",
        "kernels/pytest-gpu-kernels.txt",
        "GPU tests of the kernels (2026-12-03)",
        overwritten="the log of 2026-12-04's run (claim pytest-kernels)",
    ),
    _passed(
        "pytest-kernels", "kernels/pytest-gpu-kernels.txt", "GPU tests of the kernels after the launchers' refactor"
    ),
    _passed(
        "pytest-session5", "kernels/pytest-gpu-all-session5.txt", "GPU tests (2026-12-04, fifth session; 4 errors)"
    ),
    _passed("pytest-trees", "trees/pytest_gpu_new.txt", "new GPU tests: trees, batches, draft model, early exit"),
    Claim(
        "attention-kernel",
        H200,
        "the attention kernel, Qwen3-8B shape (32 heads, 8 KV heads, D = 128, bf16), 9 rows at 256 keys",
        "us per 9-row call (9 one-query MLX calls beside it in the file)",
        G + "kernels/attention_kernel.json",
        Json(("speed", {"n_keys": 256, "head_dim": 128, "dtype": "bfloat16", "vectors_per_warp": 4}, "kernel_9_us")),
        fmt="{:.1f} us",
    ),
    Claim(
        "qmv-kernel-gate-up",
        H200,
        "the quantized kernel alone, Qwen3-8B gate/up (4-bit, group 64, bf16), 9 rows",
        "us per 9-row call (MLX's invariant 7 + 2-row calls beside it in the file)",
        G + "kernels/kernels.json",
        Json(("speed", {"layer": "8b gate/up"}, "kernel_9_us")),
        fmt="{:.1f} us",
    ),
    Claim(
        "kernels-per-layer",
        H200,
        "the kernel per layer with its schedules, Qwen3-8B q/o projection, 9 rows",
        "us per 9-row call, kernel loop, graph built inside the clock",
        G + "kernels/kernels-per-layer.txt",
        Text(r"^8b q/o\s+9\s+[\d.]+/\s*[\d.]+\s+\d+\s+[\d.]+/\s*[\d.]+\s+\d+\s+(?P<value>[\d.]+)/"),
        fmt="{:.1f} us",
    ),
    Claim(
        "verify-calls-split",
        H200,
        "exact verify per call at 9 rows with linear layers split 7 + 2, dense Qwen3-8B 4-bit, before the kernels",
        "exact / fast seconds per 9-row verify",
        G + "default-policy/a-a-shapes/verify_calls.csv",
        Csv({"shape": "qwen3-8b-4bit", "width": "9"}, "exact_over_fast"),
        fmt="{:.2f}x",
        provenance=G + "default-policy/a-a-shapes/default_policy.json",
    ),
    # -- cost models, components and batches
    *(
        Claim(
            f"cost-c8-{name}",
            H200,
            f"verify cost c(8) in plain steps, fast, {shape} 4-bit",
            "c(8): seconds of an 8-row verify / a plain step",
            G + "cost/costs.csv",
            Csv({"name": f"synthetic:{model}", "mode": "fast", "width": "8"}, "c"),
        )
        for name, shape, model in (
            ("dense", "Qwen3-8B", "qwen3-8b-4bit"),
            ("moe", "Qwen3-30B-A3B", "qwen3-30b-a3b-4bit"),
        )
    ),
    Claim(
        "break-even-dense",
        H200,
        "break-even acceptance a*(k = 8), fast, dense Qwen3-8B 4-bit",
        "a*(8)",
        G + "cost/break_even.csv",
        Csv({"name": "synthetic:qwen3-8b-4bit", "mode": "fast", "k": "8"}, "a_star"),
    ),
    Claim(
        "cost-hybrid",
        H200,
        "verify cost c(8) of a hybrid (Qwen3.5-9B-like: gated delta net + attention), 4-bit, fast",
        "c(8): seconds of an 8-row verify / a plain step",
        G + "hybrid-profile/costs.csv",
        Csv({"name": "synthetic:qwen3.5-9b-4bit", "mode": "fast", "width": "8"}, "c"),
    ),
    Claim(
        "grid-dense-exact",
        H200,
        "measured a x k grid, exact verify, dense Qwen3-8B 4-bit: speedup at a = 0.7, k = 4",
        "speculative / plain tokens/s",
        G + "cost-grid-dense-moe/grid.csv",
        Csv({"name": "synthetic:qwen3-8b-4bit", "mode": "exact", "a": "0.7", "k": "4"}, "speedup"),
        fmt="{:.2f}x",
    ),
    _stack("stack-dense-1", "components/summary.json", "qwen3-8b-4bit", "verify cost by component, dense (2026-12-03)"),
    _stack("stack-moe-1", "components/summary.json", "qwen3-30b-a3b-4bit", "the same, MoE"),
    _stack("stack-dense-3", "components/stack-run3/summary_components.json", "qwen3-8b-4bit", "stack by phase, dense"),
    _stack(
        "stack-dense-4", "components/stack-run4/summary.json", "qwen3-8b-4bit", "stack after the stand-ins' fix, dense"
    ),
    _stack("stack-moe-4", "components/stack-run4/summary.json", "qwen3-30b-a3b-4bit", "the same, MoE"),
    _stack("stack-hybrid-4", "components/stack-run4/summary.json", "qwen3.5-9b-4bit", "the same, hybrid"),
    _stack("stack-dense-5", "components/stack-run5/summary_dense_moe.json", "qwen3-8b-4bit", "confirmation run, dense"),
    _stack("stack-moe-5", "components/stack-run5/summary_dense_moe.json", "qwen3-30b-a3b-4bit", "the same, MoE"),
    _batch("batch-grid-2", "components/batch-run2/summary.json", "qwen3-8b-4bit", "batch grid, dense, run 2"),
    _batch("batch-grid-4", "components/batch-run4/summary.json", "qwen3-8b-4bit", "after the overhead fixes, dense"),
    _batch(
        "batch-grid-5-dense",
        "components/batch-run5/summary_dense.json",
        "qwen3-8b-4bit",
        "after each timed run got a warm-up of its own kind, dense, B in {1, 4, 16, 32} (rule: <= 10 %)",
    ),
    _batch("batch-grid-5-moe", "components/batch-run5/summary_moe.json", "qwen3-30b-a3b-4bit", "the same, MoE"),
    *(
        _batch(f"batch-grid-6-moe-{part}", f"components/batch-run6/summary_moe_{part}.json", "qwen3-30b-a3b-4bit", what)
        for part, what in (
            ("a", "MoE grid after untimed full-length runs, call a (B = 1, 4)"),
            ("b", "the same, call b"),
            ("c", "the same, call c"),
        )
    ),
    *(
        _batch(f"batch-grid-7-dense-{part}", f"components/batch-run7/summary_dense_{part}.json", "qwen3-8b-4bit", what)
        for part, what in (("a", "dense grid with the MoE grid's protocol, call a"), ("b", "the same, call b"))
    ),
    Claim(
        "batch-c8-dense",
        H200,
        "c(w = 8, B = 1), dense Qwen3-8B 4-bit, full depth",
        "c(8, 1): seconds of an 8-row verify / a plain step",
        G + "batch/batch_costs.csv",
        Csv({"model": "synthetic:qwen3-8b-4bit", "batch_size": "1", "width": "8"}, "c"),
        measures=BENCH,
    ),
    # -- drafters, trees, traces, bandwidth
    Claim(
        "trees-mtp",
        H200,
        "MTP through token trees gives the same output as plain (the summary's mtp_identical)",
        "MTP runs whose output equals plain",
        G + "trees/traces_stdout.txt",
        Text(r"^category=.* settings=.* identical=True$", runs=r"^category=.* settings="),
        fmt="{:.0f}",
        n_what="runs",
        measures=BENCH,
        provenance=G + "trees/summary.json",
    ),
    Claim(
        "trees-controlled",
        H200,
        "token tree (3 branches x depth 4) at a = 0.6, fast, 12-layer dense shape, first prompt",
        "tree / plain tokens/s",
        G + "trees/controlled.csv",
        Csv(
            {"model": "qwen3-8b-4bit", "acceptance": "0.6", "verify": "fast", "draft": "tree", "plain_s": "0.1959"},
            "speedup",
        ),
        fmt="{:.2f}x",
        measures=BENCH,
        provenance=G + "trees/summary.json",
    ),
    Claim(
        "traces-suffix",
        H200,
        "SuffixDecoding on the coding-agent trace, SmolLM2-135M, 96 tokens per turn",
        "suffix / plain tokens/s",
        G + "traces_table.txt",
        Text(r"^coding-agent\s+suffix\s+(?P<n>\d+)(?:\s+[\d.]+){6}\s+(?P<value>[\d.]+)\s"),
        fmt="{:.2f}x",
        n_what="turns",
        measures=BENCH,
    ),
    Claim(
        "mtp-trained",
        H200,
        "MTP head for SmolLM2-135M trained on the H200: first-draft acceptance at the last logged step",
        "first-draft acceptance",
        G + "train_mtp_log.txt",
        Text(r"step\s+700\s+[\d.]+s\s+loss [\d.]+\s+acceptance (?P<value>[\d.]+)"),
        measures=DRAFTERS,
    ),
    Claim(
        "drafters-mtp-score",
        H200,
        "MTP head retrained on every position, held-out Spec-Bench split: tokens per verification (shipped 1.59)",
        "tokens per verification, new head",
        G + "drafters/drafters.json",
        Json(("mtp", "new_score")),
        measures=DRAFTERS,
    ),
    Claim(
        "drafters-vs-mlx-lm",
        H200,
        "the shipped draft model through specbench and through mlx-lm's speculative_generate_step, natural text",
        "specbench / mlx-lm tokens/s",
        G + "drafters/evaluate-only/drafters.json",
        Json(
            ("versus_mlx_lm", "natural", "tokens_per_s_ratio"),
            n=("versus_mlx_lm", "natural", "prompts"),
        ),
        fmt="{:.2f}x",
        n_what="prompts",
        measures=DRAFTERS,
    ),
    Claim(
        "bandwidth",
        H200,
        "memory bandwidth reached: a read-only sum over 1 GiB",
        "GB/s",
        G + "bandwidth/bandwidth.json",
        Json(("peak_passes_bytes_per_s", "sum"), scale=1e-9),
        fmt="{:.0f}",
        measures=(),
    ),
    # -- this CPU
    Claim(
        "cpu-draft-model-vs-mlx-lm",
        CPU,
        "the shipped draft model against mlx-lm's speculative decoding with the same pair, every bundled category",
        "specbench / mlx-lm tokens/s, overall",
        "cpu/draft-model-vs-mlx-lm/prompt_bench.md",
        Text(r"^\| draft-model/fixed:3/fast \|(?: [^|]+\|){8} (?P<value>[\d.]+)x \(", n=9),
        fmt="{:.2f}x",
        n_what="questions",
        measures=DRAFTERS,
        provenance="cpu/draft-model-vs-mlx-lm/prompt_bench.json",
    ),
]
