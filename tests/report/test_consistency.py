"""One report, one answer: a page that states a c(w) or a*(k) other than the report's cost model's, two pages that
state different ones, or two that say "pays" and "loses" of one quantity, are named (``specbench.report.consistency``)
and the index opens with them."""

from __future__ import annotations

import json
from dataclasses import replace

import nbformat
import polars as pl
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from specbench.bench.sweep_summary import summarize_sweep
from specbench.cost.breakeven import break_even_acceptance
from specbench.cost.profile import Profile
from specbench.report import Outputs, cost_models, runner, verdicts
from specbench.report.answer import SWEEP_RUNS
from specbench.report.consistency import conflicts, speed_statements, statements
from specbench.report.index import write_index
from specbench.report.verdicts import INCONCLUSIVE, LOSES, OWN_PROMPT, PAYS, SpeedVerdict

MODEL = "m"


@pytest.fixture
def report(tmp_path):
    """A report folder with a recorded cost model (widths 1-5, fast mode) whose a*(2) breaks even."""
    out = tmp_path / "report"
    out.mkdir()
    costs = [1.0, 1.2, 1.4, 1.6, 1.8]
    profile = Profile(
        model=MODEL,
        name=MODEL,
        device="cpu:test",
        versions={},
        plain_step_s=0.1,
        widths={"fast": [1, 2, 3, 4, 5]},
        costs={"fast": costs},
        seconds={"fast": [0.1 * c for c in costs]},
        intervals={"fast": [[c - 0.1, c + 0.1] for c in costs]},
    )
    cost_models.record(out, MODEL, profile)
    return out, cost_models.recorded(out)[MODEL][0]


def _page(out, name, values=None, verdict=""):
    (out / name).mkdir(parents=True, exist_ok=True)
    summary = {"notebook": name, "verdict": verdict, "values": values or {}, "skipped": {}}
    (out / name / "summary.json").write_text(json.dumps(summary))
    (out / name / "status.json").write_text(json.dumps({"status": "done", "seconds": 1.0}))


def test_pages_that_state_the_cost_models_values_agree(report):
    out, profile = report
    c2, a2 = profile.c(2, "fast"), float(break_even_acceptance(profile, 0.0, 2, "fast")[1])
    assert 0 < a2 < 1  # a value to state
    _page(out, "break_even", {f"{MODEL} c(2)": c2, f"{MODEL} a*(2)": a2, "prompts": 3})
    _page(out, "policies", verdict=f"Drafting pays at these rates (c(2) = {c2:.2f} plain steps, overhead included).")
    assert len(statements(out)) == 3
    assert conflicts(out) == []


def test_a_page_with_a_profile_of_its_own_is_named(report):
    out, profile = report
    c2 = profile.c(2, "fast")
    _page(out, "break_even", {f"{MODEL} c(2)": c2})
    _page(out, "explorer", {f"{MODEL} c(2)": c2 + 0.5})
    _page(out, "policies", verdict=f"It never pays (c(2) = {c2 + 1.0:.2f} plain steps).")
    problems = conflicts(out)
    assert any(p.startswith(f"{MODEL} c(2) differs between pages:") and "explorer" in p for p in problems)
    assert any(p.startswith(f"explorer states {MODEL} c(2) = {c2 + 0.5:.3g}") for p in problems)
    assert any(p.startswith("policies states the report's model c(2)") for p in problems)
    assert not any(p.startswith("break_even") for p in problems)  # the page that used the cost model
    write_index(out, {"break_even": "Break-even", "explorer": "Explorer", "policies": "Policies"})
    page = (out / "index.html").read_text()
    assert "The pages disagree:" in page and page.index("The pages disagree:") < page.index("<h2>Verdicts</h2>")


def _sweep(out, ratio: float) -> pl.DataFrame:
    """A sweep of ``MODEL`` in report folder ``out``: lookup, fixed:3 on three "copy" prompts, six adjacent pairs,
    ``ratio`` times as fast as plain decoding (+-2 % from pair to pair); its runs, as the answer reads them."""
    rows = [
        {
            "drafter": "lookup",
            "category": "copy",
            "policy": "fixed:3",
            "prompt": f"copy-{pair % 3}",
            "temperature": 0.0,
            "seed": 0,
            "pair": pair,
            "verify_mode": "exact",
            "decode_tokens": 32,
            "decode_s": 1.0 / (ratio * (1 + 0.02 * (-1) ** pair)),
            "plain_decode_tokens": 32,
            "plain_decode_s": 1.0,
            "steps": 10,
            "verifies": 10,
            "drafted": 30,
            "accepted": 21,
            "equal_to_plain": True,
        }
        for pair in range(6)
    ]
    runs = pl.DataFrame(rows)
    (out / SWEEP_RUNS).parent.mkdir(parents=True, exist_ok=True)
    runs.write_parquet(out / SWEEP_RUNS)
    status = {"status": "done", "seconds": 1.0, "parameters": {"model": MODEL}}
    (out / "draft_length_sweep" / "status.json").write_text(json.dumps(status))
    return runs


