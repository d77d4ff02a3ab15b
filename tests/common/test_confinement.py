"""Every output whose name comes from a user or a file stays in its folder; what reaches a widget is escaped."""

from __future__ import annotations

import os
from pathlib import Path

import polars as pl
import pytest
from conftest import build_tiny

from specbench.common.files import inside, safe_name

HOSTILE = ["../../escaped", "/etc/escaped", "a/../../escaped", "..", ".", "", "~/x", "a\\b", "nul\x00byte", "ü/\ud800"]


@pytest.mark.parametrize("text", HOSTILE)
def test_safe_name_is_one_plain_name(text):
    name = safe_name(text)
    assert name and "/" not in name and "\x00" not in name and not name.startswith(".")
    assert Path(name).name == name and len(name) <= 120


@pytest.mark.parametrize("text", ["coding-agent", "trace_1.v2", "Qwen3-0.6B"])
def test_safe_name_keeps_plain_names(text):
    assert safe_name(text) == text


def test_safe_names_of_different_texts_differ():
    assert len({safe_name(t) for t in ["a/b", "a_b", "a?b", "a b"]}) == 4


@pytest.mark.parametrize("relative", ["../x", "/etc/passwd", "a/../../x", ".", "link/x"])
def test_inside_refuses_what_leads_out(tmp_path, relative):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "link").symlink_to(tmp_path)
    with pytest.raises(ValueError, match="leads outside its folder"):
        inside(tmp_path / "out", relative, "a file from rank 1")


def test_inside_keeps_what_is_inside(tmp_path):
    assert inside(tmp_path, "nb/status.json") == (tmp_path / "nb" / "status.json").resolve()


def _files_under(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize("name", HOSTILE)
def test_notebook_outputs_stay_in_the_notebook_folder(tmp_path, name):
    from specbench.report.outputs import Outputs

    out = Outputs(tmp_path / "report", "agent_traces")
    frame = pl.DataFrame({"a": [1]})
    out.table(frame, name)
    out.log(frame, f"steps-{name}")
    written = _files_under(tmp_path)
    assert written and all(p.is_relative_to(tmp_path / "report" / "agent_traces") for p in written)


@pytest.mark.parametrize("trace_id", HOSTILE)
def test_trace_bench_files_stay_in_the_out_folder(tmp_path, trace_id):
    from specbench.bench.trace_bench import _trace_files

    for path in _trace_files(trace_id, tmp_path):
        assert path.parent == tmp_path and path.name.endswith(".parquet")


@pytest.mark.parametrize("model", HOSTILE)
def test_stored_profiles_stay_in_the_home_folder(tmp_path, model):
    from specbench.cost.profile import profile_path
    from specbench.cost.trees import tree_costs_path

    for path in (profile_path(model, model, {"mlx": "0"}, tmp_path), tree_costs_path(model, model, "exact", tmp_path)):
        assert Path(os.path.normpath(path)).is_relative_to(tmp_path) and "/" not in path.name


def test_model_key_of_a_hostile_model_type_is_one_name():
    from specbench.common.identity import model_key

    model = build_tiny("llama")
    saved = model.args.model_type
    try:
        model.args.model_type = "../../escaped"
        assert "/" not in model_key(model)
    finally:
        model.args.model_type = saved


def test_explorer_status_is_escaped():
    from specbench.report.explorer import Explorer

    model = build_tiny("llama")
    hostile = "<img src=x onerror=alert(1)>"
    app = Explorer(models={hostile: (model, None)}, drafters=["none"], drafter="none", max_tokens=2)
    assert app.run() is None
    assert "<img" not in app.status.value and "&lt;img" in app.status.value
