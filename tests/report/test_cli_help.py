"""The command line's version, help texts and the test session's home folder."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from specbench.cli import HelpFormatter, main
from specbench.cli.registry import COMMANDS
from specbench.common.files import home


def test_version_names_specbench_and_mlx(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("specbench ") and "mlx " in out and "mlx-lm " in out


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parsers = {}
    for name, (_, configure) in COMMANDS.items():
        parser = argparse.ArgumentParser(prog=f"specbench {name}", formatter_class=HelpFormatter)
        configure(parser)
        parsers[name] = parser
    return parsers


def test_every_option_is_documented_and_shows_its_default():
    for name, parser in _subparsers().items():
        text = " ".join(parser.format_help().split())
        for action in parser._actions:
            if not action.option_strings or action.dest == "help":
                continue
            assert action.help, f"specbench {name} {action.option_strings[0]} has no help text"
            unset = action.default is None or action.default is False or action.default in ("", [])
            if not unset and "(default" not in action.help:
                shown = f"(default: {action.default})"
                assert shown in text, f"specbench {name} {action.option_strings[0]}: help does not show {shown}"


def test_subcommand_help_prints_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "(default: 128)" in out and "(default: lookup)" in out and "(default: smollm2-135m)" in out
    assert "0 is greedy (default: 0.0)" in out


def test_the_session_uses_a_temporary_home_not_the_users_cache():
    assert home() != Path("~/.cache/specbench").expanduser()
    assert Path(os.environ["SPECBENCH_HOME"]).name.startswith("specbench-tests-")


def test_display_text_leaves_out_special_tokens():
    from conftest import word_tokenizer

    from specbench.report.render import display_text, token_pieces

    tokenizer = word_tokenizer()
    ids = tokenizer.encode("w10 w11", add_special_tokens=False) + [tokenizer.eos_token_id]
    assert "<eos>" in tokenizer.decode(ids)
    assert "<eos>" not in display_text(tokenizer, ids) and "w11" in display_text(tokenizer, ids)
    assert "<eos>" not in "".join(token_pieces(tokenizer, ids))
