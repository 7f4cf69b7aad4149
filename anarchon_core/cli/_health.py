"""``anarchon health``: whether the store answers and, given a scheduler, whether an
instance of it on this host was seen lately: a probe for a container's health check."""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
import traceback

from ..backend import Backend, InstanceInfo, wall_clock_ms
from ..backends import mask_url
from ..errors import ConfigurationError
from ..records import iso_utc
from ._errors import store_failure
from ._store import backend_url, open_and
from ._target import load_scheduler

__all__ = ["cmd_health"]


def cmd_health(args: argparse.Namespace) -> int:
    scheduler = load_scheduler(args.target) if args.target else None
    if scheduler is not None and not args.backend:
        url = scheduler.backend.describe()
        use_backend: Backend | None = scheduler.backend
    else:
        url, use_backend = backend_url(args), None
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
