"""The type checker's baseline: more errors than the baseline fail lint, fewer say to lower it, --update only lowers."""

from __future__ import annotations

import sys

import pytest

from scripts import typecheck


@pytest.fixture
def baseline(tmp_path, monkeypatch):
    path = tmp_path / "mypy-baseline"
    path.write_text("420\n")
    monkeypatch.setattr(typecheck, "BASELINE", path)
    return path


def _mypy_finds(monkeypatch, errors: int) -> None:
    report = f"specbench/x.py:1: error: no  [misc]\nFound {errors} errors in 3 files (checked 9 source files)\n"
    monkeypatch.setattr(typecheck.api, "run", lambda args: (report, "", 1))


CASES = [(421, 1, "a change added 1"), (420, 0, "baseline 420"), (7, 0, "lower")]


@pytest.mark.parametrize("errors, code, said", CASES)
def test_lint_fails_over_the_baseline_only(baseline, monkeypatch, capsys, errors, code, said):
    _mypy_finds(monkeypatch, errors)
    monkeypatch.setattr(sys, "argv", ["typecheck"])
    assert typecheck.main() == code
    assert said in capsys.readouterr().out


def test_the_baseline_is_only_ever_lowered(baseline, monkeypatch):
    _mypy_finds(monkeypatch, 400)
    monkeypatch.setattr(sys, "argv", ["typecheck", "--update"])
    assert typecheck.main() == 0 and baseline.read_text().strip() == "400"
    _mypy_finds(monkeypatch, 401)
    with pytest.raises(SystemExit, match="over the baseline 400"):
        typecheck.main()
