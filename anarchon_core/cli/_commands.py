"""The subcommands and their options, added to the ``anarchon`` parser or to a host's
own (``manage.py anarchon``)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Collection, Sequence
from typing import Any

from ..backends import DEFAULT_URL
from ..records import Status
from ._arguments import (
    TIME_HELP,
    demo_instances,
    duration_ms,
    nonnegative_int,
    parse_time_ms,
    positive_int,
)
from ._dashboard import add_dashboard_command
from ._definitions import ACTIONS, USAGE, add_definition_options
from ._errors import CliError
from ._health import cmd_health
from ._history import cmd_history, cmd_prune
from ._jobs import cmd_jobs
from ._operations import add_operation_commands
from ._run import cmd_run
from ._store import backend_url, store_call
from ._target import TARGET_FORM

__all__ = ["add_commands"]


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

    p = add("run", cmd_run, "run a scheduler in the foreground until SIGINT/SIGTERM", [])
    add_target(p, "the Scheduler to run, " + TARGET_FORM)
    keep = "keep it" + ("" if target else f"; a Scheduler built without one uses {default_store}")
    p.add_argument(
        "--backend", metavar="URL", help=f"replace the scheduler's store (default: {keep})"
    )
    p.add_argument("--instance-id", metavar="ID", help="this process's id in the history")
    p.add_argument(
        "--grace-ms",
        type=nonnegative_int,
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

    p = add(
        "jobs",
        cmd_jobs,
        "list a scheduler's jobs and their next slots, or add, change and remove the job "
        "definitions kept in the store",
        [store],
    )
    p.usage = "%(prog)s [options] " + ("[ACTION ...]" if target else "[MODULE:ATTR | ACTION ...]")
    p.epilog = USAGE
    p.add_argument(
        "words",
        nargs="*",
        metavar="WORDS",
        help=("" if target else f"the Scheduler to list ({TARGET_FORM}), or ")
        + "an action: "
        + ", ".join(ACTIONS),
    )
    p.set_defaults(fixed_target=target, target=target)
    p.add_argument(
        "--count",
        "-n",
        type=nonnegative_int,
        default=5,
        metavar="N",
        help="next slots shown (5)",
    )
    p.add_argument("--json", action="store_true", help="one JSON object per job and line")
    add_definition_options(p)

    p = add("history", cmd_history, "show the run history kept in a store", [store])
    p.add_argument("--job", metavar="NAME", help="only this job (its name in the store)")
    p.add_argument(
        "--status",
        choices=[s.value for s in Status],
        metavar="STATUS",
        help="only records with this status: " + ", ".join(s.value for s in Status),
    )
    p.add_argument(
        "--since", type=parse_time_ms, metavar="T", help="only slots at or after T " + TIME_HELP
    )
    p.add_argument(
        "--until", type=parse_time_ms, metavar="T", help="only slots before T " + TIME_HELP
    )
    p.add_argument(
        "--limit", type=positive_int, default=100, metavar="N", help="at most N records (100)"
    )
    p.add_argument(
        "--json", action="store_true", help="one JSON object per record and line (RunRecord)"
    )

    p = add(
        "prune",
        cmd_prune,
        "delete finished history records older than a duration, of the jobs named by "
        "--job, of one --namespace, or of every job with --all",
        [store],
    )
    p.add_argument(
        "--older-than",
        required=True,
        type=duration_ms,
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
        cmd_health,
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

    add_operation_commands(add, store, store_call)
    add_dashboard_command(add, store, backend_url, CliError)

    p = add("demo", cmd_demo, "start several instances, kill one mid-run, show the takeover", [])
    p.add_argument(
        "--seconds", type=float, default=20.0, metavar="S", help="approximate duration (20)"
    )
    p.add_argument("--instances", type=demo_instances, default=3, metavar="N", help="processes (3)")
    p.add_argument(
        "--backend",
        metavar="URL",
        help="a store all processes share (default: a throwaway SQLite file; "
        "$ANARCHON_BACKEND is deliberately ignored)",
    )
    p.add_argument("--keep", action="store_true", help="keep the temporary files and logs")
    return made


def cmd_demo(args: argparse.Namespace) -> int:
    from ._demo import run_demo  # the demo pulls in subprocess management only when asked

    if args.backend and args.backend.startswith("memory:"):
        raise CliError("the demo needs a store its processes share; memory:// is per process")
    return run_demo(
        seconds=args.seconds, instances=args.instances, backend=args.backend, keep=args.keep
    )
