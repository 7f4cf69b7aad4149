"""One chaos worker process: ``python -m benchmarks._chaos_worker``.

The spec (JSON in ``$ANARCHON_CHAOS_SPEC``, kept out of the process list) names the
store URL (through this worker's fault proxy), the instance id, the service (``main``
or ``other``, see :data:`benchmarks._chaos_jobs.SERVICES`), the clock offset in ms, the
jitter, the candidates, the lease settings and the events file. The worker runs a
:class:`anarchon_core.Scheduler` with its service's namespace and jobs until SIGTERM or
SIGINT, then calls ``stop()``; it appends ``ready`` and ``stopped`` events.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import time
from typing import Any

from anarchon_core import Scheduler
from anarchon_core.scheduler import DEFAULT_CANDIDATES

from ._chaos_jobs import SERVICES, emit, make_handler


def offset_clock(offset_ms: int) -> Any:
    """The worker's wall clock: the true one shifted by ``offset_ms``."""

    def clock() -> int:
        return time.time_ns() // 1_000_000 + offset_ms

    return clock


async def serve(spec: dict[str, Any]) -> None:
    events = str(spec["events"])
    service = SERVICES[spec.get("service", "main")]
    scheduler = Scheduler(
        spec["url"],
        namespace=service.namespace,
        instance_id=spec["instance_id"],
        heartbeat_ms=spec["heartbeat_ms"],
        lease_ms=spec["lease_ms"],
        jitter_ms=spec["jitter_ms"],
        candidates=spec.get("candidates", DEFAULT_CANDIDATES),
        clock=offset_clock(int(spec["offset_ms"])),
        # The chaos judge counts the slots each instance claims on time; a restarted
        # instance does not replay the slots it missed.
        catch_up="none",
    )
    for job in service.jobs:
        scheduler.every(job.name, job.every, make_handler(job, events), offset=job.offset)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await scheduler.start()
    emit(events, e="ready", instance=spec["instance_id"], offset_ms=spec["offset_ms"])
    await stop.wait()
    await scheduler.stop()
    emit(events, e="stopped", instance=spec["instance_id"])


def main() -> None:
    spec = json.loads(os.environ["ANARCHON_CHAOS_SPEC"])
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format=f"%(asctime)s {spec['instance_id']} %(levelname)s %(name)s %(message)s",
    )
    asyncio.run(serve(spec))


if __name__ == "__main__":
    main()
