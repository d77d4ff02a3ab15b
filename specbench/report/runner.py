"""Reports: the notebooks executed with papermill into reports/NAME/, with an index page.

``run_report`` runs each notebook of ``NOTEBOOKS`` with a profile's parameters (``quick`` for CI, ``full``) and
writes per notebook its executed ``.ipynb``, HTML, recorded files and ``status.json``. A finished notebook runs
again only when forced, its parameters changed or an output is gone, so an interrupted report resumes.
"""

from __future__ import annotations

import ast
import datetime as _dt
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from specbench.common import distributed
from specbench.common.blas import status_line
from specbench.common.files import PROJECT_ROOT, check_writable, write_text_atomic
from specbench.common.identity import blas_library, device_name, versions
from specbench.models.load import check_model
from specbench.report import answer, consistency, cost_models
from specbench.report.index import (
    read_status,
    read_summary,
    running_here,
    state_of,
    write_index,
    write_report_info,
    write_status,
)
from specbench.report.profiles import EXPECTED_SECONDS, ON_REQUEST, PROFILES, RUN_FIRST
from specbench.report.progress import (
    Heartbeat,
    Prefixed,
    cell_timeout,
    cpu_seconds,
    heartbeat_tail,
    run_once_more_if_stopped,
    stopped_by_signals,
)
from specbench.report.ranks import merge_ranks, notebooks_here

#: Notebooks in report order, with their titles (a report runs those of ``ON_REQUEST`` only when named).
NOTEBOOKS: dict[str, str] = {
    "quickstart": "Quickstart: one speculative generation",
    "draft_length_sweep": "Draft length sweep",
    "break_even": "Break-even: verify cost, dense vs MoE",
    "agent_traces": "Agent traces",
    "sampling": "Sampling: acceptance vs temperature, losslessness",
    "explorer": "Explorer",
    "batch_break_even": "Break-even by batch size",
    "simulate_logs": "Agent logs simulated: tokens per verification by drafter and store",
    "tree_vs_path": "Draft trees vs paths on agent traces",
    "acceptance_rules": "Acceptance rules at T > 0: token-wise, exact match, block, typical (lossy)",
    "policies": "Draft-length policies: peers' and Auto ranked on the same traces, the best two confirmed",
    "compare": "Two runs side by side: what quantization does to acceptance (on request: --only compare)",
}

#: Parameters the report sets itself (not settable with -p).
RESERVED = ("output_dir", "progress")


def expected_seconds(profile: str, name: str, previous: dict[str, Any] | None = None) -> float | None:
    """How long a notebook is expected to run: its last finished run in this folder with the same parameters,
    else the profile's expected cost (``EXPECTED_SECONDS``), else None."""
    if previous and previous.get("status") == "done" and previous.get("seconds"):
        return float(previous["seconds"])
    return EXPECTED_SECONDS.get(profile, {}).get(name)


# -- parameters --------------------------------------------------------------------------------


def notebook_parameters(path: str | os.PathLike) -> dict[str, Any]:
    """The parameters cell's names and default values (papermill's inspection)."""
    import papermill

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no notebook at {path}")
    params = papermill.inspect_notebook(str(path))
    out = {}
    for name, info in params.items():
        try:
            out[name] = ast.literal_eval(info["default"])
        except (ValueError, SyntaxError):
            out[name] = info["default"]
    return out


def _parse_value(text: str) -> Any:
    for parse in (json.loads, ast.literal_eval):
        try:
            return parse(text)
        except (ValueError, SyntaxError):
            pass
    return text


_BOOLS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}


def coerce(name: str, value: Any, default: Any) -> Any:
    """``value`` (from the command line) in the type of the parameter's default."""
    if isinstance(value, str) and (not isinstance(default, (str, list)) or value.strip().startswith("[")):
        value = _parse_value(value)
    if isinstance(default, list):
        if not isinstance(value, str):
            return value if isinstance(value, list) else [value]
        like = default[0] if default else None
        items = [v.strip() for v in value.split(",") if v.strip()]
        return [coerce(name, v if isinstance(like, str) else _parse_value(v), like) for v in items]
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(default, bool):
        found: Any = value if isinstance(value, bool) else _BOOLS.get(str(value).lower())
        expected = "true or false"
    elif isinstance(default, int):
        found, expected = int(value) if number and float(value).is_integer() else None, "an integer"
    elif isinstance(default, float):
        found, expected = float(value) if number else None, "a number"
    else:
        return str(value) if isinstance(default, str) else value
    if found is None:
        raise ValueError(f"parameter {name}: expected {expected}, got {value!r}")
    return found


