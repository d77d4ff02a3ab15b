"""Sweeps: generations over prompts x drafters x policies x temperatures, with plain baselines (``run_sweep``).

Every prompt (at every temperature and seed) is decoded plainly, then speculatively with each drafter and
policy, in the same process: speedup = speculative decode tokens/s / plain decode tokens/s, by the clock from
the first token to the last (the prefill is the same either way); greedy runs are checked token for token
against the plain output. ``Sweep.runs`` has one row per generation, ``Sweep.steps`` every step log;
``summary`` and ``per_position`` aggregate them as Spec-Bench reports.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl
from tqdm import tqdm  # text bars: a notebook run by `specbench report` shows them on the console

from specbench.bench import paired
from specbench.bench.predictions import with_predictions
from specbench.bench.sweep_summary import (
    best_per_group,  # noqa: F401 (the sweep's API)
    paired_intervals,
    per_position_acceptance,
    summarize_sweep,
)
from specbench.bench.timing import Clocked, cache_copy, exact_widths, prefix_cache, timed_generation
from specbench.common import distributed
from specbench.common.files import check_writable, write_parquet_atomic
from specbench.core.engine import Generation, plain_generation
from specbench.core.log import main_reason
from specbench.core.options import GenerateOptions
from specbench.core.policies import AdaptivePolicy, AutoPolicy, DraftPolicy, FixedPolicy, as_policy
from specbench.core.rules import AcceptanceRule, TokenRule
from specbench.core.verify import VerifyMode, check_verify_mode
from specbench.cost.profile import Profile
from specbench.exact.calibration import calibrate
from specbench.inputs.capabilities import usable_drafters
from specbench.inputs.importers import load_traces
from specbench.inputs.prompts import Prompt
from specbench.inputs.stored import read_parquet
from specbench.inputs.traces import bundled_traces

# -- policies ----------------------------------------------------------------------------------

#: The policy families of a sweep's rows (a user-written policy's family: its name).
_FAMILIES = {FixedPolicy: "fixed", AdaptivePolicy: "adaptive", AutoPolicy: "auto"}


def sweep_policies(families: Sequence[str], draft_lengths: Sequence[int]) -> list[DraftPolicy]:
    """Policies of a sweep: ``fixed`` and ``adaptive`` at every draft length, ``auto`` once (it
    picks its own length), e.g. (["fixed", "auto"], [1, 4]) -> fixed:1, fixed:4, auto."""
    policies: list[DraftPolicy] = []
    for family in families:
        if family == "auto":
            policies.append(DraftPolicy.auto())
        elif family in ("fixed", "adaptive"):
            if not draft_lengths:
                raise ValueError(f"policy {family!r} needs draft lengths")
            policies += [getattr(DraftPolicy, family)(int(k)) for k in draft_lengths]
        else:
            raise ValueError(f"unknown policy {family!r}: use fixed, adaptive or auto")
    return policies


@dataclass
class Sweep:
    """Results of ``run_sweep``: one row per generation, and every step."""

    runs: pl.DataFrame
    steps: pl.DataFrame
    skipped: dict[str, str] = field(default_factory=dict)

    def summary(self, by: Sequence[str] = ("drafter", "policy")) -> pl.DataFrame:
        return summarize_sweep(self.runs, by)

    def per_position(self, by: Sequence[str] = ("drafter", "policy")) -> pl.DataFrame:
        return per_position_acceptance(self.steps, by)

    def predictions(self, profile: Profile | Callable[[str], Profile]) -> pl.DataFrame:
        """``runs`` with each speculative run's predicted speedup and residual (``specbench.bench.predictions``);
        ``profile``: the model's cost profile, or a function verify mode -> profile."""
        return with_predictions(self.runs, self.steps, profile)

    def save(self, folder: str | os.PathLike, name: str = "sweep") -> list[Path]:
        """``NAME-runs.parquet`` and ``NAME-steps.parquet`` in ``folder``, written atomically (by rank 0
        alone when several ranks hold the merged sweep)."""
        paths = [Path(folder) / f"{name}-{part}.parquet" for part in ("runs", "steps")]
        if distributed.rank() == 0:
            for frame, path in zip((self.runs, self.steps), paths):
                write_parquet_atomic(frame, path)
        return paths


