"""The operator subcommands: pause, resume, trigger, cancel, instances.

Each acts on the shared store through :mod:`anarchon_core.operations`, so pressing a
button on any machine is the same store decision as on any other.
"""

from __future__ import annotations

import argparse
import json
import socket
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from .. import operations
from ..backend import Backend
from ..records import iso_utc
from ..web import api
from ._format import format_table, parse_instant_ms

__all__ = ["add_operation_commands"]

Command = Callable[[argparse.Namespace], int]


class StoreCall(Protocol):
    def __call__(self, args: argparse.Namespace, use: Callable[[Backend], Awaitable[Any]]) -> Any:
        """Run one operation on the store the arguments name (exit 1 if it fails)."""


class AddCommand(Protocol):
    def __call__(
        self, name: str, func: Command, help_: str, parents: Sequence[argparse.ArgumentParser]
    ) -> argparse.ArgumentParser:
        """Register a subcommand."""


def add_operation_commands(
    add: AddCommand, store: argparse.ArgumentParser, call: StoreCall
) -> None:
    """Register the operator subcommands on the main parser."""

    def job_command(name: str, help_: str, func: Command) -> argparse.ArgumentParser:
        p = add(name, func, help_, [store])
        p.add_argument("job", metavar="JOB", help="the job's name in the store (with namespace)")
        return p

    def pause(args: argparse.Namespace) -> int:
        call(args, lambda backend: operations.pause(backend, args.job, force=args.force))
        print(f"paused {args.job}: its next slots are recorded 'paused' on every instance")
        return 0

    def resume(args: argparse.Namespace) -> int:
        call(args, lambda backend: operations.resume(backend, args.job, force=args.force))
        print(f"resumed {args.job} from its next slot")
        return 0

    def trigger(args: argparse.Namespace) -> int:
        who = f"cli@{socket.gethostname()}"
        slot = call(args, lambda backend: operations.trigger(backend, args.job, requested_by=who))
        print(f"requested a manual run of {args.job}: slot {slot} ({iso_utc(slot)})")
        return 0

    def cancel(args: argparse.Namespace) -> int:
        done = call(args, lambda backend: operations.cancel(backend, args.job, args.slot))
        if not done:
            print(f"no pending or running run of {args.job} at slot {args.slot}")
            return 1
        print(f"cancelled {args.job}@{args.slot} ({iso_utc(args.slot)})")
        return 0

    def instances(args: argparse.Namespace) -> int:
        live = call(args, operations.instances)
        mismatches = operations.fingerprint_mismatches(live)
        if args.json:
            for info in live:
                print(json.dumps(api.instance_json(info), ensure_ascii=False))
            return 0
        if not live:
            print("no live instances")
            return 0
        rows = [
            [
                i.instance_id,
                i.host,
                str(i.pid),
                i.version,
                iso_utc(i.started_at),
                iso_utc(i.last_seen),
                str(len(i.jobs)),
            ]
            for i in live
        ]
        headers = ["INSTANCE", "HOST", "PID", "VERSION", "STARTED", "LAST SEEN", "JOBS"]
        for line in format_table(headers, rows, max_widths=[40, 24, None, 12, None, None, None]):
            print(line)
        for job, prints in sorted(mismatches.items()):
            groups = "; ".join(f"{fp}: {', '.join(ids)}" for fp, ids in prints.items())
            print(f"WARNING: instances disagree about {job}: {groups}")
        return 0

    for name, help_, func in (
        ("pause", "pause a job on every instance from its next slot", pause),
        ("resume", "resume a paused job from its next slot", resume),
    ):
        job_command(name, help_, func).add_argument(
            "--force",
            action="store_true",
            help="act on a job the store knows nothing of yet (not deployed, no history)",
        )
    job_command("trigger", "run a job once now, on one live instance that has it", trigger)
    p = job_command("cancel", "cancel a pending or running run of a job", cancel)
    p.add_argument(
        "slot",
        type=parse_instant_ms,
        metavar="SLOT",
        help="the run's slot: epoch ms or ISO-8601 as the history shows it",
    )
    p = add("instances", instances, "list the live instances and their jobs", [store])
    p.add_argument("--json", action="store_true", help="one JSON object per instance and line")
