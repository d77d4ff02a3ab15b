"""`specbench` command line: each subcommand parses, calls the library, prints.

Expected failures (bad arguments, missing or damaged files, OS errors) end as one line on stderr,
``specbench COMMAND: error: ...``, and exit code 2; ``--debug`` (or ``SPECBENCH_DEBUG=1``) raises
them instead, with the traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version
from typing import Any

from specbench.cli.registry import COMMANDS

#: What a user's mistake or the machine's state raises; anything else is a bug and keeps its traceback.
EXPECTED_ERRORS = (OSError, ValueError, TypeError)


class UsageError(Exception):
    """A command line argparse rejects, with the program (``specbench COMMAND``) it was given to."""

    def __init__(self, prog: str, message: str):
        super().__init__(message)
        self.prog = prog


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser that raises ``UsageError`` instead of printing the usage and exiting."""

    def error(self, message: str):
        raise UsageError(self.prog, f"{message} (see {self.prog} --help)")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help ends with its default (none for flags and options without one)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        unset = default is None or default is False or default is argparse.SUPPRESS or default in ("", [])
        if "%(default)" in text or "(default" in text or unset or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)"


def version_text() -> str:
    """``specbench X.Y.Z (mlx A, mlx-lm B)``: the installed versions."""

    def of(name: str) -> str:
        try:
            return package_version(name)
        except PackageNotFoundError:
            return "not installed"

    return f"specbench {of('specbench')} (mlx {of('mlx')}, mlx-lm {of('mlx-lm')})"


def _debug(args: argparse.Namespace | None) -> bool:
    return bool(getattr(args, "debug", False)) or os.environ.get("SPECBENCH_DEBUG", "") not in ("", "0")


def error_line(err: BaseException) -> str:
    """One line for an expected failure: an OS error as "what: file", others as their message."""
    text = str(err)
    if isinstance(err, OSError) and err.strerror:
        text = err.strerror if err.filename is None else f"{err.strerror}: {err.filename}"
    return " ".join(text.split()) or type(err).__name__


def _restart_with_optimized_blas() -> None:
    """Start this command again with an optimized BLAS preloaded for MLX's CPU matmuls
    (``specbench.common.blas``), where one is installed and not loaded yet; its children (notebook
    kernels, ranks) inherit it. ``SPECBENCH_BLAS=reference`` keeps MLX's own."""
    from specbench.common.blas import preload_environment

    try:
        env = preload_environment()
    except FileNotFoundError as err:
        print(f"specbench: warning: {err}; running on MLX's own BLAS", file=sys.stderr)
        return
    if env is not None:
        sys.stdout.flush()
        os.execve(sys.executable, sys.orig_argv, env)


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, Callable[[argparse.Namespace], Any]]]:
    """The command line's parser, and each command's runner by name."""
    parser = _Parser(
        prog="specbench", description="specbench: speculative decoding on MLX, measured", formatter_class=HelpFormatter
    )
    parser.add_argument("--version", action="version", version=version_text())
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error (also SPECBENCH_DEBUG=1)")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    runners = {}
    for name, (help_text, configure) in COMMANDS.items():
        # (argparse formats a subcommand's help with "%": a "95 %" in it is text, not a format)
        listed = help_text.replace("%", "%%")
        command_parser = sub.add_parser(name, help=listed, description=help_text, formatter_class=HelpFormatter)
        runners[name] = configure(command_parser)
    return parser, runners


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # the command line itself (tests and scripts pass their arguments)
        _restart_with_optimized_blas()
    parser, runners = build_parser()
    args = None
    try:
        args = parser.parse_args(sys.argv[1:] if argv is None else argv)
        prog = f"specbench {args.command}"
        with warnings.catch_warnings():
            if not _debug(args):
                warnings.showwarning = lambda message, *_, **__: print(f"{prog}: warning: {message}", file=sys.stderr)
            return int(runners[args.command](args) or 0)
    except (UsageError, KeyboardInterrupt, *EXPECTED_ERRORS) as err:
        if _debug(args):
            raise
        prog = getattr(err, "prog", None) or (f"specbench {args.command}" if args is not None else "specbench")
        if isinstance(err, KeyboardInterrupt):
            print(f"{prog}: interrupted", file=sys.stderr)
            return 130
        print(f"{prog}: error: {error_line(err)}", file=sys.stderr)
        return 2
