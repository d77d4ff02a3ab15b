"""The notebooks: clean sources, and the quick report profile executed through papermill."""

from __future__ import annotations

import ast
import html
import json
import re
import sys
from pathlib import Path

import nbformat
import pytest

from specbench.inputs.capabilities import has
from specbench.report import runner as report
from specbench.report.consistency import conflicts, speed_statements
from specbench.report.index import brief

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"


@pytest.mark.parametrize("name", list(report.NOTEBOOKS))
def test_notebook_source_is_clean(name):
    nb = nbformat.read(str(NOTEBOOKS / f"{name}.ipynb"), as_version=4)
    nbformat.validate(nb)
    assert nb.metadata.kernelspec.name == "specbench"  # make setup installs it, with the optimized BLAS preloaded
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code), "stored outputs"
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1
    # papermill must parse every assignment of the parameters cell (it skips lines it cannot read)
    assigned = [m.group(1) for m in re.finditer(r"^(\w+)\s*=", tagged[0].source, re.M)]
    params = report.notebook_parameters(NOTEBOOKS / f"{name}.ipynb")
    assert list(params) == assigned
    assert {"output_dir", "progress"} <= set(params)
    assert all(key in params for key in report.PROFILES["quick"].get(name, {}))
    assert all(key in params for key in report.PROFILES["full"].get(name, {}))


@pytest.mark.parametrize("name", list(report.NOTEBOOKS))
def test_notebook_code_cells_parse(name):
    nb = nbformat.read(str(NOTEBOOKS / f"{name}.ipynb"), as_version=4)
    ids = [c.get("id") for c in nb.cells]
    assert all(ids) and len(set(ids)) == len(ids), "every cell needs its own id"
    for cell in nb.cells:
        if cell.cell_type == "code":
            ast.parse(cell.source, filename=f"{name}.ipynb#{cell.id}")


def test_every_notebook_is_in_the_report():
    assert sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb")) == sorted(report.NOTEBOOKS)