def parse_assignments(items: Sequence[str]) -> dict[str, str]:
    """``["k=v", "nb.k=v"]`` -> ``{"k": "v", "nb.k": "v"}``."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"-p takes key=value (or notebook.key=value), got {item!r}")
        out[key.strip()] = value.strip()
    return out


def resolve_parameters(
    profile: str, overrides: dict[str, Any], names: Sequence[str], folder: Path
) -> dict[str, dict[str, Any]]:
    """Each notebook's parameters: the profile's, then ``overrides`` (``key`` for every notebook
    that has it, ``notebook.key`` for one). Unknown keys raise one ValueError listing the known."""
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}: choose one of {', '.join(PROFILES)}")
    defaults = {name: notebook_parameters(folder / f"{name}.ipynb") for name in names}
    resolved = {name: dict(PROFILES[profile].get(name, {})) for name in names}
    for name in names:
        unknown = [k for k in resolved[name] if k not in defaults[name]]
        if unknown:
            raise ValueError(f"profile {profile!r} sets {unknown} that notebook {name} does not have")
    problems = []
    for key, value in overrides.items():
        target, _, param = key.rpartition(".")
        targets = [target] if target else [n for n in names if param in defaults[n]]
        if target and target not in names:
            problems.append(f"{key!r} (no notebook {target!r} in this report)")
            continue
        if param in RESERVED:
            problems.append(f"{key!r} (set by the report itself)")
            continue
        if not targets or any(param not in defaults[t] for t in targets):
            problems.append(repr(key))
            continue
        for t in targets:
            resolved[t][param] = coerce(param, value, defaults[t][param])
    if problems:
        known = sorted({p for n in names for p in defaults[n] if p not in RESERVED})
        per_notebook = "; ".join(f"{n}: {', '.join(p for p in defaults[n] if p not in RESERVED)}" for n in names)
        raise ValueError(
            f"unknown parameter(s) {', '.join(problems)}. Known parameters: {', '.join(known)} "
            f"(use notebook.key=value for one notebook; per notebook: {per_notebook})"
        )
    return resolved


# -- running -----------------------------------------------------------------------------------


@dataclass
class NotebookResult:
    notebook: str
    status: str  # "done", "failed", "skipped" (already done), "running"
    seconds: float = 0.0
    error: str = ""


@dataclass
class ReportResult:
    out: Path
    results: list[NotebookResult] = field(default_factory=list)

    @property
    def index(self) -> Path:
        return self.out / "index.html"

    @property
    def failed(self) -> list[str]:
        return [r.notebook for r in self.results if r.status == "failed"]


def _now() -> str:
    return _dt.datetime.now().astimezone().isoformat(timespec="seconds")


def export_html(ipynb: Path, html_path: Path) -> Path:
    """The executed notebook as a standalone HTML page (nbconvert, figures embedded), made for reading
    (``readable_notebook``): parameters as written, no local paths, no progress bars."""
    import nbformat
    from nbconvert import HTMLExporter
    from nbconvert.preprocessors import CoalesceStreamsPreprocessor

    nb = readable_notebook(nbformat.read(str(ipynb), as_version=4), Path(html_path).parent)
    exporter = HTMLExporter(template_name="lab")
    # a progress bar's updates ("\r"-separated, as the console showed them) kept as its last state
    exporter.register_preprocessor(CoalesceStreamsPreprocessor(), enabled=True)
    body, _ = exporter.from_notebook_node(nb)
    return write_text_atomic(html_path, body)


def local_paths(out: Path) -> dict[str, str]:
    """Absolute paths of this machine a page must not show, each with what it shows instead (longest first): the
    report folder, the source checkout, the Python environment, the home folder."""
    places = {
        str(Path(out).resolve()): ".",
        str(PROJECT_ROOT): "<specbench>",
        sys.prefix: "<python env>",
        str(Path.home()): "~",
    }
    return dict(sorted(((k, v) for k, v in places.items() if len(k) > 1), key=lambda kv: -len(kv[0])))


def _without_paths(text: str, places: dict[str, str]) -> str:
    for path, shown in places.items():
        text = text.replace(path, shown)
    return text


def _readable_parameters(source: str) -> str:
    """papermill's injected parameters cell with its strings as written (papermill escapes non-ASCII characters:
    "\\xfc" for "ü")."""
    lines = []
    for line in source.splitlines():
        name, sep, value = line.partition(" = ")
        try:
            lines.append(f"{name} = {ast.literal_eval(value)!r}" if sep and name.isidentifier() else line)
        except (ValueError, SyntaxError):
            lines.append(line)
    return "\n".join(lines)


def readable_notebook(nb: Any, out: Path) -> Any:
    """``nb`` (an executed notebook) for a page: the injected parameters as written, local paths replaced
    (``local_paths``), progress bars on stderr left out (the console showed them) and other stderr lines shown as
    plain output."""
    places = local_paths(out)
    for cell in nb.cells:
        if "injected-parameters" in cell.metadata.get("tags", []):
            cell.source = _readable_parameters(cell.source)
        cell.source = _without_paths(cell.source, places)
        outputs = []
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream":
                if output.get("name") == "stderr":
                    if "\r" in output.get("text", ""):
                        continue  # a progress bar's updates
                    output["name"] = "stdout"
                output["text"] = _without_paths(output.get("text", ""), places)
            for kind in ("text/plain", "text/html", "text/markdown"):
                if kind in output.get("data", {}):
                    data = output["data"][kind]
                    output["data"][kind] = _without_paths("".join(data) if isinstance(data, list) else data, places)
            outputs.append(output)
        if cell.cell_type == "code":
            cell.outputs = outputs
    return nb


def _error_text(err: BaseException) -> str:
    ename = getattr(err, "ename", None)
    if ename:
        return f"{ename}: {getattr(err, 'evalue', '')}".strip()
    return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__


def _recorded(out: Path, name: str, svg: bool) -> list[str]:
    """A notebook's files its summary lists: figures (PNG and, with ``svg``, SVG), logs and tables."""
    summary = read_summary(out, name)
    figures = [str(p) for p in summary.get("figures", [])]
    svgs = [str(Path(p).with_suffix(".svg")) for p in figures if svg]
    return [*figures, *svgs, *(str(p) for p in summary.get("logs", []) + summary.get("tables", []))]


