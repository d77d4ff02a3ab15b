"""``specbench bench prompts`` spread over the ranks of ``mlx.launch``: each rank runs its share of the questions
(each question whole on one rank, every method interleaved there, so its speedups compare methods on one machine),
and rank 0 writes the same files as a run on one machine. Each rank keeps its progress in ``OUT/.ranks/rankRofN/``,
so an interrupted run resumes with the same ranks; the folder goes once rank 0 has written the merged results.
"""

from __future__ import annotations

import contextlib
import inspect
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from specbench.bench.prompt_bench import (
    PROMPT_RUNS_FILE,
    PromptBench,
    _plan,
    _question_key,
    bench_prompts,
    model_identity,
    read_runs,
    resumed_runs,
    stored_cost_profile,
)
from specbench.bench.prompt_runs import PromptRun
from specbench.common import distributed

#: Where each rank keeps its share's progress inside ``--out``.
RANKS_FOLDER = ".ranks"


def bench_prompts_over_ranks(model: Any, tokenizer: Any, questions: Any, **settings: Any) -> PromptBench:
    """``bench_prompts(model, tokenizer, questions, **settings)``; under ``mlx.launch`` with several ranks
    and a model that is not sharded, each rank runs its share of the questions and every rank returns the
    merged results, which rank 0 alone saves in ``out``."""
    bound = inspect.signature(bench_prompts).bind(model, tokenizer, questions, **settings)
    bound.apply_defaults()
    a = SimpleNamespace(**bound.arguments)
    if distributed.size() == 1 or distributed.is_sharded(model):
        return bench_prompts(**vars(a))
    if not questions:
        raise ValueError("no questions to benchmark: check the prompt file and --categories")
    rank, size = distributed.rank(), distributed.size()
    plan = _plan(model, a.model_name, a.drafters, a.policies, a.verify, a.draft_model, a.k, a.max_tokens, a.repeats)
    a.draft_model, methods, info, config = plan
    out = Path(a.out) if a.out is not None else None
    part = out / RANKS_FOLDER / f"rank{rank}of{size}" if out is not None else None

    def saved(folder: Path | None) -> list[PromptRun]:
        path = folder / PROMPT_RUNS_FILE if folder is not None else None
        return read_runs(path) if path is not None and path.exists() and not a.fresh else []

    def check() -> tuple[str, str, list[PromptRun]]:
        """This rank's configuration and device; on rank 0 the runs already in ``out``."""
        if part is not None:
            resumed_runs(part / PROMPT_RUNS_FILE, saved(part), {config})
        return config, info["device"], saved(out) if rank == 0 else []

    ranks = distributed.gather_outcomes(check)
    previous = resumed_runs(out / PROMPT_RUNS_FILE, ranks[0][2], {c for c, _, _ in ranks}) if out else []
    done = {r.question_key for r in previous}
    remaining = [q for q in questions if _question_key(q) not in done]
    mine = [remaining[i] for i in distributed.my_share([len(q.turns) for q in remaining])]
    say = a.progress
    if say and done and rank == 0 and out is not None:
        say(f"resuming: {len(done)} questions already done in {out / PROMPT_RUNS_FILE}")
    # each rank predicts from its own device's profile; the merged results from rank 0's
    profile = stored_cost_profile(model, a.model_name, a.profile, say if say and rank == 0 else lambda _: None)

    def run_share() -> tuple[list[PromptRun], int]:
        if not mine:
            return [], 0
        progress = (lambda text: say(f"rank {rank}/{size}: {text}")) if say else None
        result = bench_prompts(**{**vars(a), "questions": mine, "out": part, "progress": progress, "profile": profile})
        keys = {_question_key(q) for q in mine}
        return [r for r in result.runs if r.question_key in keys], result.info.get("unfinished_questions", 0)

    shares = distributed.gather_outcomes(run_share)
    order = {_question_key(q): i for i, q in enumerate(remaining)}
    runs = previous + sorted((r for rows, _ in shares for r in rows), key=lambda r: order[r.question_key])
    devices = [device for _, device, _ in ranks]
    info.update(
        **model_identity(model, tokenizer),
        device=" + ".join(dict.fromkeys(devices)),
        ranks=size,
        rank_devices=devices,
        timings=(
            f"Spread over {size} ranks (mlx.launch): each question ran whole on one rank, so its speedups compare "
            "methods on one machine; tokens/s and seconds are those of the rank's machine that ran the question."
        ),
    )
    if unfinished := sum(n for _, n in shares):
        info["unfinished_questions"] = unfinished
    result = PromptBench(runs, methods, info, profile)
    if out is not None and part is not None:
        distributed.gather_outcomes(lambda: result.save(out) if rank == 0 and runs else None)
        shutil.rmtree(part, ignore_errors=True)
        distributed.barrier()
        with contextlib.suppress(OSError):  # gone already, or another rank's share is still there
            (out / RANKS_FOLDER).rmdir()
    return result
