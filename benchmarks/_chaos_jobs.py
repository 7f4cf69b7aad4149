"""The chaos benchmark's jobs and the handlers that record what really ran.

Two services share each store: the main one (no namespace, :data:`JOBS`), whose slots
the benchmark judges, and another (namespace ``other``, :data:`OTHER_JOBS`), whose
worker holds none of the main jobs: the main service's rankings must leave it out.

Every handler appends one JSON line when it starts and one when it ends to the events
file (``O_APPEND`` keeps lines whole across processes), with the true wall time
``time.time()`` (never the worker's offset clock), the run's job, slot, attempt and
instance, and how it ended. A handler killed with its process writes no end line.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from anarchon_core import Every, RunContext

__all__ = [
    "JOBS",
    "MAIN",
    "OTHER",
    "OTHER_JOBS",
    "SERVICES",
    "JobSpec",
    "Service",
    "emit",
    "make_handler",
]

#: How often the handler that ignores cancellation looks at the signal (to record when
#: it was told), in seconds.
POLL_S = 0.02


@dataclass(frozen=True)
class JobSpec:
    """One job: its schedule and how its handler behaves.

    ``kind``: ``async`` (cancelled by the engine), ``sync`` (sleeps with ``ctx.wait``,
    returns as soon as it is told) or ``stubborn`` (sync; sleeps through the signal,
    noting when it came).
    """

    name: str
    every: str
    offset: str | None
    kind: str
    min_ms: int
    max_ms: int

    @property
    def schedule(self) -> Every:
        return Every(self.every, self.offset)

    @property
    def honours_cancellation(self) -> bool:
        return self.kind != "stubborn"

    def horizon_ms(self, slot: int) -> int:
        """``misfire_grace_ms`` left at its default: the gap to the next slot."""
        return self.schedule.next_slot(slot) - slot

    def duration_s(self, slot: int, attempt: int) -> float:
        """The planned run time: seeded by the run, so a report can be re-derived."""
        rng = random.Random(f"{self.name}:{slot}:{attempt}")
        return rng.uniform(self.min_ms, self.max_ms) / 1000


JOBS: tuple[JobSpec, ...] = (
    JobSpec("chaos.tick", "200ms", None, "async", 20, 120),
    JobSpec("chaos.async", "1s", None, "async", 100, 600),
    JobSpec("chaos.sync", "2s", None, "sync", 100, 600),
    JobSpec("chaos.stubborn", "2s", "1s", "stubborn", 300, 600),
)
#: The other service's jobs: names of their own, in a namespace of their own.
OTHER_JOBS: tuple[JobSpec, ...] = (
    JobSpec("other.poll", "500ms", None, "async", 10, 80),
    JobSpec("other.report", "3s", None, "sync", 100, 400),
)


@dataclass(frozen=True)
class Service:
    """One service on the store: its namespace (``None``: none) and its jobs.

    A handler's ``ctx.job`` is the job's name; the store keys runs by its store name
    (``namespace:name``).
    """

    name: str
    namespace: str | None
    jobs: tuple[JobSpec, ...]

    def store_name(self, job: str) -> str:
        return job if self.namespace is None else f"{self.namespace}:{job}"


MAIN = Service("main", None, JOBS)
OTHER = Service("other", "other", OTHER_JOBS)
SERVICES = {service.name: service for service in (MAIN, OTHER)}


def emit(path: str, **event: Any) -> None:
    """Append one event line (whole, across processes) with the true time and the pid."""
    event.update(pid=os.getpid(), t=time.time())
    line = (json.dumps(event) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def make_handler(spec: JobSpec, events: str) -> Callable[[RunContext], Any]:
    def record(ctx: RunContext, what: str, **extra: Any) -> None:
        emit(
            events,
            e=what,
            job=ctx.job,
            slot=ctx.slot,
            attempt=ctx.attempt,
            instance=ctx.instance_id,
            **extra,
        )

    if spec.kind == "async":

        async def async_handler(ctx: RunContext) -> None:
            record(ctx, "start")
            try:
                await asyncio.sleep(spec.duration_s(ctx.slot, ctx.attempt))
            except asyncio.CancelledError:
                record(ctx, "end", cancelled=ctx.cancel_reason or "cancelled")
                raise
            record(ctx, "end", cancelled=None)

        handler: Callable[[RunContext], Awaitable[None] | None] = async_handler
        return handler

    if spec.kind == "sync":

        def sync_handler(ctx: RunContext) -> None:
            record(ctx, "start")
            cancelled = ctx.wait(spec.duration_s(ctx.slot, ctx.attempt))
            record(ctx, "end", cancelled=ctx.cancel_reason if cancelled else None)

        return sync_handler

    def stubborn_handler(ctx: RunContext) -> None:
        record(ctx, "start")
        deadline = time.monotonic() + spec.duration_s(ctx.slot, ctx.attempt)
        told: float | None = None
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(POLL_S, left))  # ignores the signal, only notes when it came
            if told is None and ctx.cancelled:
                told = time.time()
        record(ctx, "end", cancelled=ctx.cancel_reason, told=told)

    return stubborn_handler
