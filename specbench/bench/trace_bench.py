"""Trace benchmark: conversations replayed turn by turn, plain decoding against each drafter (``bench_trace``;
``run_trace`` for a file of traces).

The next turn's prompt holds plain decoding's reply, which every drafter must reproduce token for token
(checked on every turn); drafter objects live across turns. Plain decoding's outputs are kept for
``specbench.simulate.simulate`` to replay offline.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from specbench.bench.timing import timed_generation
from specbench.bench.trace_summary import (
    PLAIN,
    format_overall,
    format_summary,
    overall_by_method,
    summarize_trace_bench,
    with_cumulative,
)
from specbench.bench.turn_cache import TurnCache, reply_text
from specbench.common.files import safe_name, write_json_atomic, write_parquet_atomic, write_text_atomic
from specbench.common.per_key import per_key
from specbench.core.draft import Drafter
from specbench.core.engine import Generation
from specbench.core.forward import context_length
from specbench.core.log import StepLog
from specbench.core.options import GenerateOptions
from specbench.core.policies import DraftPolicy, as_policy
from specbench.drafters import make_drafter
from specbench.inputs.importers import load_traces
from specbench.inputs.stored import read_json, read_parquet
from specbench.inputs.trace_prompts import fitted_turn
from specbench.inputs.traces import Trace, pick_ids
from specbench.simulate.simulate import Recorded, load_recorded, save_recorded

TRACE_SUMMARY_FILE = "trace_bench_summary.parquet"
TRACE_TABLE_FILE = "trace_bench.txt"
TRACE_CONFIG_FILE = "trace_bench_config.json"
TRACE_OVERALL_FILE = "trace_bench_overall.parquet"


@dataclass
class TraceBench:
    """What ``bench_trace`` measured: ``turns`` (one row per turn and method), ``summary`` (one row
    per method), ``steps`` (every step's record, with trace/turn/method columns) and ``recorded``
    (plain decoding's output per turn, for ``specbench.simulate.simulate``)."""

    trace: str
    turns: pl.DataFrame
    summary: pl.DataFrame
    steps: StepLog
    recorded: list[Recorded]

    @property
    def identical(self) -> bool:
        """Every drafter reproduced plain decoding's output on every turn."""
        return bool(self.turns["identical"].all())

    def table(self) -> str:
        return format_summary(self.summary)


#: What a turn's row copies of its generation's ``stats()``.
_STATS = (
    "prompt_tokens cached_prompt_tokens tokens finish_reason steps verifies drafted accepted tokens_per_verify "
    "mean_accepted_tokens"
).split()


def _row(trace_id: str, turn: int, method: str, gen: Generation, plain: Generation) -> dict[str, Any]:
    stats = gen.stats()
    decode_s = stats["decode_s"]
    return {
        "trace": trace_id,
        "turn": turn,
        "method": method,
        **{name: stats[name] for name in _STATS},
        "decode_tokens": stats["tokens"] - 1,  # the first token comes from the prompt pass
        **{name: stats[name] for name in ("decode_s", "prefill_s", "observe_s")},
        "tokens_per_s": stats["decode_tokens_per_s"],
        "speedup": plain.stats()["decode_s"] / decode_s if decode_s > 0 else 0.0,
        "identical": list(gen.tokens) == list(plain.tokens),
    }


def bench_trace(
    model: Any,
    tokenizer: Any,
    trace: Trace,
    drafters: Mapping[str, Drafter],
    policy: DraftPolicy | Mapping[str, DraftPolicy] | None = None,
    max_tokens: int = 128,
    options: GenerateOptions | None = None,
    turns: int | None = None,
    out_dir: str | os.PathLike | None = None,
    progress: bool = False,
    truncate: str = "error",
    reuse_cache: bool = True,
) -> TraceBench:
    """Replay ``trace``: plain decoding and every drafter on each turn, in one run. Each method keeps its prompt
    cache from turn to turn (``reuse_cache``), prefilling only what its prompt adds. A prompt that does not fit the
    model's context is an error naming the trace and turn, or with ``truncate="oldest"`` loses its oldest messages.

    ``drafters`` maps a method name (not "plain") to a drafter reused across turns; ``policy``: one for all (default
    ``DraftPolicy.auto()``) or one per method name. ``options`` (greedy) sets stops and verify mode, else
    ``max_tokens`` caps each reply; ``turns`` limits the replay. With ``out_dir``, its tables are written there."""
    if PLAIN in drafters:
        raise ValueError(f"{PLAIN!r} is the baseline every run includes; do not name a drafter so")
    if any(d is None for d in drafters.values()):
        raise ValueError("drafters must be Drafter objects (plain decoding is always included)")
    options = options or GenerateOptions(max_tokens=max_tokens)
    if options.temperature != 0:
        raise ValueError("the trace benchmark compares greedy outputs: use temperature=0")
    policy = DraftPolicy.auto() if policy is None else policy
    policies = per_key(policy, drafters, as_policy, "no policy given for methods {}")
    n_turns = len(trace.turns) if turns is None else min(turns, len(trace.turns))
    if n_turns < 1:
        raise ValueError(f"trace {trace.id!r} has no turns to replay")
    tokenizer_eos = getattr(tokenizer, "eos_token_ids", None) or []
    stop_ids = set(options.stop_token_ids) | set(options.eos_token_ids) | set(tokenizer_eos)

    rows: list[dict[str, Any]] = []
    steps = StepLog()
    recorded: list[Recorded] = []
    replies: list[str] = []
    context = context_length(model)
    methods = [PLAIN, *drafters]
    caches = {
        name: TurnCache(reuse_cache and not getattr(drafters.get(name), "needs_hidden", False)) for name in methods
    }
    for turn in range(n_turns):
        prompt, dropped = fitted_turn(tokenizer, trace, turn, replies, context, options.max_tokens, truncate)
        start = time.perf_counter()
        # The order of methods rotates from turn to turn, so drift in the machine's speed spreads evenly.
        order = methods[turn % len(methods) :] + methods[: turn % len(methods)]
        done: dict[str, Generation] = {}
        for name in order:  # each method prefills only what its cache does not hold, and keeps the cache
            drafter, cache = drafters.get(name), caches[name].take(prompt)
            done[name] = timed_generation(model, prompt, options, drafter, policies.get(name), tokenizer, cache).run
            caches[name].keep(prompt, done[name].cache)
        plain = done[PLAIN]
        runs = [(name, done[name]) for name in methods]
        for name, gen in runs:
            rows.append({**_row(trace.id, turn, name, gen, plain), "dropped_messages": dropped})
            for record in gen.log.records:
                cached = gen.cached_prompt_tokens if record.kind == "prefill" else 0
                where = {"trace": trace.id, "turn": turn, "method": name, "cached_prompt_tokens": cached}
                steps.append(record.labelled(**where))
        recorded.append(Recorded(list(prompt), list(plain.tokens), plain.finish_reason(), f"{trace.id}/{turn}"))
        replies.append(reply_text(tokenizer, plain.tokens, stop_ids))
        if progress:
            same = all(list(gen.tokens) == list(plain.tokens) for _, gen in runs)
            rates = ", ".join(f"{name} {gen.stats()['decode_tokens_per_s']:.1f} tok/s" for name, gen in runs)
            print(
                f"  {trace.id} turn {turn}: prompt {len(prompt)} ({plain.cached_prompt_tokens} from cache), "
                f"{len(plain.tokens)} tokens; {rates}; identical={same} ({time.perf_counter() - start:.1f} s)",
                flush=True,
            )

    frame = with_cumulative(pl.DataFrame(rows))
    result = TraceBench(trace.id, frame, summarize_trace_bench(frame), steps, recorded)
    if out_dir is not None:
        save_trace_bench(result, out_dir)
    return result


def _file_stem(trace_id: str) -> str:
    """A trace's file name in its folder, whatever its id holds (``../``, separators), and one per id: an id
    written otherwise (``a/b`` as ``a_b``, ``A`` beside ``a`` on a file system that ignores case) gets a digest
    of the exact id, so that no two traces share files."""
    name = safe_name(trace_id)
    if name == trace_id and name != name.lower():
        name = f"{name}-{hashlib.sha1(trace_id.encode('utf-8', 'surrogatepass')).hexdigest()[:8]}"
    return name


def save_trace_bench(result: TraceBench, out_dir: str | os.PathLike) -> list[Path]:
    """Write a trace benchmark's tables (atomically) into ``out_dir``; returns the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = _trace_files(result.trace, out)
    result.steps.save(paths[1])
    save_recorded(result.recorded, paths[2])
    write_parquet_atomic(result.turns, paths[0])  # last: the per-turn table marks the trace finished
    return paths


#: A trace's files in a run's folder: its per-turn table, step log and plain outputs.
_TRACE_FILE_PATTERNS = ("*.turns.parquet", "*.steps.parquet", "*.plain.parquet")


def _trace_files(trace_id: str, out_dir: Path) -> list[Path]:
    name = _file_stem(trace_id)
    return [out_dir / pattern.replace("*", name, 1) for pattern in _TRACE_FILE_PATTERNS]


_RESUME_REMEDY = "delete it (its trace then runs again), or choose another --out"


def _load_trace_bench(trace_id: str, out_dir: Path) -> TraceBench:
    turns_path, steps_path, plain_path = _trace_files(trace_id, out_dir)
    turns = read_parquet(turns_path, _RESUME_REMEDY)
    missing = {"trace", "method", "turn", "accepted", "drafted"} - set(turns.columns)
    if missing:
        raise ValueError(f"{turns_path}: not a trace benchmark's per-turn table (missing {sorted(missing)})")
    held = sorted(set(turns["trace"].to_list()))
    if held != [trace_id]:  # e.g. written for another id of the same file name, before names were one per id
        raise ValueError(f"{turns_path}: holds trace {', '.join(map(repr, held))}, not {trace_id!r}; {_RESUME_REMEDY}")
    steps = StepLog.from_rows(read_parquet(steps_path, _RESUME_REMEDY).to_dicts())
    try:
        recorded = load_recorded(plain_path)
    except ValueError as err:
        raise ValueError(f"{err}; {_RESUME_REMEDY}") from None
    return TraceBench(trace_id, turns, summarize_trace_bench(turns), steps, recorded)


@dataclass
class TraceRun:
    """``run_trace``'s results: one ``TraceBench`` per trace."""

    results: list[TraceBench]
    #: Whether each trace ran with fresh drafters (not ``share_store``): only then is the interval over traces valid.
    independent: bool = True

    @property
    def turns(self) -> pl.DataFrame:
        return pl.concat([r.turns for r in self.results], how="diagonal_relaxed")

    @property
    def summary(self) -> pl.DataFrame:
        return pl.concat([r.summary for r in self.results], how="diagonal_relaxed")

    @property
    def identical(self) -> bool:
        return all(r.identical for r in self.results)

    def overall(self) -> pl.DataFrame:
        """``overall_by_method`` of every trace's summary."""
        return overall_by_method(self.summary, self.independent)

    def table(self) -> str:
        """The summary per trace and method; with several traces, the overall speedups after it."""
        text = format_summary(self.summary)
        return text + "\n\n" + format_overall(self.overall()) if len(self.results) > 1 else text


def trace_methods(
    drafters: Sequence[str], policies: Sequence[DraftPolicy], model: Any = None, model_name: str | None = None
) -> tuple[dict[str, Drafter], dict[str, DraftPolicy]]:
    """Drafter objects and policies per method, from drafter names: one method per (drafter, policy),
    named by the drafter alone when one policy is given, else ``drafter@policy`` (the policy's
    name). "none"/"plain" are skipped (plain decoding is always the baseline)."""
    names = [d for d in drafters if d not in ("none", PLAIN, "")]
    if not policies:
        raise ValueError("give at least one policy (DraftPolicy.auto(), .fixed(n) or .adaptive(n))")
    policies = [as_policy(p) for p in policies]
    labels = [p.name for p in policies]
    if len(set(labels)) != len(labels):
        raise ValueError(f"policies need distinct names to label their methods, got {labels}")
    made: dict[str, Drafter] = {}
    chosen: dict[str, DraftPolicy] = {}
    for name in names:
        for policy in policies:
            method = name if len(policies) == 1 else f"{name}@{policy.name}"
            if (drafter := make_drafter(name, model=model, model_name=model_name)) is not None:
                made[method], chosen[method] = drafter, policy
    return made, chosen


def run_trace(
    model: Any,
    tokenizer: Any,
    source: str | os.PathLike | Trace | Sequence[Trace],
    drafters: Sequence[str] = ("lookup", "suffix"),
    policies: Sequence[DraftPolicy] | None = None,
    max_tokens: int = 128,
    options: GenerateOptions | None = None,
    turns: int | None = None,
    out: str | os.PathLike | None = None,
    format: str | None = None,
    share_store: bool = False,
    model_name: str | None = None,
    progress: bool = True,
    trace_ids: Sequence[str] | None = None,
    limit: int | None = None,
    truncate: str = "error",
    reasoning: str = "keep",
) -> TraceRun:
    """Replay the traces of a file (or bundled trace name, or ``Trace`` objects) with drafters by name, each trace
    with fresh drafters unless ``share_store`` (SuffixDecoding's store then carries over). With ``out``, every
    trace's tables and a summary are written there; a rerun with the same settings skips the traces finished there
    (not with ``share_store``). ``trace_ids`` and ``limit`` pick traces; ``truncate`` is ``bench_trace``'s,
    ``reasoning`` ("keep" or "drop") ``load_traces``'."""
    policies = [DraftPolicy.auto()] if policies is None else [as_policy(p) for p in policies]
    if isinstance(source, Trace):
        traces = [source]
    elif isinstance(source, (str, os.PathLike)):
        traces = load_traces(source, format, reasoning)
    else:
        traces = list(source)
    if trace_ids or limit is not None:
        kept = set(pick_ids([t.id for t in traces], trace_ids, limit, str(source)))
        traces = [t for t in traces if t.id in kept]
    config = {
        "model": model_name,
        "drafters": list(drafters),
        "policies": [p.name for p in policies],
        "max_tokens": max_tokens,
        "turns": turns,
        "options": repr(options),
        "share_store": share_store,
        "truncate": truncate,
    }
    say = functools.partial(print, flush=True) if progress else lambda text: None
    out_dir = Path(out) if out is not None else None
    resumable = False
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        config_path = out_dir / TRACE_CONFIG_FILE
        resumable = not share_store and config_path.exists() and read_json(config_path, _RESUME_REMEDY) == config
        if not resumable:
            # the traces finished under other settings go before the new settings are written: a run interrupted
            # after this must not take them for finished under these
            stale = [p for pattern in _TRACE_FILE_PATTERNS for p in out_dir.glob(pattern)]
            for path in stale:
                path.unlink()
            if stale:
                say(f"{out_dir}: other settings than its earlier run's: its traces run again")
            write_json_atomic(config_path, config)
    results: list[TraceBench] = []
    shared = trace_methods(drafters, policies, model, model_name) if share_store else None
    for trace in traces:
        if out_dir is not None and resumable and all(p.exists() for p in _trace_files(trace.id, out_dir)):
            results.append(_load_trace_bench(trace.id, out_dir))
            say(f"{trace.id}: finished earlier in {out_dir}, skipped")
            continue
        made, chosen = shared if shared is not None else trace_methods(drafters, policies, model, model_name)
        say(f"{trace.id}: {len(trace.turns)} turns, methods: plain, {', '.join(made)}")
        result = bench_trace(
            model, tokenizer, trace, made, chosen, max_tokens, options, turns, None, progress, truncate
        )
        if out_dir is not None:
            with _finished_kept(out_dir, len(results)):
                save_trace_bench(result, out_dir)
        results.append(result)
    run = TraceRun(results, independent=not share_store)
    if out_dir is not None:
        with _finished_kept(out_dir, len(results)):
            write_parquet_atomic(run.summary, out_dir / TRACE_SUMMARY_FILE)
            write_parquet_atomic(run.overall(), out_dir / TRACE_OVERALL_FILE)
            write_text_atomic(out_dir / TRACE_TABLE_FILE, run.table() + "\n")
    return run


@contextlib.contextmanager
def _finished_kept(out_dir: Path, finished: int) -> Iterator[None]:
    """An OSError while writing a run's files (a full disk) as one that names the file and says what is kept: the
    ``finished`` traces' files, each written whole, from which the same command resumes."""
    try:
        yield
    except OSError as err:
        where = err.filename or out_dir
        raise OSError(
            f"cannot write {where} ({err.strerror or err}): the {finished} traces finished before are kept in "
            f"{out_dir}; free space and run the same command again to resume after them"
        ) from err
