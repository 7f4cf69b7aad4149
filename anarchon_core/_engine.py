"""The asyncio engine: slot loops, claims, catch-up, takeovers, pruning, stop.

One :class:`Engine` lives between ``Scheduler.start()`` and ``stop()``. It runs one
task per job that sleeps to each slot (plus jitter) and sends its claim in a task of its
own (a claim retried through an outage must not hold up the next slots), one task that
sweeps the store for runs to continue (expired leases and due retries: the *backup*
role of SPEC §4.6, batched for all jobs), and one that prunes history. Won attempts
are handed to :class:`~anarchon_core._attempts.Attempts`, which runs them and keeps
their leases. Every store call survives an outage: it is logged, counted and
retried, never raised out of a loop. Every event is reported to the configuration's
:class:`~anarchon_core.telemetry.Telemetry` (counters, metrics, traces).
"""

from __future__ import annotations

import asyncio
import functools
import importlib.metadata
import os
import random
import secrets
import socket
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from typing import Any, TypeVar

from ._alarm import Alarm
from ._attempts import Attempts
from ._support import EngineConfig, EngineLog, retry_store
from .backend import (
    EARLY_TOLERANCE_MS,
    Backend,
    Claim,
    ClaimRequest,
    DueRun,
    InstanceInfo,
    Lease,
    TakeoverRequest,
)
from .errors import BackendUnavailable, CapabilityError
from .job import MAX_CATCH_UP_SLOTS, MAX_MISFIRE_GRACE_MS, Job
from .operations import fingerprint_mismatches
from .records import TERMINAL_STATUSES, HistoryQuery, Origin, Outcome
from .schedules import Schedule

__all__ = ["Engine", "EngineConfig"]

T = TypeVar("T")

#: A slot this far past its horizon by the local clock is not even sent to the store
#: (it would come back EXPIRED); the store's clock decides everything closer.
HORIZON_MARGIN_MS = 1000
#: Skew is sampled only from claims answered this fast.
SKEW_SAMPLE_MAX_RTT_MS = 100
#: Compare the live instances' job fingerprints every this many registry refreshes.
MISMATCH_CHECK_PERIODS = 30
#: A change of the measured skew by this much is logged again.
SKEW_LOG_STEP_MS = 1000
#: How often stop() re-cancels a task that has not ended.
DRAIN_RECANCEL_S = 1.0
#: How long stop() waits to leave the registry.
REGISTRY_STOP_TIMEOUT_S = 2.0
#: Prune history at most this often per instance.
PRUNE_EVERY_S = 3600.0
#: Most slot claims an engine starts per event-loop iteration (see :class:`Pacer`).
CLAIMS_PER_TURN = 8


class Pacer:
    """Lets at most ``per_turn`` callers through per event-loop iteration, in order.

    Many jobs due at one instant (1,000 jobs ``every("10s")`` without jitter) wake their
    loops in one iteration; claiming them all there would hold the loop for tens of
    milliseconds while the application that shares it (a web server) waits. Paced,
    the loop polls its sockets between portions: the claims leave a few milliseconds
    later instead, which is well within any horizon.
    """

    def __init__(self, per_turn: int) -> None:
        self.per_turn = per_turn
        self._used = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._next: asyncio.Handle | None = None

    def turn(self) -> asyncio.Future[None] | None:
        """``None`` to go on now, or a future to await first."""
        loop = asyncio.get_running_loop()
        if self._next is None:
            self._next = loop.call_soon(self._next_turn)
        if not self._waiters and self._used < self.per_turn:
            self._used += 1
            return None
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiters.append(waiter)
        return waiter

    def _next_turn(self) -> None:
        """The next iteration: a fresh allowance, first for those who wait."""
        self._next = None
        self._used = 0
        while self._waiters and self._used < self.per_turn:
            waiter = self._waiters.popleft()
            if not waiter.done():  # else cancelled while waiting (a stop)
                waiter.set_result(None)
                self._used += 1
        if self._used:  # they run in the next iteration, which gets its own allowance
            self._next = asyncio.get_running_loop().call_soon(self._next_turn)


