"""The ``anarchon`` command line: run a scheduler, inspect its jobs and the store's history.

Every subcommand that touches a store takes ``--backend URL`` (default
``$ANARCHON_BACKEND``, else the embedded ``sqlite:///anarchon.sqlite3``) and prints
URLs only through :func:`~anarchon_core.backends.mask_url`, so a password never
reaches a terminal or a CI log. Exit codes: 0 success, 1 the operation failed (an
unreachable store, a failed demo), 2 bad usage or configuration, 130 interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import logging
import os
import re
import socket
import sys
import time
import traceback
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Any, TypeVar

from .. import __version__
from ..backend import Backend, InstanceInfo, wall_clock_ms
from ..backends import DEFAULT_URL, backend_from_url, mask_url
from ..background import BackgroundScheduler
from ..durations import format_duration_ms, parse_duration_ms
from ..errors import AnarchonError, ConfigurationError
from ..names import validate_job_name, validate_namespace
from ..records import HistoryQuery, Status, iso_utc
from ..scheduler import Scheduler
from ._dashboard import add_dashboard_command
from ._format import history_table, parse_instant_ms
from ._operations import add_operation_commands

__all__ = [
    "CliError",
    "add_commands",
    "build_parser",
    "exit_code",
    "load_scheduler",
    "main",
    "parse_time_ms",
]

T = TypeVar("T")

TARGET_FORM = "MODULE:ATTR, e.g. 'myapp.jobs:scheduler' (a module importable from here)"
_TARGET = re.compile(
    r"(?P<module>[^\W\d]\w*(?:\.[^\W\d]\w*)*):(?P<attr>[^\W\d]\w*(?:\.[^\W\d]\w*)*)"
)
LOG_FORMAT = "%(asctime)s.%(msecs)03dZ %(levelname)-7s %(name)s [%(instance)s] %(message)s"


class CliError(Exception):
    """A failure reported as one line on stderr with an exit code (no traceback)."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


# -- entry point --------------------------------------------------------------------


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


def exit_code(exc: CliError | AnarchonError) -> int:
    """The exit code of an error reported in one line: a :class:`CliError`'s own, 2 for
    a :class:`ConfigurationError` (bad usage or configuration), else 1."""
    if isinstance(exc, CliError):
        return exc.code
    return 2 if isinstance(exc, ConfigurationError) else 1


def build_parser() -> argparse.ArgumentParser:
    """The parser of every subcommand (exposed for the docs and the tests)."""
    parser = argparse.ArgumentParser(
        prog="anarchon",
        description="A leaderless distributed job scheduler: run it, inspect jobs and history.",
    )
    parser.add_argument("--version", action="version", version=f"anarchon {__version__}")
    add_commands(parser.add_subparsers(title="commands", metavar="COMMAND", required=True))
    return parser


