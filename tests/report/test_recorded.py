"""Generations recorded in a report folder and shown by later notebooks; console progress of a report."""

from __future__ import annotations

import io
import json
from types import SimpleNamespace

import polars as pl
import pytest
from conftest import build_tiny

from specbench import DraftPolicy, GenerateOptions
from specbench.bench import sweep, timing
from specbench.cli import registry
from specbench.drafters import PromptLookup
from specbench.inputs.prompts import Prompt
from specbench.report import recorded, render
from specbench.report.progress import Heartbeat, Prefixed, running_cell


@pytest.fixture(scope="module")
def tiny():
    return build_tiny("llama", seed=5, scale=2.0)


def test_the_quickstart_shows_the_sweeps_generation_instead_of_generating(tiny, tmp_path, monkeypatch):
    prompt = Prompt("p0", "custom", "", [5, 6, 7, 8, 5, 6, 7, 8, 5, 6])
    result = sweep.run_sweep(
        tiny, None, [prompt], drafters=["lookup"], policies=["fixed:3"], max_tokens=12, progress=False, warmup_tokens=0
    )
    assert recorded.record_sweep(tmp_path, "tiny", [prompt], result, max_tokens=12) == 2
    options = GenerateOptions(max_tokens=12, temperature=0.0, seed=0)
    runs = []
    monkeypatch.setattr(recorded, "run_side_by_side", lambda *a: runs.append(a))
    both = recorded.side_by_side(
        tmp_path, "tiny", tiny, None, prompt.ids, options, "lookup", PromptLookup(), DraftPolicy.fixed(3)
    )
    assert not runs  # shown from the record, nothing generated
    row = result.runs.filter(pl.col("drafter") == "lookup").row(0, named=True)
    steps = result.steps.filter(pl.col("run") == row["run"])
    assert both.speculative.tokens == [t for ts in steps["tokens"].to_list() for t in ts]
    assert both.speedup == pytest.approx(row["speedup"])
    assert both.equal is True and both.stats()["verifies"] == row["verifies"]
    assert [s for _, s, _ in render.token_sources(both.speculative)].count("draft") == row["accepted"]
    # another drafter, policy or length is not the same generation
    for other in (("suffix", DraftPolicy.fixed(3), 12), ("lookup", DraftPolicy.fixed(1), 12), ("lookup", None, 8)):
        name, policy, tokens = other
        opts = GenerateOptions(max_tokens=tokens, temperature=0.0, seed=0)
        key = recorded.generation_key("tiny", prompt.ids, name, (policy or DraftPolicy.fixed(3)).name, opts)
        assert recorded.find(tmp_path, key) is None


def test_a_generation_made_here_is_recorded_and_found_again(tiny, tmp_path):
    ids = [3, 4, 5, 3, 4, 5, 3, 4]
    options = GenerateOptions(max_tokens=8, temperature=0.0, seed=0)
    first = recorded.side_by_side(
        tmp_path, "tiny", tiny, None, ids, options, "lookup", PromptLookup(), DraftPolicy.fixed(2)
    )
    assert isinstance(first, timing.SideBySide) and not isinstance(first, recorded.RecordedPair)
    again = recorded.side_by_side(
        tmp_path, "tiny", tiny, None, ids, options, "lookup", PromptLookup(), DraftPolicy.fixed(2)
    )
    assert isinstance(again, recorded.RecordedPair)
    assert again.speculative.tokens == list(first.speculative.tokens)
    assert again.speedup == pytest.approx(first.speedup)
    # no report folder: nothing recorded, nothing found
    assert recorded.find(None, "anything") is None


