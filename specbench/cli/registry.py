"""The subcommand registry: each module of ``specbench.cli`` registers its subcommands here; and the command line's
checks of drafter names and verify modes, read from their registries."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from typing import Any

from specbench.common.registry import Registry

#: Every module of ``specbench.cli`` is imported before the first read: a new subcommand is one module.
COMMANDS: Registry[tuple[str, Callable[[argparse.ArgumentParser], Callable]]] = Registry("subcommand", "specbench.cli")


def command(name: str, help: str):
    """Register ``configure(parser)`` as subcommand ``name``: it adds its arguments and returns ``run(args)``."""

    def wrap(configure: Callable[[argparse.ArgumentParser], Callable]):
        COMMANDS.add(name, (help, configure))
        return configure

    return wrap


def draw_figure(module: str, function: str, *args: Any) -> None:
    """``specbench.report.figures.<module>.<function>(*args)``, or a line saying how to get matplotlib."""
    try:
        draw = getattr(importlib.import_module(f"specbench.report.figures.{module}"), function)
    except ImportError:
        print("no figure drawn: install the report extra, pip install 'specbench[report]'")
    else:
        draw(*args)


def names(text: str) -> list[str]:
    """The comma-separated items of a command-line value."""
    return [part.strip() for part in text.split(",") if part.strip()]


def integers(text: str, option: str, positive: bool = False, maximum: int | None = None) -> list[int]:
    """The integers of a comma list (none for an empty one), with ``positive`` each >= 1 (and <= ``maximum``); a
    ValueError naming ``option`` otherwise."""
    try:
        values = [int(part) for part in names(text)]
    except ValueError:
        raise ValueError(f"{option} takes a comma list of integers, got {text!r}") from None
    if positive and any(v < 1 for v in values):
        raise ValueError(f"{option} takes integers >= 1, got {text!r}")
    if maximum is not None and any(v > maximum for v in values):
        raise ValueError(f"{option} takes widths up to {maximum}, got {text!r}")
    return values


def drafter_names(text: str, option: str = "--drafters", required: bool = False) -> list[str]:
    """The drafter names of a comma list, checked before any model is loaded (``required``: at least one)."""
    from specbench.drafters import drafter_choices, split_drafter_name

    chosen = names(text)
    if required and not chosen:
        raise ValueError(f"{option}: give at least one drafter name ({drafter_choices()})")
    for name in chosen:
        try:
            split_drafter_name(name)  # an unknown name, a parameter where none is taken, or not a positive integer
        except ValueError as err:
            raise ValueError(f"{option}: {err}") from None
    return chosen


def verify_modes(text: str | None, option: str = "--verify") -> list[str]:
    """The verify modes of a comma list (none for None), checked before any model is loaded."""
    from specbench.core.verify import VERIFY_MODES

    modes = names(text) if text is not None else []
    unknown = [m for m in modes if m not in VERIFY_MODES]
    if unknown or (text is not None and not modes):
        raise ValueError(f"{option} takes a comma list of {', '.join(VERIFY_MODES)}, got {text!r}")
    return modes


def add_model_argument(parser: argparse.ArgumentParser, synthetic: str | None = None, shard: bool = True) -> None:
    """``--model``, the embedded SmolLM2-135M by default; with ``synthetic`` (a note on such models, shown
    in the help) it also takes synthetic:NAME, and ``--layers``; with ``shard``, ``--shard`` too."""
    names = "short name, local folder or mlx-lm id"
    if synthetic is not None:
        names = f"short name, local folder, mlx-lm id, or synthetic:NAME ({synthetic})"
    parser.add_argument("--model", default="smollm2-135m", help=names)
    if synthetic is not None:
        parser.add_argument("--layers", type=int, default=None, help="synthetic models: number of layers")
    if shard:
        parser.add_argument(
            "--shard",
            action="store_true",
            help="split the model over the ranks of mlx.launch (mlx-lm tensor parallelism; rank 0 drafts and writes)",
        )


def reasoning_argument(parser: argparse.ArgumentParser) -> None:
    """``--reasoning keep|drop``: the logs' reasoning replayed as the model's text, or left out."""
    from specbench.inputs.importers import REASONING

    parser.add_argument(
        "--reasoning",
        choices=REASONING,
        default="keep",
        help="a log's reasoning (thinking models): keep it as the model's generated text, in the chat template's "
        "form, or drop it (default: keep)",
    )


def prompt_selection(parser: argparse.ArgumentParser, note: str = "", traces: bool = False) -> None:
    """``--categories`` and ``--limit``: which prompts run (``note``: for whom, e.g. "for two models: ";
    ``traces``: --limit counts traces too)."""
    parser.add_argument(
        "--categories",
        default=None,
        help=f"{note}comma list of categories to run (default: all; qa,translation on a CPU with the bundled prompts)",
    )
    per = "per category, or N traces" if traces else "per category"
    parser.add_argument(
        "--limit", type=int, default=None, help=f"{note}at most N questions {per} (default: all; 3 on a CPU)"
    )


#: ``bench``'s defaults for what is left unset, by device: a GPU runs every bundled question at 128 tokens; a CPU,
#: where a float32 step of the embedded model takes ~0.1-0.2 s, runs the two shortest categories' first 3 questions
#: at 32 tokens: 6 prompts, the fewest an interval over prompts is computed from. A user's own question file is run
#: whole (the limit and categories apply to the bundled prompts alone).
BENCH_DEFAULTS = {
    "gpu": {"max_tokens": 128, "limit": None, "categories": None},
    "cpu": {"max_tokens": 32, "limit": 3, "categories": "qa,translation"},
}


def device_defaults(args: argparse.Namespace, defaults: dict[str, dict[str, object]] = BENCH_DEFAULTS) -> dict:
    """Set the options of ``args`` left unset (None) to the default device's values (``defaults["cpu"]`` on a
    CPU, else ``defaults["gpu"]``; categories only for the bundled prompts); returns those it set."""
    from specbench.common.identity import device_name

    device = "cpu" if device_name().startswith("cpu") else "gpu"
    bundled = getattr(args, "prompts", None) == "bundled"
    own = hasattr(args, "prompts") and not bundled  # a user's question file (run whole)
    chosen = {}
    for name, value in defaults[device].items():
        skip = (name == "categories" and not bundled) or (name == "limit" and own)
        if getattr(args, name, None) is None and value is not None and not skip:
            setattr(args, name, value)
            chosen[name] = value
    return chosen