def output_files(out: Path, name: str) -> list[str]:
    """A notebook's outputs in report folder ``out`` (relative paths): its executed notebook and HTML,
    and the summary, figures (PNG and SVG), logs and tables it recorded that exist."""
    listed = [*_recorded(out, name, True), f"{name}/summary.json"]
    return [f"{name}.ipynb", f"{name}.html", *sorted({p for p in listed if (out / p).is_file()})]


def missing_outputs(out: Path, name: str, status: dict[str, Any]) -> list[str]:
    """The outputs a finished notebook's status lists (or, for an older status, its executed notebook,
    HTML and recorded files) that are no longer in ``out``."""
    expected = status.get("outputs")
    if not isinstance(expected, list):
        expected = [f"{name}.ipynb", f"{name}.html", *_recorded(out, name, False)]
    return [str(p) for p in expected if not (out / str(p)).is_file()]


def _reason_to_run(out: Path, name: str, params: dict[str, Any], previous: dict[str, Any] | None) -> str:
    """Why a notebook runs ("" when its earlier run still stands)."""
    state = state_of(previous)
    if state != "done":
        return {"not run": "", "interrupted": "interrupted earlier"}.get(state, f"{state} earlier")
    if previous.get("parameters") != params:
        return "parameters changed"
    missing = missing_outputs(out, name, previous)
    return f"outputs missing ({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''})" if missing else ""


