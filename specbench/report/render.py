"""Output text with every token coloured by how it came: accepted draft, bonus/correction, plain step."""

from __future__ import annotations

import html
import os
from collections.abc import Iterable, Sequence
from typing import Any

from specbench.core.log import StepRecord

#: Token sources and their background colours (shared with the per-step figures).
SOURCES = ("draft", "bonus", "plain")
SOURCE_COLOURS = {"draft": "#a6dba0", "bonus": "#fdb863", "plain": "#e0e0e0"}
SOURCE_LABELS = {
    "draft": "accepted draft token",
    "bonus": "bonus / correction token (from the verify pass)",
    "plain": "plain decode step",
}
#: A generation's stats (keys of ``Generation.stats()``) that summaries show: counts, then rates and times.
COUNT_STATS = ("tokens", "finish_reason", "steps", "verifies", "drafted", "accepted")
RATE_STATS = ("acceptance_rate", "mean_accepted_tokens", "tokens_per_verify", "decode_tokens_per_s", "prefill_s")


def step_records(log: Any) -> list[StepRecord]:
    """The step records of a Generation, a StepLog, a polars frame of steps or a list of records."""
    if hasattr(log, "log"):  # a Generation
        log = log.log
    if hasattr(log, "records"):
        return list(log.records)
    rows = log.to_dicts() if hasattr(log, "to_dicts") else list(log)
    return [row if isinstance(row, StepRecord) else StepRecord.from_row(row) for row in rows]


def token_sources(log: Any) -> list[tuple[int, str, int]]:
    """(token id, source, step) for every emitted token, in order: a verification's accepted draft tokens ("draft"),
    then the model's own token at the first rejected (or the bonus) position ("bonus"); one token per prefill and
    plain step ("plain"). A step cut short by a stop keeps only the tokens it emitted."""
    out: list[tuple[int, str, int]] = []
    for record in step_records(log):
        tokens = list(record.tokens or [])
        if record.kind == "verify":
            accepted = int(record.accepted)
            for i, t in enumerate(tokens):
                out.append((int(t), "draft" if i < accepted else "bonus", int(record.step)))
        else:
            out.extend((int(t), "plain", int(record.step)) for t in tokens)
    return out


def display_text(tokenizer: Any, tokens: Sequence[int]) -> str:
    """``tokens`` as text to show a reader: special tokens (``<|im_end|>``, ...) are left out."""
    try:
        return tokenizer.decode(list(tokens), skip_special_tokens=True)
    except TypeError:  # a tokenizer whose decode takes no options
        return tokenizer.decode(list(tokens))


def token_pieces(tokenizer: Any, tokens: Sequence[int], hold: int = 3) -> list[str]:
    """The text each token adds to the decoded output, from growing prefixes: a token that leaves a multi-byte
    character incomplete shows nothing, and the character shows on the token that completes it (waiting at most
    ``hold`` tokens, so invalid byte runs still show)."""
    pieces: list[str] = []
    committed = ""
    held = 0
    for i in range(len(tokens)):
        text = display_text(tokenizer, tokens[: i + 1])
        if text.endswith("\ufffd") and held < hold and i + 1 < len(tokens):
            pieces.append("")
            held += 1
            continue
        held = 0
        # A tokenizer may rewrite the end of earlier text (e.g. a space it held back): show the
        # new text from where the two decodings part.
        pieces.append(text[len(os.path.commonprefix([committed, text])) :])
        committed = text
    return pieces


def legend_html() -> str:
    items = "".join(
        f'<span style="background:{SOURCE_COLOURS[s]};padding:1px 6px;margin-right:10px;border-radius:3px">'
        f"{html.escape(SOURCE_LABELS[s])}</span>"
        for s in SOURCES
    )
    return f'<div style="font-size:0.85em;margin:4px 0">{items}</div>'


def coloured_html(log: Any, tokenizer: Any, legend: bool = True, max_height: str | None = "24em") -> str:
    """HTML of the output text (``log``: as ``step_records`` takes it), each token on the background of its source,
    with a legend; hovering a token shows its id and step. Without a tokenizer the token ids are shown."""
    sources = token_sources(log)
    ids = [t for t, _, _ in sources]
    pieces = token_pieces(tokenizer, ids) if tokenizer is not None else [f"{t} " for t in ids]
    spans = []
    for (token, source, step), piece in zip(sources, pieces):
        if not piece:
            continue
        spans.append(
            f'<span style="background:{SOURCE_COLOURS[source]}" title="token {token}, step {step}, {source}">'
            f"{html.escape(piece)}</span>"
        )
    height = f"max-height:{max_height};overflow-y:auto;" if max_height else ""
    body = (
        f'<div style="font-family:ui-monospace,Menlo,Consolas,monospace;font-size:0.9em;white-space:pre-wrap;'
        f'line-height:1.5;{height}border:1px solid #ccc;padding:6px">{"".join(spans)}</div>'
    )
    return (legend_html() if legend else "") + body


def source_counts(log: Any) -> dict[str, int]:
    """How many emitted tokens came from each source."""
    counts = dict.fromkeys(SOURCES, 0)
    for _, source, _ in token_sources(log):
        counts[source] += 1
    return counts


def stats_html(stats: dict[str, Any], keys: Iterable[str] | None = None) -> str:
    """A two-column HTML table of generation stats (floats to 3 decimals)."""
    keys = [k for k in keys or [*COUNT_STATS, *RATE_STATS, "decode_s"] if k in stats]
    return table_html([(k, f"{stats[k]:.3f}" if isinstance(stats[k], float) else str(stats[k])) for k in keys])


def table_html(cells: Iterable[tuple[str, str]], font_size: str = "0.85em") -> str:
    """A two-column HTML table: each (name, value) a row, the value right-aligned."""
    rows = "".join(
        f"<tr><td style='text-align:left;padding-right:1em'>{html.escape(k)}</td>"
        f"<td style='text-align:right'>{html.escape(v)}</td></tr>"
        for k, v in cells
    )
    return f"<table style='font-size:{font_size}'>{rows}</table>"
