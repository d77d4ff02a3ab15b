"""A report folder's status files and its index page (``index.html``), which links every
notebook's HTML, figures, logs and tables with a summary table.

A notebook's status is "running" while it runs (with the runner's process id and host), then "done",
"failed" or "interrupted" (a signal or Ctrl-C); a "running" status whose process is gone is shown as
"interrupted" too. Statuses and the index are written under their file's lock; a damaged status is
moved aside with a warning and the notebook runs again.
"""

from __future__ import annotations

import json
import os
import re
import socket
from html import escape as esc
from pathlib import Path
from typing import Any

from specbench.common.files import locked, read_or_set_aside, write_json_atomic, write_text_atomic
from specbench.report.answer import answer_html, sweep_model
from specbench.report.consistency import conflicts
from specbench.report.outputs import read_json, read_summary
from specbench.report.verdicts.labels import describe

_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:1.5em auto;padding:0 1em;
max-width:1200px;color:#222;box-sizing:border-box}
table{border-collapse:collapse;width:100%;margin:1em 0;table-layout:fixed}
th,td{border:1px solid #ddd;padding:6px 8px;vertical-align:top;font-size:0.92em;overflow-wrap:anywhere}
th{background:#f4f4f4;text-align:left}
col.nb{width:17%}col.st{width:8%}col.t{width:6%}col.res{width:47%}col.f{width:5%}col.logs{width:17%}
.done{color:#1a7f37;font-weight:600}.failed,.interrupted{color:#cf222e;font-weight:600}.running,.not.run{color:#9a6700}
.figs{display:flex;flex-wrap:wrap;gap:10px}.figs a img{width:260px;max-width:100%;border:1px solid #ddd}
.err{font-family:monospace;white-space:pre-wrap;color:#cf222e}.skip{color:#9a6700}
.kv{margin:0 0 2px 0}.kv .v{font-weight:600}
.verdicts li{margin:0.4em 0;line-height:1.4}
.answer td.pays{color:#1a7f37;font-weight:600}.answer td.loses{color:#cf222e;font-weight:600}
.cost{color:#555;font-size:0.9em}img.map{max-width:720px;width:100%;border:1px solid #ddd}
.conflict{color:#cf222e}
"""
#: report.json keys shown at the top of the index, in order.
_INFO_KEYS = ("profile", "device", "blas", "mlx", "mlx_lm", "specbench", "created", "updated", "last_run_s")


#: The states a status file records.
STATES = ("running", "done", "failed", "interrupted")


def check_status(data: Any) -> dict[str, Any]:
    """A notebook's status (``status.json``'s JSON), or a ValueError saying what is wrong: the one check
    of every reader."""
    if not isinstance(data, dict):
        raise ValueError(f"a JSON object was expected, not {type(data).__name__}")
    if data.get("status") not in STATES:
        raise ValueError(f"its status {data.get('status')!r} is not one of {', '.join(STATES)}")
    seconds = data.get("seconds", 0.0)
    if not (isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and 0 <= seconds < float("inf")):
        raise ValueError(f"its run time {seconds!r} is not a number of seconds >= 0")
    for key, kind in (("parameters", dict), ("outputs", list), ("error", str), ("pid", int), ("host", str)):
        if key in data and not isinstance(data[key], kind):
            raise ValueError(f"its {key!r} is not a {kind.__name__}")
    return data


def read_status(out: Path, notebook: str) -> dict[str, Any] | None:
    """A notebook's ``status.json`` in report folder ``out``: None when missing, unreadable or damaged
    (a damaged file is moved aside with a warning naming it, and the notebook runs again)."""

    def read(path: Path) -> dict[str, Any]:
        return check_status(json.loads(path.read_text(encoding="utf-8")))

    try:
        return read_or_set_aside(Path(out) / notebook / "status.json", read, "report status")
    except OSError:
        return None


def write_status(out: Path, notebook: str, status: dict[str, Any]) -> Path:
    path = Path(out) / notebook / "status.json"
    with locked(path):
        return write_json_atomic(path, check_status(status))


def write_report_info(out: Path, info: dict[str, Any]) -> Path:
    """Write ``out/report.json`` from ``info``, merged with what is stored there (its first "created"
    kept), under the file's lock."""
    path = Path(out) / "report.json"
    with locked(path):
        stored = read_json(path) or {}
        created = stored.get("created") if isinstance(stored.get("created"), str) else None
        return write_json_atomic(path, {**stored, **info, **({"created": created} if created else {})})


def running_here() -> dict[str, Any]:
    """What a "running" status records to tell a live run from an interrupted one."""
    return {"pid": os.getpid(), "host": socket.gethostname()}


def _alive(status: dict[str, Any]) -> bool:
    pid = status.get("pid")
    if not isinstance(pid, int) or status.get("host") != socket.gethostname():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def state_of(status: dict[str, Any] | None) -> str:
    """A notebook's state: "not run", "running", "interrupted" (its run's process is gone), "done", "failed"."""
    if not status:
        return "not run"
    state = str(status.get("status", "not run"))
    return "interrupted" if state == "running" and not _alive(status) else state


def _row(out: Path, name: str, title: str, status: dict[str, Any], summary: dict[str, Any]) -> str:
    state = state_of(status)
    links = [f'<a href="{esc(name)}.html">HTML</a>'] if (out / f"{name}.html").exists() else []
    if (out / f"{name}.ipynb").exists():
        links.append(f'<a href="{esc(name)}.ipynb">notebook</a>')
    logs = summary.get("logs", []) + summary.get("tables", [])
    log_links = " ".join(f'<a href="{esc(p)}">{esc(Path(p).name)}</a>' for p in logs)
    values = "".join(
        f'<div class="kv">{esc(label)}: <span class="v">{esc(text)}</span></div>'
        for label, text in (describe(k, v) for k, v in summary.get("values", {}).items())
    )
    skipped = "".join(
        f'<div class="skip">skipped: {esc(s)} ({esc(r)})</div>' for s, r in summary.get("skipped", {}).items()
    )
    message = status.get("error") or ""
    if state == "interrupted" and not message:
        message = "stopped before it finished; a rerun runs it again"
    error = f'<div class="err">{esc(message)}</div>' if message else ""
    seconds = status.get("seconds")
    return (
        f'<tr><td><b>{esc(title)}</b><br>{" | ".join(links)}</td><td class="{esc(state)}">{esc(state)}</td>'
        f"<td>{'' if seconds is None else f'{seconds:.0f} s'}</td><td>{values}{skipped}{error}</td>"
        f"<td>{len(summary.get('figures', []))}</td><td>{log_links}</td></tr>"
    )


#: The most words of a page's verdict on the index (at most two sentences; the page has the rest).
BRIEF_WORDS = 60


def brief(text: str, words: int = BRIEF_WORDS) -> str:
    """A verdict taken in at a glance: its first two sentences, cut to ``words`` words ("..." where cut)."""
    sentences = re.split(r"(?<=[.!?])\s+(?=[A-Z(])", " ".join(str(text).split()))
    shown = " ".join(sentences[:2])
    parts = shown.split()
    more = len(sentences) > 2
    if len(parts) + more > words:
        return " ".join(parts[: words - 1]) + " ..."
    return shown + (" ..." if more else "")


def _verdict(name: str, title: str, status: dict[str, Any], summary: dict[str, Any]) -> str:
    """One line per notebook: its verdict at a glance (``brief``; the page holds it whole), or why there is none."""
    state = state_of(status)
    text = brief(summary.get("verdict") or "")
    if not text:
        text = {"done": "finished without a verdict", "failed": f"failed: {status.get('error', '')}"}.get(state, state)
    return f'<li><a href="#{esc(name)}"><b>{esc(title)}</b></a>: {esc(text)}</li>'


def _gallery(name: str, title: str, figures: list[str]) -> str:
    thumbs = "".join(
        f'<a href="{esc(p)}"><img src="{esc(p)}" alt="{esc(Path(p).stem)}" title="{esc(Path(p).stem)}"></a>'
        for p in figures
    )
    svgs = " ".join(f'<a href="{esc(str(Path(p).with_suffix(".svg")))}">{esc(Path(p).stem)}.svg</a>' for p in figures)
    return f'<h3 id="{esc(name)}">{esc(title)}</h3><div class="figs">{thumbs}</div><p>SVG: {svgs}</p>'


def write_index(out: str | os.PathLike, titles: dict[str, str]) -> Path:
    """(Re)write ``out/index.html`` from the status and summary files of the notebooks in
    ``titles`` (name -> title, in report order)."""
    out = Path(out)
    with locked(out / "index.html"):  # what it reads and writes, as one: no writer's status is lost
        return _write_index(out, titles)


def _write_index(out: Path, titles: dict[str, str]) -> Path:
    info = read_json(out / "report.json") or {}
    rows, galleries, verdicts = [], [], []
    for name, title in titles.items():
        status = read_status(out, name)
        if status is None:
            continue
        summary = read_summary(out, name)
        rows.append(_row(out, name, title, status, summary))
        verdicts.append(_verdict(name, title, status, summary))
        if figures := summary.get("figures"):
            galleries.append(_gallery(name, title, figures))
    meta = " · ".join(esc(f"{k}: {info[k]}") for k in _INFO_KEYS if k in info)
    answer = answer_html(out, sweep_model(out))
    disagreements = conflicts(out)
    if disagreements:  # two answers where there must be one: said before either
        items = "".join(f"<li>{esc(text)}</li>" for text in disagreements)
        answer += f"<p class='conflict'>The pages disagree:</p><ul class='conflict'>{items}</ul>"
    page = (
        "<!doctype html><html><head><meta charset='utf-8'><title>specbench report</title>"
        f"<style>{_STYLE}</style></head>"
        f"<body><h1>specbench report</h1><p>{meta}</p>{answer}"
        f"<h2>Verdicts</h2><ul class='verdicts'>{''.join(verdicts) or '<li>no notebook has run yet</li>'}</ul>"
        "<table><colgroup><col class='nb'><col class='st'><col class='t'><col class='res'><col class='f'>"
        "<col class='logs'></colgroup>"
        f"<tr><th>notebook</th><th>status</th><th>run time</th><th>key results</th><th>figures</th>"
        f"<th>logs and tables (parquet)</th></tr>{''.join(rows)}</table>"
        f"<h2>Figures</h2>{''.join(galleries) or '<p>none yet</p>'}</body></html>"
    )
    return write_text_atomic(out / "index.html", page)
