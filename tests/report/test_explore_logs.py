"""The explorer over recorded outputs: a choice of drafter, k, policy and prompt replayed without the model."""

from __future__ import annotations

from dataclasses import asdict

import polars as pl
import pytest
from conftest import build_tiny

from specbench.bench import sweep
from specbench.cost import Profile
from specbench.inputs.prompts import Prompt
from specbench.report import recorded
from specbench.report.explorer import (
    EVERY_PROMPT,
    ROW_COLUMNS,
    Choice,
    Recordings,
    best_predicted,
    choice_html,
    coloured_outputs,
    grid,
    grid_figure,
    positions_figure,
    replay,
)
from specbench.report.figures.checks import figure_problems

#: c(1) = 1, c(2) = 1.5, c(5) = 3 (c(3) = 2 and c(4) = 2.5 between them); no overhead, no drafter cost.
PROFILE = Profile(
    model="m",
    name="m",
    device="test",
    versions={},
    plain_step_s=0.01,
    widths={"exact": [1, 2, 5]},
    costs={"exact": [1.0, 1.5, 3.0]},
    seconds={"exact": [0.01, 0.015, 0.03]},
)


def _row(id: str, category: str, prompt: list[int], output: list[int]) -> dict:
    return {
        "id": id,
        "category": category,
        "text": f"prompt {id}",
        "prompt": prompt,
        "output": output,
        "finish_reason": "length",
        "model": "m",
        "max_tokens": len(output),
        "verify": "",
        "source": "test",
    }


@pytest.fixture
def recordings():
    # "copy": the output repeats the prompt, then leaves it; "novel": nothing to look up
    rows = [
        _row("copy", "edit", list(range(10, 18)), [*range(10, 18), 20, 21]),
        _row("novel", "qa", [1, 2, 3], [7, 8, 9, 4]),
    ]
    return Recordings(pl.DataFrame(rows, schema=recorded.OUTPUTS_SCHEMA), "m", "exact", PROFILE)


def test_a_choice_gives_the_numbers_worked_out_by_hand(recordings):
    result = replay(recordings, Choice("lookup", 4, "fixed", "copy"))
    # prefill emits 10; lookup drafts 11-14 (all accepted, 15 the bonus: width 5); with 4 tokens left it drafts
    # 16, 17, 10 and the output goes on 20 (2 accepted, width 4); the last token is a plain step
    steps = [(r.kind, r.k_drafted, r.accepted, r.verify_width) for r in result.log.records[1:]]
    assert steps == [("verify", 4, 4, 5), ("verify", 3, 2, 4), ("plain", 0, 0, 1)]
    row = result.row()
    assert list(asdict(row)) == list(ROW_COLUMNS) == grid(recordings, "lookup", "copy", [4]).columns
    assert (row.tokens, row.verifies, row.drafted, row.accepted) == (10, 2, 7, 6)
    assert row.tokens_per_verify == pytest.approx(4.0)
    assert row.acceptance_rate == pytest.approx(6 / 7)
    assert row.predicted_speedup == pytest.approx(9 / (3.0 + 2.5 + 1.0))  # decode tokens / c(5) + c(4) + c(1)
    assert row.measured_speedup is None
    positions = result.positions.sort("position")
    assert positions["reached"].to_list() == [2, 2, 2, 1]
    assert positions["accepted"].to_list() == [2, 2, 1, 1]


def test_the_draft_length_and_the_prompt_change_the_result(recordings):
    short = replay(recordings, Choice("lookup", 2, "fixed", "copy")).row()
    assert (short.verifies, short.accepted) == (3, 5)
    assert short.predicted_speedup == pytest.approx(9 / (3 * 2.0 + 1.0))  # three of c(3) = 2, one of c(1)
    novel = replay(recordings, Choice("lookup", 4, "fixed", "qa")).row()  # a category: its one prompt
    assert novel.verifies == 0 and novel.tokens_per_verify is None and novel.acceptance_rate is None
    assert novel.predicted_speedup == pytest.approx(1.0)
    both = replay(recordings, Choice("lookup", 4, "fixed", EVERY_PROMPT))
    assert both.prompts == ["copy", "novel"] and both.row().tokens == 14
    assert both.row().predicted_speedup == pytest.approx(12 / (6.5 + 3.0))


