"""The slot loop: one timer for every job, waking at the next due :class:`~.planner.Due`.

At a slot the loop hands the slot to the job's catch-up if one is under way (see
:mod:`.catch_up`; if the catch-up has not claimed it by half its horizon, the loop
claims it after all), else asks the registry view for this instance's turn and claims at once,
claims later (a ``CLAIM`` entry at the turn's delay) or passes the slot to its
candidates; the job's next slot is pushed at the same time. The claims due within one
turn of the loop leave as one batch, in a task of their own (a slow or retried claim
must not hold up the next slots). Passed slots are remembered for their horizon and
claimed after all if instances leave the registry (:meth:`SlotLoop.rescue`).

Stored definitions come and go while the loop runs (:meth:`SlotLoop.add`,
:meth:`SlotLoop.remove`): an entry of a job that was changed or removed since it was
pushed is dropped when it comes due, so no slot of a superseded definition is claimed
by this instance (and the store refuses the claim of one anyway).

The wall clock may step. Forward (or after a freeze), the due entries are late: each
job resumes at its first slot still claimable and the slots in between are reported
once, with a count. Backward, the entries lie too far ahead: the loop notices that the
wall clock fell behind the loop's monotonic clock and plans every job again from now.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import random
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any

from ..job import Job
from ..records import Origin
from ..schedules import NO_SLOT
from .candidates import Candidates, Role
from .claims import PendingClaim
from .planner import (
    HORIZON_MARGIN_MS,
    Due,
    Stage,
    claim_delay_ms,
    claim_window_ms,
    first_claimable,
    jitter_ms,
)
from .support import EngineConfig, EngineLog

__all__ = ["SlotLoop"]

#: Most due entries the loop takes per event-loop iteration: a burst of 10,000 jobs due
#: at one instant is handed on in portions, so an application that shares the loop (a
#: web server) is polled between them.
DUE_PER_TURN = 256
#: Most claims sent to the store in one request.
MAX_CLAIM_BATCH = 500
#: The loop wakes at least this often to notice a wall clock stepped back.
STEP_CHECK_MS = 1000
#: A wall clock that fell this far behind the loop's clock was stepped back.
STEP_TOLERANCE_MS = 1000

ClaimBatch = Callable[[list[PendingClaim]], Coroutine[Any, Any, Any]]


class SlotLoop:
    """Plans every job's slots and hands the due claims on in batches."""

    def __init__(
        self,
        config: EngineConfig,
        log: EngineLog,
        jobs: dict[str, Job],
        candidates: Candidates,
        *,
        claim: ClaimBatch,
        spawn: Callable[[Coroutine[Any, Any, Any]], object],
        defer: Callable[[Job, int], bool] = lambda job, slot: False,
        undefer: Callable[[Job, int], bool] = lambda job, slot: False,
    ) -> None:
        self.config = config
        self.log = log
        self.jobs = jobs
        self.candidates = candidates
        self.telemetry = config.telemetry
        self._claim = claim
        self._spawn = spawn
        self._defer = defer
        self._undefer = undefer
        self._heap: list[Due] = []
        self._order = itertools.count()
        self._gaps: dict[str, int] = {}
        #: Slots passed over in this turn, by job: (the first, how many, at least?).
        self._skips: dict[str, tuple[int, int, bool]] = {}
        #: Slots passed without a claim (not ranked for them), by job: claimed after
        #: all if their candidates leave the registry within the slot's horizon.
        self._passed: dict[str, deque[int]] = {}
        self._seed = random.getrandbits(64)  # seeded by simulations
        #: Set when a job is added, to wake a loop that sleeps with nothing due soon.
        self._added = asyncio.Event()

    def now(self) -> int:
        return self.config.clock()

    def _push(self, job: Job, slot: int, stage: Stage, at: int | None = None) -> None:
        heapq.heappush(
            self._heap, Due(slot if at is None else at, next(self._order), job, slot, stage)
        )

    def _plan_from(self, now: int) -> None:
        """Plan every job's next slot after ``now`` (keeping the claims already due)."""
        self._heap = [due for due in self._heap if due.stage == Stage.CLAIM]
        heapq.heapify(self._heap)
        for job in self.jobs.values():
            self._plan_next(job, now)

    def _plan_next(self, job: Job, after: int) -> None:
        """Push the job's first slot after ``after``, unless its schedule has run out."""
        slot = job.schedule.next_slot(after)
        if slot < NO_SLOT:
            self._push(job, slot, Stage.PLAN)

    def add(self, job: Job) -> None:
        """Plan a job that was added (or changed) while the loop runs, from now on; the
        entries of the job it replaces are dropped as they come due, and the slots it
        passed to its candidates are forgotten (they are not the new definition's)."""
        self._passed.pop(job.store_name, None)
        self._plan_next(job, self.now())
        self._added.set()

    def remove(self, name: str) -> None:
        """Forget a job whose definition was removed (its entries drop as they come due)."""
        self._passed.pop(name, None)

    def _current(self, entry: Due) -> bool:
        """Whether ``entry`` belongs to the job as it is defined now."""
        return self.jobs.get(entry.job.store_name) is entry.job

    async def run(self) -> None:
        """Wake at each due entry until cancelled."""
        loop = asyncio.get_running_loop()
        self._plan_from(self.now())
        offset = self.now() - loop.time() * 1000  # wall − monotonic, to notice steps back
        while True:
            delay = min(
                self._heap[0].at - self.now() if self._heap else STEP_CHECK_MS, STEP_CHECK_MS
            )
            if delay > 0:
                self._added.clear()
                try:
                    async with asyncio.timeout(delay / 1000):
                        await self._added.wait()
                except TimeoutError:
                    pass
            now = self.now()
            drift = now - loop.time() * 1000 - offset
            if drift < -STEP_TOLERANCE_MS:
                self.log.warn("the wall clock stepped back %d ms: planning every job again", -drift)
                self._plan_from(now)
            offset = now - loop.time() * 1000
            due = self._take_due(now)
            self._flush_skips()
            for start in range(0, len(due), MAX_CLAIM_BATCH):
                self._spawn(self._claim(due[start : start + MAX_CLAIM_BATCH]))
            if self._heap and self._heap[0].at <= now:  # more due: poll the sockets first
                await asyncio.sleep(0)

    def _take_due(self, now: int) -> list[PendingClaim]:
        """Pop the entries due at ``now`` (at most :data:`DUE_PER_TURN`): the claims to
        send now, with the job's next slots and the delayed claims pushed."""
        due: list[PendingClaim] = []
        for _ in range(DUE_PER_TURN):
            if not self._heap or self._heap[0].at > now:
                break
            entry = heapq.heappop(self._heap)
            if not self._current(entry):
                continue  # a definition changed or removed since
            if entry.stage == Stage.PLAN:
                run = self._plan(entry.job, entry.slot, now)
            elif entry.job.missing_target is not None and not self._held_nowhere(entry.job, now):
                run = None  # an instance holding the target appeared: it claims
            elif entry.stage == Stage.CLAIM or self._undefer(entry.job, entry.slot):
                run = self._pending(entry.job, entry.slot, entry.at - entry.slot, now)
            else:
                run = None  # the catch-up claimed it
            if run is not None:
                due.append(run)
        return due

    def _plan(self, job: Job, slot: int, now: int) -> PendingClaim | None:
        """The slot has come: push the job's next one, then claim now, later, or pass."""
        skip = first_claimable(job, slot, now)
        if skip is not None:
            self._report_skip(job, slot, skip.count, skip.at_least)
            if skip.slot > now:
                if skip.slot < NO_SLOT:
                    self._push(job, skip.slot, Stage.PLAN)
                return None
            slot = skip.slot
        nxt = job.schedule.next_slot(slot)
        if nxt < NO_SLOT:  # a one-off, or a window's last slot: nothing follows
            self._report_gap(job, nxt - slot)
            self._push(job, nxt, Stage.PLAN)
        if self._defer(job, slot):  # the job is being caught up: claimed after it
            self._push(job, slot, Stage.DEFERRED, at=slot + job.horizon_ms(slot) // 2)
            return None
        if job.missing_target is not None:  # runs only to record that nobody holds it
            if not self._held_nowhere(job, now):
                return None
            self._push(job, slot, Stage.CLAIM, at=slot + claim_window_ms(job.horizon_ms(slot)))
            return None
        turn = self.candidates.turn(job.store_name, job.fingerprint, slot, now)
        if turn.role == Role.UNRANKED:
            delay: int | None = jitter_ms(self._seed, job, slot)
        else:
            delay = claim_delay_ms(turn, self.candidates.k or 1, job.horizon_ms(slot))
        if delay is None:
            self._pass(job, slot, now)
            return None
        if slot + delay > now:
            self._push(job, slot, Stage.CLAIM, at=slot + delay)
            return None
        return self._pending(job, slot, max(now - slot, 0), now)

    def _held_nowhere(self, job: Job, now: int) -> bool:
        """Whether a fresh registry view shows no live instance holding the job's target
        (without a fresh view the instance cannot say, and leaves the slot)."""
        return (
            self.candidates.has_view(now) and job.missing_target not in self.candidates.targets_held
        )

    def _report_gap(self, job: Job, gap: int) -> None:
        """The gap the cluster waits through now (for ``every``, the interval): what a
        "did not run for 2 intervals" alert compares the last success with."""
        if self._gaps.get(job.store_name) != gap:
            self.telemetry.job_interval(job.store_name, gap / 1000)
            self._gaps[job.store_name] = gap

    def _report_skip(self, job: Job, slot: int, count: int, at_least: bool) -> None:
        """Count slots a late loop passes over (a clock step, a freeze), for one warning
        per job at the end of the turn (:meth:`_flush_skips`)."""
        self.telemetry.abandoned(job.store_name, count)
        first, total, more = self._skips.get(job.store_name, (slot, 0, False))
        self._skips[job.store_name] = (min(first, slot), total + count, more or at_least)

    def _flush_skips(self) -> None:
        """One warning per job for the slots passed over in this turn."""
        for name, (slot, count, at_least) in self._skips.items():
            if name not in self.jobs:
                continue
            self.log.warn(
                "skipped %s%d slot(s) from this one on, past their horizon (the wall clock "
                "stepped forward or the process was frozen)",
                "at least " if at_least else "",
                count,
                job=self.jobs[name],
                slot=slot,
            )
        self._skips.clear()

    def _pending(self, job: Job, slot: int, jitter: int, now: int) -> PendingClaim | None:
        """The claim of a due slot, or ``None`` if it is already past its horizon."""
        horizon = job.horizon_ms(slot)
        if now > slot + horizon + HORIZON_MARGIN_MS:
            self._report_skip(job, slot, 1, False)
            return None
        return PendingClaim(
            job, slot, Origin.SCHEDULE, horizon, jitter, job.options.overlap == "skip"
        )

    def _pass(self, job: Job, slot: int, now: int) -> None:
        """Note a slot left to its candidates, forgetting those past their horizon."""
        passed = self._passed.setdefault(job.store_name, deque())
        while passed and passed[0] + job.horizon_ms(passed[0]) < now:
            passed.popleft()
        passed.append(slot)

    def rescue(self, now: int) -> None:
        """Claim the passed slots that this instance is ranked for now that instances
        left the registry: their candidates may have died before them."""
        runs = []
        for name, passed in list(self._passed.items()):
            job = self.jobs.get(name)
            if job is None:
                continue
            left: deque[int] = deque()
            for slot in passed:
                if slot + job.horizon_ms(slot) < now:
                    continue
                turn = self.candidates.turn(name, job.fingerprint, slot, now)
                if turn.role == Role.NONE:
                    left.append(slot)  # still another's: this instance may be next
                elif (run := self._pending(job, slot, 0, now)) is not None:
                    runs.append(run)
            self._passed[name] = left
        if runs:
            self.log.info("claiming %d slot(s) of departed instances", len(runs))
        for start in range(0, len(runs), MAX_CLAIM_BATCH):
            self._spawn(self._claim(runs[start : start + MAX_CLAIM_BATCH]))
