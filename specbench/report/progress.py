"""Progress on the console while notebooks run, with ETAs from measured costs.

Inside a notebook, ``console(label)`` is a progress callback (for ``cost.measure``'s text and
``cost.speedup_grid``'s rows) that writes time-stamped lines to stderr; ``specbench report`` forwards a
notebook's stderr to its own. ``Heartbeat`` is the runner's: while a notebook runs it prints, at least
every ``every_s`` seconds, how long it has run and how long it is expected to take, so no stretch is silent.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import re
import resource
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

#: The fields of a measured row (``cost.speedup_grid``) a progress line shows, when it has them.
_ROW_FIELDS = ("name", "mode", "a", "k", "speedup", "predicted_nominal")


def _clock(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 60}:{seconds % 60:02d}"


def console(label: str, stream: TextIO | None = None) -> Callable[[Any], None]:
    """A progress callback writing ``[elapsed label] message`` lines to stderr; a dict (a measured row) is
    written as its short fields."""
    start = time.perf_counter()

    def say(message: Any) -> None:
        if isinstance(message, dict):
            chosen = [k for k in _ROW_FIELDS if k in message] or list(message)[:8]
            fields = [(k, message[k]) for k in chosen if isinstance(message[k], (int, float, str))]
            message = ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in fields)
        out = stream or sys.stderr
        print(f"[{_clock(time.perf_counter() - start)} {label}] {message}", file=out, flush=True)

    return say


@dataclass
class Heartbeat:
    """Prints ``NAME: running M:SS of ~M:SS expected`` every ``every_s`` seconds (None: never) until stopped, with
    the ETA from ``expected_s`` (an earlier run's or the profile's measured cost) or, past it, how far over it is."""

    name: str
    expected_s: float | None = None
    every_s: float | None = 30.0
    stream: TextIO | None = None
    after: Callable[[], str] | None = None
    before: Callable[[], None] | None = None

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.start = time.perf_counter()

    def line(self, elapsed: float) -> str:
        text = f"{self.name}: running {_clock(elapsed)}"
        if self.expected_s:
            left = self.expected_s - elapsed
            text += (
                f" of ~{_clock(self.expected_s)} expected (about {_clock(left)} left)"
                if left >= 0
                else f", {_clock(-left)} past the ~{_clock(self.expected_s)} expected"
            )
        if self.after is not None:
            text += self.after()
        return text

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            if self.before is not None:
                self.before()
            print(self.line(time.perf_counter() - self.start), file=self.stream or sys.stderr, flush=True)

    def __enter__(self) -> Heartbeat:
        self.start = time.perf_counter()
        if self.every_s:
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=1.0)


_AFTER_RETURN = re.compile(r"\r(?=[^\r\n])")
_LINES = re.compile(r"[^\n]*\n|[^\n]+")


class Prefixed:
    """A text stream that writes to ``stream`` with ``prefix`` at the start of every line (a progress bar's
    in-place updates, after a carriage return, keep the console's last line)."""

    def __init__(self, stream: TextIO, prefix: str):
        self.stream, self.prefix = stream, prefix
        self._at_start = True

    def write(self, text: str) -> int:
        out = []
        for piece in _LINES.findall(text):
            if self._at_start and piece.strip("\r\n") and not piece.startswith("\r"):  # else after its "\r"
                out.append(self.prefix)
            out.append(_AFTER_RETURN.sub("\r" + self.prefix, piece))
            self._at_start = piece.endswith("\n")
        self.stream.write("".join(out))
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def end_line(self) -> None:
        """End the line a progress bar left open, so that other output starts on its own line."""
        if not self._at_start:
            self.stream.write("\n")
            self._at_start = True


def running_cell(ipynb: str | Path) -> str:
    """``"; cell 5/14: first line"``: the cell of a notebook papermill is executing (from the output
    notebook it saves when a cell starts), or "" when none is known."""
    try:
        cells = json.loads(Path(ipynb).read_text()).get("cells", [])
    except (OSError, ValueError, AttributeError):
        return ""
    code = [c for c in cells if c.get("cell_type") == "code"]
    for i, cell in enumerate(code, 1):
        if cell.get("metadata", {}).get("papermill", {}).get("status") == "running":
            source = cell.get("source", "")
            lines = (source if isinstance(source, str) else "".join(source)).splitlines()
            first = next((line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")), "")
            return f"; cell {i}/{len(code)}" + (f": {first[:60]}" if first else "")
    return ""


class Interrupted(KeyboardInterrupt):
    """A run stopped by a signal (SIGTERM, SIGHUP), raised where it was, as Ctrl-C is."""


@contextlib.contextmanager
def stopped_by_signals(signals: tuple[str, ...] = ("SIGTERM", "SIGHUP")) -> Iterator[None]:
    """Inside, ``signals`` raise ``Interrupted`` in the main thread (so that ``finally`` blocks and handlers
    record the interruption); elsewhere, or outside, they do what they did before."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, _frame: Any) -> None:
        raise Interrupted(f"stopped by {signal.Signals(signum).name}")

    before = {}
    for name in signals:
        if hasattr(signal, name):
            before[name] = signal.signal(getattr(signal, name), stop)
    try:
        yield
    finally:
        for name, handler in before.items():
            signal.signal(getattr(signal, name), handler)


def cpu_seconds() -> float:
    """CPU seconds used so far by this process and its finished children (a notebook's kernel is one): a
    notebook's cost that does not grow with the machine's load, as its wall time does."""
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


#: The shortest time a notebook cell may run before it counts as stopped (``cell_timeout``).
MIN_CELL_TIMEOUT_S = 300.0


def cell_timeout(expected_s: float | None) -> int:
    """Seconds one cell may run: ten times its notebook's expected seconds (a slower machine's whole notebook fits),
    at least ``MIN_CELL_TIMEOUT_S``. A kernel can stop answering with its cell done (its reply lost between kernel
    and client, seen in a widget's cell); past this the cell is stopped (``run_once_more_if_stopped``)."""
    return int(max(MIN_CELL_TIMEOUT_S, 10.0 * float(expected_s or 0.0)))


def run_once_more_if_stopped(execute: Callable[[], Any], say: Callable[[str], Any]) -> None:
    """``execute()`` (a notebook's run), once more in a new kernel when a cell ran past its timeout or the kernel
    died; a second stop is raised."""
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    try:
        execute()
    except (CellTimeoutError, DeadKernelError) as err:
        say(f"{type(err).__name__}: {err}: running it once more in a new kernel\n")
        execute()


def heartbeat_tail(ipynb: Path, expected_here: float | None, start: float, later: float | None) -> str:
    """What a heartbeat line adds: the running cell and "; report: about M:SS left (done ~HH:MM)" from expected
    costs: this notebook's rest (at least a tenth of its expected time while it runs over) and the notebooks after
    it (``later``), where every cost is known."""
    if not expected_here or later is None:
        return running_cell(ipynb)
    left = max(expected_here - (time.perf_counter() - start), 0.1 * expected_here) + later
    done = _dt.datetime.now() + _dt.timedelta(seconds=left)
    return running_cell(ipynb) + f"; report: about {_clock(left)} left (done ~{done:%H:%M})"