def test_a_grid_covers_every_policy_and_k_and_its_figures_pass_the_checks(recordings):
    table = grid(recordings, "lookup", "copy", [4, 1, 2], ["fixed", "adaptive", "auto"])
    assert table.select("policy", "k").rows() == [(p, k) for p in ("fixed", "adaptive", "auto") for k in (1, 2, 4)]
    fixed = table.filter(pl.col("policy") == "fixed").sort("k")
    assert fixed["verifies"].to_list() == [4, 3, 2]  # k = 1: 11, 13, 15 accepted, 10 rejected for 20
    assert table.filter(pl.col("policy") == "auto")["k"].to_list() == [1, 2, 4]
    assert best_predicted(table) == f"fixed k=4: {9 / 6.5:.2f}x"  # adaptive:4 ties it; the first listed is named
    plain_only = table.with_columns(pl.lit(0).alias("verifies"))
    assert best_predicted(plain_only) == "none (no choice verified a draft)"
    assert figure_problems(grid_figure(table, "m, lookup: 1 recorded output replayed")) == []
    for choice in (Choice("lookup", 4, "fixed", "copy"), Choice("suffix", 3, "adaptive", "novel")):
        assert figure_problems(positions_figure(replay(recordings, choice))) == []


def test_the_page_shows_the_numbers_and_the_coloured_output(recordings):
    result = replay(recordings, Choice("lookup", 4, "fixed"))
    table = choice_html(result, recordings)
    assert "fixed:4" in table and "4.00" in table and "not run by the sweep" in table
    text = coloured_outputs(result, recordings)
    assert text.count("verifications</b>") == 2 and "accepted draft token" in text
    assert 'title="token 11, step 1, draft"' in text and 'title="token 20, step 2, bonus"' in text


def test_choices_it_cannot_replay_are_refused(recordings):
    with pytest.raises(ValueError, match="only model-free drafters"):
        replay(recordings, Choice("mtp", 4, "fixed"))
    with pytest.raises(ValueError, match="policy must be one of"):
        replay(recordings, Choice("lookup", 4, "sometimes"))
    with pytest.raises(ValueError, match="integer >= 1"):
        replay(recordings, Choice("lookup", 0, "fixed"))
    with pytest.raises(ValueError, match="neither a recorded prompt's id nor a category"):
        replay(recordings, Choice("lookup", 4, "fixed", "nothing"))
    recordings.profile = None
    with pytest.raises(ValueError, match="no cost profile"):
        replay(recordings, Choice("lookup", 4, "auto"))
    assert replay(recordings, Choice("lookup", 4, "fixed")).predicted_speedup is None
    assert "auto" not in grid(recordings, "lookup", "", [2])["policy"].to_list()


