"""``manage.py anarchon run|jobs|history|instances|pause|resume|trigger|cancel|prune``
(``jobs add|apply|export|remove|next`` act on the definitions kept in the store).

The subcommands are the core ``anarchon`` command line's (:func:`anarchon_core.cli.
add_commands`): the same options, output and exit codes, with the project's scheduler
as the target and the project's store (``ANARCHON["BACKEND"]``) as the default
``--backend``. ``run`` adds what a Django process needs first: the system checks, a
refusal to start with unapplied migrations (on a ``django://`` store), and ``--reload``
for development.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from anarchon_core.cli import CliError, add_commands, exit_code
from anarchon_core.errors import AnarchonError

from ... import checks
from ..._scheduler import get_scheduler

COMMANDS = ("run", "jobs", "history", "instances", "pause", "resume", "trigger", "cancel", "prune")


class Command(BaseCommand):
    help = (
        "Run the project's anarchon scheduler, list its jobs, and inspect or operate on the "
        "store: " + " | ".join(COMMANDS) + "."
    )
    # `run` runs the checks itself; the other subcommands work even on a broken project.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(
            dest="subcommand", metavar="COMMAND", title="subcommands", required=True
        )
        made = add_commands(
            sub, COMMANDS, target="anarchon_django:scheduler", default_store="ANARCHON['BACKEND']"
        )
        made["run"].description = f"{made['run'].description}" + (
            ". It runs the system checks first and refuses to start with unapplied "
            "migrations on a django:// store."
        )
        made["run"].add_argument(
            "--reload",
            action="store_true",
            help="restart when Python files change (development only: Django's autoreloader)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options.setdefault("reload", False):
            from django.utils import autoreload

            autoreload.run_with_reloader(self._handle, **options)
        else:
            self._handle(**options)

    def _handle(self, **options: Any) -> None:
        name: str = options["subcommand"]
        if options["reload"]:
            from django.utils import autoreload

            autoreload.raise_last_exception()
        if name in ("run", "jobs"):
            # A jobs module that failed half-way would list a partial set: every problem
            # of the settings and the jobs modules stops the listing instead.
            self.check(tags=None if name == "run" else [checks.TAG], display_num_errors=False)
        if name != "run" and not options["backend"]:  # the project's store, not the default
            options["backend"] = get_scheduler().backend_url
        # The core prints to sys.stdout/stderr: send that to this command's streams.
        out = getattr(self.stdout, "_out", sys.stdout)
        err = getattr(self.stderr, "_out", sys.stderr)
        try:
            if name == "run":
                url = options["backend"] or get_scheduler().backend_url
                if url.startswith("django://"):
                    _check_migrations(url)
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = options["command"](argparse.Namespace(**options))
        except (CliError, AnarchonError) as exc:
            if options["traceback"] or options["debug"]:
                raise
            raise CommandError(f"anarchon {name}: {exc}", returncode=exit_code(exc)) from exc
        if code:
            raise CommandError(f"anarchon {name} exited with status {code}", returncode=code)


def _check_migrations(url: str) -> None:
    """Refuse to run on a django:// store whose database has unapplied migrations."""
    from django.db import connections
    from django.db.migrations.executor import MigrationExecutor

    from ...conf import alias_from_url

    alias = alias_from_url(url)
    if alias not in connections:
        raise CommandError(
            f"anarchon run: the store {url!r} names the database alias {alias!r}, which "
            f"is not in DATABASES",
            returncode=2,
        )
    connection = connections[alias]
    try:
        executor = MigrationExecutor(connection)
        plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    finally:
        connection.close()  # the scheduler opens its own; keep none idle here
    if plan:
        names = [f"{m.app_label}.{m.name}" for m, _ in plan]
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        raise CommandError(
            f"anarchon run: the database {alias!r} has {len(names)} unapplied "
            f"migration(s) ({shown}): run 'manage.py migrate' first",
            returncode=2,
        )
