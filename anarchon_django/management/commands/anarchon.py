"""``manage.py anarchon run|jobs|history|instances|pause|resume|trigger|cancel|prune``
(``jobs add|apply|export|remove|next`` act on the definitions kept in the store), and
``import-celery-beat``, which makes django-celery-beat's ``PeriodicTask`` rows stored
definitions (:mod:`anarchon_django.celery_beat`).

The subcommands are the core ``anarchon`` command line's (:func:`anarchon_core.cli.
add_commands`): the same options, output and exit codes, with the project's scheduler
as the target and the project's store (``ANARCHON["BACKEND"]``) as the default
``--backend``. ``run`` adds what a Django process needs first: the system checks, a
refusal to start with unapplied migrations (on a ``django://`` store), and ``--reload``
for development.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import sys
import zoneinfo
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from anarchon_core.backend import Backend, wall_clock_ms
from anarchon_core.backends import backend_from_url, mask_url
from anarchon_core.cli import CliError, add_commands, exit_code
from anarchon_core.errors import AnarchonError, ConfigurationError
from anarchon_core.names import validate_namespace

from ... import checks
from ..._scheduler import get_scheduler

COMMANDS = ("run", "jobs", "history", "instances", "pause", "resume", "trigger", "cancel", "prune")
IMPORT_HELP = (
    "make django-celery-beat's PeriodicTask rows stored definitions (read from its tables, "
    "installed or not): every row is imported, updated or skipped with the reason, and a "
    "rerun updates, never duplicates. Each definition's target is the Celery task name; "
    "catch_up is 'latest' and the row's last_run_at is recorded as its last run, so an "
    "imported job runs what beat would have run at its next start and nothing older. "
    "Stop celery beat before importing: two schedulers would send every task twice"
)


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
        p = sub.add_parser("import-celery-beat", help=IMPORT_HELP, description=IMPORT_HELP)
        p.set_defaults(command=None, name="import-celery-beat")
        p.add_argument(
            "--dry-run", action="store_true", help="print the plan and the table; write nothing"
        )
        p.add_argument(
            "--namespace",
            metavar="NS",
            help="the definitions' namespace (default: the project's, ANARCHON['NAMESPACE'])",
        )
        p.add_argument(
            "--database",
            metavar="ALIAS",
            default="default",
            help="the DATABASES alias holding django-celery-beat's tables (default: default)",
        )
        p.add_argument("--backend", metavar="URL", help="store URL (default: ANARCHON['BACKEND'])")
        p.add_argument(
            "--debug", action="store_true", help="print tracebacks of errors (normally one line)"
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
            if name == "import-celery-beat":
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                    _import_celery_beat(options)
                return
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


def _import_celery_beat(options: dict[str, Any]) -> None:
    """``import-celery-beat``: read the rows, convert them, write (or plan) the changes,
    print the table."""
    from django.conf import settings

    from ... import celery_beat

    namespace = options["namespace"]
    if namespace is None:
        namespace = get_scheduler().namespace
    validate_namespace(namespace)
    zone = dt.UTC if settings.USE_TZ else zoneinfo.ZoneInfo(settings.TIME_ZONE or "UTC")
    now = wall_clock_ms()
    rows = celery_beat.read_rows(options["database"])
    conversions = [celery_beat.convert(row, now_ms=now, naive_zone=zone) for row in rows]
    url: str = options["backend"]
    dry_run: bool = options["dry_run"]

    async def use(backend: Backend) -> list[celery_beat.Result]:
        return await celery_beat.import_rows(backend, conversions, namespace, dry_run=dry_run)

    async def open_and() -> list[celery_beat.Result]:
        backend = backend_from_url(url)
        try:
            await backend.open()
            return await use(backend)
        finally:
            await backend.close()

    try:
        results = asyncio.run(open_and())
    except ConfigurationError:
        raise
    except Exception as exc:
        text = str(exc) if isinstance(exc, AnarchonError) else f"{type(exc).__name__}: {exc}"
        raise CliError(f"{mask_url(url)}: {text}", code=1) from exc
    app, tasks = celery_beat.celery_task_names()
    unknown = 0
    for result in results:
        if result.definition is None:
            continue
        if tasks is None:
            result.detail.append("task unverified (no Celery app)")
        elif result.definition.target not in tasks:
            unknown += 1
            result.detail.append(f"task not registered in the Celery app {app!r}")
    where = f"namespace {namespace!r}" if namespace else "no namespace"
    changes = [r for r in results if r.result in ("imported", "updated") and r.definition]
    if dry_run:
        print(f"dry run: the changes import-celery-beat would make ({where}); nothing written")
    else:
        print(f"import-celery-beat: {len(rows)} PeriodicTask row(s) read ({where})")
    for r in changes:
        assert r.definition is not None
        mark = "+" if r.result == "imported" else "~"
        schedule = r.definition.effective_schedule.describe()
        print(f"  {mark} {r.name}: {schedule} -> {r.definition.target}")
    for line in celery_beat.table(results, dry_run=dry_run):
        print(line)
    if unknown:
        print(
            f"{unknown} definition(s) name a task the Celery app {app!r} does not register: "
            "their slots record a MissingTargetError until an instance holds that target"
        )
    elif tasks is None and changes:
        print("the task names are unverified: no Celery app is configured in this process")
