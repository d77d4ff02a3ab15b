"""Summaries of the prompt benchmark: per method and category, and the markdown tables.

Spec-Bench's measures (Xia et al., arXiv 2401.07851): speedup over plain decoding (here mlx-lm's),
#MAT (tokens per target forward, the bonus token included, so plain decoding gives 1.00),
acceptance per draft position, and how many outputs equal plain greedy decoding.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from specbench.bench.paired import ratio_interval
from specbench.bench.prompt_predictions import add_predictions, is_speculative_specbench
from specbench.bench.prompt_runs import PROMPT_BASELINE, Method, PromptRun
from specbench.cost.profile import Profile


def _decode_tokens(run: PromptRun) -> int:
    """Tokens produced by the forwards counted in ``forwards`` (mlx-lm's draft-model speculation
    produces its first token in a verification too)."""
    mlx_lm_draft = run.drafter == "draft-model" and run.engine == "mlx-lm"
    return run.new_tokens if mlx_lm_draft else max(0, run.new_tokens - 1)


def throughput_ratio(base_rows: Sequence[PromptRun], rows: Sequence[PromptRun]) -> float:
    """Throughput of ``rows`` over that of ``base_rows`` (total tokens / total seconds each)."""

    def rate(rs: Sequence[PromptRun]) -> float:
        seconds = sum(r.wall_s for r in rs)
        return sum(r.new_tokens for r in rs) / seconds if seconds > 0 else 0.0

    base = rate(base_rows)
    return rate(rows) / base if base > 0 else float("nan")


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def _tokens_and_seconds(runs: list[PromptRun]) -> tuple[int, float]:
    """One prompt's (turn's) tokens and its median seconds over repeats, as the summary counts them."""
    return runs[0].new_tokens, _median([r.wall_s for r in runs])


def _per_question(
    units: dict[tuple[str, int], tuple[int, float]], keys: Sequence[tuple[str, int]]
) -> list[tuple[int, float]]:
    """(tokens, seconds) per question over its turns among ``keys``: a conversation's turns depend on each
    other (each turn's prompt holds the replies before it, and a method's caches carry over), so an interval
    resamples whole questions."""
    questions: dict[str, tuple[int, float]] = {}
    for key in keys:
        tokens, seconds = questions.get(key[0], (0, 0.0))
        questions[key[0]] = (tokens + units[key][0], seconds + units[key][1])
    return list(questions.values())


def summarize_prompt_runs(
    runs: Sequence[PromptRun],
    methods: Sequence[Method],
    info: dict[str, Any] | None = None,
    profile: Profile | None = None,
) -> list[dict[str, Any]]:
    """Per method and category (and "overall"): throughput, speedup over mlx-lm plain, #MAT,
    acceptance, per-position acceptance and output equality; and for specbench's methods the decode speedup
    over specbench plain beside the one ``profile`` predicts, with the residual
    (``specbench.bench.prompt_predictions.SUMMARY_COLUMNS``; None without a profile).

    Seconds per prompt are the median over repeats; throughput is total tokens / total seconds
    (Spec-Bench's overall speedup), end to end (``tokens_per_s``, ``speedup``) and after the first
    token (``decode_*``). ``speedup_min``/``speedup_max`` are the extremes over repeats;
    ``speedup_low``/``speedup_high`` the 95 % bootstrap interval of ``speedup`` over the questions both methods
    ran (each with all its turns), resampled with their baseline runs (None under 6 questions).
    ``position_acceptance[i]``: verifications that accepted draft position i / all verifications
    (vLLM's per-position acceptance rate); ``mean_accepted_tokens``: #MAT.
    """
    info = info or {}
    categories = list(dict.fromkeys(r.category for r in runs))
    repeats = sorted({r.repeat for r in runs})
    out = []
    for group in categories + ["overall"]:
        in_group = [r for r in runs if group == "overall" or r.category == group]
        timing = {}
        for m in methods:
            mine = [r for r in in_group if r.method == m.name]
            by_prompt: dict[tuple[str, int], list[PromptRun]] = {}
            for r in mine:
                by_prompt.setdefault((r.question_key, r.turn), []).append(r)
            units = {key: _tokens_and_seconds(rs) for key, rs in by_prompt.items()}
            tokens, wall = sum(t for t, _ in units.values()), sum(s for _, s in units.values())
            first = sum(_median([r.first_token_s for r in rs]) for rs in by_prompt.values())
            per_repeat = {rep: ([r for r in mine if r.repeat == rep]) for rep in repeats}
            timing[m.name] = (mine, by_prompt, units, tokens, wall, first, per_repeat)
        base = timing.get(PROMPT_BASELINE)
        for m in methods:
            mine, by_prompt, units, tokens, wall, first, per_repeat = timing[m.name]
            if not mine:
                continue
            decode_s = wall - first
            tps = tokens / wall if wall > 0 else 0.0
            decode_tps = max(0, tokens - len(by_prompt)) / decode_s if decode_s > 0 else 0.0
            row = {
                "model": info.get("model", ""),
                "device": info.get("device", ""),
                "method": m.name,
                "engine": m.engine,
                "drafter": m.drafter,
                "policy": m.policy_name,
                "verify": mine[0].verify,
                "category": group,
                "prompts": len(by_prompt),
                "new_tokens": tokens,
                "seconds": wall,
                "tokens_per_s": tps,
                "decode_tokens_per_s": decode_tps,
            }
            if base is not None and base[3] > 0:
                _, _, base_units, btokens, bwall, bfirst, bper_repeat = base
                btps = btokens / bwall
                bdecode = max(0, btokens - len(base_units)) / (bwall - bfirst) if bwall > bfirst else 0.0
                spread = [throughput_ratio(bper_repeat[rep], per_repeat[rep]) for rep in repeats if per_repeat[rep]]
                shared = [key for key in units if key in base_units]
                interval = (
                    ratio_interval(_per_question(base_units, shared), _per_question(units, shared))
                    if m.name != PROMPT_BASELINE
                    else None  # the baseline against itself: 1 exactly
                )
                row.update(
                    speedup=tps / btps,
                    decode_speedup=decode_tps / bdecode if bdecode > 0 else float("nan"),
                    speedup_min=min(spread),
                    speedup_max=max(spread),
                    speedup_low=interval[0] if interval else None,
                    speedup_high=interval[1] if interval else None,
                )
            forwards = sum(r.forwards for r in mine)
            drafted = sum(r.drafted for r in mine)
            accepted = sum(r.accepted for r in mine)
            verifies = sum(r.verifies for r in mine)
            width = max((len(r.pos_drafted) for r in mine), default=0)
            pos_a = [sum(r.pos_accepted[i] for r in mine if i < len(r.pos_accepted)) for i in range(width)]
            row.update(
                mean_accepted_tokens=sum(_decode_tokens(r) for r in mine) / forwards if forwards else float("nan"),
                acceptance_rate=accepted / drafted if drafted else float("nan"),
                position_acceptance=[a / verifies for a in pos_a] if verifies else [],
                equal=sum(all(r.equal for r in rs) for rs in by_prompt.values()),
                total=len(by_prompt),
            )
            out.append(row)
    return add_predictions(out, runs, profile)


def _fmt(value: Any, spec: str = ".2f", missing: str = "-") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return missing
    return format(value, spec)


def _speedup_cell(row: dict[str, Any]) -> str:
    """A speedup with its interval over prompts where it has one: ``1.12x [1.03-1.21]``."""
    text = _fmt(row.get("speedup"), ".2f") + "x"
    if row.get("speedup_low") is not None:
        text += f" [{row['speedup_low']:.2f}-{row['speedup_high']:.2f}]"
    return text


def prompt_table(
    summary: Sequence[dict[str, Any]],
    methods: Sequence[Method],
    categories: Sequence[str],
    info: dict[str, Any],
    prediction: str = "",
) -> str:
    """Markdown tables: speedup over mlx-lm plain by category, the overall metrics per method, and each
    speculative method's measured decode speedup over specbench plain beside its prediction (``prediction``:
    where it comes from, or why there is none)."""
    groups = list(categories) + ["overall"]
    cell = {(r["method"], r["category"]): r for r in summary}
    names = [m.name for m in methods if (m.name, "overall") in cell]
    head = (
        f"Prompt benchmark: {info.get('model', '')} on {info.get('device', '')}, greedy, batch 1, "
        f"max {info.get('max_tokens', '')} new tokens, {info.get('repeats', 1)} repeat(s); "
        f"mlx {info.get('mlx', '')}, mlx-lm {info.get('mlx_lm', '')}, {info.get('date', '')}"
    )
    lines = [
        head,
        "",
        "Speedup over mlx-lm plain (end to end, tokens/s ratio; [95 % bootstrap interval over prompts], "
        "from 6 prompts on):",
        "",
    ]
    lines.append("| method | " + " | ".join(groups) + " |")
    lines.append("|---" * (len(groups) + 1) + "|")
    for name in names:
        speedups = [_speedup_cell(cell.get((name, g), {})) for g in groups]
        lines.append(f"| {name} | " + " | ".join(speedups) + " |")
    lines += ["", "Overall:", ""]
    cols = [
        "method",
        "tok/s",
        "decode tok/s",
        "speedup",
        "decode speedup",
        "spread",
        "#MAT",
        "accept",
        "per-position acceptance (unconditional: accepting i / all verifications)",
        "equal",
    ]
    lines.append("| " + " | ".join(cols) + " |")
    lines.append("|---" * len(cols) + "|")
    for name in names:
        r = cell[(name, "overall")]
        spread = f"{_fmt(r.get('speedup_min'))}-{_fmt(r.get('speedup_max'))}"
        positions = " ".join(f"{a:.2f}" for a in r["position_acceptance"][:8]) or "-"
        lines.append(
            f"| {name} | {_fmt(r['tokens_per_s'], '.1f')} | {_fmt(r['decode_tokens_per_s'], '.1f')} | "
            f"{_fmt(r.get('speedup'))}x | {_fmt(r.get('decode_speedup'))}x | {spread} | "
            f"{_fmt(r['mean_accepted_tokens'])} | {_fmt(r['acceptance_rate'])} | {positions} | "
            f"{r['equal']}/{r['total']} |"
        )
    lines += _draft_model_lines(cell, methods, groups)
    lines += _prediction_lines(cell, names, groups, prediction)
    if info.get("unfinished_questions"):
        lines += ["", f"(time budget reached: {info['unfinished_questions']} questions not run)"]
    return "\n".join(lines)


def _prediction_lines(
    cell: dict[tuple[str, str], dict[str, Any]], names: Sequence[str], groups: list[str], prediction: str
) -> list[str]:
    """Each speculative specbench method's decode speedup over specbench plain, measured and predicted, the
    residual overall and by category, and the mean absolute residual of its runs."""
    ours = [n for n in names if is_speculative_specbench(cell[(n, "overall")])]
    if not ours:
        return []
    lines = ["", f"Decode speedup over specbench plain, measured and predicted ({prediction}):", ""]
    if not any(cell[(n, "overall")].get("predicted_speedup") is not None for n in ours):
        return ["", f"Predictions: {prediction}"]
    categories = groups[:-1]
    cols = ["method", "measured", "predicted", "residual", "mean abs residual (runs)", "d"]
    lines.append("| " + " | ".join(cols + [f"residual {g}" for g in categories]) + " |")
    lines.append("|---" * (len(cols) + len(categories)) + "|")
    for name in ours:
        r = cell[(name, "overall")]
        by_category = [_fmt((cell.get((name, g)) or {}).get("residual"), "+.1%") for g in categories]
        lines.append(
            f"| {name} | {_fmt(r['plain_speedup'])}x | {_fmt(r['predicted_speedup'])}x | "
            f"{_fmt(r['residual'], '+.1%')} | {_fmt(r['mean_abs_residual'], '.1%')} | {_fmt(r['d'], '.2g')} | "
            + " | ".join(by_category)
            + " |"
        )
    return lines


def _draft_model_lines(
    cell: dict[tuple[str, str], dict[str, Any]], methods: Sequence[Method], groups: list[str]
) -> list[str]:
    """specbench's draft-model methods against mlx-lm's speculation with the same pair: tokens/s ratio
    and acceptance (specbench's / mlx-lm's) per category."""
    theirs = [m.name for m in methods if m.engine == "mlx-lm" and m.drafter == "draft-model"]
    ours = [m.name for m in methods if m.engine == "specbench" and m.drafter == "draft-model"]
    if not theirs or not ours:
        return []
    lines = [
        "",
        f"Draft model, specbench over mlx-lm's speculative_generate_step ({theirs[0]}), same pair "
        "(tokens/s ratio; acceptance specbench / mlx-lm):",
        "",
        "| method | " + " | ".join(groups) + " |",
        "|---" * (len(groups) + 1) + "|",
    ]
    for name in ours:
        cells = []
        for g in groups:
            a, b = cell.get((name, g)), cell.get((theirs[0], g))
            if not a or not b or not b["tokens_per_s"]:
                cells.append("-")
                continue
            ratio = a["tokens_per_s"] / b["tokens_per_s"]
            cells.append(f"{ratio:.2f}x ({_fmt(a['acceptance_rate'])} / {_fmt(b['acceptance_rate'])})")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines
