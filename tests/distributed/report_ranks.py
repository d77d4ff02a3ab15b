"""A report of two small notebooks, run on 2 ranks by tests/distributed/spread_ranks.py (each rank writing
into a folder of its own, as on two machines, merged into rank 0's; then again after rank 0's folder lost one
notebook's HTML and rank 1's folder everything) and in a world of one by the test itself."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_notebook

from specbench.common import distributed
from specbench.report import runner

NOTEBOOKS = ["batch_break_even", "tree_vs_path"]
#: A notebook body on the standard library alone (a kernel that imports nothing heavy starts fast): a table and
#: the summary the report lists its outputs from (the format ``specbench.report.Outputs`` writes).
BODY = """import json, pathlib
name = NAME
folder = pathlib.Path(output_dir) / name
(folder / "tables").mkdir(parents=True, exist_ok=True)
(folder / "tables" / "numbers.csv").write_text(f"k,value\\n1,{value}\\n2,{2 * value}\\n")
summary = {"values": {"value": value}, "tables": [f"{name}/tables/numbers.csv"], "figures": [], "logs": []}
(folder / "summary.json").write_text(json.dumps(summary))"""


def write_notebooks(folder: Path) -> Path:
    """Two notebooks with a ``value`` parameter that write a table and a summary."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in NOTEBOOKS:
        cell = new_code_cell('value = 3\noutput_dir = ""\nprogress = True')
        cell.metadata["tags"] = ["parameters"]
        body = new_code_cell(BODY.replace("NAME", repr(name)))
        kernel = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nbformat.write(new_notebook(cells=[cell, body], metadata={"kernelspec": kernel}), str(folder / f"{name}.ipynb"))
    return folder


def report(out: Path, notebooks: Path) -> dict[str, str]:
    """The report into ``out``: each notebook's status ("done", "skipped", ...)."""
    result = runner.run_report("quick", out, {"value": "5"}, NOTEBOOKS, notebooks=notebooks, progress=False)
    return {r.notebook: r.status for r in result.results}


def held(out: Path) -> list[str]:
    """The notebooks with a status in report folder ``out``."""
    return [name for name in NOTEBOOKS if runner.read_status(out, name) is not None]


def run_on_ranks(root: Path) -> None:
    """The report on this rank, then again after losing outputs; what each run did goes to ``ROOT/resultR.json``."""
    notebooks = write_notebooks(root / "notebooks")
    out = root / f"host{distributed.rank()}" / "report"
    result = {"first": report(out, notebooks), "held": held(out)}
    # Interrupted: rank 0's folder lost one notebook's HTML, rank 1's folder lost everything.
    if distributed.is_main():
        (out / "tree_vs_path.html").unlink()
    else:
        shutil.rmtree(out)
    distributed.barrier()
    result.update(second=report(out, notebooks), held_after=held(out))
    (root / f"result{distributed.rank()}.json").write_text(json.dumps(result))
