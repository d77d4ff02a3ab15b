"""Prompt benchmark: Spec-Bench's protocol (Xia et al., arXiv 2401.07851), side by side with mlx-lm.

Prompts by category, greedy decoding, batch 1: speedup over plain decoding, #MAT (tokens per target forward,
the bonus token included, so plain decoding gives 1.00) and a check that every output equals plain greedy
decoding. Every method (``specbench.bench.prompt_runs``) runs in one process on the same prompts, warmed up
first and interleaved per prompt in a rotating order, so that drift of the machine's speed spreads evenly.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import polars as pl

from specbench.bench.prompt_runs import PROMPT_BASELINE, Method, MethodRunner, PromptRun, prompt_methods
from specbench.bench.prompt_summary import prompt_table, summarize_prompt_runs, throughput_ratio
from specbench.bench.turn_cache import first_divergence, reply_text
from specbench.common import distributed
from specbench.common.files import write_json_atomic, write_parquet_atomic, write_text_atomic
from specbench.common.identity import device_name, model_key, tokenizer_key, versions
from specbench.core.forward import vocab_size
from specbench.core.policies import DraftPolicy
from specbench.cost.profile import Profile, load_profile
from specbench.drafters.draft_model import shipped_draft_model
from specbench.inputs.prompts import render_prompt
from specbench.inputs.stored import read_json, read_parquet

PROMPT_RUNS_FILE = "prompt_bench_runs.parquet"
PROMPT_SUMMARY_FILE = "prompt_bench_summary.parquet"
PROMPT_TABLE_FILE = "prompt_bench.md"
PROMPT_INFO_FILE = "prompt_bench.json"
#: Where each rank of a run spread over ranks keeps its share's progress inside ``out``.
RANKS_FOLDER = ".ranks"


def no_profile_note(model_name: str, device: str) -> str:
    """What the benchmark says when no cost profile is stored for the model on this device."""
    return (
        f"no stored cost profile for {model_name} on {device}: run `specbench profile {model_name}` to see predictions"
    )


def _say(text: str) -> None:
    print(text, flush=True)


def _question_key(question: Any) -> str:
    text = json.dumps([str(question.question_id), question.category, list(question.turns)], ensure_ascii=False)
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def _write_parquet(rows: Sequence[dict[str, Any] | PromptRun], path: Path) -> Path:
    rows = [r.row() if isinstance(r, PromptRun) else r for r in rows]
    return write_parquet_atomic(pl.DataFrame(rows, infer_schema_length=None), path)


def read_runs(path: Path) -> list[PromptRun]:
    """The runs stored at ``path`` (a ValueError naming it when it is not a runs table)."""
    rows = read_parquet(path, "delete it, choose another --out, or pass --fresh to start over").to_dicts()
    if rows and not {"config", "question_key"} <= set(rows[0]):
        raise ValueError(f"{path}: not a prompt benchmark's runs table; choose another --out or pass --fresh")
    return [PromptRun.from_row(r) for r in rows]


def resumed_runs(path: Path | None, runs: list[PromptRun], configs: set[str]) -> list[PromptRun]:
    """``runs`` (read from ``path``) to resume, or a ValueError when they hold a configuration not in ``configs``."""
    if {r.config for r in runs} - configs:
        raise ValueError(
            f"{path} holds results of another benchmark configuration: choose another --out, "
            f"or pass --fresh to overwrite it"
        )
    return runs


@dataclass
class PromptBench:
    """A prompt benchmark's results: one row per timed run, and per-category summaries; with the model's cost
    ``profile``, each speculative method's measured speedup beside its prediction."""

    runs: list[PromptRun]
    methods: list[Method]
    info: dict[str, Any]
    profile: Profile | None = None

    def categories(self) -> list[str]:
        return list(dict.fromkeys(r.category for r in self.runs))

    def summary(self) -> list[dict[str, Any]]:
        """The rows of ``prompt_bench_summary.parquet`` (``summarize_prompt_runs``)."""
        return [r.row() for r in summarize_prompt_runs(self.runs, self.methods, self.info, self.profile)]

    def table(self) -> str:
        summary = summarize_prompt_runs(self.runs, self.methods, self.info, self.profile)
        return prompt_table(summary, self.methods, self.categories(), self.info, self.prediction_source())

    def prediction_source(self) -> str:
        """Where the predictions come from (the cost profile), or why there are none."""
        if self.profile is None:
            return no_profile_note(self.info.get("model", "model"), self.info.get("device", ""))
        speculative = [r for r in self.runs if r.speculative_specbench]
        if speculative and not any(r.steps for r in speculative):
            return "these runs kept no step records (saved by an older specbench): run again with --fresh to see them"
        p = self.profile
        text = (
            f"cost profile of {p.name} on {p.device}{', quick' if p.quick else ''} {p.created}: acceptance per "
            "position x k x c(w) with the engine's overhead, d from each run's drafting; residual = measured / "
            "predicted - 1"
        )
        missing = ",".join(sorted({r.verify for r in speculative} - set(p.costs)))
        if missing:
            model = self.info.get("model", "MODEL")
            text += f"; it has no {missing} verify costs: `specbench profile {model} --verify {missing}`"
        return text

    def save(self, out: str | os.PathLike) -> dict[str, Path]:
        """Write runs and summary (parquet), settings (JSON) and the table (markdown), atomically."""
        out = Path(out)
        meta = {"info": self.info, "methods": [m.record() for m in self.methods]}
        return {
            "runs": _write_parquet(self.runs, out / PROMPT_RUNS_FILE),
            "summary": _write_parquet(self.summary(), out / PROMPT_SUMMARY_FILE),
            "info": write_json_atomic(out / PROMPT_INFO_FILE, meta),
            "table": write_text_atomic(out / PROMPT_TABLE_FILE, self.table() + "\n"),
        }


def is_recorded_run(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a folder a prompt benchmark saved its runs in (``specbench bench prompts --out``)."""
    return (Path(path) / PROMPT_RUNS_FILE).is_file() and (Path(path) / PROMPT_INFO_FILE).is_file()


def load_prompt_bench(folder: str | os.PathLike, profile: Profile | None = None) -> PromptBench:
    """The results ``bench_prompts`` saved in ``folder`` (e.g. to draw the figure elsewhere); with the model's
    cost ``profile``, the speculative methods' predictions."""
    folder = Path(folder)
    runs_path, info_path = folder / PROMPT_RUNS_FILE, folder / PROMPT_INFO_FILE
    if not is_recorded_run(folder):
        raise FileNotFoundError(
            f"no prompt benchmark in {folder}: {PROMPT_RUNS_FILE} and {PROMPT_INFO_FILE} are needed"
        )
    meta = read_json(info_path)
    if not isinstance(meta, dict) or not {"methods", "info"} <= set(meta):
        raise ValueError(f"{info_path}: not a prompt benchmark's settings (needs 'methods' and 'info')")
    methods = [Method.from_record(m) for m in meta["methods"]]
    return PromptBench(read_runs(runs_path), methods, meta["info"], profile)


def bench_prompts(
    model: Any,
    tokenizer: Any,
    questions: Sequence[Any],
    drafters: Sequence[str] = ("lookup", "suffix"),
    policies: Sequence[DraftPolicy] | None = None,
    max_tokens: int = 128,
    repeats: int = 1,
    draft_model: Any = None,
    k: int = 2,
    verify: Sequence[str | None] = (None,),
    model_name: str = "model",
    out: str | os.PathLike | None = None,
    fresh: bool = False,
    warmup: bool = True,
    time_budget_s: float | None = None,
    progress: Callable[[str], None] | None = _say,
    profile: Profile | str | None = "stored",
    spread: bool = False,
) -> PromptBench:
    """Benchmark every method on ``questions`` (``specbench.inputs.prompts.Question``), greedy, batch 1: per prompt
    every method ``repeats`` times in a rotating order; turn 2 and later hold mlx-lm's plain greedy answers to the
    earlier turns. ``policies`` default to ``DraftPolicy.auto()`` and ``DraftPolicy.fixed(4)``. With ``out``, each
    finished question is saved and an interrupted run resumes there (``fresh`` starts over). ``time_budget_s`` stops
    starting new questions once that many seconds have passed. ``profile``: the cost profile that predicts each
    speculative method's speedup ("stored": the model's on this device, if any; None: no predictions).

    ``spread``: under ``mlx.launch`` with several ranks and a model that is not sharded, each rank runs its share of
    the questions (each question whole on one rank, every method interleaved there, so its speedups compare methods
    on one machine) and keeps its progress in ``out/.ranks/rankRofN/`` (an interrupted run resumes with the same
    ranks); every rank returns the merged results, which rank 0 alone saves."""
    if not questions:
        raise ValueError("no questions to benchmark: check the prompt file and --categories")
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(f"max_tokens must be a positive integer, got {max_tokens!r}")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if draft_model is None and "draft-model" in drafters:  # the shipped pair's: mlx-lm's speculation runs it too
        draft_model = shipped_draft_model(model, model_name)
    methods = prompt_methods(drafters, policies, verify, draft_model is not None, k)
    device = device_name()
    info: dict[str, Any] = {"model": model_name, "device": device, **versions(), "max_tokens": max_tokens}
    info.update(repeats=repeats, date=time.strftime("%Y-%m-%d"))
    text = json.dumps([model_name, [m.record() for m in methods], max_tokens, repeats, k, device])
    config = hashlib.sha1(text.encode()).hexdigest()[:12]  # the digest of the run's configuration
    spread = spread and distributed.size() > 1 and not distributed.is_sharded(model)
    rank, size = (distributed.rank(), distributed.size()) if spread else (0, 1)

    def say(text: str) -> None:
        if progress:
            progress(f"rank {rank}/{size}: {text}" if spread else text)

    out = Path(out) if out is not None else None
    part = out / RANKS_FOLDER / f"rank{rank}of{size}" if out is not None and spread else out

    def saved(folder: Path | None, configs: set[str] | None) -> list[PromptRun]:
        """The runs ``folder`` holds to resume (``configs`` None: not checked yet)."""
        path = folder / PROMPT_RUNS_FILE if folder is not None else None
        runs = read_runs(path) if path is not None and path.exists() and not fresh else []
        return runs if configs is None else resumed_runs(path, runs, configs)

    def check() -> tuple[str, str, list[PromptRun], list[PromptRun]]:
        """This rank's configuration, device and progress; on rank 0 of a spread run, the merged runs in ``out``."""
        return config, device, saved(part, {config}), saved(out, None) if spread and rank == 0 else []

    ranks = distributed.gather_outcomes(check) if spread else [check()]
    kept = ranks[rank][2]
    previous = resumed_runs(out / PROMPT_RUNS_FILE, ranks[0][3], {r[0] for r in ranks}) if out and spread else []
    merged = {r.question_key for r in previous}
    remaining = [q for q in questions if _question_key(q) not in merged]
    mine = [remaining[i] for i in distributed.my_share([len(q.turns) for q in remaining])] if spread else remaining
    if merged and rank == 0 and progress:
        progress(f"resuming: {len(merged)} questions already done in {out and out / PROMPT_RUNS_FILE}")
    done = {r.question_key for r in kept}
    if done:
        say(f"resuming: {len(done)} questions already done in {part and part / PROMPT_RUNS_FILE}")
    if isinstance(profile, str):  # "stored": each rank's own device's (the merged results: rank 0's), if any
        profile = load_profile(model)
        if profile is None and rank == 0:  # the benchmark measures none itself: `specbench profile` does
            say(no_profile_note(model_name, device))
    # what ``specbench.bench.compare`` needs to tell whether two runs compare: the model's shape and dtypes (a
    # 4-bit and a bf16 version differ), its tokenizer's vocabulary and the ids its output layer predicts
    info.update(model_key=model_key(model), tokenizer=tokenizer_key(tokenizer), vocab=vocab_size(model))
    runner = MethodRunner(model, tokenizer, model_name, draft_model, k, max_tokens)
    stop_ids = set(getattr(tokenizer, "eos_token_ids", None) or [])
    todo = [q for q in mine if _question_key(q) not in done]
    runs = list(kept)
    start = time.perf_counter()
    if warmup and todo:
        prompts = [render_prompt(tokenizer, q.turns[0]) for q in todo]
        runner.warm_up(methods, prompts[0], max(prompts, key=len), say)
    for index, question in enumerate(todo):
        if time_budget_s is not None and time.perf_counter() - start > time_budget_s:
            say(f"time budget of {time_budget_s:.0f} s spent: {len(todo) - index} questions not run")
            info["unfinished_questions"] = len(todo) - index
            break
        key = _question_key(question)
        asked: dict[str, Any] = {"config": config, "question_key": key, "question_id": str(question.question_id)}
        asked |= {"category": question.category, "subcategory": question.subcategory}
        messages: list[dict[str, str]] = []
        rows: list[PromptRun] = []
        for turn, text in enumerate(question.turns):
            messages.append({"role": "user", "content": text})
            prompt = render_prompt(tokenizer, messages)
            timed: list[tuple[int, Method, PromptRun]] = []
            for repeat in range(repeats):
                shift = (len(done) + index + turn + repeat) % len(methods)
                for method in methods[shift:] + methods[:shift]:
                    run = runner.run(method, prompt, repeat)
                    say(f"  {question.category} {question.question_id}: {method.name} {run.wall_s:.1f} s")
                    timed.append((repeat, method, run))
            reference = next(run.tokens for repeat, m, run in timed if m.name == PROMPT_BASELINE and repeat == 0)
            for repeat, method, run in timed:
                at = first_divergence(run.tokens, reference)  # where the output leaves the baseline's (None: equal)
                found: dict[str, Any] = {"equal": at is None, "first_mismatch": -1 if at is None else at, "turn": turn}
                rows.append(replace(run, **asked, **method.labels(), **found, repeat=repeat, prompt_tokens=len(prompt)))
            messages.append({"role": "assistant", "content": reply_text(tokenizer, reference, stop_ids)})
        runs += rows
        base = [r for r in rows if r.method == PROMPT_BASELINE]
        say(
            f"[{len(done) + index + 1}/{len(done) + len(todo)}] {question.category} {question.question_id}: "
            + ", ".join(
                f"{m.name} {throughput_ratio(base, [r for r in rows if r.method == m.name]):.2f}x" for m in methods[1:]
            )
        )
        if part is not None:
            _write_parquet(runs, part / PROMPT_RUNS_FILE)
    if spread:
        keys = {_question_key(q) for q in mine}
        unfinished = info.pop("unfinished_questions", 0)
        shares = distributed.gather_outcomes(lambda: ([r for r in runs if r.question_key in keys], unfinished))
        order = {_question_key(q): i for i, q in enumerate(remaining)}
        runs = previous + sorted((r for rows, _ in shares for r in rows), key=lambda r: order[r.question_key])
        devices = [r[1] for r in ranks]
        info.update(
            device=" + ".join(dict.fromkeys(devices)),
            ranks=size,
            rank_devices=devices,
            timings=(
                f"Spread over {size} ranks (mlx.launch): each question ran whole on one rank, so its speedups "
                "compare methods on one machine; tokens/s and seconds are those of the rank's machine that ran "
                "the question."
            ),
        )
        if unfinished := sum(n for _, n in shares):
            info["unfinished_questions"] = unfinished
    result = PromptBench(runs, methods, info, profile)
    if out is not None and runs and not spread:
        result.save(out)
    elif spread and out is not None and part is not None:
        distributed.gather_outcomes(lambda: result.save(out) if rank == 0 and runs else None)
        shutil.rmtree(part, ignore_errors=True)
        distributed.barrier()
        with contextlib.suppress(OSError):  # gone already, or another rank's share is still there
            (out / RANKS_FOLDER).rmdir()
    return result
