"""``manage.py anarchon run|jobs|history|instances|pause|resume|trigger|cancel|prune``.

The subcommands are the core ``anarchon`` command line's (``anarchon_core.cli``): the
same options, output and exit codes, with the project's scheduler as the target and
the project's store (``ANARCHON["BACKEND"]``) as the default ``--backend``. ``run``
adds what a Django process needs first: the system checks, a refusal to start with
unapplied migrations (on a ``django://`` store), and ``--reload`` for development.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any, cast

from django.core.management.base import BaseCommand, CommandError, CommandParser

from anarchon_core.cli import CliError, build_parser
from anarchon_core.errors import AnarchonError, ConfigurationError

from ... import checks
from ..._scheduler import get_scheduler

#: The core subcommands offered as they are (their parsers are reused as parents).
STORE_COMMANDS = ("history", "instances", "pause", "resume", "trigger", "cancel", "prune")
TARGET = "anarchon_django:scheduler"

CoreCommand = Callable[[argparse.Namespace], int]


def _milliseconds(text: str) -> int:
    """``--grace-ms``: an integer >= 0."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not valid: give an integer >= 0 (ms)")
    return value


def _core_subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise RuntimeError("anarchon_core.cli.build_parser() has no subcommands")  # pragma: no cover


class Command(BaseCommand):
    help = (
        "Run the project's anarchon scheduler, list its jobs, and inspect or operate on the "
        "store: run | jobs | history | instances | pause | resume | trigger | cancel | prune."
    )
    # `run` runs the checks itself; the other subcommands work even on a broken project.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        core = _core_subparsers()
        sub = parser.add_subparsers(
            dest="subcommand", metavar="COMMAND", title="subcommands", required=True
        )

        run = sub.add_parser(
            "run",
            help="run the scheduler in the foreground until SIGINT/SIGTERM (hand-over on stop)",
            description="Run the project's scheduler until SIGINT or SIGTERM, then stop "
            "with hand-over. Runs the system checks first and refuses to start with "
            "unapplied migrations on a django:// store.",
        )
        run.add_argument(
            "--backend", metavar="URL", help="replace the store (default: ANARCHON['BACKEND'])"
        )
        run.add_argument("--instance-id", metavar="ID", help="this process's id in the history")
        run.add_argument(
            "--grace-ms",
            type=_milliseconds,
            metavar="N",
            help="on stop, wait up to N ms for running handlers before handing them over "
            "(default: ANARCHON['GRACE_MS'], 10000)",
        )
        run.add_argument(
            "--log-level",
            default="INFO",
            type=str.upper,
            choices=["DEBUG", "INFO", "WARNING", "ERROR"],
            help="logging level of the stderr log (default: INFO)",
        )
        run.add_argument(
            "--reload",
            action="store_true",
            help="restart when Python files change (development only: Django's autoreloader)",
        )

        jobs = sub.add_parser(
            "jobs",
            help="list the project's jobs and their next slots",
            description="List the jobs of every jobs.py with their schedules, zones, store "
            "names and next slots (nothing is read from the store).",
        )
        jobs.add_argument("--count", type=int, default=5, metavar="N", help="next slots shown (5)")
        jobs.add_argument("--json", action="store_true", help="one JSON object per job and line")

        for name in STORE_COMMANDS:
            parent = core[name]
            sub.add_parser(
                name,
                parents=[cast(CommandParser, parent)],
                add_help=False,
                help=parent.description,
                description=f"{parent.description} (default store: ANARCHON['BACKEND'])",
            )

    def handle(self, *args: Any, **options: Any) -> None:
        subcommand: str = options["subcommand"]
        if subcommand == "run":
            self._run(options)
            return
        namespace = argparse.Namespace(**options)
        namespace.name = subcommand
        if subcommand == "jobs":
            # A jobs module that failed half-way would list a partial set: every problem
            # of the settings and the jobs modules stops the listing instead.
            self.check(tags=[checks.TAG], display_num_errors=False)
            namespace.target, namespace.backend = TARGET, None
            command: CoreCommand = _core_subparsers()["jobs"].get_default("command")
        else:
            command = options["command"]
            if not options.get("backend"):
                namespace.backend = get_scheduler().backend_url
        self._call(subcommand, command, namespace, options)

    def _call(
        self,
        subcommand: str,
        command: CoreCommand,
        namespace: argparse.Namespace,
        options: dict[str, Any],
    ) -> None:
        try:
            with self._output():
                code = command(namespace)
        except CliError as exc:
            if options.get("traceback") or options.get("debug"):
                raise
            raise CommandError(f"anarchon {subcommand}: {exc}", returncode=exc.code) from exc
        except AnarchonError as exc:
            if options.get("traceback") or options.get("debug"):
                raise
            code = 2 if isinstance(exc, ConfigurationError) else 1
            raise CommandError(f"anarchon {subcommand}: {exc}", returncode=code) from exc
        if code:
            raise CommandError(f"anarchon {subcommand} exited with status {code}", returncode=code)

    @contextlib.contextmanager
    def _output(self) -> Iterator[None]:
        """The core prints to sys.stdout/stderr: send that to this command's streams."""
        out = getattr(self.stdout, "_out", sys.stdout)
        err = getattr(self.stderr, "_out", sys.stderr)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            yield

    # -- run --------------------------------------------------------------------------
    def _run(self, options: dict[str, Any]) -> None:
        if options["reload"]:
            from django.utils import autoreload

            autoreload.run_with_reloader(self._run_inner, options)
        else:
            self._run_inner(options)

    def _run_inner(self, options: dict[str, Any]) -> None:
        if options["reload"]:
            from django.utils import autoreload

            autoreload.raise_last_exception()
        self.check(display_num_errors=False)
        scheduler = get_scheduler()
        url = options.get("backend") or scheduler.backend_url
        if url.startswith("django://"):
            self._check_migrations(url)
        namespace = argparse.Namespace(
            name="run",
            target=TARGET,
            backend=options.get("backend"),
            instance_id=options.get("instance_id"),
            grace_ms=options.get("grace_ms"),
            log_level=options["log_level"],
            debug=False,
        )
        command: CoreCommand = _core_subparsers()["run"].get_default("command")
        self._call("run", command, namespace, options)

    def _check_migrations(self, url: str) -> None:
        """Refuse to run on a django:// store whose database has unapplied migrations."""
        from django.db import DEFAULT_DB_ALIAS, connections
        from django.db.migrations.executor import MigrationExecutor

        from ...conf import AnarchonSettings

        alias = AnarchonSettings(backend=url).django_alias or DEFAULT_DB_ALIAS
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
