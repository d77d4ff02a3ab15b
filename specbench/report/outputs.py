"""Where a notebook's figures, logs, tables, summary values and skipped sections go.

from specbench.report import Outputs
out = Outputs(output_dir, "quickstart")   # output_dir: the parameter `specbench report` sets
out.figure(fig, "steps"); out.table(frame, "runs"); out.summary(speedup=1.4)
"""

from __future__ import annotations

import html
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specbench.common.files import safe_name, write_parquet_atomic, write_text_atomic
from specbench.inputs.capabilities import check

if TYPE_CHECKING:
    from specbench.report.verdicts import SpeedVerdict

#: Resolution of the figures a report writes.
FIGURE_DPI = 110


def read_json(path: str | os.PathLike) -> dict[str, Any] | None:
    """A JSON object stored at ``path``; None where it is missing, unreadable or not an object."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_table(path: str | os.PathLike) -> Any:
    """The polars frame stored at ``path``; None where it is missing or unreadable."""
    import polars as pl

    try:
        return pl.read_parquet(path) if Path(path).is_file() else None
    except (OSError, pl.exceptions.PolarsError):
        return None


def read_summary(out: str | os.PathLike, notebook: str) -> dict[str, Any]:
    """A notebook's ``summary.json`` in report folder ``out`` (what ``Outputs`` wrote: verdict, its speed verdicts,
    values, skipped sections, figures, logs, tables); {} if none."""
    return read_json(Path(out) / notebook / "summary.json") or {}


def in_ipython() -> bool:
    """True inside an IPython kernel or shell (where figures and Markdown can be displayed)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    return get_ipython() is not None


def _say(markdown: str, text: str) -> None:
    """Show ``markdown`` in IPython, else print ``text``."""
    if in_ipython():
        from IPython.display import Markdown, display

        display(Markdown(markdown))
    else:
        print(text)


def reference_blas_note() -> str:
    """The sentence every verdict of a run on MLX's reference BLAS ends with ("" elsewhere): its matmuls are slow, so
    verification looks dearer than with an optimized BLAS, and its numbers are not comparable with such a run's."""
    from specbench.common.blas import is_reference
    from specbench.common.identity import blas_library

    blas = blas_library()
    if blas is None or not is_reference(blas):
        return ""
    return (
        " (Measured on MLX's reference BLAS, whose matmuls run 20-50x slower than an optimized one's: not comparable "
        "with a run on OpenBLAS.)"
    )


class Outputs:
    """Where one notebook's figures, logs, tables and summary go: under ``output_dir/NOTEBOOK/`` (``output_dir``
    set by ``specbench report``); without one, figures are only shown. ``needs`` and ``skip`` turn a missing
    capability into a visible, recorded skipped section."""

    def __init__(self, output_dir: str | os.PathLike | None, notebook: str):
        self.notebook = notebook
        self.folder = Path(output_dir) / notebook if output_dir else None
        self.values: dict[str, Any] = {}
        self.verdict_text = ""
        #: What the verdict says of speed, as typed statements (``verdicts.SpeedVerdict``).
        self.speeds: list[SpeedVerdict] = []
        self.skipped: dict[str, str] = {}
        #: The files written so far (paths relative to the report folder).
        self.figures: list[str] = []
        self.logs: list[str] = []
        self.tables: list[str] = []
        #: Per figure name, what it breaks of the report's rules (``figures.checks.figure_problems``).
        self.figure_problems: dict[str, list[str]] = {}

    def _keep(self, files: list[str], path: Path) -> Path:
        files.append(str(path.relative_to(self.folder.parent)) if self.folder else str(path))
        self._save_summary()
        return path

    def _save_summary(self) -> None:
        if self.folder is None:
            return
        data: dict[str, Any] = {"notebook": self.notebook, "verdict": self.verdict_text, "values": self.values}
        data |= {"skipped": self.skipped, "speeds": [s.to_json() for s in self.speeds]}
        data |= {"figure_problems": self.figure_problems, "figures": self.figures, "logs": self.logs}
        data |= {"tables": self.tables}
        write_text_atomic(self.folder / "summary.json", json.dumps(data, indent=1, default=str))

    def figure(self, fig: Any, name: str, show: bool = True) -> None:
        """Save ``fig`` (PNG and SVG, when writing), show it once, and close it; what it breaks of the report's
        rules (``figures.checks``) is printed and kept in the summary."""
        import matplotlib.pyplot as plt

        from specbench.report.figures import save_figure
        from specbench.report.figures.checks import figure_problems

        problems = figure_problems(fig)
        if problems:
            self.figure_problems[name] = problems
            print(f"figure {name}: " + "; ".join(problems))
        if self.folder is not None:
            path = self.folder / "figures" / f"{safe_name(name)}.png"
            png = save_figure(fig, path, dpi=FIGURE_DPI, svg=True, close=False)
            self._keep(self.figures, png)
        if show and in_ipython():
            from IPython.display import display

            display(fig)
        plt.close(fig)

    def log(self, log: Any, name: str) -> Path | None:
        """Save a StepLog (or a polars frame of steps) as logs/NAME.parquet."""
        return self._parquet(log, "logs", name)

    def table(self, frame: Any, name: str) -> Path | None:
        """Save a polars frame as tables/NAME.parquet."""
        return self._parquet(frame, "tables", name)

    def _parquet(self, data: Any, kind: str, name: str) -> Path | None:
        if self.folder is None:
            return None
        path = self.folder / kind / f"{safe_name(name)}.parquet"
        data.save(path) if hasattr(data, "save") else write_parquet_atomic(data, path)
        return self._keep(getattr(self, kind), path)

    def summary(self, **values: Any) -> None:
        """Key results shown in the report's index (numbers, short strings; NaN is stored as null)."""
        self.values.update({k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in values.items()})
        self._save_summary()

    def verdict(self, text: str, speeds: Sequence[SpeedVerdict] = ()) -> None:
        """The notebook's conclusion in words (from ``specbench.report.verdicts``): shown here once, stored for the
        index, which opens with one verdict per notebook; ``speeds``: what the words say of speed, as statements
        (``verdicts.SpeedVerdict``) that ``report.consistency`` sets against the other pages'."""
        self.verdict_text = " ".join(str(text).split()) + reference_blas_note()
        self.speeds = list(speeds)
        self._save_summary()
        _say(f"**Verdict.** {html.escape(self.verdict_text)}", f"Verdict: {self.verdict_text}")

    def skip(self, section: str, reason: str) -> None:
        """Record and show that ``section`` was skipped, and why."""
        self.skipped[section] = str(reason)
        self._save_summary()
        _say(f"> **Skipped: {section}.** {html.escape(str(reason))}", f"Skipped: {section}. {reason}")

    def needs(self, *capabilities: str, section: str) -> bool:
        """True when every capability is available; otherwise ``skip`` the section and False."""
        for name in capabilities:
            cap = check(name)
            if not cap.available:
                self.skip(section, f"{name} is not available: {cap.detail}")
                return False
        return True
