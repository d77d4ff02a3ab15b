"""One report, one answer: a page that states a c(w) or a*(k) other than the report's cost model's, or two pages
that state different ones, are named (``specbench.report.consistency``) and the index opens with them."""

from __future__ import annotations

import json

import pytest

from specbench.cost import Protocol
from specbench.cost.breakeven import break_even_acceptance
from specbench.report import cost_models
from specbench.report.consistency import conflicts, statements
from specbench.report.index import write_index

MODEL = "synthetic:qwen3-8b-tiny"


@pytest.fixture
def report(tmp_path, monkeypatch):
    """A report folder with the tiny model's cost model recorded (3 widths, fast mode, 2 rounds)."""
    monkeypatch.setenv("SPECBENCH_HOME", str(tmp_path / "home"))
    out = tmp_path / "report"
    protocol = Protocol(widths=3, verify=("fast",), offset=16, repeats=2, plain_tokens=2)
    profile = cost_models.prepare(out, [MODEL], protocol, lambda _: None)[MODEL]
    return out, profile


def _page(out, name, values=None, verdict=""):
    (out / name).mkdir(parents=True, exist_ok=True)
    summary = {"notebook": name, "verdict": verdict, "values": values or {}, "skipped": {}}
    (out / name / "summary.json").write_text(json.dumps(summary))
    (out / name / "status.json").write_text(json.dumps({"status": "done", "seconds": 1.0}))


def test_pages_that_state_the_cost_models_values_agree(report):
    out, profile = report
    c2, a2 = profile.c(2, "fast"), float(break_even_acceptance(profile, 0.0, 2, "fast")[1])
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
