"""Catch-up: the slots missed since a job's last recorded run, claimed after a start.

Catch-up runs are claimed in slot order and one at a time across the cluster: before
claiming the next slot, an instance waits until the previous catch-up run has ended,
whichever instance won it. They are exempt from skipping each other, not from the
overlap rule: a won catch-up run waits, lease held, for the job's live run of another
origin (another instance's current slot) to end before its handler starts, within the
catch-up window. The check follows the claim, so a run claimed after it is skipped by
the store, and one claimed before it is seen by the check. This instance's own slots
that come due while it catches a job up (``overlap="skip"``) are handed to the catch-up
(:meth:`CatchUp.defer`) and claimed, in order, once the missed ones have run: they are
neither skipped for the catch-up's sake nor run beside it. One that the catch-up has
not claimed by half its horizon is claimed as usual (and skipped, recorded, if a
catch-up run is live then) rather than left to expire.
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
        #: The jobs being caught up, each with the scheduled slots handed to it.
        self._deferred: dict[str, list[int]] = {}

    def defer(self, job: Job, slot: int) -> bool:
        """Take a scheduled slot of ``job`` if the job is being caught up (and may not
        overlap): it is claimed after the missed slots. ``False``: claim it as usual."""
        deferred = self._deferred.get(job.store_name)
        if deferred is None or job.options.overlap != "skip":
            return False
        deferred.append(slot)
        return True

    def undefer(self, job: Job, slot: int) -> bool:
        """Take back a slot handed over by :meth:`defer` that the catch-up has not
        claimed yet (half its horizon has passed: it is claimed as usual, and skipped if
        a catch-up run is still live). ``False``: the catch-up claimed it."""
        deferred = self._deferred.get(job.store_name)
        if deferred is None or slot not in deferred:
            return False
        deferred.remove(slot)
        return True

    async def run(self, job: Job) -> None:
        """Catch ``job`` up, then claim the scheduled slots handed over meanwhile."""
        deferred = self._deferred[job.store_name] = []
        try:
            await self._catch_up(job)
            while deferred:  # no await between the last check and the del: none is lost
                slot = deferred.pop(0)
                horizon = job.horizon_ms(slot)
                run = PendingClaim(job, slot, Origin.SCHEDULE, horizon, 0, True)
                run.jitter = max(self.config.clock() - slot, 0)
                await self._claim_one(run)
        finally:
            del self._deferred[job.store_name]

    async def report_left_out(self, job: Job) -> None:
        """For a job with ``catch_up="none"``: log once how many slots passed since its
        last recorded run while no instance ran it (they are not run)."""
        last = await self._read(job, lambda: self.backend.last_scheduled_slot(job.store_name))
        if last is None:
            return
        now = self.config.clock()
        missed = latest_slots(job.schedule, max(last, now - job.options.catch_up_window_ms), now)
        if missed:
            self.log.warn(
                "%s%d slot(s) passed while no instance ran this job, the latest at %d; "
                "catch_up='none' leaves them out",
                "at least " if len(missed) == MAX_CATCH_UP_SLOTS else "",
                len(missed),
                missed[-1],
                job=job,
            )

    async def _claim_one(self, run: PendingClaim) -> bool:
        """Claim ``run`` and wait for its attempt to end; ``True`` if this instance won."""
        (task,) = await self.claimer.claim_runs([run])
        if task is None:
            return False
        await asyncio.wait({task})
        return True

    async def _catch_up(self, job: Job) -> None:
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
            if not await self._claim_one(run):
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
