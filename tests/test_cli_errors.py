"""The command line on bad input: one line on stderr, a non-zero exit, and no model work done first."""

from __future__ import annotations

import json
import os
from pathlib import Path

import polars as pl
import pytest

import specbench.models.load as model_loading
from specbench.cli import main
from specbench.common.identity import device_name, model_key, versions
from specbench.core.log import StepLog
from specbench.cost import profile_path
from specbench.exact import calibration as exact_calibration

SYNTHETIC = "synthetic:qwen3-8b-tiny"


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SPECBENCH_DEBUG", raising=False)
    return tmp_path / "home"


@pytest.fixture
def no_model(monkeypatch):
    """Fail the test if the command loads a model."""

    def load(*args, **kwargs):
        pytest.fail(f"a model was loaded: {args}")

    monkeypatch.setattr(model_loading, "load", load)


def one_error_line(err: str, command: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"specbench{' ' + command if command else ''}: error: "), err
    assert "Traceback" not in err
    return lines[0]


COMMANDS = {"generate", "check-exact", "profile", "bench", "train-mtp", "report", "ab", "compare"}

# (arguments, with {tmp} the test's folder) -> (exit code, text the error line holds)
CASES = {
    "no command": ([], "required: command"),
    "unknown command": (["nope"], "invalid choice: 'nope'"),
    "missing argument": (["generate"], "required: --prompt"),
    "not a number": (["generate", "--prompt", "x", "--max-tokens", "many"], "invalid int value: 'many'"),
    "bad choice": (["generate", "--prompt", "x", "--verify", "slow"], "invalid choice: 'slow'"),
    "unknown acceptance rule": (
        ["generate", "--prompt", "x", "--acceptance-rule", "lenient"],
        "invalid choice: 'lenient'",
    ),
    "a rule that cannot sample by position": (
        [
            "generate",
            "--prompt",
            "x",
            "--temp",
            "1",
            "--seed",
            "0",
            "--sample-by-position",
            "--acceptance-rule",
            "typical",
        ],
        "acceptance 'typical' cannot give plain sampling's tokens",
    ),
    "unknown policy": (["generate", "--prompt", "x", "--policy", "sometimes"], "unknown policy 'sometimes'"),
    "unknown drafter": (["generate", "--prompt", "x", "--drafter", "psychic"], "unknown drafter 'psychic'"),
    "sampling by position without a seed": (
        ["generate", "--prompt", "x", "--temp", "1", "--sample-by-position"],
        "sample_by_position keys each token's draw by (seed, position): give a seed",
    ),
    "audit below 0": (["generate", "--prompt", "x", "--audit", "-0.1"], "audit must be a rate in [0, 1]"),
    "audit above 1": (["generate", "--prompt", "x", "--audit", "1.5"], "audit must be a rate in [0, 1]"),
    "audit of fast verification": (
        ["generate", "--prompt", "x", "--audit", "0.5", "--verify", "fast"],
        "set verify='exact' or audit=0",
    ),
    "log is a folder": (["generate", "--prompt", "x", "--log", "{tmp}"], "--log: {tmp} is a folder"),
    "log under a file": (
        ["generate", "--prompt", "x", "--log", "{tmp}/file.txt/log.parquet"],
        "--log: cannot write to the folder {tmp}/file.txt",
    ),
    "check-exact out is a folder": (["check-exact", "--model", SYNTHETIC, "--out", "{tmp}"], "is a folder"),
    "check-exact no prompts": (
        ["check-exact", "--model", SYNTHETIC, "--num-prompts", "0"],
        "--num-prompts must be >= 1",
    ),
    "check-exact acceptance": (["check-exact", "--acceptance", "1.5"], "--acceptance must be in [0, 1]"),
    "check-exact draft lengths": (["check-exact", "--k", "2,x"], "--k takes a comma list of integers"),
    "check-exact verify": (["check-exact", "--verify", "exact,slow"], "--verify takes a comma list"),
    "profile verify": (["profile", "--model", SYNTHETIC, "--verify", "slow"], "--verify takes a comma list"),
    "profile widths": (["profile", "--model", SYNTHETIC, "--widths", "1"], "--widths must be in [2, 256]"),
    "profile plot is a file": (
        ["profile", "--model", SYNTHETIC, "--plot", "{tmp}/file.txt"],
        "is a file, not a folder",
    ),
    "bench prompts missing": (["bench", "prompts", "{tmp}/none.jsonl"], "none.jsonl"),
    "bench trace missing": (["bench", "trace", "{tmp}/none.jsonl"], "no trace file at {tmp}/none.jsonl"),
    "bench trace is a folder": (["bench", "trace", "{tmp}"], "it is a folder"),
    "bench no turns": (["bench", "trace", "{tmp}/file.txt", "--turns", "0"], "--turns must be >= 1, got 0"),
    "bench out is a file": (["bench", "prompts", "bundled", "--out", "{tmp}/file.txt"], "is a file, not a folder"),
    "bench two verify modes for a trace": (
        ["bench", "trace", "{tmp}/file.txt", "--verify", "exact,fast"],
        "one --verify mode",
    ),
    "train-mtp out is a file": (["train-mtp", "--out", "{tmp}/file.txt"], "is a file, not a folder"),
    "train-mtp no steps": (["train-mtp", "--out", "{tmp}/mtp", "--steps", "0"], "--steps must be > 0, got 0"),
    "train-mtp negative seq-len": (["train-mtp", "--out", "{tmp}/mtp", "--seq-len", "-1"], "--seq-len must be > 0"),
    "bench no drafters": (["bench", "prompts", "bundled", "--drafters", ""], "give at least one drafter name"),
    "profile components too wide": (
        ["profile", "--model", SYNTHETIC, "--components", "1,100000"],
        "--components takes widths up to 256",
    ),
    "profile widths too wide": (
        ["profile", "--model", "synthetic:qwen3-8b-tiny", "--widths", "100000"],
        "--widths must be in [2, 256]",
    ),
    "report out is a file": (["report", "--out", "{tmp}/file.txt"], "is a file, not a folder"),
    "draft length beyond the bound": (
        ["generate", "--prompt", "x", "--policy", "fixed:100000"],
        "over the longest draft specbench verifies (128 tokens)",
    ),
    "bench draft length beyond the bound": (
        ["bench", "prompts", "bundled", "--policies", "fixed:1000"],
        "over the longest draft specbench verifies",
    ),
    "vllm draft length beyond the bound": (
        ["generate", "--prompt", "x", "--policy", "vllm:1=1000"],
        "draft length 1000 is over the longest draft specbench verifies (128 tokens)",
    ),
    "sglang tier beyond the bound": (
        ["generate", "--prompt", "x", "--policy", "sglang:1,3,1000"],
        "an SGLang tier must be an integer from 0 to 128, got 1000",
    ),
    "ab plain under a policy": (["ab", "--b", "plain/fixed:4"], "--b 'plain/fixed:4': plain decoding takes no policy"),
    "ab policy without a drafter": (["ab", "--b", "/auto"], "--b '/auto' names no drafter: give plain, a drafter"),
    "ab drafter past the bound": (["ab", "--a", "lookup/fixed:1000"], "--a 'lookup/fixed:1000': draft length 1000"),
    "prompt that is not text": (["generate", "--prompt", "caf\udce9"], "--prompt cannot be tokenized: character 3"),
    "question file not UTF-8": (["bench", "prompts", "{tmp}/latin1.jsonl"], "latin1.jsonl:1: not UTF-8 text"),
    "question with a lone surrogate": (["bench", "prompts", "{tmp}/surrogate.jsonl"], "surrogate.jsonl:1: a turn"),
    "compare an unknown drafter": (["compare", "smollm2-135m", "{tmp}/noweights", "--drafter", "psychic"], "psychic"),
    "compare a folder without weights": (["compare", "smollm2-135m", "{tmp}/noweights"], "noweights has config.json"),
    "compare two drafters": (["compare", "a", "b", "--drafter", "lookup,suffix"], "--drafter takes one drafter"),
    "report of an unknown model": (
        ["report", "--model", "synthetic:nope", "--out", "{tmp}/r"],
        "unknown synthetic model 'synthetic:nope'",
    ),
    "report of a folder without weights": (
        ["report", "--model", "{tmp}/noweights", "--out", "{tmp}/r"],
        "noweights has config.json but no weights (*.safetensors)",
    ),
    "report parameter of the wrong type": (
        ["report", "--profile", "quick", "-p", "break_even.widths=many", "--out", "{tmp}/r"],
        "widths",
    ),
    "report model parameter unknown": (
        ["report", "--profile", "quick", "-p", "quickstart.model=/nowhere/model", "--out", "{tmp}/r"],
        "Model '/nowhere/model' not found",
    ),
}


