"""`specbench` command line: each subcommand parses, calls the library, prints."""

from __future__ import annotations

import argparse
import sys

from specbench.cli import bench, decode, measure, mtp, report  # noqa: F401  (each registers its subcommands)
from specbench.cli.registry import COMMANDS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="specbench", description="specbench: speculative decoding on MLX, measured")
    sub = parser.add_subparsers(dest="command", required=True)
    runners = {}
    for name, (help_text, configure) in COMMANDS.items():
        runners[name] = configure(sub.add_parser(name, help=help_text, description=help_text))
    args = parser.parse_args(argv)
    try:
        return int(runners[args.command](args) or 0)
    except (ValueError, FileNotFoundError) as err:
        print(f"specbench {args.command}: error: {err}", file=sys.stderr)
        return 2