class Engine:
    """The running state of one started scheduler."""

    def __init__(self, backend: Backend, jobs: Mapping[str, Job], config: EngineConfig) -> None:
        self.backend = backend
        self.config = config
        self.jobs = {job.store_name: job for job in jobs.values()}
        self.telemetry = config.telemetry
        self.skew_ms = 0
        self.log = EngineLog(config.logger, config.instance_id)
        self.attempts = Attempts(backend, config, self.log)
        self._lease = backend.capabilities.lease
        self._loops: set[asyncio.Future[Any]] = set()
        self._heartbeat: asyncio.Future[Any] | None = None
        self._started_at = config.clock()
        #: Set when the store turned out unusable after a background start (not an outage).
        self.failed: BaseException | None = None
        self._reported_mismatches: set[str] = set()
        self._logged_skew: int | None = None
        self._pacer = Pacer(CLAIMS_PER_TURN)
        self._alarm = Alarm()  # the job loops' sleeps to their slots

    @property
    def stats(self) -> Counter[str]:
        """Plain counters of this engine's events (``Scheduler.stats``)."""
        return self.telemetry.stats

    # -- life cycle --------------------------------------------------------------
    async def start(self) -> None:
        """Open the store and start the loops.

        A store that is down (:class:`BackendUnavailable`) is retried in the background
        so that an outage never stops a process from starting; anything else from
        ``open()`` (bad credentials, a newer schema, a refused configuration) will not
        mend by waiting and is raised to the caller.
        """
        try:
            await self.backend.open()
        except BackendUnavailable as exc:
            self.log.warn(None, None, None, "store unavailable at start, retrying: %s", exc)
            self._spawn(self._open_then_run())
            return
        self._start_loops()

    async def _open_then_run(self) -> None:
        """Retry an unreachable store until it answers; any other failure is final."""
        delay = 0.05
        while True:
            try:
                await self.backend.open()
                break
            except BackendUnavailable as exc:
                self.telemetry.store_error("open")
                self.log.warn(
                    None, None, None, "store unavailable, retrying in %.2fs: %s", delay, exc
                )
                self.telemetry.store_retry("open")
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
            except Exception as exc:
                self.log.error(
                    None, None, None, "anarchon cannot use its store and claims nothing: %s", exc
                )
                self.failed = exc
                return
        self._start_loops()

    def _start_loops(self) -> None:
        for job in self.jobs.values():
            self._spawn(self._job_loop(job))
            if self._lease and job.options.catch_up != "none":
                self._spawn(self._catch_up(job))
        if self._lease:
            self._heartbeat = self._spawn(self.attempts.heartbeat_loop())
            self._spawn(self._sweep_loop())
        self._spawn(self._registry_loop())  # ends at once on a store without a registry
        self._spawn(self._prune_loop())

    def _spawn(self, coro: Awaitable[Any]) -> asyncio.Future[Any]:
        task = asyncio.ensure_future(coro)
        self._loops.add(task)
        task.add_done_callback(self._loop_ended)
        return task

    def _loop_ended(self, task: asyncio.Future[Any]) -> None:
        self._loops.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.log.error(None, None, None, "engine loop crashed", exc_info=task.exception())

    async def stop(self, grace_ms: int) -> None:
        """Stop claiming, wait up to ``grace_ms`` for runs, then hand the rest over."""
        for task in list(self._loops):
            if task is not self._heartbeat:  # runs keep their leases until handed over
                task.cancel()
        try:
            if self.attempts.tasks:
                await asyncio.wait(set(self.attempts.tasks), timeout=grace_ms / 1000)
            await self.attempts.hand_over()
            if self._heartbeat is not None:
                self._heartbeat.cancel()
            await self._drain({*self._loops, *self.attempts.tasks})
        finally:  # the job loops are cancelled: even if this stop is, leave no timer on a
            self._alarm.close()  # loop that runs on (a web app's)
        self.attempts.close()  # every attempt has ended: no self-fence is due any more
        if self.failed is None:
            try:
                async with asyncio.timeout(REGISTRY_STOP_TIMEOUT_S):
                    await self.backend.unregister(self.config.instance_id)
            except CapabilityError:
                pass
            except Exception as exc:  # it expires on its own after one lease
                self.log.warn(None, None, None, "could not leave the instance registry: %s", exc)
        await self.backend.close()

    @staticmethod
    async def _drain(tasks: set[asyncio.Future[Any]]) -> None:
        """Wait for cancelled tasks, cancelling again any that swallowed its cancel.

        Some drivers wrap calls in ``asyncio.wait_for``, which on Python 3.11 can eat a
        cancellation that races with its own timeout; one more cancel ends them.
        """
        pending = {t for t in tasks if not t.done()}
        while pending:
            _, pending = await asyncio.wait(pending, timeout=DRAIN_RECANCEL_S)
            for task in pending:
                task.cancel()

    # -- slots -------------------------------------------------------------------
    def now(self) -> int:
        return self.config.clock()

    def _observe_skew(self, sample: int) -> None:
        """Keep the latest skew (store − local); log it at first and when it moves by 1 s.

        Past :data:`EARLY_TOLERANCE_MS` it is a warning: a clock that far ahead has its
        claims refused as early (and sent again at the slot), and one that far behind
        claims late, up to missing slots whose horizon is shorter than the skew.
        """
        if self._logged_skew is None or abs(sample - self._logged_skew) >= SKEW_LOG_STEP_MS:
            if abs(sample) > EARLY_TOLERANCE_MS:
                self.log.warn(
                    None,
                    None,
                    None,
                    "store clock skew %+d ms (store − local) is over %d ms: fix this host's "
                    "clock (NTP); its claims are early or late by that much",
                    sample,
                    EARLY_TOLERANCE_MS,
                )
            else:
                self.log.info(None, None, None, "store clock skew %+d ms (store − local)", sample)
            self._logged_skew = sample
        self.skew_ms = sample
        self.telemetry.skew(sample)

    async def _job_loop(self, job: Job) -> None:
        slot = job.schedule.next_slot(self.now())
        previous: int | None = None
        reported: int | None = None
        while True:
            # The gap the cluster waits through now (for `every`, the interval): what a
            # "did not run for 2 intervals" alert compares the last success with. A
            # gauge keeps its value: it is set again only when the gap changes.
            gap = slot - previous if previous is not None else job.schedule.next_slot(slot) - slot
            if gap != reported:
                self.telemetry.job_interval(job.store_name, gap / 1000)
                reported = gap
            bound = job.jitter_bound_ms(slot)
            jitter = random.randint(0, bound) if bound > 0 else 0
            delay = slot + jitter - self.now()
            if delay > 0:
                await self._alarm.sleep(delay / 1000)
            paced = self._pacer.turn()
            if paced is not None:
                await paced
            horizon = job.horizon_ms(slot)
            if self.now() > slot + horizon + HORIZON_MARGIN_MS:
                self.telemetry.abandoned(job.store_name)
                self.log.warn(job, slot, None, "slot abandoned: past its horizon of %d ms", horizon)
            else:  # a slow or retried claim must not hold up the job's next slots
                self._spawn(self._claim(job, slot, Origin.SCHEDULE, horizon, jitter))
            previous, slot = slot, job.schedule.next_slot(slot)

    async def _catch_up(self, job: Job) -> None:
        """Claim, in slot order and one at a time, the slots missed since the last record.

        "One at a time" holds across the cluster: before claiming the next slot, wait
        until the previous catch-up run has ended, whichever instance won it. Catch-up
        runs are exempt from skipping each other.
        """
        last = await self._retry(
            lambda: self.backend.last_scheduled_slot(job.store_name),
            what="catch-up read",
            operation="catch_up",
            job=job,
        )
        if last is None:
            return
        now = self.now()
        window = job.options.catch_up_window_ms
        missed = latest_slots(job.schedule, max(last, now - window), now)
        if job.options.catch_up == "latest":
            missed = missed[-1:]
        if missed:
            self.log.info(job, None, None, "catching up %d missed slot(s)", len(missed))
            # The last recorded run may itself be a catch-up run another instance is in.
            await self._await_end(job, last, deadline=last + window)
        for slot in missed:
            run = await self._claim(job, slot, Origin.CATCH_UP, window, 0, skip_overlap=False)
            if run is not None:
                await asyncio.wait({run})
            else:
                await self._await_end(job, slot, deadline=slot + window)

    async def _await_end(self, job: Job, slot: int, *, deadline: int) -> None:
        """Poll the history, once per heartbeat, until the run of ``slot`` has ended."""
        query = HistoryQuery(job=job.store_name, since=slot, until=slot + 1, limit=1)
        while self.now() < deadline:
            records = await self._retry(
                lambda: self.backend.history(query),
                what="catch-up wait",
                operation="catch_up",
                job=job,
            )
            if not records or records[0].status in TERMINAL_STATUSES:
                return  # nothing recorded (expired or early) or ended
            await asyncio.sleep(self.config.heartbeat_ms / 1000)

    async def _claim(
        self,
        job: Job,
        slot: int,
        origin: Origin,
        horizon: int,
        jitter: int,
        *,
        skip_overlap: bool | None = None,
    ) -> asyncio.Task[Any] | None:
        """Claim one run; start it if won. Returns the run's task when this instance won.

        A lost reply is retried with the same token, and the attempt's self-fence
        deadline counts from the first send: the store may have started the lease then.
        On a lease store an answer ``EARLY`` wrote nothing, so the claim sent again at the
        slot is a new one, with a new token (a late copy of the first can then never pass
        for it and its lease). A claim-only store may keep an early claim (a stream
        entry) and recognise the same token at the slot.
        """
        loop = asyncio.get_running_loop()
        token = secrets.token_hex(16)
        while True:
            request = ClaimRequest(
                job=job.store_name,
                slot=slot,
                origin=origin,
                token=token,
                instance_id=self.config.instance_id,
                lease_ms=self.config.lease_ms,
                horizon_ms=horizon,
                skip_overlap=(job.options.overlap == "skip")
                if skip_overlap is None
                else skip_overlap,
                fingerprint=job.fingerprint,
            )
            sent = loop.time()
            answer = await self._retry(
                functools.partial(self._timed_claim, request),
                what="claim",
                deadline=slot + horizon,
                job=job,
                slot=slot,
            )
            claim, latency = answer or (Claim(Outcome.EXPIRED), None)
            self.telemetry.claim(job.store_name, claim.outcome, latency)
            if claim.outcome != Outcome.EARLY:
                break
            if self._lease:
                token = secrets.token_hex(16)
            await asyncio.sleep(max(slot - (claim.store_now or slot), 10) / 1000)
        if claim.outcome == Outcome.WON:
            lease = Lease(job.store_name, slot, claim.attempt, token)
            return self.attempts.start(
                job,
                lease,
                origin,
                jitter,
                sent=sent,
                horizon_end=slot + horizon,
                store_now=_store_now_at_most(claim, latency),
            )
        if claim.outcome in (Outcome.SKIPPED, Outcome.PAUSED):
            self.log.info(job, slot, None, "slot %s", claim.outcome)
        elif claim.outcome == Outcome.EXPIRED:
            self.log.warn(job, slot, None, "slot abandoned: claimed past its horizon")
        elif claim.outcome == Outcome.LAPSED:
            self.log.warn(job, slot, 1, "not started: the claim's lease lapsed before its answer")
        return None

    async def _timed_claim(self, request: ClaimRequest) -> tuple[Claim, float]:
        """One claim and its round trip in seconds, sampling the skew (store − local).

        A slow answer (a pool wait, a reconnect) says nothing about the clocks: its
        midpoint could be seconds off, so such samples are dropped.
        """
        loop = asyncio.get_running_loop()
        sent, sent_at = self.now(), loop.time()
        claim = await self.backend.claim(request)
        latency = loop.time() - sent_at
        received = self.now()
        if (
            claim.store_now is not None
            and self.backend.capabilities.store_clock
            and received - sent <= SKEW_SAMPLE_MAX_RTT_MS
        ):
            self._observe_skew(claim.store_now - (sent + received) // 2)
        return claim, latency

    # -- backups -------------------------------------------------------------------
    async def _sweep_loop(self) -> None:
        """Continue runs whose runner died or whose retry is due (any of our jobs)."""
        names = frozenset(self.jobs)
        while True:
            await asyncio.sleep(self.config.heartbeat_ms * random.uniform(1, 2) / 1000)
            try:
                due = await self.backend.due_runs(names)
            except Exception as exc:
                self.telemetry.store_error("sweep")
                self.log.warn(None, None, None, "sweep failed: %s", exc)
                continue
            for run in due:
                if (run.job, run.slot) not in self.attempts.held and run.job in self.jobs:
                    await self._take_over(run)

    async def _take_over(self, run: DueRun) -> None:
        job = self.jobs[run.job]
        if run.origin == Origin.CATCH_UP:
            horizon = job.options.catch_up_window_ms
        elif run.origin == Origin.SCHEDULE:
            horizon = job.horizon_ms(run.slot)
        else:
            horizon = MAX_MISFIRE_GRACE_MS
        token = secrets.token_hex(16)
        request = TakeoverRequest(
            job=run.job,
            slot=run.slot,
            attempt=run.attempt,
            token=token,
            instance_id=self.config.instance_id,
            lease_ms=self.config.lease_ms,
            horizon_ms=horizon,
            max_attempts=job.options.max_attempts,
            skip_overlap=job.options.overlap == "skip",
        )
        sent = asyncio.get_running_loop().time()  # the first send: self-fencing counts from it
        # Repeated with the same token after an ambiguous failure, it answers WON again
        # while the lease it started is live (LAPSED after).
        answer = await self._retry(
            lambda: _timed(self.backend.take_over(request)),
            what="takeover",
            deadline=run.slot + horizon,
            job=job,
            slot=run.slot,
        )
        if answer is None:
            return
        claim, latency = answer
        self.telemetry.takeover(run.job, claim.outcome)
        if claim.outcome == Outcome.WON:
            self.log.info(job, run.slot, claim.attempt, "took over the run (%s)", run.reason)
            lease = Lease(run.job, run.slot, claim.attempt, token)
            self.attempts.start(
                job,
                lease,
                run.origin,
                0,
                sent=sent,
                horizon_end=run.slot + horizon,
                store_now=_store_now_at_most(claim, latency),
            )
        elif claim.outcome == Outcome.LAPSED:
            self.log.warn(
                job, run.slot, run.attempt + 1, "not started: the takeover's lease lapsed first"
            )
        elif claim.outcome in (Outcome.EXHAUSTED, Outcome.EXPIRED):
            why = "max_attempts reached" if claim.outcome == Outcome.EXHAUSTED else "too late"
            self.log.warn(job, run.slot, run.attempt, "run ended interrupted: %s", why)

    # -- the instance registry -------------------------------------------------------
    def instance_info(self) -> InstanceInfo:
        """What this instance tells the registry: who it is and the specs of its jobs."""
        return InstanceInfo(
            instance_id=self.config.instance_id,
            host=socket.gethostname(),
            pid=os.getpid(),
            version=_version(),
            started_at=self._started_at,
            last_seen=0,
            jobs={name: job.spec() for name, job in self.jobs.items()},
        )

    async def _registry_loop(self) -> None:
        """Stay in the registry while alive (expiring one lease after the last refresh)."""
        info = self.instance_info()
        periods = 0
        while True:
            try:
                await self.backend.register(
                    replace(info, skew_ms=self.skew_ms), self.config.lease_ms
                )
                if periods % MISMATCH_CHECK_PERIODS == 0:
                    await self._check_fingerprints()
            except CapabilityError as exc:  # a store without a registry: nothing to refresh
                self.log.warn(None, None, None, "no instance registry: %s", exc)
                return
            except Exception as exc:
                self.telemetry.store_error("registry")
                self.log.warn(None, None, None, "registry refresh failed: %s", exc)
            periods += 1
            await asyncio.sleep(self.config.heartbeat_ms / 1000)

    async def _check_fingerprints(self) -> None:
        """Warn when live replicas disagree about one of our jobs (a rolling deploy)."""
        mismatches = {
            job: prints
            for job, prints in fingerprint_mismatches(await self.backend.instances()).items()
            if job in self.jobs
        }
        changed = mismatches.keys() != self._reported_mismatches
        self.telemetry.fingerprints(self.jobs, set(mismatches), changed=changed)
        if mismatches and changed:
            self.log.warn(
                None,
                None,
                None,
                "live instances disagree about the schedule or options of: %s",
                "; ".join(f"{job} ({len(p)} versions)" for job, p in mismatches.items()),
            )
        self._reported_mismatches = set(mismatches)

    async def _prune_loop(self) -> None:
        await asyncio.sleep(random.uniform(10, 60))
        # A run record must outlive every horizon it can still be claimed within.
        keep = max(
            [self.config.history_retention_ms]
            + [
                max(j.options.catch_up_window_ms, j.options.misfire_grace_ms or 0)
                + MAX_MISFIRE_GRACE_MS
                for j in self.jobs.values()
            ]
        )
        while True:
            try:
                deleted = await self.backend.prune(self.now() - keep)
                if deleted:
                    self.log.info(None, None, None, "pruned %d history record(s)", deleted)
            except Exception as exc:
                self.telemetry.store_error("prune")
                self.log.warn(None, None, None, "prune failed: %s", exc)
            await asyncio.sleep(PRUNE_EVERY_S * random.uniform(0.9, 1.1))

    async def _retry(
        self,
        call: Callable[[], Awaitable[T]],
        *,
        what: str,
        deadline: int | None = None,
        operation: str | None = None,
        job: Job | None = None,
        slot: int | None = None,
    ) -> T | None:
        return await retry_store(
            call,
            what=what,
            config=self.config,
            log=self.log,
            deadline=deadline,
            operation=operation,
            job=job,
            slot=slot,
        )


async def _timed(call: Awaitable[T]) -> tuple[T, float]:
    """``call``'s answer and how long it took (loop time, seconds)."""
    loop = asyncio.get_running_loop()
    sent = loop.time()
    answer = await call
    return answer, loop.time() - sent


def _store_now_at_most(claim: Claim, latency: float | None) -> int | None:
    """The store's clock now, at the latest: the answer was decided at ``store_now``,
    within the round trip just measured (``None`` where the store gives no time)."""
    if claim.store_now is None:
        return None
    return claim.store_now + round((latency or 0.0) * 1000)


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


def _version() -> str:
    try:
        return importlib.metadata.version("anarchon")
    except importlib.metadata.PackageNotFoundError:  # running from a source tree
        return "unknown"