@pytest.mark.parametrize("args, expected", list(CASES.values()), ids=list(CASES))
def test_a_bad_command_line_is_one_error_line_before_any_model_work(args, expected, tmp_path, capsys, no_model):
    (tmp_path / "file.txt").write_text("x")
    (tmp_path / "latin1.jsonl").write_bytes('{"question_id": 1, "category": "qa", "turns": ["café"]}'.encode("latin-1"))
    (tmp_path / "surrogate.jsonl").write_text('{"question_id": 1, "category": "qa", "turns": ["caf\\udce9"]}')
    (tmp_path / "noweights").mkdir()
    (tmp_path / "noweights" / "config.json").write_text('{"model_type": "llama"}')
    argv = [a.replace("{tmp}", str(tmp_path)) for a in args]
    assert main(argv) == 2
    captured = capsys.readouterr()
    command = argv[0] if argv and argv[0] in COMMANDS else ""
    line = one_error_line(captured.err, command)
    assert expected.replace("{tmp}", str(tmp_path)) in line
    assert captured.out == ""
    assert not (tmp_path / "r").exists()  # nothing written half


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_an_unwritable_log_folder_is_an_error_before_loading(tmp_path, capsys, no_model):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        assert main(["generate", "--prompt", "x", "--log", str(folder / "log.parquet")]) == 2
    finally:
        folder.chmod(0o700)
    assert f"cannot write to the folder {folder}" in one_error_line(capsys.readouterr().err, "generate")