def run_sweep(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[Prompt | Sequence[int]],
    drafters: Sequence[str] = ("lookup",),
    policies: Sequence[DraftPolicy | str | int] = (1, 2, 4),
    max_tokens: int = 64,
    temperatures: Sequence[float] = (0.0,),
    seeds: Sequence[int] = (0,),
    verify: VerifyMode | None = None,
    model_name: str | None = None,
    ignore_eos: bool = False,
    warmup_tokens: int = 4,
    progress: bool = True,
    drafter_factories: dict[str, Callable[[], Any]] | None = None,
    reuse_prefill: bool = True,
    out: str | os.PathLike | None = None,
    spread: bool | None = None,
    rules: Sequence[AcceptanceRule] = (TokenRule(),),
    pairs: int = 0,
    max_pairs: int | None = None,
    time_budget_s: float | None = None,
    audit: float = 0.0,
) -> Sweep:
    """Decode every prompt plainly, then with each rule x drafter x policy, per temperature and seed.

    ``policies``: policy objects, their text ("fixed:4", "auto") or draft lengths (fixed policies). ``verify``:
    "exact", "fast" or None (exact when greedy). Drafters are built fresh for every generation; those the model
    cannot use are listed in ``Sweep.skipped``; ``drafter_factories`` adds or replaces drafters (name -> a
    function building one). ``reuse_prefill`` starts every generation of a prompt from one prefill of its
    prefix. ``rules``: the acceptance rules of every speculative generation (column ``acceptance``).

    ``pairs`` 0 compares every generation of a cell with the cell's one plain run (one timing each, no
    interval); N >= 1 times each method N times, in N blocks of one plain run and every method, each method paired
    with its block's plain run: the plain run first and then the methods, or the methods in reverse order and then
    the plain run, alternating (``paired.baseline_first``), so that each method lies as far after its baseline in one
    block as before it in the next; consecutive plain runs form the A/A rows (policy ``AA_POLICY``); step logs
    are kept for the first block. ``max_pairs`` (> ``pairs``) adds a pair on every prompt of each group (prompt
    kind x temperature x rule x drafter x policy) whose interval does not yet exclude 1, round after round,
    until all decide, ``max_pairs`` is reached or the next round would not fit ``time_budget_s``; its
    intervals are at ``paired.sequential_level`` of its looks (column ``looks``). ``audit``: the share of exact
    verifications compared with serial steps (column ``exact_divergence``).

    A cell is one prompt at one temperature and seed. With ``out`` each finished cell is written to ``cells/``
    and a sweep run again with the same settings reads it back. Under ``mlx.launch`` (``spread``, the default
    for several ranks and a model not sharded) rank r runs the cells r modulo the group size and every rank gets
    the merged result; a sharded model runs every cell on all ranks in lockstep and rank 0 writes.
    """
    if not prompts:
        raise ValueError("no prompts to sweep")
    if pairs < 0:
        raise ValueError(f"pairs must be >= 0, got {pairs}")
    if max_pairs is not None and (pairs < 1 or max_pairs < pairs):
        raise ValueError(f"max_pairs ({max_pairs}) needs pairs >= 1 and max_pairs >= pairs (got pairs={pairs})")
    if time_budget_s is not None and not time_budget_s > 0:
        raise ValueError(f"time_budget_s must be > 0 seconds, got {time_budget_s}")
    looks = max_pairs - pairs + 1 if max_pairs is not None else 1
    policies = [as_policy(p) for p in policies]
    if verify is not None:
        check_verify_mode(verify)
    GenerateOptions(audit=audit, verify="exact").check()  # the rate, before any model work
    name = model_name or getattr(model, "specbench_name", None)
    listed = [d for d in drafters if d not in (drafter_factories or {})]
    factories, skipped = usable_drafters(listed, model, name)
    factories.pop("none", None)
    factories.pop("plain", None)
    factories.update(drafter_factories or {})
    items = [
        p if isinstance(p, Prompt) else Prompt(f"p{i}", "custom", "", [int(t) for t in p])
        for i, p in enumerate(prompts)
    ]
    if spread is None:
        spread = distributed.size() > 1 and not distributed.is_sharded(model)
    size, rank = (distributed.size(), distributed.rank()) if spread else (1, 0)
    cells = [(prompt, float(t), seed) for prompt in items for t in temperatures for seed in seeds]
    settings = {
        "model": name,
        "drafters": list(factories),
        "policies": [p.name for p in policies],
        "max_tokens": max_tokens,
        "verify": verify,
        "ignore_eos": ignore_eos,
        "reuse_prefill": reuse_prefill,
        **({"pairs": pairs} if pairs else {}),
        **({"max_pairs": max_pairs} if looks > 1 else {}),
        **({"audit": audit} if audit else {}),
        **({"acceptances": [rule.key for rule in rules]} if list(rules) != [TokenRule()] else {}),
    }
    store = _CellStore(out, settings) if out is not None else None
    mine = [i for i in range(len(cells)) if i % size == rank]
    done = {i: store.read(cells[i]) for i in mine if store is not None and store.has(cells[i])}
    if distributed.is_sharded(model):  # every rank must run the same cells: rank 0's files decide
        done = distributed.broadcast(done if distributed.is_main() else None)
    todo = [i for i in mine if i not in done]
    if warmup_tokens and todo:
        list(plain_generation(model, items[0].ids, GenerateOptions(max_tokens=warmup_tokens, ignore_eos=True)))
        modes = {GenerateOptions(temperature=float(t), verify=verify).verify_mode for t in temperatures}
        if "exact" in modes and (made := [make() for make in factories.values()]):
            calibrate(model, exact_widths([(p, d) for p in policies for d in made], max_tokens))
    total = len(todo) * (1 + pairs + len(rules) * len(factories) * len(policies) * max(1, pairs))
    shown = progress and distributed.is_main()
    bar = tqdm(total=total, desc="sweep", disable=not shown, leave=False)
    results: dict[int, tuple[list[dict[str, Any]], pl.DataFrame]] = dict(done)
    shared = size > 1 or distributed.is_sharded(model)
    prefix, prefix_of = None, None

    def run(key: int, cell_index: int, first_pair: int, count: int, only: set[tuple] | None) -> None:
        nonlocal prefix, prefix_of
        prompt, temperature, seed = cells[cell_index]
        tag = f"pair{first_pair}-" + ",".join(sorted(map(str, only))) if only is not None else ""
        if store is not None and store.has(cells[cell_index], tag):
            results[key] = store.read(cells[cell_index], tag)
            return
        if reuse_prefill and prefix_of is not prompt:
            prefix, prefix_of = prefix_cache(model, prompt.ids), prompt
        options = GenerateOptions(
            max_tokens=max_tokens, temperature=temperature, seed=seed, ignore_eos=ignore_eos, verify=verify
        )
        options.audit = audit if options.verify_mode == "exact" else 0.0
        results[key] = _run_cell(
            model, tokenizer, prompt, options, factories, policies, prefix, bar, rules, count, first_pair, only
        )
        if store is not None:
            store.write(cells[cell_index], *results[key], tag=tag)

    def merged() -> dict[int, tuple[list[dict[str, Any]], pl.DataFrame]]:
        if not shared:
            return results
        parts = distributed.gather(results if spread or distributed.is_main() else {})
        return {i: cell for part in parts for i, cell in part.items()}

    try:
        started = time.perf_counter()
        for i in todo:
            run(i, i, 0, pairs, None)
        per_generation_s = (time.perf_counter() - started) / max(1, total)
        results = merged()
        sequential_s = 0.0
        for pair in range(pairs, max_pairs or pairs):
            undecided = _undecided(merged_cells(results, looks)[0])
            tasks = [
                (c, methods)
                for c, (prompt, temperature, _) in enumerate(cells)
                if (methods := {m for m in undecided if m[:2] == (prompt.category, temperature)})
            ]
            planned = per_generation_s * sum(len(m) + 1 for _, m in tasks) / size
            go = bool(tasks) and (time_budget_s is None or sequential_s + planned <= time_budget_s)
            if shared:  # the ranks' clocks differ: rank 0's decides
                go = distributed.broadcast(go if distributed.is_main() else None)
            if not go:
                break
            round_started = time.perf_counter()
            bar.reset(total=sum(len(m) + 1 for j, (_, m) in enumerate(tasks) if j % size == rank))
            for j, (c, methods) in enumerate(tasks):
                if j % size == rank:
                    run(pair * len(cells) + c, c, pair, 1, {m[2:] for m in methods})
            results = merged()
            sequential_s += time.perf_counter() - round_started
    finally:
        bar.close()
    runs, steps = merged_cells(results, looks)
    return Sweep(runs, steps, skipped)