def add_commands(
    sub: argparse._SubParsersAction[Any],
    names: Collection[str] | None = None,
    *,
    target: str | None = None,
    default_store: str = f"$ANARCHON_BACKEND, else {DEFAULT_URL}",
) -> dict[str, argparse.ArgumentParser]:
    """Add the subcommands ``names`` (default: all) to ``sub`` (``add_subparsers()``).

    Each parser's default ``command`` runs it: given the parsed namespace, it returns
    the exit code, or raises :class:`CliError` / :class:`AnarchonError` (see
    :func:`exit_code`). Given ``target`` (``MODULE:ATTR``), ``run``, ``jobs`` and
    ``health`` act on that scheduler instead of taking it as an argument, and
    ``default_store`` is what ``--backend`` defaults to: how a framework's own command
    (``manage.py anarchon``) offers them. Returns the parsers added, by name.
    """
    made: dict[str, argparse.ArgumentParser] = {}
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--debug", action="store_true", help="print tracebacks of errors (normally one line)"
    )
    store = argparse.ArgumentParser(add_help=False)
    store.add_argument("--backend", metavar="URL", help=f"store URL (default: {default_store})")

    def add(
        name: str,
        func: Callable[[argparse.Namespace], int],
        help_: str,
        parents: Sequence[argparse.ArgumentParser],
    ) -> argparse.ArgumentParser:
        if names is not None and name not in names:
            return argparse.ArgumentParser(add_help=False)  # not offered: a throwaway
        p: argparse.ArgumentParser = sub.add_parser(
            name, help=help_, description=help_, parents=[common, *parents]
        )
        p.set_defaults(command=func, name=name)
        made[name] = p
        return p

    def add_target(p: argparse.ArgumentParser, help_: str, **optional: Any) -> None:
        if target is None:
            p.add_argument("target", metavar="MODULE:ATTR", help=help_, **optional)
        else:
            p.set_defaults(target=target)

    p = add("run", _cmd_run, "run a scheduler in the foreground until SIGINT/SIGTERM", [])
    add_target(p, "the Scheduler to run, " + TARGET_FORM)
    keep = "keep it" + ("" if target else f"; a Scheduler built without one uses {default_store}")
    p.add_argument(
        "--backend", metavar="URL", help=f"replace the scheduler's store (default: {keep})"
    )
    p.add_argument("--instance-id", metavar="ID", help="this process's id in the history")
    p.add_argument(
        "--grace-ms",
        type=_nonnegative_int,
        metavar="N",
        help="on stop, wait up to N ms for running handlers before handing them over "
        "(default: the scheduler's grace_ms, 10000)",
    )
    p.add_argument(
        "--log-level",
        default="INFO",
        type=str.upper,
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="logging level of the stderr log (default: INFO)",
    )

    p = add("jobs", _cmd_jobs, "list a scheduler's jobs and their next slots", [store])
    add_target(p, "the Scheduler to list, " + TARGET_FORM)
    p.add_argument(
        "--count", type=_nonnegative_int, default=5, metavar="N", help="next slots shown (5)"
    )
    p.add_argument("--json", action="store_true", help="one JSON object per job and line")

    p = add("history", _cmd_history, "show the run history kept in a store", [store])
    p.add_argument("--job", metavar="NAME", help="only this job (its name in the store)")
    p.add_argument(
        "--status",
        choices=[s.value for s in Status],
        metavar="STATUS",
        help="only records with this status: " + ", ".join(s.value for s in Status),
    )
    p.add_argument(
        "--since", type=parse_time_ms, metavar="T", help="only slots at or after T " + _TIME_HELP
    )
    p.add_argument(
        "--until", type=parse_time_ms, metavar="T", help="only slots before T " + _TIME_HELP
    )
    p.add_argument(
        "--limit", type=_positive_int, default=100, metavar="N", help="at most N records (100)"
    )
    p.add_argument(
        "--json", action="store_true", help="one JSON object per record and line (RunRecord)"
    )

    p = add(
        "prune",
        _cmd_prune,
        "delete finished history records older than a duration, of the jobs named by "
        "--job, of one --namespace, or of every job with --all",
        [store],
    )
    p.add_argument(
        "--older-than",
        required=True,
        type=_duration_ms,
        metavar="DURATION",
        help="records of slots older than this, e.g. 7d, 12h, 30m",
    )
    p.add_argument(
        "--job",
        action="append",
        dest="jobs",
        metavar="NAME",
        help="only this job, by its name in the store (billing:sync); repeatable",
    )
    p.add_argument("--namespace", metavar="NS", help="only the jobs of this namespace (NS:...)")
    p.add_argument(
        "--all",
        action="store_true",
        dest="all_jobs",
        help="every job in the store, of every service that shares it",
    )

    p = add(
        "health",
        _cmd_health,
        "exit 0 if the store is reachable (and, given MODULE:ATTR, an instance of that "
        "scheduler on this host was seen within 3 heartbeats), else 1",
        [store],
    )
    add_target(
        p,
        "also require a live instance of this Scheduler on this host: a liveness probe",
        nargs="?",
    )
    p.add_argument(
        "--timeout", type=float, default=10.0, metavar="SECONDS", help="give up after (10)"
    )

    add_operation_commands(add, store, _store_call)
    add_dashboard_command(add, store, _backend_url, CliError)

    p = add("demo", _cmd_demo, "start several instances, kill one mid-run, show the takeover", [])
    p.add_argument(
        "--seconds", type=float, default=20.0, metavar="S", help="approximate duration (20)"
    )
    p.add_argument(
        "--instances", type=_demo_instances, default=3, metavar="N", help="processes (3)"
    )
    p.add_argument(
        "--backend",
        metavar="URL",
        help="a store all processes share (default: a throwaway SQLite file; "
        "$ANARCHON_BACKEND is deliberately ignored)",
    )
    p.add_argument("--keep", action="store_true", help="keep the temporary files and logs")
    return made