@pytest.mark.parametrize(
    "error, expected",
    [
        (PermissionError(13, "Permission denied", "/models/x"), "Permission denied: /models/x"),
        (IsADirectoryError(21, "Is a directory", "/models/x"), "Is a directory: /models/x"),
        (FileNotFoundError("no model at /models/x"), "no model at /models/x"),
        (ValueError("a message\nover two lines"), "a message over two lines"),
    ],
)
def test_os_and_value_errors_of_a_command_are_one_line(error, expected, monkeypatch, capsys):
    def load(*args, **kwargs):
        raise error

    monkeypatch.setattr(model_loading, "load", load)
    assert main(["check-exact", "--model", "somewhere"]) == 2
    assert one_error_line(capsys.readouterr().err, "check-exact") == f"specbench check-exact: error: {expected}"


def test_debug_raises_with_the_traceback(tmp_path, monkeypatch, no_model):
    with pytest.raises(ValueError, match="is a folder"):
        main(["--debug", "generate", "--prompt", "x", "--log", str(tmp_path)])
    monkeypatch.setenv("SPECBENCH_DEBUG", "1")
    with pytest.raises(ValueError, match="unknown policy"):
        main(["generate", "--prompt", "x", "--policy", "sometimes"])


def test_output_folders_are_made_before_the_work(tmp_path, monkeypatch, capsys):
    """The folder of an output path exists before the model is loaded."""
    out = tmp_path / "a" / "b" / "rows.parquet"

    def load(*args, **kwargs):
        assert out.parent.is_dir()
        raise OSError("stop here")

    monkeypatch.setattr(model_loading, "load", load)
    assert main(["check-exact", "--model", SYNTHETIC, "--out", str(out)]) == 2
    assert "stop here" in one_error_line(capsys.readouterr().err, "check-exact")