def test_the_sweep_records_its_outputs_and_the_replay_matches_its_runs(tmp_path):
    tiny = build_tiny("llama", seed=5, scale=2.0)
    prompts = [Prompt("p0", "copy", "", [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]), Prompt("p1", "copy", "", [9, 3, 9, 3, 9])]
    result = sweep.run_sweep(
        tiny, None, prompts, drafters=["lookup"], policies=["fixed:3"], max_tokens=12, progress=False, warmup_tokens=0
    )
    recorded.record_sweep(tmp_path, "tiny", prompts, result, max_tokens=12)
    outputs = recorded.recorded_outputs(tmp_path)
    plain = result.runs.filter(pl.col("drafter") == "none")
    assert outputs["id"].to_list() == ["p0", "p1"] and outputs["prompt"].to_list()[1] == [9, 3, 9, 3, 9]
    assert [len(o) for o in outputs["output"].to_list()] == plain["tokens"].to_list()
    recordings = Recordings(outputs, "tiny", "exact", PROFILE, output_dir=tmp_path)
    spec = result.runs.filter(pl.col("drafter") == "lookup").sort("prompt")
    for row in spec.iter_rows(named=True):
        replayed = replay(recordings, Choice("lookup", 3, "fixed", row["prompt"])).row()
        assert (replayed.verifies, replayed.accepted) == (row["verifies"], row["accepted"])
        assert replayed.measured_speedup == pytest.approx(row["speedup"])
    every = replay(recordings, Choice("lookup", 3, "fixed"))
    assert every.measured_speedup == pytest.approx(spec["speedup"].mean())
    assert replay(recordings, Choice("lookup", 2, "fixed")).measured_speedup is None  # the sweep ran k = 3 only
    # recording again replaces the rows of the same model, prompt and length; other models' rows stay
    recorded.record_sweep(tmp_path, "tiny", prompts[:1], result, max_tokens=12)
    recorded.write_outputs(tmp_path, outputs.with_columns(pl.lit("other").alias("model")))
    again = recorded.recorded_outputs(tmp_path)
    kept = sorted(zip(again["model"], again["id"]))
    assert kept == [("other", "p0"), ("other", "p1"), ("tiny", "p0"), ("tiny", "p1")]


def test_the_widgets_replay_each_choice(recordings):
    import ipywidgets

    from specbench.report.explorer import LogExplorer

    app = LogExplorer(recordings, Choice("lookup", 4, "fixed", "copy"))
    assert isinstance(app.widget, ipywidgets.VBox)
    drawn = bytes(app.plot.value)
    assert drawn.startswith(b"\x89PNG")
    assert not any(isinstance(c, ipywidgets.Output) for c in _widgets(app.widget))  # see explorer.figure_png
    assert app.replay.row().verifies == 2 and "fixed:4" in app.table.value and "<span" in app.text.value
    app.k.value = 2
    assert app.replay.choice == Choice("lookup", 2, "fixed", "copy") and app.replay.row().verifies == 3
    assert bytes(app.plot.value).startswith(b"\x89PNG") and bytes(app.plot.value) != drawn  # redrawn for the new choice
    app.prompt.value = EVERY_PROMPT
    assert app.replay.prompts == ["copy", "novel"]
    app.drafter.value = "suffix"
    assert app.replay.log.records[1].drafter == "suffix"
    assert [v for _, v in app.prompt.options] == ["", "copy", "novel"]
    with pytest.raises(ValueError, match="neither a recorded prompt's id nor a category"):
        LogExplorer(recordings, Choice(prompt="nothing"))


def test_load_recordings_takes_this_models_longest_outputs_from_the_report(tmp_path):
    from specbench.report.explorer import load_recordings

    rows = [_row("a", "edit", [1, 2], [3, 4, 5, 6]), _row("a", "edit", [1, 2], [3, 4]), _row("b", "qa", [1], [2, 3])]
    frame = pl.DataFrame(rows, schema=recorded.OUTPUTS_SCHEMA)
    other = frame.with_columns(pl.lit("other").alias("model"))
    recorded.write_outputs(tmp_path, pl.concat([frame, other]))
    assert len(recorded.recorded_outputs(tmp_path)) == 6
    tiny = build_tiny("llama", seed=5, scale=2.0)
    recordings = load_recordings("m", tiny, None, tmp_path)
    assert recordings.outputs.select("id", "max_tokens").rows() == [("a", 4), ("b", 2)]
    assert recordings.verify == "exact" and recordings.profile is not None
    assert "2 plain greedy outputs of m (6 tokens, recorded by test)" in recordings.describe()
    assert replay(recordings, Choice("lookup", 2, "fixed")).prompts == ["a", "b"]


def _widgets(widget):
    """``widget`` and every widget inside it."""
    yield widget
    for child in getattr(widget, "children", ()):
        yield from _widgets(child)
