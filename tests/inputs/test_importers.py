"""Importers: benchmark runs, bare message lists, content parts, tools as text; detection and error texts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specbench.inputs.importers import detect_format, load_traces

FIXTURES = Path(__file__).parent / "fixtures"
TOOL = {
    "name": "find_order",
    "description": "Look up an order by its id.",
    "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]},
}


def test_benchmark_runs_import_one_trace_per_run(tmp_path):
    path = FIXTURES / "runs.json"
    assert detect_format(path) == "runs"
    traces = load_traces(path)
    assert [t.id for t in traces] == ["task1-trial0", "task1-trial1", "task2-trial0"]
    first = traces[0]
    assert first.meta == {"source": str(path), "task_id": 1, "reward": 1.0, "trial": 0}
    assert len(first.turns) == 3 and first.turns[2].assistant is None  # ends on the user's message
    call = first.turns[0].assistant["tool_calls"][0]
    assert call == {"id": "call_10", "name": "find_order", "arguments": {"order_id": "#B100"}}
    assert first.turns[1].messages[0]["role"] == "tool" and first.turns[1].messages[0]["tool_call_id"] == "call_10"
    assert first.turns[1].assistant["content"] == "Your order #B100 is shipped."
    # The same runs with their tools, as a list or a JSON string: the same descriptions.
    runs = json.loads(path.read_text())
    for i, tools in enumerate(([{"type": "function", "function": TOOL}], json.dumps([TOOL]))):
        assert load_traces(_write_json(tmp_path, [{**runs[0], "tools": tools}], f"{i}.json"))[0].tools == [TOOL]


def test_a_bare_message_list_is_detected_by_content_not_name(tmp_path):
    path = FIXTURES / "bare.traj.json"
    assert detect_format(path) == "openai"
    (trace,) = load_traces(path)
    assert len(trace.turns) == 2 and trace.turns[0].assistant["tool_calls"][0]["arguments"] == {
        "command": "cat calc.py"
    }
    assert trace.turns[1].assistant["content"].startswith("Remove the + 1")
    # A .traj.json that is a SWE-agent trajectory is read as one, by its keys.
    swe = tmp_path / "fix.traj.json"
    swe.write_text(json.dumps({"history": json.loads(path.read_text())}))
    assert detect_format(swe) == "swe-agent" and len(load_traces(swe)[0].turns) == 2


def test_content_parts_and_tools_as_a_json_string(tmp_path):
    path = FIXTURES / "parts.jsonl"
    value, listed = load_traces(path)
    assert value.turns[0].messages == [{"role": "user", "content": "What does 'terse' mean?"}]
    assert [t.assistant["content"] for t in value.turns] == ["Brief, using few words.", "Using more words than needed."]
    assert value.tools == listed.tools == [json.loads(json.loads(path.read_text().splitlines()[0])["tools"])[0]]
    assert value.tools[0]["name"] == "lookup"
    share = _write_json(tmp_path, [{"conversations": [{"from": "human", "value": [{"type": "text", "value": "hi"}]}]}])
    assert load_traces(share)[0].turns[0].messages == [{"role": "user", "content": "hi"}]


def test_ambiguous_records_list_the_candidates_and_the_flag():
    path = FIXTURES / "ambiguous.jsonl"
    expected = f"{path}:2: ambiguous: this record could be openai or sharegpt .*--trace-format openai\\|sharegpt"
    with pytest.raises(ValueError, match=expected):
        load_traces(path)
    assert [len(t.turns) for t in load_traces(path, "openai")] == [1, 1]


@pytest.mark.parametrize(
    "records, where, message",
    [
        ([{"task_id": 3, "traj": "none"}], "item 0", "a run needs 'traj', a list of OpenAI messages"),
        (
            [
                {"traj": [{"role": "user", "content": "x"}]},
                {"traj": [{"role": "user", "content": [{"type": "img"}]}]},
            ],
            "item 1: traj\\[0\\]: content\\[0\\]",
            "a 'img' part cannot be replayed: only text, reasoning/thinking and tool_call parts are read; remove it",
        ),
        ([{"messages": [{"role": "user", "content": "x"}], "tools": "[{"}], "item 0", "tools: not valid JSON"),
        (
            [{"messages": [{"role": "user", "content": "x"}], "tools": '{"name": "f"}'}],
            "item 0",
            "tools: expected a list of function descriptions \\(or that list as a JSON string\\), got dict",
        ),
        ([{"messages": [{"role": "user", "content": "x"}], "tools": [{"description": "d"}]}], "item 0", "tools\\[0\\]"),
        ([{"traj": [{"role": "system", "content": "s"}]}], "item 0", "no turns: expected at least one assistant"),
        ([{"traj": [{"role": "robot", "content": "s"}]}], "item 0: traj\\[0\\]", "message role must be one of"),
        ([{"messages": []}, {"text": "x"}], "item 1", "cannot tell its format .*keys: text.*--trace-format"),
        ([], "", "empty: expected conversations"),
    ],
)
def test_errors_name_file_item_and_what_was_expected(tmp_path, records, where, message):
    path = _write_json(tmp_path, records)
    with pytest.raises(ValueError, match=f"{path}{': ' if where else ''}{where}: {message}"):
        load_traces(path)


def test_json_lines_errors_name_the_line_and_non_utf8_files_are_named(tmp_path):
    good = json.dumps({"messages": [{"role": "user", "content": "hi"}]})
    path = tmp_path / "chat.jsonl"
    path.write_text(good + "\n" + json.dumps({"messages": [{"role": "user", "content": [{"type": "text"}]}]}) + "\n")
    with pytest.raises(ValueError, match=f"{path}:2: messages\\[0\\]: content\\[0\\]: a 'text' part needs its text"):
        load_traces(path)
    latin = tmp_path / "latin.json"
    latin.write_bytes(b'[{"role": "user", "content": "caf\xe9"}]')
    with pytest.raises(ValueError, match=f"{latin}:1: not UTF-8 text \\(byte 33.*save the file as UTF-8"):
        load_traces(latin)
    broken = tmp_path / "broken.json"
    broken.write_text('[\n {"traj": []},\n {"traj": [}\n]')
    with pytest.raises(ValueError, match=f"{broken}:3: not valid JSON .*expected one JSON value"):
        load_traces(broken)


def _write_json(folder: Path, records, name: str = "log.json") -> Path:
    path = folder / name
    path.write_text(json.dumps(records))
    return path