# -- argument types -----------------------------------------------------------------

_TIME_HELP = (
    "(ISO-8601, UTC if it has no offset, e.g. 2026-12-03T08:00; epoch ms; "
    "or a duration such as 1h meaning that long ago)"
)


def parse_time_ms(text: str) -> int:
    """``--since``/``--until``: an ISO-8601 time, epoch ms, or a duration ago, as epoch ms."""
    if re.fullmatch(r"(?:[0-9]+(?:ms|d|h|m|s))+", text.strip()):
        return wall_clock_ms() - parse_duration_ms(text.strip(), what="time")
    return parse_instant_ms(text, other_forms=", or a duration ago (1h)")


def _duration_ms(text: str) -> int:
    try:
        return parse_duration_ms(text, what="duration")
    except ConfigurationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _nonnegative_int(text: str) -> int:
    return _int_at_least(text, 0)


def _positive_int(text: str) -> int:
    return _int_at_least(text, 1)


def _demo_instances(text: str) -> int:
    return _int_at_least(text, 2, "a takeover needs at least two instances")


def _int_at_least(text: str, minimum: int, why: str = "") -> int:
    try:
        value = int(text)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not valid: give an integer >= {minimum}" + (f" ({why})" if why else "")
        )
    return value


# -- loading a scheduler --------------------------------------------------------------


def load_scheduler(target: str) -> Scheduler:
    """Import ``MODULE:ATTR`` (the current directory first on ``sys.path``) to a Scheduler.

    A :class:`BackgroundScheduler` is accepted too (its wrapped scheduler is used), so the
    object a Django or WSGI app already exposes can be run or listed as it is.
    """
    match = _TARGET.fullmatch(target)
    if match is None:
        raise CliError(f"{target!r} is not a valid target: give {TARGET_FORM}")
    module_name, attr = match.group("module"), match.group("attr")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)  # console scripts start with their own bin/ there instead
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise CliError(
                f"cannot import module {module_name!r} (from {target!r}): {exc}; run from "
                f"the directory that contains it, or set PYTHONPATH"
            ) from exc
        raise CliError(f"importing {module_name!r} failed: {_one_line(exc)}") from exc
    except Exception as exc:  # anything the user's module raises while importing
        raise CliError(f"importing {module_name!r} failed: {_one_line(exc)}") from exc
    obj: object = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise CliError(
                f"{target!r}: module {module_name!r} has no attribute {attr!r}; "
                f"expected {TARGET_FORM}"
            ) from None
    if isinstance(obj, BackgroundScheduler):
        obj = obj.scheduler
    if not isinstance(obj, Scheduler):
        raise CliError(
            f"{target!r} is an object of type {type(obj).__name__}, not an anarchon "
            f"Scheduler: give MODULE:ATTR naming a Scheduler (or BackgroundScheduler), "
            f"e.g. 'myapp.jobs:scheduler'"
        )
    return obj


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _backend_url(args: argparse.Namespace) -> str:
    url: str | None = args.backend
    return url or os.environ.get("ANARCHON_BACKEND") or DEFAULT_URL


async def open_and(url: str, use: Callable[[Backend], Awaitable[T]]) -> T:
    """Build the store of ``url``, open it, run ``use`` on it and close it again."""
    backend = backend_from_url(url)
    try:
        await backend.open()
        return await use(backend)
    finally:
        await backend.close()  # idempotent, and frees what a failed open() left behind


# -- run ------------------------------------------------------------------------------


class _InstanceFilter(logging.Filter):
    """Give every record an ``instance`` field: this process runs one scheduler."""

    def __init__(self) -> None:
        super().__init__()
        self.instance = "-"

    def filter(self, record: logging.LogRecord) -> bool:
        if not getattr(record, "instance", None):
            record.instance = self.instance
        return True


