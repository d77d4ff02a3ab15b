"""One report, one answer: a page that states a c(w) or a*(k) other than the report's cost model's, or two pages
that state different ones, are named (``specbench.report.consistency``) and the index opens with them."""

from __future__ import annotations

import json

import pytest

from specbench.cost.breakeven import break_even_acceptance
from specbench.cost.profile import Profile
from specbench.report import cost_models
from specbench.report.consistency import conflicts, statements
from specbench.report.index import write_index

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