# -- damaged cache files are moved aside and made anew -------------------------------------------


def test_profile_over_a_damaged_stored_profile(home, capsys):
    model, _ = model_loading.load(SYNTHETIC)
    path = profile_path(model_key(model), device_name(), versions())
    path.parent.mkdir(parents=True)
    path.write_text('{"model": "x",\n "costs": ')
    args = ["profile", "--model", SYNTHETIC, "--widths", "2", "--repeats", "1", "--offset", "8", "--verify", "fast"]
    assert main(args) == 0
    captured = capsys.readouterr()
    assert f"specbench profile: warning: the cost profile {path} is damaged" in captured.err
    assert "Traceback" not in captured.err and f"profile: {path}" in captured.out
    assert json.loads(path.read_text())["model"] == model_key(model)  # the new profile
    (aside,) = path.parent.glob(f"{path.name}.damaged-*")
    assert aside.read_text().startswith('{"model": "x"')


def test_check_exact_over_a_damaged_stored_calibration(home, capsys):
    model, _ = model_loading.load(SYNTHETIC)
    exact_calibration._calibrations.clear()
    path = home / "exact" / f"{exact_calibration.calibration_key(model)}.json"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\x00\xff garbage")
    args = ["check-exact", "--model", SYNTHETIC, "--num-prompts", "1", "--max-tokens", "6", "--verify", "exact"]
    try:
        assert main(args) == 0
    finally:
        exact_calibration._calibrations.clear()
    captured = capsys.readouterr()
    assert f"specbench check-exact: warning: the exact-mode calibration {path} is damaged" in captured.err
    assert "1/1 prompts equal" in captured.out
    assert json.loads(path.read_text())["widths"]  # calibrated anew
    assert [p.name.split(".damaged-")[0] for p in path.parent.glob("*.damaged-*")] == [path.name]


def test_a_damaged_step_log_names_the_file(tmp_path):
    path = tmp_path / "log.parquet"
    path.write_text("not parquet")
    with pytest.raises(ValueError, match=f"{path} is not a readable step log"):
        StepLog.load(path)
    with pytest.raises(IsADirectoryError, match="is a folder"):
        StepLog.load(tmp_path)
    with pytest.raises(FileNotFoundError, match="no step log"):
        StepLog.load(tmp_path / "none.parquet")
    pl.DataFrame({"x": [1]}).write_parquet(tmp_path / "other.parquet")
    with pytest.raises(ValueError, match="is not a step log: it has no step, kind, emitted column"):
        StepLog.load(tmp_path / "other.parquet")
    assert Path(path).read_text() == "not parquet"  # left as it was


def _command_paths(parser, path=()):
    """Every parser path of the command line: (), ("bench",), ("bench", "prompts"), ..."""
    import argparse

    yield path
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _command_paths(sub, (*path, name))


def test_help_of_every_command_exits_zero(capsys):
    from specbench.cli import build_parser

    paths = list(_command_paths(build_parser()[0]))
    assert len(paths) > 10 and ("ab",) in paths
    for path in paths:
        for flag in ("--help", "-h"):
            with pytest.raises(SystemExit) as done:
                main([*path, flag])
            assert done.value.code == 0, path
            out = capsys.readouterr().out
            assert out.startswith("usage: specbench"), (path, out[:200])


def test_a_bare_command_line_is_one_error_line(capsys):
    assert main([]) == 2
    err = capsys.readouterr().err
    assert one_error_line(err, "").endswith("(see specbench --help)")