@pytest.mark.skipif(not has("embedded_model"), reason="the quick profile uses the embedded model's tokenizer")
@pytest.mark.parametrize("name", list(report.NOTEBOOKS))
def test_quick_profile_runs_each_notebook(tmp_path, name):
    """Each notebook of the quick profile in a report of its own (so that a parallel test run spreads them):
    done, rendered without local paths or escapes, its figures drawn and passing the figure checks, nothing
    skipped but drafters the miniature lacks, its verdict in words at the top of the index. The policies
    notebook's run also checks its ranking and confirmed policies (formerly
    test_quick_profile_runs_the_policies_notebook, which ran that notebook a second time)."""
    out = tmp_path / "quick"
    result = report.run_report("quick", out, only=[name], progress=False)
    assert [(r.notebook, r.status, r.error) for r in result.results] == [(name, "done", "")]
    page = (out / "index.html").read_text()
    local = [str(tmp_path), str(report.PROJECT_ROOT), sys.prefix, str(Path.home())]
    assert (out / f"{name}.html").stat().st_size > 10_000
    text = (out / f"{name}.html").read_text()
    assert not [p for p in local if p in text], f"{name}.html shows a local path"
    assert "\\x" not in text.split("<body", 1)[1].split("data:image", 1)[0], f"{name}.html escapes characters"
    assert f'href="{name}.html"' in page
    # no Output widget: a headless run answering one can hang its cell (specbench.report.explorer.figure_png)
    assert "OutputModel" not in (out / f"{name}.ipynb").read_text()
    assert json.loads((out / name / "status.json").read_text())["cpu_s"] > 0  # its kernel's CPU time counted
    summary = json.loads((out / name / "summary.json").read_text())
    # no c(w) or a*(k) other than the report's cost model's, and no "pays" where another page says "loses"
    assert conflicts(out) == [], f"{name} disagrees with the report's cost model or another page"
    assert summary["figures"], f"{name} drew no figure"
    for figure in summary["figures"]:
        assert (out / figure).read_bytes()[:4] == b"\x89PNG"
        assert (out / figure).with_suffix(".svg").exists()
    # only drafters the miniature lacks (an MTP head) may be skipped
    assert all(section.startswith("drafter ") for section in summary["skipped"]), summary["skipped"]
    # every figure titled, labelled, inside its canvas, no series hidden (figures.checks)
    assert not summary.get("figure_problems"), (name, summary["figure_problems"])
    assert len(summary["verdict"]) > 40, f"{name} ends without a verdict"  # in words, from its numbers
    # on the index: each verdict at a glance (at most 60 words), key results in words, no float past 3 digits
    verdicts_html = page[page.index("<h2>Verdicts</h2>") : page.index("<table><colgroup>")]
    for item in re.findall(r"<li>(.*?)</li>", verdicts_html):
        assert len(item.split("</a>: ", 1)[-1].split()) <= 60, item
    results = page[page.index("<table><colgroup>") :]
    for label, value in re.findall(r'<div class="kv">([^:<]*): <span class="v">([^<]*)</span>', results):
        assert "_" not in label, label
        for number in re.findall(r"\d+\.\d+", value):
            assert len(number.replace(".", "").lstrip("0")) <= 3, (label, value)
    # the index opens with the answer (once the sweep ran), then one verdict per notebook, before the notebooks' table
    assert html.escape(brief(summary["verdict"])) in page[: page.index("<table><colgroup>")]
    if name == "draft_length_sweep":
        assert summary["values"]["outputs_equal_to_plain"] is True
        # both the page and the answer's table state speed verdicts; where the page says a kind "cannot pay" (a
        # verification yields fewer tokens than it costs: most runs of the miniature, as the quick profile's timing
        # under load allows), it and the answer's cell state one quantity, which the conflict check above compared
        said = speed_statements(out)
        assert {page for page, _ in said} == {"draft_length_sweep", "answer"}, said
        if "cannot pay" in summary["verdict"]:
            pages = {v.quantity: {p for p, w in said if w.quantity == v.quantity} for _, v in said}
            assert {"draft_length_sweep", "answer"} in pages.values(), said
        assert page.index("Does speculation pay here?") < page.index("<h2>Verdicts</h2>")
        assert "cost model: tiny:smollm2-135m, measured" in page  # the one cost model its pages planned with
    if name == "agent_traces":
        assert summary["values"]["identical"] is True
        assert "agent_traces/tables/overall.parquet" in summary["tables"]  # two traces: each method over both
    if name == "sampling":  # sampled by position with one seed, the speculative tokens were plain sampling's
        assert summary["values"]["same_tokens_same"] == summary["values"]["same_tokens_runs"] > 0
    if name == "policies":
        _check_policies_outputs(out / "policies", summary)


def _check_policies_outputs(folder: Path, summary: dict) -> None:
    """The quick policies notebook's ranking (six policies on both traces), its confirmed policies with measured,
    predicted and residual speedups, and a verdict that says the ranking is simulated."""
    import polars as pl

    assert summary["figures"] == ["policies/figures/ranking.png"] and not summary["figure_problems"]
    ranking = pl.read_parquet(folder / "tables" / "ranking.parquet")
    assert ranking["policy"].n_unique() == 6  # the notebook's five policies and fixed:4
    assert {"chat-revision", "tool-agent"} <= set(ranking["workload"])
    confirmed = pl.read_parquet(folder / "tables" / "confirmed.parquet")
    assert len(confirmed) == 2 and confirmed["requests"].n_unique() == 1 and confirmed["requests"][0] >= 1
    assert (
        confirmed["residual"] - (confirmed["measured_speedup"] / confirmed["predicted_speedup"] - 1)
    ).abs().max() < 1e-9
    assert summary["values"]["confirmed"] == ", ".join(confirmed["policy"])
    assert "not a measurement" in summary["verdict"] and "Real runs on" in summary["verdict"]
