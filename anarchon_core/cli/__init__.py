"""The ``anarchon`` command line: run a scheduler, inspect its jobs and the store's history.

Every subcommand that touches a store takes ``--backend URL`` (default
``$ANARCHON_BACKEND``, else the embedded ``sqlite:///anarchon.sqlite3``) and prints
URLs only through :func:`~anarchon_core.backends.mask_url`, so a password never
reaches a terminal or a CI log. Exit codes: 0 success, 1 the operation failed (an
unreachable store, a failed demo), 2 bad usage or configuration, 130 interrupted.
"""

from __future__ import annotations

from ._arguments import parse_time_ms
from ._commands import add_commands
from ._errors import CliError, exit_code
from ._main import build_parser, main
from ._target import load_scheduler

__all__ = [
    "CliError",
    "add_commands",
    "build_parser",
    "exit_code",
    "load_scheduler",
    "main",
    "parse_time_ms",
]