def _configure_logging(level: str) -> tuple[logging.Handler, _InstanceFilter]:
    handler = logging.StreamHandler(sys.stderr)
    formatter = logging.Formatter(LOG_FORMAT, datefmt="%Y-%m-%dT%H:%M:%S")
    formatter.converter = time.gmtime  # slots are UTC; so are the log times
    handler.setFormatter(formatter)
    instance = _InstanceFilter()
    handler.addFilter(instance)
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(level)
    return handler, instance


def _cmd_run(args: argparse.Namespace) -> int:
    handler, instance = _configure_logging(args.log_level)
    log = logging.getLogger("anarchon.cli")
    try:
        scheduler = load_scheduler(args.target)
        if scheduler.running:
            raise CliError(f"{args.target!r} is already running in this process")
        scheduler.configure(backend=args.backend or None, instance_id=args.instance_id)
        instance.instance = scheduler.instance_id
        grace = scheduler.grace_ms if args.grace_ms is None else args.grace_ms
        log.info(
            "running %s: %d job(s) on %s; stop with Ctrl-C or SIGTERM (grace %d ms)",
            args.target,
            len(scheduler.jobs),
            scheduler.backend.describe(),
            grace,
        )
        try:
            scheduler.run(grace_ms=args.grace_ms)
        except AnarchonError as exc:  # refused at start: the configuration must change
            raise CliError(str(exc)) from exc
        log.info("stopped")
        return 0
    finally:
        logging.getLogger().removeHandler(handler)


# -- jobs -----------------------------------------------------------------------------


def _cmd_jobs(args: argparse.Namespace) -> int:
    scheduler = load_scheduler(args.target)
    url = args.backend or None
    backend = mask_url(url) if url else scheduler.backend.describe()
    now = wall_clock_ms()
    if args.json:
        for job in scheduler.jobs.values():
            slots = _next_slots(job.schedule.next_slot, now, args.count)
            print(
                json.dumps(
                    {
                        "job": job.name,
                        "store_name": job.store_name,
                        "schedule": job.describe(),
                        "tz": job.schedule.tz,
                        "next_slots": slots,
                        "next_at": [iso_utc(s) for s in slots],
                    }
                )
            )
        return 0
    print(f"{args.target}: {len(scheduler.jobs)} job(s), backend {backend}, now {iso_utc(now)}")
    for job in scheduler.jobs.values():
        print()
        print(f"{job.name}")
        print(f"  schedule    {job.describe()}")
        print(f"  zone        {job.schedule.tz}")
        print(f"  store name  {job.store_name}")
        slots = _next_slots(job.schedule.next_slot, now, args.count)
        for i, slot in enumerate(slots):
            label = f"next {len(slots)}" if i == 0 else ""
            print(f"  {label:<10}  {iso_utc(slot)}  {slot}")
    return 0


def _next_slots(next_slot: Callable[[int], int], after: int, count: int) -> list[int]:
    slots: list[int] = []
    for _ in range(count):
        after = next_slot(after)
        slots.append(after)
    return slots


# -- history, prune, health -------------------------------------------------------------


def _cmd_history(args: argparse.Namespace) -> int:
    query = HistoryQuery(
        job=args.job,
        status=None if args.status is None else Status(args.status),
        since=args.since,
        until=args.until,
        limit=args.limit,
    )
    records = _store_call(args, lambda backend: backend.history(query))
    if args.json:
        for record in records:
            print(json.dumps(record.to_json(), ensure_ascii=False))
        return 0
    if not records:
        print(f"no history records in {mask_url(_backend_url(args))} match")
        return 0
    for line in history_table(records):
        print(line)
    return 0


_PRUNE_SCOPE = (
    "give --job NAME (repeatable), --namespace NS, or --all (every job of every service "
    "sharing the store)"
)


