"""``anarchon history`` and ``anarchon prune``: read and trim the run history a store
keeps."""

from __future__ import annotations

import argparse
import json

from ..backend import Backend
from ..backends import mask_url
from ..durations import format_duration_ms
from ..names import validate_job_name, validate_namespace
from ..records import HistoryQuery, Status, iso_utc
from ._errors import CliError
from ._format import history_table
from ._store import backend_url, store_call

__all__ = ["cmd_history", "cmd_prune"]


def cmd_history(args: argparse.Namespace) -> int:
    query = HistoryQuery(
        job=args.job,
        status=None if args.status is None else Status(args.status),
        since=args.since,
        until=args.until,
        limit=args.limit,
    )
    records = store_call(args, lambda backend: backend.history(query))
    if args.json:
        for record in records:
            print(json.dumps(record.to_json(), ensure_ascii=False))
        return 0
    if not records:
        print(f"no history records in {mask_url(backend_url(args))} match")
        return 0
    for line in history_table(records):
        print(line)
    return 0


_PRUNE_SCOPE = (
    "give --job NAME (repeatable), --namespace NS, or --all (every job of every service "
    "sharing the store)"
)


def cmd_prune(args: argparse.Namespace) -> int:
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

    deleted, cutoff = store_call(args, prune)
    print(
        f"{deleted} history record(s) pruned from {mask_url(backend_url(args))} "
        f"(finished slots before {iso_utc(cutoff)}, older than {format_duration_ms(older_than)}; "
        f"{scope})"
    )
    return 0