def test_report_progress_lines_name_the_notebook_and_its_running_cell(tmp_path):
    sink = io.StringIO()
    out = Prefixed(sink, "[nb] ")
    out.write("one\ntw")
    out.write("o\n\r 10%\r 20%\n")
    assert sink.getvalue() == "[nb] one\n[nb] two\n\r[nb]  10%\r[nb]  20%\n"
    out.write("\r 30%")
    out.end_line()  # a heartbeat after an open bar starts on its own line
    out.end_line()
    assert sink.getvalue().endswith("\r[nb]  30%\n")
    cells = [
        {"cell_type": "markdown", "source": "# title", "metadata": {}},
        {"cell_type": "code", "source": ["x = 1\n"], "metadata": {"papermill": {"status": "completed"}}},
        {
            "cell_type": "code",
            "source": "# run it\nresult = run_sweep(x)\n",
            "metadata": {"papermill": {"status": "running"}},
        },
    ]
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps({"cells": cells}))
    assert running_cell(path) == "; cell 2/2: result = run_sweep(x)"
    assert running_cell(tmp_path / "missing.ipynb") == ""
    beat = Heartbeat("nb", 60, every_s=None, after=lambda: running_cell(path))
    assert beat.line(30).endswith("cell 2/2: result = run_sweep(x)")


def test_bench_defaults_depend_on_the_device(monkeypatch, capsys):
    import specbench.common.identity as identity

    monkeypatch.setattr(identity, "device_name", lambda: "cpu:test")
    args = SimpleNamespace(max_tokens=None, limit=None, categories=None, prompts="bundled")
    assert registry.device_defaults(args) == {"max_tokens": 32, "limit": 3, "categories": "qa,translation"}
    assert (args.max_tokens, args.limit, args.categories) == (32, 3, "qa,translation")  # 6 prompts: an interval
    assert capsys.readouterr().out == ""  # nothing printed before the command line is checked
    mine = SimpleNamespace(max_tokens=64, limit=None, categories=None, prompts="my.jsonl")
    registry.device_defaults(mine)
    assert (mine.max_tokens, mine.limit, mine.categories) == (64, None, None)  # given values kept; a user's file whole
    monkeypatch.setattr(identity, "device_name", lambda: "gpu:test")
    gpu = SimpleNamespace(max_tokens=None, limit=None, categories=None, prompts="bundled")
    registry.device_defaults(gpu)
    assert (gpu.max_tokens, gpu.limit, gpu.categories) == (128, None, None)


def test_a_sweep_takes_its_recorded_cells_and_runs_the_rest(tiny, tmp_path, monkeypatch):
    prompt = Prompt("p0", "custom", "", [5, 6, 7, 8, 5, 6, 7, 8, 5, 6])
    kwargs = dict(drafters=["lookup"], policies=["fixed:3"], max_tokens=10, progress=False)
    first = sweep.run_sweep(tiny, None, [prompt], warmup_tokens=0, **kwargs)
    recorded.record_sweep(tmp_path, "tiny", [prompt], first, max_tokens=10)
    ran = []
    real = sweep.run_sweep
    monkeypatch.setattr(sweep, "run_sweep", lambda *a, **k: ran.append(a[6]) or real(*a, **k))
    both = recorded.run_sweep(tmp_path, "tiny", tiny, None, [prompt], temperatures=[0.0, 1.0], **kwargs)
    assert ran == [[1.0]]  # the greedy cell was recorded: only the sampled one ran
    assert both.runs["run"].to_list() == [0, 1, 2, 3]
    assert both.runs["temperature"].to_list() == [0.0, 0.0, 1.0, 1.0]
    greedy = both.runs.filter(pl.col("temperature") == 0.0)
    assert greedy["speedup"].to_list() == pytest.approx(first.runs["speedup"].to_list())
    assert set(both.steps["run"].unique().to_list()) == {0, 1, 2, 3}
    assert both.summary(["drafter", "temperature"]).height == 4
    assert not both.per_position(["drafter", "temperature"]).is_empty()
    again = recorded.run_sweep(tmp_path, "tiny", tiny, None, [prompt], temperatures=[0.0, 1.0], **kwargs)
    assert ran == [[1.0]] and again.runs.height == 4  # now every cell is recorded
