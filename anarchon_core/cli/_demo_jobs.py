"""The jobs ``anarchon demo`` runs in each of its instance processes.

Short heartbeats (300 ms, so a lease of 900 ms) make a killed runner's run be taken
over within about two seconds. The long job's interval leaves room for its takeover
(attempt 2 starts over, about 2 s after the kill) to finish before the next slot. The
backend here is only a placeholder: the demo always passes ``--backend`` with a store
its processes share.
"""

from __future__ import annotations

import asyncio

from ..context import RunContext
from ..scheduler import Scheduler

__all__ = ["LONG_JOB", "LONG_RUN_S", "scheduler"]

LONG_JOB = "demo.long"
#: How long one run of the long job works.
LONG_RUN_S = 3.0

scheduler = Scheduler("memory://", heartbeat_ms=300)


@scheduler.every("demo.tick", "1s")
def tick(ctx: RunContext) -> None:
    """A quick sync handler (runs in a worker thread)."""
    ctx.wait(0.05)


@scheduler.every("demo.report", "5s")
async def report(ctx: RunContext) -> None:
    """A quick async handler (runs on the scheduler's event loop)."""
    await asyncio.sleep(0.1)
    ctx.meta["note"] = "async handler"


@scheduler.every(LONG_JOB, "6s")
def long_job(ctx: RunContext) -> None:
    """Works for a while; ``ctx.wait`` returns early if the run must stop (lease lost, stop)."""
    if ctx.wait(LONG_RUN_S):
        ctx.raise_if_cancelled()
