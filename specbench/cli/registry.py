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


def drafter_names(text: str, option: str = "--drafters", required: bool = False) -> list[str]:
    """The drafter names of a comma list, checked before any model is loaded (``required``: at least one)."""
    from specbench.drafters import DRAFTER_NAMES, is_drafter_name

    chosen = names(text)
    if required and not chosen:
        raise ValueError(f"{option}: give at least one drafter name ({', '.join(DRAFTER_NAMES)})")
    unknown = [n for n in chosen if not is_drafter_name(n)]
    if unknown:
        what = "drafters" if option.endswith("s") else "drafter"
        raise ValueError(
            f"{option}: unknown {what} {', '.join(map(repr, unknown))}: choose from {', '.join(DRAFTER_NAMES)}"
        )
    return chosen


def verify_modes(text: str | None, option: str = "--verify") -> list[str]:
    """The verify modes of a comma list (none for None), checked before any model is loaded."""
    from specbench.core.options import VERIFY_MODES

    modes = names(text) if text is not None else []
    unknown = [m for m in modes if m not in VERIFY_MODES]
    if unknown or (text is not None and not modes):
        raise ValueError(f"{option} takes a comma list of {', '.join(VERIFY_MODES)}, got {text!r}")
    return modes


def add_model_argument(parser: argparse.ArgumentParser, synthetic: str | None = None, shard: bool = True) -> None:
    """``--model``, the embedded SmolLM2-135M by default; with ``synthetic`` (a note on such models, shown
    in the help) it also takes synthetic:NAME; with ``shard``, ``--shard`` too."""
    names = "short name, local folder or mlx-lm id"
    if synthetic is not None:
        names = f"short name, local folder, mlx-lm id, or synthetic:NAME ({synthetic})"
    parser.add_argument("--model", default="smollm2-135m", help=names)
    if shard:
        parser.add_argument(
            "--shard",
            action="store_true",
            help="split the model over the ranks of mlx.launch (mlx-lm tensor parallelism; rank 0 drafts and writes)",
        )
