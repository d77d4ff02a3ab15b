"""The subcommand registry: each module of ``specbench.cli`` registers its subcommands here."""

from __future__ import annotations

import argparse
from collections.abc import Callable

COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], Callable]]] = {}


def command(name: str, help: str):
    """Register ``configure(parser)`` as subcommand ``name``: it adds its arguments and returns ``run(args)``."""

    def wrap(configure: Callable[[argparse.ArgumentParser], Callable]):
        COMMANDS[name] = (help, configure)
        return configure

    return wrap


def names(text: str) -> list[str]:
    """The comma-separated items of a command-line value."""
    return [part.strip() for part in text.split(",") if part.strip()]


def add_model_argument(parser: argparse.ArgumentParser, synthetic: str | None = None) -> None:
    """``--model``, the embedded SmolLM2-135M by default; with ``synthetic`` (a note on such models, shown
    in the help) it also takes synthetic:NAME."""
    names = "short name, local folder or mlx-lm id"
    if synthetic is not None:
        names = f"short name, local folder, mlx-lm id, or synthetic:NAME ({synthetic})"
    parser.add_argument("--model", default="smollm2-135m", help=names)
