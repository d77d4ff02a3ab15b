"""The per-step log: one typed record per decoding step, kept as plain Python during decoding."""

from __future__ import annotations

import dataclasses
import os
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from specbench.common.files import write_parquet_atomic


@dataclass
class StepRecord:
    """What one decoding step did.

    ``kind`` is "prefill" (the prompt pass that yields the first token), "plain" (one token,
    no draft) or "verify" (a draft checked in one forward pass of ``verify_width`` tokens).
    ``paused`` marks plain steps taken because the policy paused drafting; the first of such a stretch
    may carry a draft that was not verified (``draft_tokens``, ``draft_s``: Auto's measure of acceptance).
    ``accepted_positions`` lists the accepted draft positions (0-based); acceptance is a
    prefix, so it is ``range(accepted)``; ``accept_probs`` holds the acceptance rule's probability per
    draft position when sampling (min(1, p/q) for the default rule; ``specbench.core.rules`` says each
    rule's). A token-tree verification records its tree (``draft_parents``,
    ``tree_nodes``, ``tree_depth``: the deepest node's depth) and the accepted nodes root to leaf
    (``accepted_path``; ``accepted`` is its depth); paths leave these empty.
    ``labels`` are the columns a caller adds to a log of many generations (``request``, ``trace``, ``turn``,
    ``method``, ...): a row holds them after the record's own columns.
    """

    step: int
    position: int
    kind: str
    drafter: str = "none"
    policy: str = "none"
    k_requested: int = 0
    k_drafted: int = 0
    accepted: int = 0
    emitted: int = 0
    accepted_positions: list[int] = field(default_factory=list)
    verify_width: int = 1
    draft_s: float = 0.0
    verify_s: float = 0.0
    other_s: float = 0.0
    paused: bool = False
    #: Why a plain step, or a draft shorter than the policy's longest: "code: detail" (``specbench.core.reasons``).
    reason: str = ""
    accept_probs: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    draft_tokens: list[int] = field(default_factory=list)
    draft_parents: list[int] = field(default_factory=list)
    tree_nodes: int = 0
    tree_depth: int = 0
    accepted_path: list[int] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    labels: dict[str, Any] = field(default_factory=dict)

    def labelled(self, **labels: Any) -> StepRecord:
        """This record with ``labels`` added to its own (a new record; the lists are shared)."""
        clash = sorted(set(labels) & _FIELDS)
        if clash:
            raise ValueError(f"labels {clash} are names of a step record's own columns")
        return dataclasses.replace(self, labels={**self.labels, **labels})

    def row(self) -> dict[str, Any]:
        """The record as one row: its columns in order, then its labels."""
        row = dict(self.__dict__)
        labels = row.pop("labels")
        if labels:
            row.update(labels)
        return row

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> StepRecord:
        """A record from a row (``row()``'s, or a stored log's): columns it does not know become labels, and
        a missing or null list (or ``extra``) is empty."""
        known: dict[str, Any] = {}
        labels: dict[str, Any] = {}
        for key, value in row.items():
            if key not in _FIELDS:
                labels[key] = value
            elif value is not None or key not in _EMPTY:
                known[key] = value
        return cls(**known, labels=labels)


#: A record's own columns, in order (``labels`` are a row's added columns, not one of its own).
COLUMNS = [f.name for f in fields(StepRecord) if f.name != "labels"]
_FIELDS = frozenset(COLUMNS)
_EMPTY = frozenset(f.name for f in fields(StepRecord) if f.default_factory is not dataclasses.MISSING)


def reason_counts(records: Iterable[StepRecord]) -> dict[str, int]:
    """Steps per reason code (the text before a reason's ":"), most frequent first: why plain steps were taken and
    drafts were shorter than the policy's longest."""
    counts = Counter(record.reason.split(":", 1)[0] for record in records if record.reason)
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def main_reason(records: Iterable[StepRecord]) -> str:
    """The most frequent reason of ``records`` in full (its latest wording), "" where none has one."""
    records = [r for r in records if r.reason]
    counts = reason_counts(records)
    if not counts:
        return ""
    code = next(iter(counts))
    return next(r.reason for r in reversed(records) if r.reason.split(":", 1)[0] == code)


