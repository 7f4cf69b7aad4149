"""The ``anarchon`` entry point: parse the arguments, run one subcommand, and report a
failure in one line with its exit code."""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Callable

from .. import __version__
from ..errors import AnarchonError
from ._commands import add_commands
from ._errors import CliError, exit_code

__all__ = ["build_parser", "main"]


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit code instead of exiting (tests call it)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits on --help and on usage errors
        return exc.code if isinstance(exc.code, int) else 2
    command: Callable[[argparse.Namespace], int] = args.command
    try:
        return command(args)
    except (CliError, AnarchonError) as exc:
        if args.debug:
            traceback.print_exc()
        print(f"anarchon {args.name}: {exc}", file=sys.stderr)
        return exit_code(exc)
    except KeyboardInterrupt:
        print(f"anarchon {args.name}: interrupted", file=sys.stderr)
        return 130


def build_parser() -> argparse.ArgumentParser:
    """The parser of every subcommand (exposed for the docs and the tests)."""
    parser = argparse.ArgumentParser(
        prog="anarchon",
        description="A leaderless distributed job scheduler: run it, inspect jobs and history.",
    )
    parser.add_argument("--version", action="version", version=f"anarchon {__version__}")
    add_commands(parser.add_subparsers(title="commands", metavar="COMMAND", required=True))
    return parser
