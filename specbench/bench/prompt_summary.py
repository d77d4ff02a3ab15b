"""Summaries of the prompt benchmark: per method and category, and the markdown tables.

Spec-Bench's measures (Xia et al., arXiv 2401.07851): speedup over plain decoding (here mlx-lm's),
#MAT (tokens per target forward, the bonus token included, so plain decoding gives 1.00),
acceptance per draft position, and how many outputs equal plain greedy decoding.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from specbench.bench.paired import ratio_interval
from specbench.bench.predictions import drafting_cost
from specbench.bench.prompt_runs import PROMPT_BASELINE, Method, PromptRun
from specbench.cost.predict import mean_absolute_error, predicted_speedup, residual
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


@dataclass(frozen=True, kw_only=True)
class MethodSummary:
    """One method in one category (or "overall") of ``summarize_prompt_runs``, a row of
    ``prompt_bench_summary.parquet`` (``row``). The speedups over mlx-lm plain are None without a baseline;
    ``add_predictions`` sets the decode speedup over specbench plain, the predicted one, the residual (measured /
    predicted - 1), the mean absolute residual of the runs and their mean d (None where there is none)."""

    model: str
    device: str
    method: str
    engine: str
    drafter: str
    policy: str
    verify: str
    category: str
    prompts: int
    new_tokens: int
    seconds: float
    tokens_per_s: float
    decode_tokens_per_s: float
    speedup: float | None = None
    decode_speedup: float | None = None
    speedup_min: float | None = None
    speedup_max: float | None = None
    speedup_low: float | None = None
    speedup_high: float | None = None
    mean_accepted_tokens: float
    acceptance_rate: float
    position_acceptance: list[float]
    equal: int
    total: int
    plain_speedup: float | None = None
    predicted_speedup: float | None = None
    residual: float | None = None
    mean_abs_residual: float | None = None
    d: float | None = None

    @property
    def speculative_specbench(self) -> bool:
        """Whether it is specbench with a drafter: a method that gets a prediction."""
        return self.engine == "specbench" and self.drafter != "none"

    def row(self) -> dict[str, Any]:
        """The row of ``prompt_bench_summary.parquet``, in the stored column order."""
        return dict(self.__dict__)


def question_timing(runs: Iterable[PromptRun]) -> dict[str, tuple[int, float]]:
    """(tokens, seconds) per question key over its turns, each turn's seconds the median over its repeats: a
    conversation's turns depend on each other (each turn's prompt holds the replies before it, and a method's caches
    carry over), so an interval resamples whole questions."""
    by_prompt: dict[tuple[str, int], list[PromptRun]] = {}
    for r in runs:
        by_prompt.setdefault((r.question_key, r.turn), []).append(r)
    questions: dict[str, tuple[int, float]] = {}
    for (key, _), rs in by_prompt.items():
        tokens, seconds = questions.get(key, (0, 0.0))
        questions[key] = (tokens + rs[0].new_tokens, seconds + statistics.median(r.wall_s for r in rs))
    return questions


@dataclass(frozen=True)
class _Timing:
    """One method's runs in one category: by prompt (question and turn), each prompt's tokens and median seconds
    over repeats, their sums, and the runs of each repeat."""

    runs: list[PromptRun]
    by_prompt: dict[tuple[str, int], list[PromptRun]]
    tokens: int
    seconds: float
    first_s: float
    per_repeat: dict[int, list[PromptRun]]

    @classmethod
    def of(cls, runs: list[PromptRun], repeats: Sequence[int]) -> _Timing:
        by_prompt: dict[tuple[str, int], list[PromptRun]] = {}
        for r in runs:
            by_prompt.setdefault((r.question_key, r.turn), []).append(r)
        return cls(
            runs,
            by_prompt,
            sum(rs[0].new_tokens for rs in by_prompt.values()),
            sum(statistics.median(r.wall_s for r in rs) for rs in by_prompt.values()),
            sum(statistics.median(r.first_token_s for r in rs) for rs in by_prompt.values()),
            {rep: [r for r in runs if r.repeat == rep] for rep in repeats},
        )

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        decode_s = self.seconds - self.first_s
        return max(0, self.tokens - len(self.by_prompt)) / decode_s if decode_s > 0 else 0.0

    def per_question(self, keys: Sequence[tuple[str, int]]) -> list[tuple[int, float]]:
        """(tokens, seconds) per question over its turns among ``keys`` (``question_timing``)."""
        return list(question_timing(r for key in keys for r in self.by_prompt[key]).values())


def summarize_prompt_runs(
    runs: Sequence[PromptRun],
    methods: Sequence[Method],
    info: dict[str, Any] | None = None,
    profile: Profile | None = None,
) -> list[MethodSummary]:
    """Per method and category (and "overall"): throughput, speedup over mlx-lm plain, #MAT, acceptance,
    per-position acceptance (vLLM's: accepting position i / all verifications) and output equality; for specbench's
    methods the decode speedup over specbench plain beside the one ``profile`` predicts (``add_predictions``).
    Seconds per prompt are the median over repeats; throughput is total tokens / total seconds (Spec-Bench's);
    ``speedup_low``/``speedup_high``: its 95 % bootstrap interval over whole questions (None under 6)."""
    info = info or {}
    categories = list(dict.fromkeys(r.category for r in runs))
    repeats = sorted({r.repeat for r in runs})
    out = []
    for group in [*categories, "overall"]:
        in_group = [r for r in runs if group == "overall" or r.category == group]
        timing = {m.name: _Timing.of([r for r in in_group if r.method == m.name], repeats) for m in methods}
        base = timing.get(PROMPT_BASELINE)
        for m in methods:
            mine = timing[m.name]
            if not mine.runs:
                continue
            speedups: dict[str, Any] = {}
            if base is not None and base.tokens > 0:
                spread = [
                    throughput_ratio(base.per_repeat[r], mine.per_repeat[r]) for r in repeats if mine.per_repeat[r]
                ]
                shared = [key for key in mine.by_prompt if key in base.by_prompt]
                # the baseline against itself: 1 exactly, no interval
                itself = m.name == PROMPT_BASELINE
                interval = None if itself else ratio_interval(base.per_question(shared), mine.per_question(shared))
                low, high = interval or (None, None)
                bdecode = base.decode_tokens_per_s
                speedups = {
                    "speedup": mine.tokens_per_s / base.tokens_per_s,
                    "decode_speedup": mine.decode_tokens_per_s / bdecode if bdecode > 0 else float("nan"),
                    "speedup_min": min(spread),
                    "speedup_max": max(spread),
                    "speedup_low": low,
                    "speedup_high": high,
                }
            forwards = sum(r.forwards for r in mine.runs)
            drafted = sum(r.drafted for r in mine.runs)
            verifies = sum(r.verifies for r in mine.runs)
            width = max((len(r.pos_drafted) for r in mine.runs), default=0)
            pos_a = [sum(r.pos_accepted[i] for r in mine.runs if i < len(r.pos_accepted)) for i in range(width)]
            decode_tokens = sum(_decode_tokens(r) for r in mine.runs)
            out.append(
                MethodSummary(
                    model=info.get("model", ""),
                    device=info.get("device", ""),
                    method=m.name,
                    engine=m.engine,
                    drafter=m.drafter,
                    policy=m.policy_name,
                    verify=mine.runs[0].verify,
                    category=group,
                    prompts=len(mine.by_prompt),
                    new_tokens=mine.tokens,
                    seconds=mine.seconds,
                    tokens_per_s=mine.tokens_per_s,
                    decode_tokens_per_s=mine.decode_tokens_per_s,
                    **speedups,
                    mean_accepted_tokens=decode_tokens / forwards if forwards else float("nan"),
                    acceptance_rate=sum(r.accepted for r in mine.runs) / drafted if drafted else float("nan"),
                    position_acceptance=[a / verifies for a in pos_a] if verifies else [],
                    equal=sum(all(r.equal for r in rs) for rs in mine.by_prompt.values()),
                    total=len(mine.by_prompt),
                )
            )
    return add_predictions(out, runs, profile)


@dataclass(frozen=True)
class GroupPrediction:
    """A method's runs in a category pooled (``_pooled``): the predicted speedup, the mean absolute residual over
    the runs and their mean d; all None where a run has no prediction."""

    predicted_speedup: float | None = None
    mean_abs_residual: float | None = None
    d: float | None = None


@dataclass(frozen=True)
class _RunPrediction:
    """A speculative run's decode tokens and, from its kept steps, its predicted speedup over specbench plain, the
    residual of the measured one and d (``predicted`` None: it kept no steps or has no plain run beside it)."""

    method: str
    category: str
    decode_tokens: int
    predicted: float | None = None
    residual: float = math.nan
    d: float = 0.0


def _decode(run: PromptRun | None) -> tuple[float, int]:
    """A specbench run's seconds and tokens after its first token (none without a run)."""
    return (run.wall_s - run.first_token_s, max(0, run.new_tokens - 1)) if run else (0.0, 0)


def _run_predictions(runs: Sequence[PromptRun], profile: Profile) -> list[_RunPrediction]:
    """Each specbench speculative run in a verify mode ``profile`` has, against the specbench plain run of its
    prompt and repeat."""
    plain = {(r.question_key, r.turn, r.repeat): r for r in runs if r.plain_specbench}
    out = []
    for r in runs:
        if not r.speculative_specbench or r.verify not in profile.costs:
            continue
        base = plain.get((r.question_key, r.turn, r.repeat))
        (seconds, tokens), (plain_s, plain_tokens) = _decode(r), _decode(base)
        if base is None or not r.steps:
            out.append(_RunPrediction(r.method, r.category, tokens))
            continue
        ok = tokens and plain_tokens and seconds > 0
        measured = (plain_s / plain_tokens) / (seconds / tokens) if ok else math.nan
        records = r.step_records()
        d = drafting_cost(records, plain_s / plain_tokens if plain_tokens else 0.0)
        predicted = predicted_speedup(records, profile, d, r.prompt_tokens, r.verify)
        out.append(_RunPrediction(r.method, r.category, tokens, predicted, residual(measured, predicted), d))
    return out


def _pooled(predictions: Sequence[_RunPrediction], method: str, category: str | None) -> GroupPrediction:
    """``method``'s runs in ``category`` (None: all) pooled: the predicted speedup is their decode tokens over
    their predicted plain steps."""
    mine = [p for p in predictions if p.method == method and category in (None, p.category)]
    timed = [(p.decode_tokens, p.predicted) for p in mine if p.decode_tokens > 0]
    if not timed or any(p.predicted is None for p in mine) or any(not x or x <= 0 for _, x in timed):
        return GroupPrediction()
    pooled = sum(n for n, _ in timed) / sum(n / x for n, x in timed if x)
    error = mean_absolute_error(p.residual for p in mine)
    return GroupPrediction(pooled, error if math.isfinite(error) else None, statistics.fmean(p.d for p in mine))


def add_predictions(
    summary: list[MethodSummary], runs: Sequence[PromptRun], profile: Profile | None
) -> list[MethodSummary]:
    """``summary``'s rows (``summarize_prompt_runs``) with the predictions: each method's decode speedup over
    specbench plain in its category, and for speculative methods with ``profile`` the prediction and residual
    (None without a profile, for a verify mode it lacks, or for runs that kept no steps)."""
    plain = {r.category: r for r in summary if r.engine == "specbench" and r.drafter == "none"}
    predictions = _run_predictions(runs, profile) if profile is not None else []
    out = []
    for row in summary:
        base = plain.get(row.category)
        measured = (
            row.decode_tokens_per_s / base.decode_tokens_per_s
            if base is not None and base.decode_tokens_per_s > 0 and row.engine == "specbench"
            else None
        )
        predicted = _pooled(predictions, row.method, None if row.category == "overall" else row.category)
        p = predicted.predicted_speedup
        out.append(
            replace(
                row,
                plain_speedup=measured,
                residual=residual(measured, p) if measured is not None and p is not None else None,
                **asdict(predicted),
            )
        )
    return out


def _fmt(value: Any, spec: str = ".2f", missing: str = "-") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return missing
    return format(value, spec)


def _speedup_cell(row: MethodSummary | None) -> str:
    """A speedup with its interval over prompts where it has one: ``1.12x [1.03-1.21]``."""
    if row is None:
        return "-x"
    text = _fmt(row.speedup, ".2f") + "x"
    if row.speedup_low is not None:
        text += f" [{row.speedup_low:.2f}-{row.speedup_high:.2f}]"
    return text


def _markdown(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """A markdown table's lines."""
    line = lambda cells: "| " + " | ".join(cells) + " |"  # noqa: E731
    return [line(header), "|---" * len(header) + "|", *map(line, rows)]


def prompt_table(
    summary: Sequence[MethodSummary],
    methods: Sequence[Method],
    categories: Sequence[str],
    info: dict[str, Any],
    prediction: str = "",
) -> str:
    """Markdown tables: speedup over mlx-lm plain by category, the overall metrics per method, and each
    speculative method's measured decode speedup over specbench plain beside its prediction (``prediction``:
    where it comes from, or why there is none)."""
    groups = [*categories, "overall"]
    cell = {(r.method, r.category): r for r in summary}
    names = [m.name for m in methods if (m.name, "overall") in cell]
    lines = [
        f"Prompt benchmark: {info.get('model', '')} on {info.get('device', '')}, greedy, batch 1, "
        f"max {info.get('max_tokens', '')} new tokens, {info.get('repeats', 1)} repeat(s); "
        f"mlx {info.get('mlx', '')}, mlx-lm {info.get('mlx_lm', '')}, {info.get('date', '')}",
        "",
        "Speedup over mlx-lm plain (end to end, tokens/s ratio; [95 % bootstrap interval over prompts], "
        "from 6 prompts on):",
        "",
        *_markdown(["method", *groups], ([n, *(_speedup_cell(cell.get((n, g))) for g in groups)] for n in names)),
        "",
        "Overall:",
        "",
    ]
    cols = ["method", "tok/s", "decode tok/s", "speedup", "decode speedup", "spread", "#MAT", "accept"]
    cols += ["per-position acceptance (unconditional: accepting i / all verifications)", "equal"]
    rows = []
    for name in names:
        r = cell[(name, "overall")]
        rows.append(
            [
                name,
                _fmt(r.tokens_per_s, ".1f"),
                _fmt(r.decode_tokens_per_s, ".1f"),
                f"{_fmt(r.speedup)}x",
                f"{_fmt(r.decode_speedup)}x",
                f"{_fmt(r.speedup_min)}-{_fmt(r.speedup_max)}",
                _fmt(r.mean_accepted_tokens),
                _fmt(r.acceptance_rate),
                " ".join(f"{a:.2f}" for a in r.position_acceptance[:8]) or "-",
                f"{r.equal}/{r.total}",
            ]
        )
    lines += _markdown(cols, rows)
    lines += _draft_model_lines(cell, methods, groups)
    lines += _prediction_lines(cell, names, groups, prediction)
    if unfinished := info.get("unfinished_questions"):
        lines += ["", f"(time budget reached: {unfinished} questions not run)"]
    if timings := info.get("timings"):  # a run spread over ranks: where its timings come from
        lines += ["", timings]
    return "\n".join(lines)


def _prediction_lines(
    cell: dict[tuple[str, str], MethodSummary], names: Sequence[str], groups: list[str], prediction: str
) -> list[str]:
    """Each speculative specbench method's decode speedup over specbench plain, measured and predicted, the
    residual overall and by category, and the mean absolute residual of its runs."""
    ours = [n for n in names if cell[(n, "overall")].speculative_specbench]
    if not ours:
        return []
    if not any(cell[(n, "overall")].predicted_speedup is not None for n in ours):
        return ["", f"Predictions: {prediction}"]
    categories = groups[:-1]
    cols = ["method", "measured", "predicted", "residual", "mean abs residual (runs)", "d"]
    rows = []
    for name in ours:
        r = cell[(name, "overall")]
        rows.append(
            [
                name,
                f"{_fmt(r.plain_speedup)}x",
                f"{_fmt(r.predicted_speedup)}x",
                _fmt(r.residual, "+.1%"),
                _fmt(r.mean_abs_residual, ".1%"),
                _fmt(r.d, ".2g"),
                *(_fmt(c.residual if (c := cell.get((name, g))) else None, "+.1%") for g in categories),
            ]
        )
    title = f"Decode speedup over specbench plain, measured and predicted ({prediction}):"
    return ["", title, "", *_markdown(cols + [f"residual {g}" for g in categories], rows)]


def _draft_model_lines(
    cell: dict[tuple[str, str], MethodSummary], methods: Sequence[Method], groups: list[str]
) -> list[str]:
    """specbench's draft-model methods against mlx-lm's speculation with the same pair: tokens/s ratio
    and acceptance (specbench's / mlx-lm's) per category."""
    theirs = [m.name for m in methods if m.engine == "mlx-lm" and m.drafter == "draft-model"]
    ours = [m.name for m in methods if m.engine == "specbench" and m.drafter == "draft-model"]
    if not theirs or not ours:
        return []

    def ratio(a: MethodSummary | None, b: MethodSummary | None) -> str:
        if not a or not b or not b.tokens_per_s:
            return "-"
        return f"{a.tokens_per_s / b.tokens_per_s:.2f}x ({_fmt(a.acceptance_rate)} / {_fmt(b.acceptance_rate)})"

    rows = ([name, *(ratio(cell.get((name, g)), cell.get((theirs[0], g))) for g in groups)] for name in ours)
    return [
        "",
        f"Draft model, specbench over mlx-lm's speculative_generate_step ({theirs[0]}), same pair "
        "(tokens/s ratio; acceptance specbench / mlx-lm):",
        "",
        *_markdown(["method", *groups], rows),
    ]
