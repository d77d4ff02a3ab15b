"""Per-call verify timing: the seconds of one synchronised forward of w rows after a cached context, fast or in
exact mode at a given level, with the cache trimmed back after each call so that every call sees the same
context. What a verification's forward costs alone, to set beside its seconds inside the decode loop.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import mlx.core as mx
import numpy as np

from specbench.common.timing import quiet
from specbench.core.forward import prefill, vocab_size
from specbench.exact import ExactPlan, exact_mode

#: Calls timed and dropped before the timed ones (first-use kernel builds, caches warming).
WARMUP_CALLS = 2


def filled_cache(model: Any, length: int, seed: int = 3, chunk: int = 512) -> list[Any]:
    """A prompt cache holding ``length`` random tokens (prefilled ``chunk`` at a time)."""
    return prefill(model, np.random.default_rng(seed).integers(0, vocab_size(model), size=length).tolist(), chunk)


def random_rows(model: Any, width: int, seed: int = 3) -> mx.array:
    """``width`` random tokens, [1, width]: a verification's rows."""
    return mx.array(np.random.default_rng(seed).integers(0, vocab_size(model), size=width).tolist())[None]


def _mode(model: Any, level: str | None, **exact: Any) -> contextlib.AbstractContextManager:
    return contextlib.nullcontext() if level is None else exact_mode(model, level, **exact)


def call_once(model: Any, cache: list[Any], tokens: mx.array) -> float:
    """Seconds of one synchronised forward of ``tokens`` (in whatever mode is installed), the cache trimmed
    back after it."""
    mx.synchronize()
    t0 = time.perf_counter()
    mx.eval(model(tokens, cache=cache))
    seconds = time.perf_counter() - t0
    for c in cache:
        c.trim(tokens.shape[1])
    return seconds


def time_call(model: Any, cache: list[Any], tokens: mx.array, level: str | None, repeats: int, **exact: Any) -> float:
    """Median seconds of one forward of ``tokens`` after ``cache``'s context, fast (``level`` None) or in exact
    mode at ``level`` (``exact`` passed on to ``exact_mode``), over ``repeats`` calls after ``WARMUP_CALLS``."""
    times = []
    with quiet():
        for i in range(repeats + WARMUP_CALLS):
            with _mode(model, level, **exact):
                seconds = call_once(model, cache, tokens)
            if i >= WARMUP_CALLS:
                times.append(seconds)
    return statistics.median(times)


def level_seconds(
    model: Any, cache: list[Any], levels: Sequence[str], widths: Sequence[int], repeats: int, warmup: int, seed: int = 1
) -> dict[str, dict[int, float]]:
    """Median seconds of a width-w forward per level and width, the levels interleaved round by round so that
    drift in the machine's speed falls on all of them: "fast" (no exact mode), "exact" (the calibrated level
    per width) or any exact-mode level; ``warmup`` rounds dropped."""
    probe = random_rows(model, max(widths), seed)
    seconds: dict[str, dict[int, list[float]]] = {level: {w: [] for w in widths} for level in levels}
    with quiet():
        for round_ in range(warmup + repeats):
            for level in levels:
                with _mode(model, None if level == "fast" else "auto" if level == "exact" else level):
                    for w in widths:
                        took = call_once(model, cache, probe[:, :w])
                        if round_ >= warmup:
                            seconds[level][w].append(took)
    return {level: {w: statistics.median(ts) for w, ts in per.items()} for level, per in seconds.items()}


def verify_call_rows(
    model: Any,
    label: str,
    widths: Sequence[int],
    level_for: Callable[[int], str],
    repeats: int,
    context: int,
    compiled: bool = False,
    say: Callable[[str], None] = lambda text: None,
) -> list[dict[str, Any]]:
    """Per width, the seconds of one verify forward after ``context`` random tokens: fast, exact at the
    calibrated level (``level_for(w)``), and from 2 rows the attention split alone and the linear layers in
    chunks alone (and, ``compiled``, exact with compiled linear chunks); one row per width ("shape" =
    ``label``), with exact over fast."""
    cache = filled_cache(model, context)
    probe = random_rows(model, max(widths))
    rows = []
    for w in widths:
        tokens, level = probe[:, :w], level_for(w)
        fast = time_call(model, cache, tokens, None, repeats)
        exact = time_call(model, cache, tokens, "auto", repeats)
        row: dict[str, Any] = {"shape": label, "width": w, "exact_level": level, "fast_s": fast, "exact_s": exact}
        line = f"  {w} rows: fast {1e3 * fast:.1f} ms, exact {1e3 * exact:.1f} ms ({level})"
        if w > 1:
            rows_per_call = ExactPlan.parse(level).linear
            chunk = rows_per_call if isinstance(rows_per_call, int) else 1
            attention = time_call(model, cache, tokens, "attention", repeats)
            linear = time_call(model, cache, tokens, f"linear/{chunk}", repeats)
            row.update(attention_split_s=attention, linear_chunks=chunk, linear_split_s=linear)
            line += (
                f"; attention split alone {1e3 * attention:.1f} ms, linear in chunks of {chunk} "
                f"alone {1e3 * linear:.1f} ms"
            )
            if compiled:
                compiled_s = time_call(model, cache, tokens, "auto", repeats, compiled=True)
                row.update(exact_compiled_s=compiled_s)
                line += f"; exact with compiled linear chunks {1e3 * compiled_s:.1f} ms"
        rows.append(row | {"exact_over_fast": exact / fast})
        say(line + f" -> exact/fast {exact / fast:.2f}")
    return rows