def merged_cells(
    results: dict[int, tuple[list[dict[str, Any]], pl.DataFrame]], looks: int = 1
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """A sweep's runs and steps from its cells' (or several sweeps') results, run ids renumbered in key order
    (cells first, then each sequential round's), every run with the sequential rule's ``looks`` where it has more
    than one."""
    runs: list[dict[str, Any]] = []
    frames: list[pl.DataFrame] = []
    for i in sorted(results):  # run ids in cell order, whoever ran the cell
        rows, steps = results[i]
        offset = len(runs)
        runs += [{**row, "run": row["run"] + offset, **({"looks": looks} if looks > 1 else {})} for row in rows]
        if steps.height:
            frames.append(steps.with_columns(pl.col("run") + offset))
    steps = pl.concat(frames, how="diagonal_relaxed") if frames else pl.DataFrame()
    return pl.DataFrame(runs, infer_schema_length=None), steps


#: A sweep group, the unit of its sequential rule: (prompt kind, temperature, rule label, drafter, policy name).
_GROUP = ("category", "temperature", "acceptance", "drafter", "policy")


def _undecided(runs: pl.DataFrame) -> set[tuple]:
    """The groups (``_GROUP``) whose paired speedup interval does not exclude 1 yet (or that have none)."""
    timed = (
        runs.filter((pl.col("drafter") != "none") & pl.col("pair").is_not_null()) if "pair" in runs.columns else None
    )
    if timed is None or not timed.height:
        return set()
    intervals = paired_intervals(timed, _GROUP)
    open_ = intervals.filter(
        pl.col("speedup_low").is_null() | ((pl.col("speedup_low") <= 1.0) & (pl.col("speedup_high") >= 1.0))
    )
    return {tuple(row) for row in open_.select(_GROUP).iter_rows()}


#: A speculative method of a sweep cell: its acceptance rule, drafter name and policy.
_SweepMethod = tuple[AcceptanceRule, str, DraftPolicy]
#: The policy name of a sweep's A/A rows: plain decoding against the plain run before it.
AA_POLICY = "A/A"


def _run_cell(
    model: Any,
    tokenizer: Any,
    prompt: Prompt,
    options: GenerateOptions,
    factories: dict[str, Callable[[], Any]],
    policies: Sequence[DraftPolicy],
    prefix: Any,
    bar: Any,
    rules: Sequence[AcceptanceRule] = (TokenRule(),),
    pairs: int = 0,
    first_pair: int = 0,
    only: set[tuple] | None = None,
) -> tuple[list[dict[str, Any]], pl.DataFrame]:
    """One prompt at the temperature and seed of ``options``: the plain run, then every rule x drafter x policy (run
    ids from 0), once against that plain run, or in ``pairs`` blocks of one plain run and every method (each method
    paired with its block's plain run; the order reversed from one block to the next).

    A sequential round (``first_pair`` > 0) runs blocks ``first_pair`` on of the methods in ``only`` ((rule label,
    drafter, policy name) each) alone: no reference run, no step logs, A/A rows between its own plain runs."""
    temperature = options.temperature
    base = {
        "prompt": prompt.id,
        "category": prompt.category,
        "prompt_tokens": len(prompt.ids),
        "temperature": temperature,
        "seed": options.seed,
        "verify_mode": options.verify_mode,
    }
    runs: list[dict[str, Any]] = []
    frames: list[pl.DataFrame] = []

    def run_plain() -> Clocked[Generation]:
        bar.set_postfix_str(f"{prompt.id} plain T={temperature}")
        clock = timed_generation(model, prompt.ids, options, tokenizer=tokenizer, prompt_cache=cache_copy(prefix))
        bar.update()
        return clock

    previous_plain: Clocked[Generation] | None = None
    plain_tokens: list[int] | None = None
    if not first_pair:
        reference = previous_plain = run_plain()
        plain_tokens = reference.items
        runs.append(_row(len(runs), {**base, "acceptance": "none"}, "none", None, reference, reference))
        frames.append(_steps(reference.run.log, len(runs) - 1, base))

    def run_method(rule: AcceptanceRule, drafter_name: str, policy: DraftPolicy) -> Clocked[Generation]:
        bar.set_postfix_str(f"{prompt.id} {drafter_name} {policy.name} {rule.name} T={temperature}")
        ruled = dataclasses.replace(options, acceptance_rule=rule)
        drafter = factories[drafter_name]()
        clock = timed_generation(model, prompt.ids, ruled, drafter, policy, tokenizer, cache_copy(prefix, drafter))
        bar.update()
        return clock

    methods = [
        (r, d, p) for r in rules for d in factories for p in policies if only is None or (r.label, d, p.name) in only
    ]

    def record(method: _SweepMethod, timed: Clocked[Generation], baseline: Clocked[Generation], pair: int) -> None:
        rule, drafter_name, policy = method
        labelled = {**base, "acceptance": rule.label}
        same = timed.items == plain_tokens if temperature == 0 else None
        row = _row(len(runs), labelled, drafter_name, policy, timed, baseline, same)
        runs.append({**row, "pair": pair} if pairs else row)
        if pair == 0:
            frames.append(_steps(timed.run.log, len(runs) - 1, labelled))

    if not pairs:
        for method in methods:
            record(method, run_method(*method), reference, 0)
    for pair in range(first_pair, first_pair + pairs):
        # one plain run per pair, shared by its methods: first and the methods after it, or the methods in reverse
        # order and then it, alternating from one pair to the next, so that each method lies as far before its
        # baseline in one pair as after it in the next and a machine whose speed drifts one way favours neither
        first = paired.baseline_first(pair)
        baseline = run_plain() if first else None
        order = range(len(methods)) if first else range(len(methods) - 1, -1, -1)
        timed = {i: run_method(*methods[i]) for i in order}
        if baseline is None:
            baseline = run_plain()
        if previous_plain is not None:  # consecutive plain runs: the A/A row
            row = _row(len(runs), {**base, "acceptance": "none"}, "none", None, baseline, previous_plain)
            runs.append({**row, "policy": AA_POLICY, "pair": pair})
        previous_plain = baseline
        plain_tokens = plain_tokens or baseline.items
        for i, method in enumerate(methods):
            record(method, timed[i], baseline, pair)
    return runs, pl.concat(frames, how="diagonal_relaxed") if frames else pl.DataFrame()


class _CellStore:
    """Finished cells of a sweep in ``OUT/cells/``: ``<key>-runs.parquet`` (written last: the cell is
    done) and ``<key>-steps.parquet``; the key is a digest of the sweep's settings and the cell."""

    def __init__(self, out: str | os.PathLike, settings: dict[str, Any]):
        self.folder = check_writable(Path(out) / "cells", folder=True, name="out")
        self.settings = settings

    def _paths(self, cell: tuple[Prompt, float, int], tag: str = "") -> list[Path]:
        prompt, temperature, seed = cell
        text = json.dumps([self.settings, prompt.id, prompt.ids, temperature, seed], sort_keys=True, default=str)
        name = hashlib.sha1((text + tag).encode()).hexdigest()[:16]  # tag: a sequential round's pair and methods
        return [self.folder / f"{name}-{part}.parquet" for part in ("runs", "steps")]

    def has(self, cell: tuple[Prompt, float, int], tag: str = "") -> bool:
        return all(path.is_file() for path in self._paths(cell, tag))

    def read(self, cell: tuple[Prompt, float, int], tag: str = "") -> tuple[list[dict[str, Any]], pl.DataFrame]:
        runs, steps = (read_parquet(path, "delete it to run the cell again") for path in self._paths(cell, tag))
        return runs.to_dicts(), steps

    def write(
        self, cell: tuple[Prompt, float, int], runs: list[dict[str, Any]], steps: pl.DataFrame, tag: str = ""
    ) -> None:
        runs_path, steps_path = self._paths(cell, tag)
        write_parquet_atomic(steps, steps_path)
        write_parquet_atomic(pl.DataFrame(runs, infer_schema_length=None), runs_path)


#: What a run's row copies of its generation's ``stats()``, after its tokens and clock.
_STATS = (
    "prefill_s steps verifies drafted accepted pauses acceptance_rate mean_accepted_tokens tokens_per_verify "
    "draft_s verify_s verification_s"
).split()


def _row(
    run: int,
    base: dict[str, Any],
    drafter: str,
    policy: DraftPolicy | None,
    timed: Clocked[Generation],
    baseline: Clocked[Generation],
    same: bool | None = None,
) -> dict[str, Any]:
    """One row of ``Sweep.runs``: a generation's stats, its decode clock, and its plain baseline's decode tokens and
    seconds (``policy`` None: plain)."""
    gen, seconds = timed.run, timed.decode_s
    stats = gen.stats()
    tokens = len(timed.items) - 1
    if policy is None:
        name, family, k = "none", "none", 0
    else:
        name, family = policy.name, _FAMILIES.get(type(policy), policy.name)
        k = policy.k if isinstance(policy, (FixedPolicy, AdaptivePolicy)) else None  # None: it picks its own
    tps = tokens / seconds if seconds > 0 else 0.0
    plain_tokens, plain_s = len(baseline.items) - 1, baseline.decode_s
    plain_tps = plain_tokens / plain_s if plain_s > 0 else 0.0
    return {
        "run": run,
        **base,
        "drafter": drafter,
        "policy": name,
        "policy_family": family,
        "k": k,
        "tokens": stats["tokens"],
        "decode_tokens": tokens,
        "decode_s": seconds,
        **{name: stats[name] for name in _STATS},
        "main_reason": main_reason(r for r in gen.log.records if r.kind != "prefill"),
        "decode_tokens_per_s": tps,
        "plain_decode_tokens": plain_tokens,
        "plain_decode_s": plain_s,
        "speedup": tps / plain_tps if plain_tps > 0 else float("nan"),
        "equal_to_plain": same,
        "finish_reason": stats["finish_reason"],
        "exact_divergence": str(audit.divergence) if (audit := stats.get("exact_audit")) and audit.divergence else None,
    }


def _steps(log: Any, run: int, base: dict[str, Any]) -> pl.DataFrame:
    """A generation's step log with the run's id, prompt, category, temperature, seed and acceptance rule."""
    df = log.to_polars()
    if "extra" in df.columns:
        df = df.drop("extra")
    labels = {"run": run, **{c: base[c] for c in ("prompt", "category", "temperature", "seed")}}
    labels["acceptance"] = base.get("acceptance", "none")
    return df.with_columns(pl.lit(value).alias(column) for column, value in labels.items())


# -- agent traces ------------------------------------------------------------------------------


def load_trace_list(names: str | Sequence[str]) -> list[Any]:
    """Traces by name: ``"bundled"`` (every bundled trace), bundled trace names, or files in any
    format ``specbench.inputs.importers.load_traces`` imports."""
    if isinstance(names, str):
        names = bundled_traces() if names == "bundled" else [names]
    if not names:
        raise ValueError("no traces given (and none bundled in data/traces)")
    traces = []
    for name in names:
        traces += load_traces(name)
    return traces


def trace_turns(results: Sequence[Any]) -> pl.DataFrame:
    """Per-turn rows of trace-bench results (``bench_trace``), with ``drafter`` ("none" for
    plain decoding) and ``saved``: tokens emitted after the prefill minus the forward passes
    that emitted them (the passes speculation avoided); ``tokens_per_verify`` is null on turns
    without a verification."""
    if not results:
        raise ValueError("no trace results")
    turns = pl.concat([r.turns for r in results], how="diagonal_relaxed")
    return turns.with_columns(
        pl.when(pl.col("method") == "plain").then(pl.lit("none")).otherwise(pl.col("method")).alias("drafter"),
        (pl.col("decode_tokens") - pl.col("steps")).alias("saved"),
        # no verification, no tokens per verification (rather than 0)
        pl.when(pl.col("verifies") > 0).then(pl.col("tokens_per_verify")).otherwise(None).alias("tokens_per_verify"),
    )