def _cmd_prune(args: argparse.Namespace) -> int:
    """Prune a scope the user names: a store is shared, so "everything" must be asked for."""
    older_than: int = args.older_than
    jobs: list[str] | None = args.jobs
    namespace: str | None = args.namespace
    given = [
        option
        for option, value in (("--job", jobs), ("--namespace", namespace), ("--all", args.all_jobs))
        if value
    ]
    if len(given) != 1:
        why = (
            "which jobs to prune is required"
            if not given
            else f"{' and '.join(given)} exclude each other"
        )
        raise CliError(f"{why}: {_PRUNE_SCOPE}")
    if jobs is not None:
        for job in jobs:
            validate_job_name(job, what="--job")
        scope = ", ".join(jobs)
    elif namespace is not None:
        validate_namespace(namespace)
        scope = f"namespace {namespace}"
    else:
        scope = "every job"

    async def prune(backend: Backend) -> tuple[int, int]:
        cutoff = await backend.now_ms() - older_than
        return await backend.prune(cutoff, jobs=jobs, namespace=namespace), cutoff

    deleted, cutoff = _store_call(args, prune)
    print(
        f"{deleted} history record(s) pruned from {mask_url(_backend_url(args))} "
        f"(finished slots before {iso_utc(cutoff)}, older than {format_duration_ms(older_than)}; "
        f"{scope})"
    )
    return 0


def _cmd_health(args: argparse.Namespace) -> int:
    scheduler = load_scheduler(args.target) if args.target else None
    if scheduler is not None and not args.backend:
        url = scheduler.backend.describe()
        use_backend: Backend | None = scheduler.backend
    else:
        url, use_backend = _backend_url(args), None
    timeout: float = args.timeout

    async def probe(backend: Backend) -> tuple[int, list[InstanceInfo]]:
        now = await backend.now_ms()
        return now, (await backend.instances() if scheduler is not None else [])

    async def check() -> tuple[int, list[InstanceInfo]]:
        if use_backend is None:
            return await open_and(url, probe)
        await use_backend.open()
        try:
            return await probe(use_backend)
        finally:
            await use_backend.close()

    sent = wall_clock_ms()
    try:
        store_now, live = asyncio.run(asyncio.wait_for(check(), timeout))
    except ConfigurationError:  # a bad URL is a usage error (exit 2), not "unhealthy"
        raise
    except TimeoutError:
        print(f"unhealthy: {mask_url(url)} did not answer within {timeout:g}s", file=sys.stderr)
        return 1
    except Exception as exc:
        if args.debug:
            traceback.print_exc()
        print(f"unhealthy: {store_failure(url, exc)}", file=sys.stderr)
        return 1
    skew = store_now - (sent + wall_clock_ms()) // 2
    print(f"ok: {mask_url(url)} is reachable (store clock {iso_utc(store_now)}, skew {skew:+d} ms)")
    if scheduler is None:
        return 0
    host, names = socket.gethostname(), {job.store_name for job in scheduler.jobs.values()}
    recent = store_now - 3 * scheduler.heartbeat_ms
    mine = [i for i in live if i.host == host and names <= i.jobs.keys() and i.last_seen >= recent]
    if not mine:
        print(
            f"unhealthy: no instance of {args.target} on {host} was seen in the last "
            f"{3 * scheduler.heartbeat_ms} ms (3 heartbeats)",
            file=sys.stderr,
        )
        return 1
    print(f"ok: {', '.join(i.instance_id for i in mine)} alive on {host}")
    return 0


def _store_call(args: argparse.Namespace, use: Callable[[Backend], Awaitable[T]]) -> T:
    """Run one store operation; a store failure is exit 1 with the masked URL."""
    url = _backend_url(args)
    try:
        return asyncio.run(open_and(url, use))
    except ConfigurationError:
        raise
    except Exception as exc:
        raise CliError(store_failure(url, exc), code=1) from exc


def store_failure(url: str, exc: BaseException) -> str:
    """One line naming the store (masked) once: backend errors usually name it already."""
    text = str(exc) if isinstance(exc, AnarchonError) else _one_line(exc)
    where = mask_url(url)
    return text if where in text else f"{where}: {text}"


# -- demo -----------------------------------------------------------------------------


def _cmd_demo(args: argparse.Namespace) -> int:
    from ._demo import run_demo  # the demo pulls in subprocess management only when asked

    if args.backend and args.backend.startswith("memory:"):
        raise CliError("the demo needs a store its processes share; memory:// is per process")
    return run_demo(
        seconds=args.seconds, instances=args.instances, backend=args.backend, keep=args.keep
    )
