"""Timing hygiene for every timed run: the garbage collector collected before and paused during it, and the
process on whichever cores time most steadily (free to move or pinned to four).

A collection in the middle of a timed run lands on whichever run it happens to fall in; a scheduler moving
the process between cores on a many-core host spreads run-to-run times. Both are noise the benchmarks of
every layer (cost profiles, prompt and trace benchmarks, paired A/B runs) keep out the same way.
"""

from __future__ import annotations

import contextlib
import gc
import os
import statistics
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass

#: Fewest cores a host needs before pinning is tried (on fewer, pinning to four leaves nothing else).
MIN_CORES_TO_PIN = 8
#: Cores a pinned run keeps: the host's last four.
PINNED_CORES = 4


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """A timed run: garbage collected before, the collector paused during (re-entrant: an inner ``quiet``
    inside an outer one neither collects nor resumes the collector)."""
    outermost = gc.isenabled()
    if outermost:
        gc.collect()
        gc.disable()
    try:
        yield
    finally:
        if outermost:
            gc.enable()


@dataclass(frozen=True)
class Affinity:
    """What ``steadier_affinity`` chose: "free", "pinned to cores [...]", or why it chose nothing; the
    coefficients of variation it measured (None where it measured none)."""

    chosen: str
    free_cv: float | None = None
    pinned_cv: float | None = None

    def as_dict(self) -> dict[str, float | str]:
        """What a results file keeps: the measured variations only where measured."""
        return {k: v for k, v in asdict(self).items() if v is not None}


def variation(seconds: list[float]) -> float:
    """Coefficient of variation (standard deviation over mean) of run times."""
    return statistics.stdev(seconds) / statistics.mean(seconds)


def steadier_affinity(
    run: Callable[[], float], runs: int = 6, say: Callable[[str], None] = lambda text: None
) -> Affinity:
    """Time ``run()`` (it returns its own seconds) ``runs`` times free to move between cores and as many
    pinned to the host's last four; keep the steadier (lower coefficient of variation) for the rest of the
    process. Nothing is tried without affinity control or on fewer than 8 cores."""
    if not hasattr(os, "sched_setaffinity"):
        return Affinity("free (no affinity control)")
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < MIN_CORES_TO_PIN:
        return Affinity(f"free ({len(cores)} cores)")
    free = variation([run() for _ in range(runs)])
    pinned_cores = set(cores[-PINNED_CORES:])
    os.sched_setaffinity(0, pinned_cores)
    pinned = variation([run() for _ in range(runs)])
    chosen = f"pinned to cores {sorted(pinned_cores)}" if pinned < free else "free"
    if pinned >= free:
        os.sched_setaffinity(0, set(cores))
    say(f"  plain decoding's run-to-run variation: free {100 * free:.1f}%, pinned {100 * pinned:.1f}% -> {chosen}")
    return Affinity(chosen, free, pinned)
