"""Catch-up: the slots missed since a job's last recorded run, claimed after a start.

Catch-up runs are claimed in slot order and one at a time across the cluster: before
claiming the next slot, an instance waits until the previous catch-up run has ended,
whichever instance won it. They are exempt from skipping each other, not from the
overlap rule: a won catch-up run waits, lease held, for the job's live run of another
origin (the current slot) to end before its handler starts, within the catch-up window.
The check follows the claim, so a run claimed after it is skipped by the store, and one
claimed before it is seen by the check.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import TypeVar

from ..backend import Backend
from ..job import MAX_CATCH_UP_SLOTS, Job
from ..records import TERMINAL_STATUSES, HistoryQuery, Origin, Status
from ..schedules import Schedule
from .claims import Claimer, PendingClaim
from .support import EngineConfig, EngineLog, retry_store

__all__ = ["CatchUp", "latest_slots"]

T = TypeVar("T")

#: How many of a job's live runs one overlap check reads.
LIVE_READ_LIMIT = 50


class CatchUp:
    """Catches up the missed slots of jobs whose policy asks for it."""

    def __init__(
        self, backend: Backend, config: EngineConfig, log: EngineLog, claimer: Claimer
    ) -> None:
        self.backend = backend
        self.config = config
        self.log = log
        self.claimer = claimer

    async def run(self, job: Job) -> None:
        """Claim, in slot order and one at a time, the slots missed since the last record."""
        last = await self._read(job, lambda: self.backend.last_scheduled_slot(job.store_name))
        if last is None:
            return
        now = self.config.clock()
        window = job.options.catch_up_window_ms
        missed = latest_slots(job.schedule, max(last, now - window), now)
        if job.options.catch_up == "latest":
            missed = missed[-1:]
        if missed:
            self.log.info("catching up %d missed slot(s)", len(missed), job=job)
            # The last recorded run may itself be a catch-up run another instance is in.
            await self._await_end(job, last, deadline=last + window)
        for slot in missed:
            before = functools.partial(self._no_live_run, job, slot, deadline=slot + window)
            run = PendingClaim(job, slot, Origin.CATCH_UP, window, 0, False, before=before)
            (task,) = await self.claimer.claim_runs([run])
            if task is not None:
                await asyncio.wait({task})
            else:
                await self._await_end(job, slot, deadline=slot + window)

    async def _read(self, job: Job, call: Callable[[], Awaitable[T]]) -> T | None:
        return await retry_store(
            call,
            what="catch-up read",
            config=self.config,
            log=self.log,
            operation="catch_up",
            job=job,
        )

    async def _await_end(self, job: Job, slot: int, *, deadline: int) -> None:
        """Poll the history, once per heartbeat, until the run of ``slot`` has ended."""
        query = HistoryQuery(job=job.store_name, since=slot, until=slot + 1, limit=1)
        while self.config.clock() < deadline:
            records = await self._read(job, lambda: self.backend.history(query))
            if not records or records[0].status in TERMINAL_STATUSES:
                return  # nothing recorded (expired or early) or ended
            await asyncio.sleep(self.config.heartbeat_ms / 1000)

    async def _no_live_run(self, job: Job, slot: int, *, deadline: int) -> bool:
        """Wait until the job has no live run of another origin (the overlap rule);
        ``False`` if one is still live at ``deadline``."""
        query = HistoryQuery(job=job.store_name, status=Status.RUNNING, limit=LIVE_READ_LIMIT)
        while True:
            records = await self._read(job, lambda: self.backend.history(query))
            live = [r for r in records or () if r.origin != Origin.CATCH_UP and r.slot != slot]
            if not live:
                return True
            if self.config.clock() >= deadline:
                self.log.warn(
                    "catch-up run not started: the run of slot %d was still live at the end "
                    "of the catch-up window",
                    live[0].slot,
                    job=job,
                    slot=slot,
                )
                return False
            await asyncio.sleep(self.config.heartbeat_ms / 1000)


def latest_slots(schedule: Schedule, start: int, end: int) -> list[int]:
    """The last :data:`MAX_CATCH_UP_SLOTS` slots in ``(start, end]``, in order.

    Widens a look-back window from ``end`` instead of listing everything from
    ``start``: a frequent schedule over a long window would otherwise list tens of
    thousands of slots only to keep the last thousand.
    """
    first = schedule.next_slot(end)
    span = max(schedule.next_slot(first) - first, 1) * MAX_CATCH_UP_SLOTS
    while True:
        lo = max(start, end - span)
        slots = schedule.slots_between(lo, end)
        if lo == start or len(slots) >= MAX_CATCH_UP_SLOTS:
            return slots[-MAX_CATCH_UP_SLOTS:]
        span *= 4
