"""``anarchon jobs``: a scheduler's jobs and their next slots, as text or JSON lines."""

from __future__ import annotations

import argparse
import json

from ..backend import wall_clock_ms
from ..backends import mask_url
from ..records import iso_utc
from ._definitions import ACTIONS, USAGE, run_action
from ._errors import CliError
from ._target import load_scheduler

__all__ = ["cmd_jobs"]


def cmd_jobs(args: argparse.Namespace) -> int:
    """List a scheduler's jobs, or run a definitions action (``jobs add FILE``…)."""
    words: list[str] = list(args.words)
    if words and words[0] in ACTIONS:
        return run_action(words[0], words[1:], args)
    target = args.fixed_target
    if target is None:
        if len(words) != 1:
            raise CliError(f"usage: anarchon jobs MODULE:ATTR, or {USAGE}", code=2)
        target = words[0]
    elif words:
        raise CliError(f"jobs: unknown action {words[0]!r}; {USAGE}", code=2)
    args.target = target
    return _list(args)


def _list(args: argparse.Namespace) -> int:
    scheduler = load_scheduler(args.target)
    url = args.backend or None
    backend = mask_url(url) if url else scheduler.backend.describe()
    now = wall_clock_ms()
    if args.json:
        for job in scheduler.jobs.values():
            slots = job.schedule.next_slots(now, args.count)
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
        slots = job.schedule.next_slots(now, args.count)
        for i, slot in enumerate(slots):
            label = f"next {len(slots)}" if i == 0 else ""
            print(f"  {label:<10}  {iso_utc(slot)}  {slot}")
    return 0
