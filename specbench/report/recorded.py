"""Generations recorded in a report folder, so one notebook shows what another already generated.

The draft-length sweep records each generation (``record_sweep``) under ``OUTPUT_DIR/recorded/``, keyed by
``generation_key``; the quickstart (``side_by_side``) looks one up before generating, the explorer (``find``) reads
the sweep's speedup from it.
The plain greedy outputs are kept in one table too (``write_outputs``, ``recorded_outputs``), for the replays.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import polars as pl

from specbench.bench.sweep import AA_POLICY
from specbench.bench.timing import SideBySide, clock_stats
from specbench.bench.timing import side_by_side as run_side_by_side
from specbench.common.files import write_json_atomic, write_parquet_atomic
from specbench.core.draft import Drafter
from specbench.core.log import StepLog
from specbench.core.options import GenerateOptions
from specbench.core.rules import TokenRule
from specbench.report.outputs import read_json, read_table

#: The folder of a report that holds recorded generations.
FOLDER = "recorded"
#: The table (in ``FOLDER``) of plain greedy outputs with their prompts' ids, one row per model, prompt and length.
OUTPUTS_FILE = "outputs.parquet"


@dataclass(frozen=True)
class OutputRow:
    """A row of ``OUTPUTS_FILE``: ``simulate.load_recorded``'s (id, prompt, output, finish_reason) and where the
    output came from."""

    id: str
    category: str
    text: str
    prompt: list[int]
    output: list[int]
    finish_reason: str
    model: str
    max_tokens: int
    verify: str
    source: str

    @classmethod
    def of(cls, prompt: Any, output: Sequence[int], *rest: Any) -> OutputRow:
        """The output of a ``Prompt``; ``rest``: the fields after ``output``."""
        return cls(
            str(prompt.id), prompt.category, prompt.text, [int(t) for t in prompt.ids], [int(t) for t in output], *rest
        )


_POLARS = {"str": pl.Utf8, "int": pl.Int64, "list[int]": pl.List(pl.Int64)}
#: The columns of ``OUTPUTS_FILE``.
OUTPUTS_SCHEMA = {f.name: _POLARS[str(f.type)] for f in fields(OutputRow)}


def outputs_frame(outputs: Sequence[OutputRow]) -> pl.DataFrame:
    """``outputs`` as rows of ``OUTPUTS_SCHEMA``."""
    return pl.DataFrame([asdict(o) for o in outputs], schema=OUTPUTS_SCHEMA)


def output_rows(frame: pl.DataFrame) -> list[OutputRow]:
    """The rows of a frame of ``OUTPUTS_SCHEMA``."""
    return [OutputRow(**row) for row in frame.select(list(OUTPUTS_SCHEMA)).iter_rows(named=True)]


#: Columns a sweep adds to each step record (which run, prompt and sampling settings it belongs to).
_SWEEP_COLUMNS = ("run", "prompt", "category", "temperature", "seed")
#: A generation's stats (``Generation.stats()`` keys) that a sweep's row holds.
_STATS = (
    "tokens",
    "steps",
    "verifies",
    "drafted",
    "accepted",
    "pauses",
    "acceptance_rate",
    "mean_accepted_tokens",
    "tokens_per_verify",
    "draft_s",
    "verify_s",
    "verification_s",
    "prefill_s",
    "finish_reason",
)


def generation_key(model: str, prompt_ids: Sequence[int], drafter: str, policy: str, options: GenerateOptions) -> str:
    """What makes two generations the same: model, prompt ids, drafter ("none": plain), policy and options."""
    settings: list[Any] = [
        options.max_tokens,
        float(options.temperature),
        options.seed,
        options.verify,
        options.ignore_eos,
    ]
    if options.rule != TokenRule():  # the default rule keeps the keys recorded before rules were options
        settings.append(options.rule.key)
    if options.sample_by_position:  # likewise: keys recorded before it was an option stay as they were
        settings.append("sample_by_position")
    text = json.dumps([model, [int(t) for t in prompt_ids], drafter, policy, settings], default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


@dataclass
class RecordedGeneration:
    """A generation as it was recorded: its stats and clock (``row``) and its steps."""

    row: dict[str, Any]
    steps: pl.DataFrame
    temperature: float

    @property
    def log(self) -> StepLog:
        return StepLog.from_rows(self.steps.to_dicts())

    @property
    def tokens(self) -> list[int]:
        return [int(t) for tokens in self.steps["tokens"].to_list() for t in (tokens or [])]

    def stats(self) -> dict[str, Any]:
        return {k: self.row[k] for k in _STATS if k in self.row}

    @property
    def decode_s(self) -> float:
        return float(self.row["decode_s"])


class RecordedPair(SideBySide):
    """A plain and a speculative generation recorded side by side (``SideBySide`` over recorded runs)."""

    @property
    def equal(self) -> bool | None:
        if self.plain.temperature != 0:
            return None
        return self.plain.tokens == self.speculative.tokens


def _folder(output_dir: str | os.PathLike | None) -> Path | None:
    return Path(output_dir) / FOLDER if output_dir else None


def record(
    output_dir: str | os.PathLike | None, key: str, row: dict[str, Any], steps: pl.DataFrame, source: str
) -> None:
    """Keep one generation (its stats row and step log) under ``output_dir/recorded`` (nothing without a folder)."""
    folder = _folder(output_dir)
    if folder is None:
        return
    steps = steps.drop([c for c in _SWEEP_COLUMNS if c in steps.columns])
    write_parquet_atomic(steps, folder / f"{key}-steps.parquet")
    write_json_atomic(folder / f"{key}.json", {**row, "source": source})  # written last: the record is whole


def find(output_dir: str | os.PathLike | None, key: str) -> RecordedGeneration | None:
    """The generation recorded under ``key`` (None when there is none)."""
    folder = _folder(output_dir)
    row = read_json(folder / f"{key}.json") if folder else None
    steps = read_table(folder / f"{key}-steps.parquet") if folder and row is not None else None
    if row is None or steps is None:  # none, or unreadable: generated again
        return None
    return RecordedGeneration(row, steps, float(row.get("temperature", 0.0)))


def record_sweep(
    output_dir: str | os.PathLike | None,
    model: str,
    prompts: Sequence[Any],
    sweep: Any,
    max_tokens: int,
    verify: str | None = None,
    ignore_eos: bool = False,
    source: str = "draft_length_sweep",
) -> int:
    """Record every generation of a ``Sweep`` (``bench.sweep.run_sweep``'s result over ``prompts``, run
    with ``max_tokens``, ``verify`` and ``ignore_eos``), and its greedy plain outputs in the report's table of outputs
    (``write_outputs``); returns how many generations were recorded."""
    if _folder(output_dir) is None or sweep.runs.is_empty():
        return 0
    by_id = {p.id: p for p in prompts}
    runs = sweep.runs.filter(pl.col("prompt").is_in(list(by_id)) & (pl.col("policy") != AA_POLICY))
    if "pair" in runs.columns:  # one generation per drafter and policy: the first pair's (its steps are kept)
        runs = runs.filter(pl.col("pair").fill_null(0) == 0)
    for row in runs.to_dicts():
        options = GenerateOptions(
            max_tokens=max_tokens,
            temperature=float(row["temperature"]),
            seed=int(row["seed"]),
            verify=verify,
            ignore_eos=ignore_eos,
        )
        key = generation_key(model, by_id[row["prompt"]].ids, row["drafter"], row["policy"], options)
        record(output_dir, key, row, sweep.steps.filter(pl.col("run") == row["run"]), source)
    plain = sweep.runs.filter(pl.col("prompt").is_in(list(by_id)), drafter="none", policy="none", temperature=0)
    outputs = []
    firsts = plain.unique("prompt", keep="first", maintain_order=True).select("prompt", "run", "finish_reason")
    for prompt_id, run, finish_reason in firsts.iter_rows():
        steps = sweep.steps.filter(pl.col("run") == run).sort("step")["tokens"]
        output = [t for tokens in steps.to_list() for t in (tokens or [])]
        outputs.append(
            OutputRow.of(by_id[prompt_id], output, finish_reason, model, int(max_tokens), verify or "", source)
        )
    write_outputs(output_dir, outputs_frame(outputs))
    return len(runs)


def write_outputs(output_dir: str | os.PathLike | None, outputs: pl.DataFrame) -> int:
    """Add rows of ``OUTPUTS_SCHEMA`` to the report's table of outputs, replacing those of the same model, prompt,
    max_tokens and verify mode; returns how many rows were written (nothing without a folder)."""
    folder = _folder(output_dir)
    if folder is None or outputs.is_empty():
        return 0
    outputs = outputs.select(list(OUTPUTS_SCHEMA)).cast(OUTPUTS_SCHEMA)
    written = len(outputs)
    old = recorded_outputs(output_dir)
    if not old.is_empty():
        outputs = pl.concat([old.join(outputs, on=["model", "id", "max_tokens", "verify"], how="anti"), outputs])
    write_parquet_atomic(outputs, folder / OUTPUTS_FILE)
    return written


def recorded_outputs(output_dir: str | os.PathLike | None) -> pl.DataFrame:
    """The report's table of plain greedy outputs (``write_outputs``); empty when there is none or it is
    unreadable."""
    folder = _folder(output_dir)
    frame = read_table(folder / OUTPUTS_FILE) if folder else None
    if frame is None or set(frame.columns) != set(OUTPUTS_SCHEMA):
        return pl.DataFrame(schema=OUTPUTS_SCHEMA)
    return frame.select(list(OUTPUTS_SCHEMA))


def _row(gen: Any, seconds: float, drafter: str, policy: str) -> dict[str, Any]:
    stats = clock_stats(gen, seconds)
    row = {k: stats[k] for k in (*_STATS, "decode_s", "decode_tokens_per_s") if k in stats}
    decode, temperature = len(gen.tokens) - 1, float(gen.options.temperature)
    return row | {"drafter": drafter, "policy": policy, "temperature": temperature, "decode_tokens": decode}


def side_by_side(
    output_dir: str | os.PathLike | None,
    model_name: str,
    model: Any,
    tokenizer: Any,
    prompt_ids: Sequence[int],
    options: GenerateOptions,
    drafter_name: str,
    drafter: Drafter,
    policy: Any,
) -> SideBySide:
    """``bench.timing.side_by_side``, or the pair recorded in ``output_dir`` with the same model, prompt,
    drafter, policy and options (printing where it comes from); a pair generated here is recorded."""
    plain_key = generation_key(model_name, prompt_ids, "none", "none", options)
    spec_key = generation_key(model_name, prompt_ids, drafter_name, policy.name, options)
    plain, spec = find(output_dir, plain_key), find(output_dir, spec_key)
    if plain is not None and spec is not None:
        print(f"recorded by {spec.row.get('source', 'an earlier notebook')} in this report (not generated again)")
        return RecordedPair(plain, spec, plain.decode_s, spec.decode_s)
    both = run_side_by_side(model, tokenizer, prompt_ids, options, drafter, policy)
    plain_row = _row(both.plain, both.plain_s, "none", "none")
    record(output_dir, plain_key, plain_row, both.plain.log.to_polars(), "quickstart")
    spec_row = _row(both.speculative, both.speculative_s, drafter_name, policy.name)
    record(output_dir, spec_key, spec_row, both.speculative.log.to_polars(), "quickstart")
    return both


def run_sweep(
    output_dir: str | os.PathLike | None,
    model_name: str,
    model: Any,
    tokenizer: Any,
    prompts: Sequence[Any],
    drafters: Sequence[str],
    policies: Sequence[Any],
    max_tokens: int,
    temperatures: Sequence[float] = (0.0,),
    seeds: Sequence[int] = (0,),
    verify: str | None = None,
    progress: bool = True,
    source: str = "sampling",
) -> Any:
    """``bench.sweep.run_sweep`` over ``prompts`` (``Prompt`` objects), taking every cell (a prompt at a
    temperature and seed) whose generations are all recorded in ``output_dir`` from there and running the
    others (recorded in turn). The result is a ``Sweep`` as one run would give."""
    from specbench.bench.sweep import Sweep
    from specbench.bench.sweep import run_sweep as sweep_run
    from specbench.core.policies import as_policy
    from specbench.inputs.capabilities import usable_drafters

    policies = [as_policy(p) for p in policies]
    usable, skipped = usable_drafters(list(drafters), model, model_name)
    names = [d for d in usable if d not in ("none", "plain")]
    order = [("none", "none"), *((d, p.name) for d in names for p in policies)]  # the sweep's run order
    keys = [(prompt, float(t), seed) for prompt, t, seed in itertools.product(prompts, temperatures, seeds)]
    cells: dict[tuple[str, float, int], list[tuple[dict[str, Any], pl.DataFrame]]] = {}
    for prompt, t, seed in keys:
        options = GenerateOptions(max_tokens=max_tokens, temperature=t, seed=seed, verify=verify)
        found = [find(output_dir, generation_key(model_name, prompt.ids, d, p, options)) for d, p in order]
        if all(f is not None for f in found):
            cells[prompt.id, t, seed] = [(f.row, f.steps) for f in found if f is not None]
    if cells:
        print(f"{len(cells)} of {len(keys)} cells recorded in this report earlier (not generated again)")
    for t, seed in sorted({(t, seed) for prompt, t, seed in keys if (prompt.id, t, seed) not in cells}):
        todo = [p for p in prompts if (p.id, t, seed) not in cells]
        part = sweep_run(
            model, tokenizer, todo, drafters, policies, max_tokens, [t], [seed], verify, model_name, progress=progress
        )
        skipped.update(part.skipped)
        record_sweep(output_dir, model_name, todo, part, max_tokens, verify, source=source)
        for row in part.runs.to_dicts():
            steps = part.steps.filter(pl.col("run") == row["run"])
            cells.setdefault((row["prompt"], float(row["temperature"]), int(row["seed"])), []).append((row, steps))
    runs: list[dict[str, Any]] = []
    frames = []
    for prompt, t, seed in keys:
        for row, steps in cells.get((prompt.id, t, seed), []):
            run = len(runs)
            base = {"run": run, "prompt": prompt.id, "category": prompt.category, "temperature": t, "seed": seed}
            steps = steps.drop([c for c in _SWEEP_COLUMNS if c in steps.columns])
            frames.append(steps.with_columns(*(pl.lit(v).alias(k) for k, v in base.items())))
            runs.append({k: v for k, v in row.items() if k != "source"} | {"run": run})
    steps = pl.concat(frames, how="diagonal_relaxed") if frames else pl.DataFrame()
    return Sweep(pl.DataFrame(runs, infer_schema_length=None), steps, skipped)
