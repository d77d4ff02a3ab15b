"""Model-free drafters replayed over logs: conversation logs' recorded assistant messages (tokenized
with a chosen tokenizer) or a model's recorded greedy outputs, for every drafter, draft length k and
store scope (``specbench.simulate.simulate.replay_logs``). What ``specbench simulate`` and the
simulate_logs notebook run.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from specbench.common.files import write_parquet_atomic, write_text_atomic
from specbench.core.log import StepLog
from specbench.inputs.importers import load_traces
from specbench.inputs.traces import pick_ids
from specbench.simulate.simulate import (
    DEFAULT_DRAFTERS,
    STORES,
    Group,
    check_settings,
    group_by_trace,
    load_recorded,
    replay_logs,
    trace_groups,
)

#: Files of a folder of logs that are read (others, such as a README, are not).
LOG_SUFFIXES = (".json", ".jsonl", ".traj")
SUMMARY_FILE = "simulate_summary.parquet"
STEPS_FILE = "simulate_steps.parquet"
TABLE_FILE = "simulate.txt"


@dataclass
class SimulatedLogs:
    """``simulate_logs``' results: the summary (one row per drafter, store and k), every step, the
    traces and turns replayed, turns left out for lack of a recorded reply, and the seconds taken."""

    summary: pl.DataFrame
    steps: StepLog
    traces: int
    turns: int
    skipped: int
    prompt_tokens: int
    seconds: float

    def table(self) -> str:
        """The summary as a text table: accepted tokens per verification per drafter, store scope and k."""
        lines = [
            f"{'drafter':8s} {'store':9s} {'k':>3s} {'verifies':>9s} {'accepted':>9s} {'acc/verify':>10s} "
            f"{'tok/verify':>10s} {'accept rate':>11s}"
        ]
        for r in self.summary.iter_rows(named=True):
            lines.append(
                f"{r['drafter']:8s} {r['store']:9s} {r['k']:3d} {r['verifies']:9d} {r['accepted']:9d} "
                f"{r['accepted_per_verify']:10.2f} {r['tokens_per_verify']:10.2f} {r['acceptance_rate']:11.2f}"
            )
        return "\n".join(lines)


def log_files(path: str | os.PathLike, suffixes: Sequence[str] = LOG_SUFFIXES) -> list[Path]:
    """``path`` itself, or the files of folder ``path`` ending in one of ``suffixes`` (sorted)."""
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and p.name.endswith(tuple(suffixes)))
        if not files:
            raise FileNotFoundError(f"{path}: a folder without logs (no {', '.join(f'*{s}' for s in suffixes)} files)")
        return files
    if not path.exists():
        raise FileNotFoundError(f"no such file or folder: {path}")
    return [path]


def load_tokenizer(name: str) -> Any:
    """A tokenizer by model name: an embedded model (built when missing) or a local model folder."""
    from mlx_lm.utils import load_tokenizer as mlx_load_tokenizer

    from specbench.models.load import EMBEDDED_MODELS, ensure_embedded

    path = ensure_embedded(name) if name in EMBEDDED_MODELS else Path(name).expanduser()
    if not (path / "tokenizer_config.json").is_file() and not (path / "tokenizer.json").is_file():
        raise FileNotFoundError(
            f"--tokenizer {name!r}: expected an embedded model ({', '.join(EMBEDDED_MODELS)}) or a local model folder "
            "with tokenizer.json or tokenizer_config.json"
        )
    return mlx_load_tokenizer(path)


def simulate_logs(
    source: str | os.PathLike,
    drafters: Sequence[str] = DEFAULT_DRAFTERS,
    ks: Sequence[int] = (2, 4, 8, 16),
    stores: Sequence[str] = STORES,
    tokenizer: Any = "smollm2-135m",
    recorded: bool = False,
    format: str | None = None,
    trace_ids: Sequence[str] | None = None,
    limit: int | None = None,
    reasoning: str = "keep",
) -> SimulatedLogs:
    """Replay ``drafters`` at each k and store scope over a log file or a folder of logs.

    Conversation logs (any format ``load_traces`` reads) are replayed on their recorded assistant messages,
    tokenized with ``tokenizer`` (or a model name for ``load_tokenizer``); with ``recorded``, ``source`` holds
    recorded greedy outputs (``save_recorded``'s parquet; a folder's ``*.plain.parquet`` where it has them),
    replayed as they are. ``trace_ids`` and ``limit`` pick traces; ``reasoning`` is ``load_traces``'.
    """
    check_settings(drafters, ks, stores, limit)
    start = time.perf_counter()
    groups, skipped = load_groups(source, tokenizer, recorded, format, trace_ids, limit, reasoning)
    summary, steps = replay_logs(groups, drafters, ks, stores)
    first = summary.row(0, named=True)
    seconds = time.perf_counter() - start
    return SimulatedLogs(summary, steps, len(groups), first["turns"], skipped, first["prompt_tokens"], seconds)


def load_groups(
    source: str | os.PathLike,
    tokenizer: Any = "smollm2-135m",
    recorded: bool = False,
    format: str | None = None,
    trace_ids: Sequence[str] | None = None,
    limit: int | None = None,
    reasoning: str = "keep",
) -> tuple[list[Group], int]:
    """The recorded requests of a log file or folder grouped by trace (``simulate_logs`` says how they are
    read), and how many turns were left out for lack of a recorded reply."""
    groups: list[Group] = []
    skipped = 0
    if recorded:
        plain_outputs = Path(source).is_dir() and any(Path(source).glob("*.plain.parquet"))
        files = log_files(source, (".plain.parquet",) if plain_outputs else (".parquet",))
        requests = [r for path in files for r in load_recorded(path)]
        by_trace = group_by_trace(requests)
        kept = set(pick_ids([name for name, _ in by_trace], trace_ids, limit, str(source)))
        groups = [(name, lambda rs=rs: rs) for name, rs in by_trace if name in kept]
    else:
        paths = log_files(source) if Path(source).exists() else [source]  # else a bundled trace's name
        traces = [t for path in paths for t in load_traces(path, format, reasoning)]
        kept = set(pick_ids([t.id for t in traces], trace_ids, limit, str(source)))
        if isinstance(tokenizer, str):
            tokenizer = load_tokenizer(tokenizer)
        groups, skipped = trace_groups([t for t in traces if t.id in kept], tokenizer)
    if not groups:
        raise ValueError(f"{source}: no turn with a recorded reply to replay ({skipped} without one)")
    return groups, skipped


def save_simulation(result: SimulatedLogs, out: str | os.PathLike) -> list[Path]:
    """Write the summary (parquet and text) and the step log into folder ``out``, atomically."""
    out = Path(out)
    result.steps.save(out / STEPS_FILE)
    write_parquet_atomic(result.summary, out / SUMMARY_FILE)
    write_text_atomic(out / TABLE_FILE, result.table() + "\n")
    return [out / SUMMARY_FILE, out / STEPS_FILE, out / TABLE_FILE]