def test_opposite_speed_verdicts_of_one_quantity_are_named_and_compatible_ones_are_not(report):
    out, _ = report
    runs = _sweep(out, 1.5)
    summary = summarize_sweep(runs, ["drafter", "policy"])
    sweep = Outputs(out, "draft_length_sweep")  # the page and the answer built from its runs: one quantity, twice
    sweep.verdict(verdicts.sweep(summary, MODEL), verdicts.sweep_speeds(summary, runs, MODEL))
    said = speed_statements(out)
    assert sorted(page for page, _ in said) == ["answer", "draft_length_sweep"]
    assert {v.word for _, v in said} == {PAYS} and len({v.quantity for _, v in said}) == 1
    assert conflicts(out) == []
    (stated,) = {v for page, v in said if page == "draft_length_sweep"}
    assert stated == SpeedVerdict(MODEL, "lookup", "fixed:3", "copy", 0.0, "exact", PAYS, stated.speedup)

    other = Outputs(out, "policies")
    other.verdict("lookup, fixed:3 loses on copy prompts.", [replace(stated, word=LOSES)])
    problems = conflicts(out)
    quantity = f"{MODEL} with lookup, fixed:3 on copy prompts, greedy, exact verification"
    assert problems == [f"{quantity}: answer and draft_length_sweep say it pays, policies says it loses"]
    write_index(out, {"draft_length_sweep": "Draft length sweep", "policies": "Policies"})
    page = (out / "index.html").read_text()
    assert page.index("The pages disagree:") < page.index(quantity) < page.index("<h2>Verdicts</h2>")

    for compatible in (replace(stated, word=INCONCLUSIVE), replace(stated, kind="qa", word=LOSES)):
        other.verdict("lookup, fixed:3 on its prompts.", [compatible])  # inconclusive; another prompt kind
        assert conflicts(out) == []
    _sweep(out, 0.7)  # the answer now says it loses, the sweep page still says it pays
    assert conflicts(out) == [f"{quantity}: draft_length_sweep says it pays, answer says it loses"]


def test_a_stored_speed_verdict_reads_back_and_a_damaged_one_is_left_out(report):
    out, _ = report
    stated = SpeedVerdict(MODEL, "suffix", "auto", OWN_PROMPT, 0.0, "exact", INCONCLUSIVE, None)
    assert SpeedVerdict.of_json(json.loads(json.dumps(stated.to_json()))) == stated
    assert SpeedVerdict.of_json({**stated.to_json(), "word": "maybe"}) is None
    assert SpeedVerdict.of_json({**stated.to_json(), "temperature": "hot"}) is None
    _page(out, "quickstart")
    summary = json.loads((out / "quickstart" / "summary.json").read_text())
    summary["speeds"] = [stated.to_json(), {"model": MODEL}]
    (out / "quickstart" / "summary.json").write_text(json.dumps(summary))
    assert speed_statements(out) == [("quickstart", stated)]


def test_specbench_report_prints_opposite_verdicts(report, tmp_path, capsys):
    out, _ = report
    _sweep(out, 1.5)  # the answer: lookup, fixed:3 pays on copy prompts
    stated = SpeedVerdict(MODEL, "lookup", "fixed:3", "copy", 0.0, "exact", LOSES)
    notebooks = tmp_path / "nb"
    notebooks.mkdir()
    cell = new_code_cell('model = "m"\nmax_tokens = 12\npairs = 2\noutput_dir = ""\nprogress = True')
    cell.metadata["tags"] = ["parameters"]
    summary = {"notebook": "quickstart", "verdict": "It loses.", "speeds": [stated.to_json()]}
    body = (  # what Outputs.verdict stores (the kernel may import another checkout of specbench)
        f"import json, pathlib\npath = pathlib.Path(output_dir, 'quickstart', 'summary.json')\n"
        f"path.parent.mkdir(parents=True, exist_ok=True)\npath.write_text(json.dumps({summary!r}))"
    )
    kernel = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}
    nbformat.write(
        new_notebook(cells=[cell, new_code_cell(body)], metadata=kernel), str(notebooks / "quickstart.ipynb")
    )
    result = runner.run_report("quick", out, only=["quickstart"], notebooks=notebooks, progress=False)
    assert [r.status for r in result.results] == ["done"]
    quantity = f"{MODEL} with lookup, fixed:3 on copy prompts, greedy, exact verification"
    printed = capsys.readouterr().out
    assert f"the report's pages disagree: {quantity}: answer says it pays, quickstart says it loses" in printed