def run_report(
    profile: str = "full",
    out: str | os.PathLike | None = None,
    parameters: dict[str, Any] | None = None,
    only: Sequence[str] | None = None,
    force: bool = False,
    notebooks: str | os.PathLike | None = None,
    kernel_name: str = "python3",
    progress: bool = True,
    start_timeout: int = 120,
) -> ReportResult:
    """Execute the notebooks into ``out`` (default ``reports/PROFILE``) and write its index.html."""
    import papermill

    folder = Path(notebooks) if notebooks else PROJECT_ROOT / "notebooks"  # the source tree's
    names = list(only) if only else [n for n in NOTEBOOKS if n not in ON_REQUEST]  # the others when named
    names.sort(key=lambda n: n not in RUN_FIRST)  # run first what later notebooks show (the index keeps its order)
    unknown = [n for n in names if n not in NOTEBOOKS]
    if unknown:
        raise ValueError(f"unknown notebook(s) {unknown}: choose from {', '.join(NOTEBOOKS)}")
    missing = [n for n in names if not (folder / f"{n}.ipynb").is_file()]
    if missing:
        raise FileNotFoundError(
            f"notebooks {missing} not found in {folder}: the notebooks live in a source checkout of specbench "
            "(install it editable from there, as `make report` does), or pass their folder (--notebooks DIR)"
        )
    started = time.perf_counter()
    resolved = resolve_parameters(profile, dict(parameters or {}), names, folder)
    for model in cost_models.models_of(resolved):  # a model that cannot be loaded: one line before any model work
        check_model(model)
    out = Path(out) if out else Path("reports") / profile
    out = check_writable(out, folder=True, name="--out").resolve()
    write_report_info(out, _report_info(profile))
    result = ReportResult(out)
    previous_status = {name: read_status(out, name) for name in names}
    expected = {name: expected_seconds(profile, name, previous_status[name]) for name in names}
    to_run = {n: force or not s or bool(_reason_to_run(out, n, resolved[n], s)) for n, s in previous_status.items()}
    if distributed.broadcast(any(to_run.values())):  # one cost model for every page, measured before them all
        source_name = cost_models.SOURCE  # the break-even page's parameters fix the protocol: defaults, then the run's
        page = folder / f"{source_name}.ipynb"
        source = {**(notebook_parameters(page) if page.is_file() else {}), **PROFILES[profile].get(source_name, {})}
        source.update(resolved.get(source_name, {}))
        say = (lambda line: print(f"[cost model] {line}", file=sys.stderr, flush=True)) if progress else None
        protocol, contexts = cost_models.protocol_of(source), cost_models.contexts_of(resolved)
        models = cost_models.prepare(out, cost_models.models_of(resolved), protocol, say, contexts, resolved)
        expected = cost_models.scaled(expected, resolved, models, say)
    expected = notebooks_here(expected, to_run)  # under mlx.launch: this rank's share (rank 0's folder decides)
    names = list(expected)
    if progress:
        known = [v for v in expected.values() if v]
        total = f", about {sum(known) / 60:.0f} min in all" if len(known) == len(names) else ""
        plan = ", ".join(f"{n} ~{v / 60:.1f} min" if v else n for n, v in expected.items())
        print(f"report ({profile}) into {out}: {plan}{total} (from earlier runs)", file=sys.stderr, flush=True)
    # no ETA from the mean notebook (their costs differ tenfold): the heartbeat gives one from expected costs
    bar_format = "{desc}: {n_fmt}/{total_fmt} notebooks [{elapsed}]{postfix}"
    bar = tqdm(names, desc=f"report ({profile})", bar_format=bar_format, disable=not progress)
    for name in bar:
        params = resolved[name]
        previous = read_status(out, name)
        reason = "forced" if force else _reason_to_run(out, name, params, previous)
        if previous and not reason:
            result.results.append(NotebookResult(name, "skipped", previous.get("seconds", 0.0)))
            bar.write(f"{name}: already done ({previous.get('seconds', 0):.0f} s); --force to run it again")
            write_index(out, NOTEBOOKS)
            continue
        if previous and reason:
            bar.write(f"{name}: running again ({reason})")
        bar.set_postfix_str(name)
        ipynb = out / f"{name}.ipynb"
        status = {"notebook": name, "status": "running", "profile": profile, "parameters": params, "started": _now()}
        write_status(out, name, {**status, **running_here()})
        (out / name / "summary.json").unlink(missing_ok=True)
        write_index(out, NOTEBOOKS)
        t0, cpu0 = time.perf_counter(), cpu_seconds()
        error = ""
        console = Prefixed(sys.stderr, f"[{name}] ")
        later = _expected_after(name, names, expected, to_run)
        heartbeat = Heartbeat(
            name,
            expected[name],
            every_s=30.0 if progress else None,
            after=partial(heartbeat_tail, ipynb, expected[name], t0, later),
            before=console.end_line,
        )
        try:
            try:
                with heartbeat, stopped_by_signals():
                    execute = partial(
                        papermill.execute_notebook,
                        str(folder / f"{name}.ipynb"),
                        str(ipynb),
                        parameters={**params, "output_dir": str(out), "progress": progress},
                        kernel_name=kernel_name,
                        progress_bar=False,
                        # what the notebook prints (its progress bars and lines, warnings, results) goes to the
                        # console as it comes, each line marked with the notebook's name
                        stdout_file=console if progress else None,
                        stderr_file=console if progress else None,
                        cwd=str(folder.parent),
                        start_timeout=start_timeout,
                        execution_timeout=cell_timeout(expected[name]),
                    )
                    run_once_more_if_stopped(execute, console.write)
            except Exception as err:  # a failed notebook is recorded; the others still run
                error = _error_text(err)
            seconds = time.perf_counter() - t0
            if ipynb.exists():
                try:
                    export_html(ipynb, out / f"{name}.html")
                except Exception as err:
                    error = error or f"HTML export failed: {_error_text(err)}"
            state, cpu_s = "failed" if error else "done", round(cpu_seconds() - cpu0, 1)
            status.update(status=state, finished=_now(), seconds=round(seconds, 1), error=error, cpu_s=cpu_s)
            if not error:
                status["outputs"] = output_files(out, name)
            write_status(out, name, status)
        except BaseException as err:  # interrupted (a signal, Ctrl-C) or unable to record: said at once
            state = "failed" if isinstance(err, Exception) else "interrupted"
            _record_end(out, name, status, state, _error_text(err) or state, time.perf_counter() - t0)
            raise
        result.results.append(NotebookResult(name, status["status"], seconds, error))
        cpu_note = f" ({status['cpu_s']:.0f} CPU s)" if status.get("cpu_s") else ""
        bar.write(f"{name}: {status['status']} in {seconds:.0f} s{cpu_note}" + (f" ({error})" if error else ""))
        write_index(out, NOTEBOOKS)
    bar.close()
    result.results = merge_ranks(out, result.results, list(NOTEBOOKS))  # under mlx.launch: every rank's, on rank 0
    info = _report_info(profile)
    info["last_run_s"] = round(time.perf_counter() - started, 1)  # the run's wall clock, not the ranks' sum
    if distributed.is_main():
        answer.write_map(out, answer.sweep_model(out))
    write_report_info(out, info)
    write_index(out, NOTEBOOKS)
    if distributed.is_main():
        for text in consistency.conflicts(out):
            print(f"the report's pages disagree: {text}")
    return result