class StepLog:
    """Records of one generation (or of many, each labelled by its caller: ``StepRecord.labelled``)."""

    def __init__(self, records: list[StepRecord] | None = None):
        self.records: list[StepRecord] = records if records is not None else []

    def append(self, record: StepRecord) -> None:
        if not isinstance(record, StepRecord):
            raise TypeError(f"a step log holds StepRecord objects, got {type(record).__name__}")
        self.records.append(record)

    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self) -> Iterator[StepRecord]:
        return iter(self.records)

    def stats(self) -> dict[str, Any]:
        """Totals and the rates derived from them.

        ``mean_accepted_tokens`` is Spec-Bench's #MAT: tokens per model forward after the
        prompt (plain decoding gives 1.0); ``tokens_per_verify`` counts verifications only.
        ``verify_s`` is the seconds of every forward (the prompt's and plain steps' too);
        ``verification_s`` those of the verifications alone.
        """
        decode = [r for r in self.records if r.kind != "prefill"]
        verifies = [r for r in decode if r.kind == "verify"]
        drafted = sum(r.k_drafted for r in verifies)
        accepted = sum(r.accepted for r in verifies)
        decode_tokens = sum(r.emitted for r in decode)
        prefill = [r for r in self.records if r.kind == "prefill"]
        decode_s = sum(r.draft_s + r.verify_s + r.other_s for r in decode)
        return {
            "tokens": sum(r.emitted for r in self.records),
            "steps": len(decode),
            "verifies": len(verifies),
            "drafted": drafted,
            "accepted": accepted,
            "pauses": sum(1 for r in decode if r.paused),
            "acceptance_rate": accepted / drafted if drafted else 0.0,
            "mean_accepted_tokens": decode_tokens / len(decode) if decode else 0.0,
            "tokens_per_verify": (accepted + len(verifies)) / len(verifies) if verifies else 0.0,
            "draft_s": sum(r.draft_s for r in self.records),
            "verify_s": sum(r.verify_s for r in self.records),
            "reasons": reason_counts(decode),
            "verification_s": sum(r.verify_s for r in verifies),
            "other_s": sum(r.other_s for r in self.records),
            "prefill_s": sum(r.verify_s + r.other_s for r in prefill),
            "decode_s": decode_s,
            "decode_tokens_per_s": decode_tokens / decode_s if decode_s > 0 else 0.0,
        }

    def rows(self) -> list[dict[str, Any]]:
        """One dict per step: the record's columns, then its labels."""
        return [record.row() for record in self.records]

    def to_polars(self):
        """One row per step as a polars DataFrame (``extra`` only where some step has one)."""
        import polars as pl

        if not self.records:
            return pl.DataFrame(schema={c: pl.Null for c in COLUMNS})
        rows = [{**r, "extra": None} if not r["extra"] else r for r in self.rows()]
        df = pl.DataFrame(rows, infer_schema_length=None)
        if "extra" in df.columns and df["extra"].dtype == pl.Null:
            df = df.drop("extra")
        return df

    @classmethod
    def from_rows(cls, rows: Iterable[Mapping[str, Any]]) -> StepLog:
        """A log from rows (``rows()``'s, or a stored log's: ``frame.to_dicts()``)."""
        return cls([StepRecord.from_row(row) for row in rows])

    def save(self, path: str | os.PathLike) -> Path:
        """Write the log as parquet, atomically."""
        return write_parquet_atomic(self.to_polars(), path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> StepLog:
        """A log written by ``save``. A missing file raises FileNotFoundError, a folder
        IsADirectoryError, and a file that is not a step log's parquet a ValueError naming it."""
        import polars as pl

        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"no step log at {path}")
        if path.is_dir():
            raise IsADirectoryError(f"{path} is a folder, not a step log (a parquet file)")
        try:
            frame = pl.read_parquet(path)
        except (pl.exceptions.PolarsError, OSError, ValueError) as err:
            reason = " ".join(str(err).split()) or type(err).__name__
            raise ValueError(f"{path} is not a readable step log (a parquet file): {reason}") from err
        missing = [c for c in ("step", "kind", "emitted") if c not in frame.columns]
        if missing:
            raise ValueError(f"{path} is not a step log: it has no {', '.join(missing)} column")
        return cls.from_rows(frame.to_dicts())
