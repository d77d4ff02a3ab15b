"""Benchmarks: conversation-trace replay, and Spec-Bench-style prompt sets (below).

``bench_trace`` replays a trace (``specbench.traces``) turn by turn. The model writes every reply
(greedy): plain decoding and each drafter on the same prompt, in an order that rotates from turn to
turn; the next turn's prompt holds plain decoding's reply (which every drafter must reproduce token
for token; checked on every turn).
Drafter objects live across turns (SuffixDecoding keeps its store; pass the same objects to several
calls to keep it across traces). Results: one row per (turn, method) with per-turn and cumulative
drafted, accepted, tokens per verification, decode tokens/s and the ratio to plain decoding in the
same run; per-step logs; plain decoding's outputs, which ``specbench.simulate`` replays offline.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from specbench.common.files import write_parquet_atomic, write_text_atomic
from specbench.drafters.base import Drafter
from specbench.core.engine import GenerateOptions, generate, speculative_generate
from specbench.core.log import StepLog
from specbench.core.policies import DraftPolicy
from specbench.experiments.simulate import Recorded, save_recorded
from specbench.experiments.traces import Trace, render_turn

# =============================================================================================
# Trace replay: conversations turn by turn, plain decoding against each drafter
# =============================================================================================

PLAIN = "plain"


@dataclass
class TraceBench:
    """What ``bench_trace`` measured: ``turns`` (one row per turn and method), ``summary`` (one row
    per method), ``steps`` (every step's record, with trace/turn/method columns) and ``recorded``
    (plain decoding's output per turn, for ``specbench.simulate``)."""

    trace: str
    turns: Any  # polars.DataFrame
    summary: Any  # polars.DataFrame
    steps: StepLog
    recorded: list[Recorded]

    @property
    def identical(self) -> bool:
        """Every drafter reproduced plain decoding's output on every turn."""
        return bool(self.turns["identical"].all())

    def table(self) -> str:
        return format_summary(self.summary)


def _reply_text(tokenizer: Any, tokens: Sequence[int], stop_ids: set[int]) -> str:
    """The reply as text, without its trailing stop tokens."""
    tokens = list(tokens)
    while tokens and tokens[-1] in stop_ids:
        tokens.pop()
    return tokenizer.decode(tokens)


def _run(model, prompt, options, drafter, policy, tokenizer):
    gen = (
        generate(model, prompt, options, tokenizer=tokenizer)
        if drafter is None
        else speculative_generate(model, prompt, options, drafter, policy, tokenizer=tokenizer)
    )
    for _ in gen:
        pass
    return gen


def _row(trace_id: str, turn: int, method: str, gen: Any, plain: Any) -> dict[str, Any]:
    stats = gen.stats()
    plain_stats = plain.stats()
    decode_tokens = stats["tokens"] - 1  # the first token comes from the prompt pass
    return {
        "trace": trace_id,
        "turn": turn,
        "method": method,
        "prompt_tokens": stats["prompt_tokens"],
        "tokens": stats["tokens"],
        "finish_reason": stats["finish_reason"],
        "steps": stats["steps"],
        "verifies": stats["verifies"],
        "drafted": stats["drafted"],
        "accepted": stats["accepted"],
        "tokens_per_verify": stats["tokens_per_verify"],
        "mean_accepted_tokens": stats["mean_accepted_tokens"],
        "decode_tokens": decode_tokens,
        "decode_s": stats["decode_s"],
        "prefill_s": stats["prefill_s"],
        "tokens_per_s": stats["decode_tokens_per_s"],
        "speedup": plain_stats["decode_s"] / stats["decode_s"] if stats["decode_s"] > 0 else 0.0,
        "identical": list(gen.tokens) == list(plain.tokens),
    }


def _with_cumulative(turns):
    """Add running totals per method and their rates."""
    import polars as pl

    by = pl.col("turn")
    cum = lambda name: pl.col(name).cum_sum().over("method", order_by=by)  # noqa: E731
    frame = turns.with_columns(
        cum("drafted").alias("cum_drafted"),
        cum("accepted").alias("cum_accepted"),
        cum("verifies").alias("cum_verifies"),
        cum("decode_tokens").alias("cum_decode_tokens"),
        cum("decode_s").alias("cum_decode_s"),
    )
    frame = frame.with_columns(
        pl.when(pl.col("cum_verifies") > 0)
        .then((pl.col("cum_accepted") + pl.col("cum_verifies")) / pl.col("cum_verifies"))
        .otherwise(0.0)
        .alias("cum_tokens_per_verify"),
        (pl.col("cum_decode_tokens") / pl.col("cum_decode_s")).alias("cum_tokens_per_s"),
    )
    plain = frame.filter(pl.col("method") == PLAIN).select("turn", pl.col("cum_decode_s").alias("_plain_s"))
    return frame.join(plain, on="turn", how="left").with_columns(
        (pl.col("_plain_s") / pl.col("cum_decode_s")).alias("cum_speedup")
    ).drop("_plain_s")


def summarize(turns):
    """One row per (trace, method): totals over the turns and the rates derived from them."""
    import polars as pl

    frame = turns.group_by("trace", "method", maintain_order=True).agg(
        pl.len().alias("turns"),
        pl.col("prompt_tokens").mean().round(0).cast(pl.Int64).alias("mean_prompt_tokens"),
        pl.col("tokens").sum(),
        pl.col("drafted").sum(),
        pl.col("accepted").sum(),
        pl.col("verifies").sum(),
        pl.col("steps").sum(),
        pl.col("decode_tokens").sum(),
        pl.col("decode_s").sum(),
        pl.col("identical").all(),
    )
    frame = frame.with_columns(
        pl.when(pl.col("verifies") > 0)
        .then((pl.col("accepted") + pl.col("verifies")) / pl.col("verifies"))
        .otherwise(0.0)
        .alias("tokens_per_verify"),
        pl.when(pl.col("drafted") > 0).then(pl.col("accepted") / pl.col("drafted")).otherwise(0.0).alias("acceptance_rate"),
        (pl.col("decode_tokens") / pl.col("steps")).alias("mean_accepted_tokens"),
        (pl.col("decode_tokens") / pl.col("decode_s")).alias("tokens_per_s"),
    )
    plain = frame.filter(pl.col("method") == PLAIN).select("trace", pl.col("decode_s").alias("_plain_s"))
    return frame.join(plain, on="trace", how="left").with_columns(
        (pl.col("_plain_s") / pl.col("decode_s")).alias("speedup")
    ).drop("_plain_s")


def format_summary(summary) -> str:
    """A compact text table of ``summarize``'s rows."""
    header = f"{'trace':18s} {'method':8s} {'turns':>5s} {'tokens':>7s} {'drafted':>8s} {'accepted':>8s} " \
             f"{'tok/verify':>10s} {'MAT':>5s} {'tok/s':>8s} {'speedup':>7s} {'identical':>9s}"
    lines = [header]
    for r in summary.iter_rows(named=True):
        lines.append(
            f"{r['trace'][:18]:18s} {r['method'][:8]:8s} {r['turns']:5d} {r['tokens']:7d} {r['drafted']:8d} "
            f"{r['accepted']:8d} {r['tokens_per_verify']:10.2f} {r['mean_accepted_tokens']:5.2f} "
            f"{r['tokens_per_s']:8.1f} {r['speedup']:7.2f} {str(r['identical']):>9s}"
        )
    return "\n".join(lines)


def format_turns(turns) -> str:
    """Per-turn lines: tokens, accepted per verification and speedup, per turn and cumulatively."""
    lines = [f"{'trace':18s} {'turn':>4s} {'method':8s} {'prompt':>6s} {'tokens':>6s} {'drafted':>7s} {'accepted':>8s} "
             f"{'tok/verify':>10s} {'tok/s':>8s} {'speedup':>7s} {'cum speedup':>11s} {'same':>5s}"]
    for r in turns.iter_rows(named=True):
        lines.append(
            f"{r['trace'][:18]:18s} {r['turn']:4d} {r['method'][:8]:8s} {r['prompt_tokens']:6d} {r['tokens']:6d} "
            f"{r['drafted']:7d} {r['accepted']:8d} {r['tokens_per_verify']:10.2f} {r['tokens_per_s']:8.1f} "
            f"{r['speedup']:7.2f} {r['cum_speedup']:11.2f} {str(r['identical']):>5s}"
        )
    return "\n".join(lines)


def bench_trace(
    model: Any,
    tokenizer: Any,
    trace: Trace,
    drafters: Mapping[str, Drafter],
    policy: DraftPolicy | str | Mapping[str, DraftPolicy | str] = "auto",
    max_tokens: int = 128,
    options: GenerateOptions | None = None,
    turns: int | None = None,
    out_dir: str | os.PathLike | None = None,
    progress: bool = False,
) -> TraceBench:
    """Replay ``trace``: plain decoding and every drafter on each turn, in one run.

    ``drafters`` maps a method name to a drafter (reused across turns; names must not be "plain");
    ``policy`` is one policy for all, or a mapping from method name to policy. ``options`` (greedy)
    sets stops and verify mode; ``max_tokens`` caps each reply when ``options`` is not given.
    ``turns`` limits the replay to the first turns. With ``out_dir``, writes
    ``<trace>.turns.parquet``, ``<trace>.steps.parquet`` and ``<trace>.plain.parquet`` (the
    recorded plain outputs) there.
    """
    import polars as pl

    if PLAIN in drafters:
        raise ValueError(f"{PLAIN!r} is the baseline every run includes; do not name a drafter so")
    if any(d is None for d in drafters.values()):
        raise ValueError("drafters must be Drafter objects (plain decoding is always included)")
    options = options or GenerateOptions(max_tokens=max_tokens)
    if options.temperature != 0:
        raise ValueError("the trace benchmark compares greedy outputs: use temperature=0")
    as_policy = lambda p: DraftPolicy.parse(p) if isinstance(p, str) else p  # noqa: E731
    if isinstance(policy, Mapping):
        missing = [name for name in drafters if name not in policy]
        if missing:
            raise ValueError(f"no policy given for methods {missing}")
        policies = {name: as_policy(policy[name]) for name in drafters}
    else:
        policies = {name: as_policy(policy) for name in drafters}
    n_turns = len(trace.turns) if turns is None else min(turns, len(trace.turns))
    if n_turns < 1:
        raise ValueError(f"trace {trace.id!r} has no turns to replay")
    stop_ids = set(options.stop_token_ids) | set(options.eos_token_ids) | set(getattr(tokenizer, "eos_token_ids", None) or [])

    rows: list[dict[str, Any]] = []
    steps = StepLog()
    recorded: list[Recorded] = []
    replies: list[str] = []
    for turn in range(n_turns):
        prompt = render_turn(tokenizer, trace, turn, replies)
        start = time.perf_counter()
        # The order of methods rotates from turn to turn, so drift in the machine's speed spreads evenly.
        methods = [PLAIN, *drafters]
        order = methods[turn % len(methods) :] + methods[: turn % len(methods)]
        done = {
            name: _run(model, prompt, options, drafters.get(name), policies.get(name), tokenizer) for name in order
        }
        plain = done[PLAIN]
        runs = [(name, done[name]) for name in methods]
        for name, gen in runs:
            rows.append(_row(trace.id, turn, name, gen, plain))
            for record in gen.log.records:
                steps.append({**record, "trace": trace.id, "turn": turn, "method": name})
        recorded.append(Recorded(list(prompt), list(plain.tokens), plain.finish_reason(), f"{trace.id}/{turn}"))
        replies.append(_reply_text(tokenizer, plain.tokens, stop_ids))
        if progress:
            same = all(r["identical"] for r in rows[-len(runs):])
            rates = ", ".join(f"{r['method']} {r['tokens_per_s']:.1f} tok/s" for r in rows[-len(runs):])
            print(f"  {trace.id} turn {turn}: prompt {len(prompt)}, {len(plain.tokens)} tokens; {rates}; "
                  f"identical={same} ({time.perf_counter() - start:.1f} s)", flush=True)

    frame = _with_cumulative(pl.DataFrame(rows))
    result = TraceBench(trace.id, frame, summarize(frame), steps, recorded)
    if out_dir is not None:
        save_trace_bench(result, out_dir)
    return result


def _write_frame(frame, path: Path) -> None:
    write_parquet_atomic(frame, path)


def save_trace_bench(result: TraceBench, out_dir: str | os.PathLike) -> list[Path]:
    """Write a trace benchmark's tables (atomically) into ``out_dir``; returns the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    name = result.trace.replace("/", "_")
    paths = [out / f"{name}.turns.parquet", out / f"{name}.steps.parquet", out / f"{name}.plain.parquet"]
    _write_frame(result.turns, paths[0])
    result.steps.save(paths[1])
    save_recorded(result.recorded, paths[2])
    return paths


TRACE_SUMMARY_FILE = "trace_bench_summary.parquet"
TRACE_TABLE_FILE = "trace_bench.txt"


@dataclass
class TraceRun:
    """``run_trace``'s results: one ``TraceBench`` per trace."""

    results: list[TraceBench]

    @property
    def turns(self):
        import polars as pl

        return pl.concat([r.turns for r in self.results], how="diagonal_relaxed")

    @property
    def summary(self):
        import polars as pl

        return pl.concat([r.summary for r in self.results], how="diagonal_relaxed")

    @property
    def identical(self) -> bool:
        return all(r.identical for r in self.results)

    def table(self) -> str:
        return format_summary(self.summary)


def trace_methods(
    drafters: Sequence[str], policies: Sequence[str], model: Any = None, model_name: str | None = None
) -> tuple[dict[str, Drafter], dict[str, str]]:
    """Drafter objects and policies per method, from names: one method per (drafter, policy), named
    by the drafter alone when one policy is given, else ``drafter@policy``. "none"/"plain" are
    skipped (plain decoding is always the baseline)."""
    from specbench.drafters import make_drafter

    names = [d for d in drafters if d not in ("none", PLAIN, "")]
    if not policies:
        raise ValueError("give at least one policy (auto, fixed:N or adaptive:N)")
    for spec in policies:
        DraftPolicy.parse(spec)  # fails early on a bad name
    made: dict[str, Drafter] = {}
    chosen: dict[str, str] = {}
    for name in names:
        for spec in policies:
            method = name if len(policies) == 1 else f"{name}@{spec}"
            drafter = make_drafter(name, model=model, model_name=model_name)
            if drafter is None:
                continue
            made[method] = drafter
            chosen[method] = spec
    return made, chosen


def run_trace(
    model: Any,
    tokenizer: Any,
    source: str | os.PathLike | Trace | Sequence[Trace],
    drafters: Sequence[str] = ("lookup", "suffix"),
    policies: Sequence[str] = ("auto",),
    max_tokens: int = 128,
    options: GenerateOptions | None = None,
    turns: int | None = None,
    out: str | os.PathLike | None = None,
    format: str | None = None,
    share_store: bool = False,
    model_name: str | None = None,
    progress: bool = True,
) -> TraceRun:
    """Replay the traces of a file (or bundled trace name, or ``Trace`` objects) with drafters by name.

    Each trace starts with fresh drafters unless ``share_store`` (then SuffixDecoding's store
    carries over from trace to trace). With ``out``, every trace's tables are written there, with a
    summary; a rerun with the same settings skips traces already finished there (not with
    ``share_store``, whose results depend on the traces before).
    """
    import json as _json

    import polars as pl

    from specbench.experiments.traces import load_traces

    if isinstance(source, Trace):
        traces = [source]
    elif isinstance(source, (str, os.PathLike)):
        traces = load_traces(source, format)
    else:
        traces = list(source)
    config = {
        "model": model_name, "drafters": list(drafters), "policies": list(policies), "max_tokens": max_tokens,
        "turns": turns, "options": repr(options), "share_store": share_store,
    }
    out_dir = Path(out) if out is not None else None
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        config_path = out_dir / "trace_bench_config.json"
        resumable = not share_store and config_path.exists() and _json.loads(config_path.read_text()) == config
        if not resumable:
            write_text_atomic(config_path, _json.dumps(config, indent=1))
    results: list[TraceBench] = []
    shared = trace_methods(drafters, policies, model, model_name) if share_store else None
    for trace in traces:
        name = trace.id.replace("/", "_")
        if out_dir is not None and resumable and (out_dir / f"{name}.turns.parquet").exists():
            results.append(_load_trace_bench(trace.id, out_dir))
            if progress:
                print(f"{trace.id}: finished earlier in {out_dir}, skipped", flush=True)
            continue
        made, chosen = shared if shared is not None else trace_methods(drafters, policies, model, model_name)
        if progress:
            print(f"{trace.id}: {len(trace.turns)} turns, methods: plain, {', '.join(made)}", flush=True)
        results.append(
            bench_trace(model, tokenizer, trace, made, chosen, max_tokens, options, turns, out_dir, progress)
        )
    run = TraceRun(results)
    if out_dir is not None:
        _write_frame(run.summary, out_dir / TRACE_SUMMARY_FILE)
        write_text_atomic(out_dir / TRACE_TABLE_FILE, run.table() + "\n")
    return run


def _load_trace_bench(trace_id: str, out_dir: Path) -> TraceBench:
    import polars as pl

    from specbench.experiments.simulate import load_recorded

    name = trace_id.replace("/", "_")
    turns = pl.read_parquet(out_dir / f"{name}.turns.parquet")
    steps = StepLog.load(out_dir / f"{name}.steps.parquet")
    return TraceBench(trace_id, turns, summarize(turns), steps, load_recorded(out_dir / f"{name}.plain.parquet"))




# =============================================================================================
# Prompt benchmark: Spec-Bench's protocol, side by side with mlx-lm
# =============================================================================================
#
# Spec-Bench (Xia et al., arXiv 2401.07851): prompts by category, greedy decoding, batch 1;
# speedup over plain decoding, #MAT (tokens per target forward, the bonus token included, so
# plain decoding gives 1.00) and a check that every output equals plain greedy decoding.
# Every method runs in one process on the same prompts: mlx-lm's ``stream_generate`` (the
# baseline), mlx-lm's draft-model speculation when a draft model is given, specbench's plain
# ``generate`` and specbench with each drafter and policy. Methods are warmed up first and
# interleaved per prompt (a rotating order) so that drift of the machine's speed spreads evenly.

PROMPT_BASELINE = "mlx-lm"
PROMPT_RUNS_FILE = "prompt_bench_runs.parquet"
PROMPT_SUMMARY_FILE = "prompt_bench_summary.parquet"
PROMPT_TABLE_FILE = "prompt_bench.md"
PROMPT_INFO_FILE = "prompt_bench.json"
PROMPT_FIGURE_FILE = "prompt_bench_speedup.png"

#: Drafters keep the colours of every other figure (``figures.DRAFTER_COLOURS``); policies are
#: told apart by hatching.
POLICY_HATCHES = {"none": "", "auto": "", "fixed": "//", "adaptive": ".."}


def _drafter_colour(drafter: str) -> str:
    from specbench.report.figures import DRAFTER_COLOURS

    return DRAFTER_COLOURS.get(drafter, "0.3")


@dataclass(frozen=True)
class Method:
    """One way to generate: ``engine`` "mlx-lm" or "specbench"; ``drafter``/``policy`` by name
    ("none": plain decoding); ``verify`` None for the engine's default (exact for greedy)."""

    name: str
    engine: str
    drafter: str = "none"
    policy: str = "none"
    verify: str | None = None


def prompt_methods(
    drafters: Sequence[str] = ("lookup", "suffix"),
    policies: Sequence[str] = ("auto", "fixed:4"),
    verify: Sequence[str | None] = (None,),
    draft_model: bool = False,
    num_draft_tokens: int = 2,
) -> list[Method]:
    """The methods of a prompt benchmark, the mlx-lm baseline first."""
    from specbench.drafters import DRAFTER_NAMES
    from specbench.core.engine import VERIFY_MODES
    from specbench.core.policies import DraftPolicy

    unknown = [d for d in drafters if d not in DRAFTER_NAMES or d == "none"]
    if unknown:
        raise ValueError(f"unknown drafters {unknown}: choose from {', '.join(n for n in DRAFTER_NAMES if n != 'none')}")
    for spec in policies:
        DraftPolicy.parse(spec)
    bad = [v for v in verify if v not in (None, *VERIFY_MODES)]
    if bad:
        raise ValueError(f"unknown verify modes {bad}: choose from {', '.join(VERIFY_MODES)}")
    if num_draft_tokens < 1:
        raise ValueError(f"num_draft_tokens must be >= 1, got {num_draft_tokens}")
    methods = [Method(PROMPT_BASELINE, "mlx-lm")]
    if draft_model:
        methods.append(Method(f"mlx-lm draft/fixed:{num_draft_tokens}", "mlx-lm", "draft-model", f"fixed:{num_draft_tokens}"))
    methods.append(Method("specbench", "specbench"))
    for drafter in drafters:
        for policy in policies:
            for mode in verify:
                suffix = f"/{mode}" if mode is not None else ""
                methods.append(Method(f"{drafter}/{policy}{suffix}", "specbench", drafter, policy, mode))
    return methods


@dataclass
class TimedRun:
    """One timed generation: its tokens, seconds, and what its target forwards did.

    ``forwards``: target forwards after the prompt pass (plain steps and verifications);
    ``pos_drafted[i]``/``pos_accepted[i]``: verifications that drafted / accepted position i.
    """

    tokens: list[int]
    wall_s: float
    first_token_s: float
    forwards: int
    verifies: int = 0
    drafted: int = 0
    accepted: int = 0
    pos_drafted: list[int] = field(default_factory=list)
    pos_accepted: list[int] = field(default_factory=list)
    finish_reason: str | None = None


def _count_positions(pos_drafted: list[int], pos_accepted: list[int], drafted: int, accepted: int) -> None:
    for i in range(drafted):
        if i == len(pos_drafted):
            pos_drafted.append(0)
            pos_accepted.append(0)
        pos_drafted[i] += 1
        pos_accepted[i] += i < accepted


def run_mlx_lm(
    model: Any, tokenizer: Any, prompt: Sequence[int], max_tokens: int,
    draft_model: Any = None, num_draft_tokens: int = 2,
) -> TimedRun:
    """mlx-lm's ``stream_generate`` (greedy), or its draft-model speculation, timed."""
    import mlx.core as mx
    from mlx_lm import stream_generate

    kwargs = {} if draft_model is None else {"draft_model": draft_model, "num_draft_tokens": num_draft_tokens}
    tokens: list[int] = []
    from_draft: list[bool] = []
    finish = None
    start = time.perf_counter()
    first = None
    for response in stream_generate(model, tokenizer, mx.array(prompt), max_tokens=max_tokens, **kwargs):
        if first is None:
            first = time.perf_counter()
        tokens.append(int(response.token))
        from_draft.append(bool(response.from_draft))
        finish = response.finish_reason
    wall = time.perf_counter() - start
    run = TimedRun(tokens, wall, (first or start) - start, max(0, len(tokens) - 1), finish_reason=finish)
    if draft_model is not None:
        # Each verification emits its accepted draft tokens, then one token of the target's own;
        # the first verification also consumes the prompt's last token.
        run.forwards = 0
        done = 0
        group = 0
        for i, drafted_token in enumerate(from_draft):
            group += drafted_token
            if not drafted_token or i == len(from_draft) - 1:
                drafted = min(max_tokens - done, num_draft_tokens)
                run.forwards += 1
                run.verifies += 1
                run.drafted += drafted
                run.accepted += group
                _count_positions(run.pos_drafted, run.pos_accepted, drafted, group)
                done = i + 1
                group = 0
    return run


def run_specbench(
    model: Any, tokenizer: Any, prompt: Sequence[int], max_tokens: int,
    drafter: Any = None, policy: Any = None, verify: str | None = None,
) -> TimedRun:
    """specbench's plain ``generate`` (no drafter) or ``speculative_generate``, greedy, timed."""
    from specbench.core.engine import GenerateOptions, speculative_generate

    options = GenerateOptions(max_tokens=max_tokens, verify=verify)
    start = time.perf_counter()
    first = None
    gen = speculative_generate(model, list(prompt), options, drafter, policy, tokenizer=tokenizer)
    for _ in gen:
        if first is None:
            first = time.perf_counter()
    wall = time.perf_counter() - start
    stats = gen.stats()
    run = TimedRun(
        list(gen.tokens), wall, (first or start) - start, stats["steps"], stats["verifies"], stats["drafted"],
        stats["accepted"], finish_reason=gen.finish_reason(),
    )
    for record in gen.log.records:
        if record["kind"] == "verify":
            _count_positions(run.pos_drafted, run.pos_accepted, record["k_drafted"], record["accepted"])
    return run


def _first_mismatch(tokens: Sequence[int], reference: Sequence[int]) -> int:
    """Index of the first differing token (-1 when equal)."""
    for i, (a, b) in enumerate(zip(tokens, reference)):
        if a != b:
            return i
    return -1 if len(tokens) == len(reference) else min(len(tokens), len(reference))


def _question_key(question: Any) -> str:
    text = json.dumps([str(question.question_id), question.category, list(question.turns)], ensure_ascii=False)
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def _prompt_config(
    model_name: str, methods: Sequence[Method], max_tokens: int, repeats: int, num_draft_tokens: int, device: str
) -> str:
    text = json.dumps([model_name, [asdict(m) for m in methods], max_tokens, repeats, num_draft_tokens, device])
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def _write_parquet(rows: list[dict[str, Any]], path: Path) -> Path:
    import polars as pl

    from specbench.common.files import write_parquet_atomic

    return write_parquet_atomic(pl.DataFrame(rows, infer_schema_length=None), path)




def _strip_stops(tokens: Sequence[int], stop_ids: set[int]) -> list[int]:
    out = list(tokens)
    while out and out[-1] in stop_ids:
        out.pop()
    return out


class _MethodRunner:
    """Runs methods on prompts; keeps one drafter per (method, repeat), as a server keeps one
    drafter across requests, so that no repeat sees another repeat's outputs."""

    def __init__(self, model, tokenizer, model_name, draft_model, num_draft_tokens, max_tokens):
        self.model, self.tokenizer, self.model_name = model, tokenizer, model_name
        self.draft_model, self.num_draft_tokens, self.max_tokens = draft_model, num_draft_tokens, max_tokens
        self.drafters: dict[tuple[str, int], Any] = {}

    def drafter(self, method: Method, repeat: int) -> Any:
        from specbench.drafters import make_drafter

        key = (method.name, repeat)
        if key not in self.drafters:
            self.drafters[key] = make_drafter(method.drafter, model=self.model, model_name=self.model_name)
        return self.drafters[key]

    def run(self, method: Method, prompt: Sequence[int], repeat: int, max_tokens: int | None = None) -> TimedRun:
        from specbench.core.policies import DraftPolicy

        n = max_tokens or self.max_tokens
        if method.engine == "mlx-lm":
            draft = self.draft_model if method.drafter == "draft-model" else None
            return run_mlx_lm(self.model, self.tokenizer, prompt, n, draft, self.num_draft_tokens)
        if method.drafter == "none":
            return run_specbench(self.model, self.tokenizer, prompt, n, verify=method.verify)
        return run_specbench(
            self.model, self.tokenizer, prompt, n, self.drafter(method, repeat), DraftPolicy.parse(method.policy),
            method.verify,
        )


def _verify_widths(methods: Sequence[Method], runner: _MethodRunner) -> list[int]:
    """Verification widths the methods can use (for calibrating exact verification up front)."""
    widest = 1
    for m in methods:
        if m.engine != "specbench" or m.drafter == "none" or m.verify == "fast":
            continue
        name, _, arg = m.policy.partition(":")
        k = int(arg) if arg else max(1, int(getattr(runner.drafter(m, -1), "preferred_k", 4)))
        widest = max(widest, k + 1)
    return list(range(2, widest + 1))


@dataclass
class PromptBench:
    """A prompt benchmark's results: one row per timed run, and per-category summaries."""

    runs: list[dict[str, Any]]
    methods: list[Method]
    info: dict[str, Any]

    def categories(self) -> list[str]:
        return list(dict.fromkeys(r["category"] for r in self.runs))

    def summary(self) -> list[dict[str, Any]]:
        return summarize_prompt_runs(self.runs, self.methods, self.info)

    def table(self) -> str:
        return prompt_table(self.summary(), self.methods, self.categories(), self.info)

    def figure(self):
        return prompt_figure(self.summary(), self.methods, self.categories(), self.info)

    def save(self, out: str | os.PathLike, figure: bool = True) -> dict[str, Path]:
        """Write runs and summary (parquet), settings (JSON), the table (markdown) and the figure
        (PNG, unless ``figure`` is False), atomically."""
        out = Path(out)
        summary = self.summary()
        meta = {"info": self.info, "methods": [asdict(m) for m in self.methods]}
        paths = {
            "runs": _write_parquet(self.runs, out / PROMPT_RUNS_FILE),
            "summary": _write_parquet(summary, out / PROMPT_SUMMARY_FILE),
            "info": write_text_atomic(out / PROMPT_INFO_FILE, json.dumps(meta, indent=1) + "\n"),
            "table": write_text_atomic(out / PROMPT_TABLE_FILE, self.table() + "\n"),
        }
        if figure:
            from specbench.report.plots import save as save_figure

            paths["figure"] = save_figure(self.figure(), out / PROMPT_FIGURE_FILE)
        return paths


def load_prompt_bench(folder: str | os.PathLike) -> PromptBench:
    """The results ``bench_prompts`` saved in ``folder`` (e.g. to draw the figure elsewhere)."""
    import polars as pl

    folder = Path(folder)
    runs_path, info_path = folder / PROMPT_RUNS_FILE, folder / PROMPT_INFO_FILE
    if not runs_path.exists() or not info_path.exists():
        raise FileNotFoundError(f"no prompt benchmark in {folder}: {PROMPT_RUNS_FILE} and {PROMPT_INFO_FILE} are needed")
    meta = json.loads(info_path.read_text())
    return PromptBench(pl.read_parquet(runs_path).to_dicts(), [Method(**m) for m in meta["methods"]], meta["info"])


def bench_prompts(
    model: Any,
    tokenizer: Any,
    questions: Sequence[Any],
    drafters: Sequence[str] = ("lookup", "suffix"),
    policies: Sequence[str] = ("auto", "fixed:4"),
    max_tokens: int = 128,
    repeats: int = 1,
    draft_model: Any = None,
    num_draft_tokens: int = 2,
    verify: Sequence[str | None] = (None,),
    model_name: str = "model",
    out: str | os.PathLike | None = None,
    fresh: bool = False,
    warmup: bool = True,
    time_budget_s: float | None = None,
    figure: bool = True,
    progress: Callable[[str], None] | None = functools.partial(print, flush=True),
) -> PromptBench:
    """Benchmark every method on ``questions`` (``specbench.prompts.Question``), greedy, batch 1.

    Each question's turns are rendered with the chat template; for turn 2 and later the history
    holds mlx-lm's plain greedy answers to the earlier turns. Per prompt every method runs
    ``repeats`` times in a rotating order; outputs are compared with mlx-lm's plain output.
    With ``out``, finished questions are saved after each one and an interrupted run resumes
    there (``fresh`` starts over); the summary, table and figure (unless ``figure`` is False) are
    written at the end.
    ``time_budget_s`` stops starting new questions once that many seconds (warm-up included) have passed.
    """
    from specbench.experiments.prompts import render_prompt

    if not questions:
        raise ValueError("no questions to benchmark: check the prompt file and --categories")
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(f"max_tokens must be a positive integer, got {max_tokens!r}")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    methods = prompt_methods(drafters, policies, verify, draft_model is not None, num_draft_tokens)
    say = progress or (lambda text: None)
    info = _bench_info(model_name, max_tokens, repeats)
    config = _prompt_config(model_name, methods, max_tokens, repeats, num_draft_tokens, info["device"])
    runs: list[dict[str, Any]] = []
    done: set[str] = set()
    runs_path = Path(out) / PROMPT_RUNS_FILE if out is not None else None
    if runs_path is not None and runs_path.exists() and not fresh:
        import polars as pl

        previous = pl.read_parquet(runs_path).to_dicts()
        if previous and previous[0].get("config") != config:
            raise ValueError(
                f"{runs_path} holds results of another benchmark configuration: choose another --out, "
                f"or pass --fresh to overwrite it"
            )
        runs = previous
        done = {r["question_key"] for r in runs}
        if done:
            say(f"resuming: {len(done)} questions already done in {runs_path}")
    runner = _MethodRunner(model, tokenizer, model_name, draft_model, num_draft_tokens, max_tokens)
    stop_ids = set(getattr(tokenizer, "eos_token_ids", None) or [])
    todo = [q for q in questions if _question_key(q) not in done]
    start = time.perf_counter()
    if warmup and todo:
        prompts = [render_prompt(tokenizer, q.turns[0]) for q in todo]
        _warm_up(runner, methods, prompts[0], max(prompts, key=len), say)
    for index, question in enumerate(todo):
        if time_budget_s is not None and time.perf_counter() - start > time_budget_s:
            say(f"time budget of {time_budget_s:.0f} s spent: {len(todo) - index} questions not run")
            info["unfinished_questions"] = len(todo) - index
            break
        key = _question_key(question)
        messages: list[dict[str, str]] = []
        rows = []
        for turn, text in enumerate(question.turns):
            messages.append({"role": "user", "content": text})
            prompt = render_prompt(tokenizer, messages)
            reference: list[int] | None = None
            for repeat in range(repeats):
                shift = (len(done) + index + turn + repeat) % len(methods)
                for method in methods[shift:] + methods[:shift]:
                    run = runner.run(method, prompt, repeat)
                    if method.name == PROMPT_BASELINE and repeat == 0:
                        reference = run.tokens
                    rows.append(_run_row(config, key, question, turn, repeat, method, prompt, run))
            for row in rows:
                if row["turn"] == turn:
                    row["first_mismatch"] = _first_mismatch(row["tokens"], reference)
                    row["equal"] = row["first_mismatch"] == -1
            messages.append({"role": "assistant", "content": tokenizer.decode(_strip_stops(reference, stop_ids))})
        runs += rows
        base = [r for r in rows if r["method"] == PROMPT_BASELINE]
        say(
            f"[{len(done) + index + 1}/{len(done) + len(todo)}] {question.category} {question.question_id}: "
            + ", ".join(
                f"{m.name} {_ratio(base, [r for r in rows if r['method'] == m.name]):.2f}x" for m in methods[1:]
            )
        )
        if runs_path is not None:
            _write_parquet(runs, runs_path)
    result = PromptBench(runs, methods, info)
    if out is not None and runs:
        result.save(out, figure=figure)
    return result


def _bench_info(model_name: str, max_tokens: int, repeats: int) -> dict[str, Any]:
    from specbench.cost.profile import device_name, versions

    return {
        "model": model_name, "device": device_name(), **versions(), "max_tokens": max_tokens, "repeats": repeats,
        "date": time.strftime("%Y-%m-%d"),
    }


def _warm_up(
    runner: _MethodRunner, methods: Sequence[Method], first: list[int], longest: list[int], say: Callable[[str], None]
) -> None:
    """Untimed: calibrate exact verification for the widths in use, run every method on the first
    prompt for the full ``max_tokens``, and plain decoding on the longest prompt, so that the
    kernels for every verify width and the cache sizes the run reaches are built before timing
    (on a GPU the first call at a new shape compiles kernels)."""
    t0 = time.perf_counter()
    widths = _verify_widths(methods, runner)
    if widths:
        from specbench.exact.hooks import calibrate

        calibrate(runner.model, widths)
    for method in methods:
        runner.run(method, first, repeat=-1)
    if longest != first:
        runner.run(methods[0], longest, repeat=-1)
    runner.drafters = {k: v for k, v in runner.drafters.items() if k[1] >= 0}
    say(f"warm-up: {len(methods)} methods, exact widths {widths[-1] if widths else 1}, {time.perf_counter() - t0:.1f} s")


def _run_row(config, key, question, turn, repeat, method: Method, prompt, run: TimedRun) -> dict[str, Any]:
    new = len(run.tokens)
    return {
        "config": config, "question_key": key, "question_id": str(question.question_id),
        "category": question.category, "subcategory": question.subcategory, "turn": turn, "repeat": repeat,
        "method": method.name, "engine": method.engine, "drafter": method.drafter, "policy": method.policy,
        "verify": method.verify or ("none" if method.engine == "mlx-lm" or method.drafter == "none" else "exact"),
        "prompt_tokens": len(prompt), "new_tokens": new, "wall_s": run.wall_s, "first_token_s": run.first_token_s,
        "tokens_per_s": new / run.wall_s if run.wall_s > 0 else 0.0,
        "forwards": run.forwards, "verifies": run.verifies, "drafted": run.drafted, "accepted": run.accepted,
        "pos_drafted": run.pos_drafted, "pos_accepted": run.pos_accepted, "finish_reason": run.finish_reason,
        "tokens": run.tokens, "equal": False, "first_mismatch": 0,
    }


def _decode_tokens(row: dict[str, Any]) -> int:
    """Tokens produced by the forwards counted in ``forwards`` (mlx-lm's draft-model speculation
    produces its first token in a verification too)."""
    return row["new_tokens"] if row["drafter"] == "draft-model" else max(0, row["new_tokens"] - 1)


def _ratio(base_rows: list[dict[str, Any]], rows: list[dict[str, Any]]) -> float:
    """Throughput of ``rows`` over that of ``base_rows`` (total tokens / total seconds each)."""
    def rate(rs):
        seconds = sum(r["wall_s"] for r in rs)
        return sum(r["new_tokens"] for r in rs) / seconds if seconds > 0 else 0.0

    base = rate(base_rows)
    return rate(rows) / base if base > 0 else float("nan")


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def summarize_prompt_runs(
    runs: Sequence[dict[str, Any]], methods: Sequence[Method], info: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """Per method and category (and "overall"): throughput, speedup over mlx-lm plain, #MAT,
    acceptance, per-position acceptance and output equality.

    Seconds per prompt are the median over repeats; throughput is total tokens / total seconds
    (Spec-Bench's overall speedup), end to end (``tokens_per_s``, ``speedup``) and after the first
    token (``decode_*``). ``speedup_min``/``speedup_max`` are the extremes over repeats.
    ``position_acceptance[i]``: verifications that accepted draft position i / all verifications
    (vLLM's per-position acceptance rate); ``mean_accepted_tokens``: #MAT.
    """
    info = info or {}
    categories = list(dict.fromkeys(r["category"] for r in runs))
    repeats = sorted({r["repeat"] for r in runs})
    out = []
    for group in categories + ["overall"]:
        in_group = [r for r in runs if group == "overall" or r["category"] == group]
        timing = {}
        for m in methods:
            mine = [r for r in in_group if r["method"] == m.name]
            by_prompt: dict[tuple[str, int], list[dict[str, Any]]] = {}
            for r in mine:
                by_prompt.setdefault((r["question_key"], r["turn"]), []).append(r)
            tokens = sum(rs[0]["new_tokens"] for rs in by_prompt.values())
            wall = sum(_median([r["wall_s"] for r in rs]) for rs in by_prompt.values())
            first = sum(_median([r["first_token_s"] for r in rs]) for rs in by_prompt.values())
            per_repeat = {
                rep: ([r for r in mine if r["repeat"] == rep]) for rep in repeats
            }
            timing[m.name] = (mine, by_prompt, tokens, wall, first, per_repeat)
        base = timing.get(PROMPT_BASELINE)
        for m in methods:
            mine, by_prompt, tokens, wall, first, per_repeat = timing[m.name]
            if not mine:
                continue
            decode_s = wall - first
            tps = tokens / wall if wall > 0 else 0.0
            decode_tps = max(0, tokens - len(by_prompt)) / decode_s if decode_s > 0 else 0.0
            row = {
                "model": info.get("model", ""), "device": info.get("device", ""), "method": m.name,
                "engine": m.engine, "drafter": m.drafter, "policy": m.policy, "verify": mine[0]["verify"],
                "category": group, "prompts": len(by_prompt), "new_tokens": tokens, "seconds": wall,
                "tokens_per_s": tps, "decode_tokens_per_s": decode_tps,
            }
            if base is not None and base[3] > 0:
                _, base_prompts, btokens, bwall, bfirst, bper_repeat = base
                btps = btokens / bwall
                bdecode = max(0, btokens - len(base_prompts)) / (bwall - bfirst) if bwall > bfirst else 0.0
                spread = [_ratio(bper_repeat[rep], per_repeat[rep]) for rep in repeats if per_repeat[rep]]
                row.update(
                    speedup=tps / btps, decode_speedup=decode_tps / bdecode if bdecode > 0 else float("nan"),
                    speedup_min=min(spread), speedup_max=max(spread),
                )
            forwards = sum(r["forwards"] for r in mine)
            drafted = sum(r["drafted"] for r in mine)
            accepted = sum(r["accepted"] for r in mine)
            verifies = sum(r["verifies"] for r in mine)
            width = max((len(r["pos_drafted"]) for r in mine), default=0)
            pos_a = [sum(r["pos_accepted"][i] for r in mine if i < len(r["pos_accepted"])) for i in range(width)]
            row.update(
                mean_accepted_tokens=sum(_decode_tokens(r) for r in mine) / forwards if forwards else float("nan"),
                acceptance_rate=accepted / drafted if drafted else float("nan"),
                position_acceptance=[a / verifies for a in pos_a] if verifies else [],
                equal=sum(all(r["equal"] for r in rs) for rs in by_prompt.values()),
                total=len(by_prompt),
            )
            out.append(row)
    return out


def _fmt(value: Any, spec: str = ".2f", missing: str = "-") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return missing
    return format(value, spec)


def prompt_table(
    summary: Sequence[dict[str, Any]], methods: Sequence[Method], categories: Sequence[str], info: dict[str, Any]
) -> str:
    """Two markdown tables: speedup over mlx-lm plain by category, and the overall metrics per method."""
    groups = list(categories) + ["overall"]
    cell = {(r["method"], r["category"]): r for r in summary}
    names = [m.name for m in methods if (m.name, "overall") in cell]
    head = (
        f"Prompt benchmark: {info.get('model', '')} on {info.get('device', '')}, greedy, batch 1, "
        f"max {info.get('max_tokens', '')} new tokens, {info.get('repeats', 1)} repeat(s); "
        f"mlx {info.get('mlx', '')}, mlx-lm {info.get('mlx_lm', '')}, {info.get('date', '')}"
    )
    lines = [head, "", "Speedup over mlx-lm plain (end to end, tokens/s ratio):", ""]
    lines.append("| method | " + " | ".join(groups) + " |")
    lines.append("|---" * (len(groups) + 1) + "|")
    for name in names:
        lines.append(
            f"| {name} | " + " | ".join(_fmt(cell.get((name, g), {}).get("speedup"), ".2f") + "x" for g in groups) + " |"
        )
    lines += ["", "Overall:", ""]
    cols = [
        "method", "tok/s", "decode tok/s", "speedup", "decode speedup", "spread", "#MAT", "accept",
        "per-position acceptance", "equal",
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
    if info.get("unfinished_questions"):
        lines += ["", f"(time budget reached: {info['unfinished_questions']} questions not run)"]
    return "\n".join(lines)


def method_style(method: Method) -> dict[str, Any]:
    """Bar colour (by drafter) and hatching (by policy) of a method in benchmark figures."""
    policy = method.policy.partition(":")[0]
    return {"color": _drafter_colour(method.drafter), "hatch": POLICY_HATCHES.get(policy, "xx")}


def prompt_figure(
    summary: Sequence[dict[str, Any]], methods: Sequence[Method], categories: Sequence[str], info: dict[str, Any]
):
    """Speedup over mlx-lm plain by category, one bar per method (whiskers: range over repeats)."""
    import matplotlib

    if matplotlib.get_backend().lower() != "agg":
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    groups = list(categories) + ["overall"]
    cell = {(r["method"], r["category"]): r for r in summary}
    shown = [m for m in methods if m.name != PROMPT_BASELINE and (m.name, "overall") in cell]
    fig, ax = plt.subplots(figsize=(min(16.0, max(7.0, 0.2 * len(groups) * len(shown) + 3)), 4.8),
                           constrained_layout=True)
    width = 0.8 / max(1, len(shown))
    x = np.arange(len(groups))
    for i, m in enumerate(shown):
        rows = [cell.get((m.name, g), {}) for g in groups]
        values = np.array([r.get("speedup", np.nan) for r in rows], dtype=float)
        low = np.array([r.get("speedup_min", np.nan) for r in rows], dtype=float)
        high = np.array([r.get("speedup_max", np.nan) for r in rows], dtype=float)
        style = method_style(m)
        ax.bar(x - 0.4 + width * (i + 0.5), values, width, label=m.name, color=style["color"], hatch=style["hatch"],
               edgecolor="0.2", linewidth=0.5)
        if info.get("repeats", 1) > 1:
            ax.errorbar(x - 0.4 + width * (i + 0.5), values, yerr=[values - low, high - values], fmt="none",
                        ecolor="0.15", elinewidth=0.8, capsize=2)
    ax.axhline(1.0, color="0.2", lw=0.9, ls="--", label="mlx-lm plain (1.0)")
    ax.set_xticks(x, [g.replace("_", "\n") for g in groups], fontsize=9)
    ax.set_ylabel("speedup over mlx-lm plain decoding (x)")
    ax.set_xlabel("prompt category")
    ax.set_title(
        f"Speculative decoding speedup by category: {info.get('model', '')} on {info.get('device', '').split(':', 1)[-1]}\n"
        f"greedy, batch 1, max {info.get('max_tokens', '')} new tokens (mlx {info.get('mlx', '')}, mlx-lm {info.get('mlx_lm', '')})",
        fontsize=10,
    )
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), title="method", title_fontsize=8)
    ax.set_ylim(0, None)
    return fig


# ---------------------------------------------------------------------------- end of prompt benchmark