def _expected_after(
    name: str, names: Sequence[str], expected: dict[str, float | None], to_run: dict[str, Any]
) -> float | None:
    """Expected seconds of the notebooks that run after ``name`` (None when one of them has no expected time)."""
    later = [n for n in names[names.index(name) + 1 :] if to_run.get(n, True)]
    if any(not expected.get(n) for n in later):
        return None
    return float(sum(expected[n] for n in later))


def _report_info(profile: str) -> dict[str, Any]:
    """What report.json says of this run (``write_report_info`` keeps the first run's "created")."""
    now = _now()
    blas = blas_library()  # the CPU's BLAS (None on a GPU); MLX's reference BLAS says how to get a faster one
    shown = {} if blas is None else {"blas": status_line().removeprefix("CPU BLAS: ")}
    return {"profile": profile, "created": now, "device": device_name(), **shown, **versions(), "updated": now}


def _record_end(out: Path, name: str, status: dict[str, Any], state: str, error: str, seconds: float) -> None:
    """Mark notebook ``name`` ``state`` ("interrupted", "failed") in its status and the index, at once; what
    cannot be written (a full disk) is said on stderr instead."""
    status.update(status=state, finished=_now(), seconds=round(seconds, 1), error=error)
    try:
        write_status(out, name, status)
        write_index(out, NOTEBOOKS)
    except OSError as err:
        print(f"{name}: {state} ({error}); could not record it in {out} ({err})", file=sys.stderr, flush=True)
    else:
        print(f"{name}: {state} ({error}); the next run of this report resumes here", file=sys.stderr, flush=True)
