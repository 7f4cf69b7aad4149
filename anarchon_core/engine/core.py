"""The engine's life cycle: the loops it runs between ``start()`` and ``stop()``.

One :class:`Engine` lives between ``Scheduler.start()`` and ``stop()``. It runs the slot
loop (:mod:`.slots`), whose claims go out in tasks of their own (:mod:`.claims`); the
backup sweep (:mod:`.backups`); the heartbeat of held attempts (:mod:`.leases`); the
registry refresh (:mod:`.registry`); catch-up (:mod:`.catch_up`) and pruning. Every
store call survives an outage: it is logged, counted and retried, never raised out of a
loop. A loop that ends any other way fails the scheduler loudly: it leaves the registry
(so that no survivor ranks it for a run it will not claim), stops claiming, logs at
ERROR and shows in :attr:`Engine.failed`.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from ..backend import Backend, InstanceInfo
from ..errors import BackendUnavailable, CapabilityError, SchedulerStateError
from ..job import MAX_MISFIRE_GRACE_MS, Job
from .backups import Backups
from .candidates import Candidates
from .catch_up import CatchUp
from .claims import Claimer
from .definitions import Build, Follower
from .registry import Registry
from .runner import Attempts
from .slots import SlotLoop
from .support import EngineConfig, EngineLog

__all__ = ["Engine"]


class SyncOutcome(Protocol):
    """What a sync of the code jobs reports (``stored_jobs.SyncReport``)."""

    def changes(self) -> str:
        """What it changed, as one line ('' for nothing)."""
        ...


#: How often stop() re-cancels a task that has not ended.
DRAIN_RECANCEL_S = 1.0
#: How long stop() waits for the answers of the claims already sent (within the grace).
CLAIM_WAIT_MS = 2000
#: Prune history at most this often per instance.
PRUNE_EVERY_S = 3600.0


class Engine:
    """The running state of one started scheduler."""

    def __init__(
        self,
        backend: Backend,
        jobs: Mapping[str, Job],
        config: EngineConfig,
        *,
        namespace: str | None = None,
        build: Build | None = None,
        sync: Callable[[], Awaitable[SyncOutcome]] | None = None,
    ) -> None:
        self.backend = backend
        #: Stores the code jobs as ``owner='code'`` definitions once the store opens.
        self._sync = sync
        self.config = config
        self.jobs = {job.store_name: job for job in jobs.values()}
        self.telemetry = config.telemetry
        self.log = EngineLog(config.logger, config.instance_id)
        self._lease = backend.capabilities.lease
        self.attempts = Attempts(backend, config, self.log)
        self.claimer = Claimer(backend, config, self.log, self.attempts)
        #: Who claims which run (every instance, without a registry view).
        self.candidates = Candidates(
            config.candidates if self._lease else None,
            config.instance_id,
            stale_after_ms=config.lease_ms,
        )
        self.catch_up = CatchUp(backend, config, self.log, self.claimer)
        self.slots = SlotLoop(
            config,
            self.log,
            self.jobs,
            self.candidates,
            claim=self.claimer.claim_runs,
            spawn=self._spawn_claims,
            defer=self.catch_up.defer,
            undefer=self.catch_up.undefer,
        )
        self.registry = Registry(
            backend,
            config,
            self.log,
            self.jobs,
            self.candidates,
            skew=lambda: self.claimer.skew_ms,
            on_departed=self.slots.rescue,
        )
        #: The stored definitions this instance plans (``build`` makes their jobs).
        self.follower = (
            None
            if build is None
            else Follower(
                backend,
                config,
                self.log,
                namespace=namespace,
                build=build,
                on_change=self._stored_job_changed,
            )
        )
        if self.follower is not None:
            self.claimer.on_stale = self.follower.wake
        self._looping = False
        self._loops: set[asyncio.Future[Any]] = set()
        #: The loops that claim (the slot loop) or rank this instance (the registry).
        self._claiming: set[asyncio.Future[Any]] = set()
        #: The loops that run until the stop.
        self._forever: set[asyncio.Future[Any]] = set()
        #: The claim requests of the slot loop in flight.
        self._sent: set[asyncio.Future[Any]] = set()
        self._heartbeat: asyncio.Future[Any] | None = None
        #: Set to end a stop's grace early (a second Ctrl-C).
        self._hurried = asyncio.Event()
        self._stopping = False
        #: Why the engine claims nothing any more: the store turned out unusable after a
        #: background start, or an engine loop died (not an outage).
        self.failed: BaseException | None = None
        #: Set when :attr:`failed` is.
        self.failed_event = asyncio.Event()
        #: The store opened and the loops run (False while an outage at start is retried).
        self.opened = False

    @property
    def stats(self) -> Counter[str]:
        """Plain counters of this engine's events (``Scheduler.stats``)."""
        return self.telemetry.stats

    @property
    def skew_ms(self) -> int:
        """The last measured clock skew, store − local."""
        return self.claimer.skew_ms

    def instance_info(self) -> InstanceInfo:
        """This instance's registry entry (see :meth:`.Registry.instance_info`)."""
        return self.registry.instance_info()

    # -- start -----------------------------------------------------------------------
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
            self.log.warn("store unavailable at start, retrying: %s", exc)
            self._spawn(self._open_then_run())
            return
        await self._begin()

    async def _open_then_run(self) -> None:
        """Retry an unreachable store until it answers; any other failure is final."""
        delay = 0.05
        while True:
            try:
                await self.backend.open()
                break
            except BackendUnavailable as exc:
                self.telemetry.store_error("open")
                self.log.warn("store unavailable, retrying in %.2fs: %s", delay, exc)
                self.telemetry.store_retry("open")
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
            except Exception as exc:
                self.log.error("anarchon cannot use its store and claims nothing: %s", exc)
                self._fail(exc)
                return
        await self._begin()

    async def _begin(self) -> None:
        """The store is open: store the code jobs, read the stored definitions, then run
        the loops (with every job known, so that catch-up covers the stored ones too)."""
        await self._sync_code_jobs()
        if self.follower is not None:
            await self.follower.load()
        self._start_loops()

    async def _sync_code_jobs(self) -> None:
        """Store the code jobs as ``owner='code'`` definitions, where the dashboards read
        their schedules (the registry lists names and fingerprints only). Neither a store
        that keeps no definitions nor an outage stops the start: the first is skipped
        quietly, the second logged (the next start syncs)."""
        if self._sync is None:
            return
        try:
            report = await self._sync()
        except CapabilityError:
            return
        except Exception as exc:
            self.telemetry.store_error("definitions")
            self.log.warn(
                "could not store the code jobs' definitions (synced at the next start): %s", exc
            )
            return
        changed = report.changes()
        if changed:
            self.log.info("code jobs stored: %s", changed)

    def _start_loops(self) -> None:
        self.opened = True
        for warning in self.backend.setting_warnings:
            self.log.warn("%s", warning)
        self._claiming.add(self._spawn(self.slots.run(), forever=True))
        if self._lease:
            for job in self.jobs.values():
                if job.missing_target is not None:
                    continue  # runs only to record that no instance holds its target
                if self._catches_up(job):
                    self._spawn(self.catch_up.run(job))
                else:
                    self._spawn(self.catch_up.report_left_out(job))
            self._heartbeat = self._spawn(self.attempts.leases.heartbeat_loop(), forever=True)
            backups = Backups(
                self.backend, self.config, self.log, self.jobs, self.claimer, self.attempts
            )
            self._spawn(backups.sweep_loop(), forever=True)
        # The registry loop ends at once, and normally, on a store without a registry.
        self._claiming.add(self._spawn(self.registry.loop()))
        self._spawn(self._prune_loop())
        if self.follower is not None and self.follower.kept:
            self._spawn(self.follower.loop())
            self._spawn(self.follower.listen())
        self._looping = True

    def _stored_job_changed(self, name: str, job: Job | None) -> None:
        """A stored definition was added, changed, disabled or removed: plan it from
        now on (its claims name the new version), or stop planning it. A job that
        appears (added, enabled again) is caught up by its own policy."""
        old = self.jobs.pop(name, None)
        if job is None:
            self.slots.remove(name)
        else:
            self.jobs[name] = job
            if self._looping:
                self.slots.add(job)
                if old is None and self._lease and self._catches_up(job):
                    self._spawn(self.catch_up.run(job))
        self.registry.changed()

    @staticmethod
    def _catches_up(job: Job) -> bool:
        """Whether the job's missed slots are claimed (a job whose target this instance
        lacks runs only to record that nobody holds it: never caught up)."""
        return job.options.catch_up != "none" and job.missing_target is None

    def _spawn(self, coro: Awaitable[Any], *, forever: bool = False) -> asyncio.Future[Any]:
        """Run ``coro`` in a task of the engine's; one that raises (or, ``forever``, that
        ends at all) fails the engine."""
        task = asyncio.ensure_future(coro)
        self._loops.add(task)
        if forever:
            self._forever.add(task)
        task.add_done_callback(self._loop_ended)
        return task

    def _spawn_claims(self, coro: Awaitable[Any]) -> asyncio.Future[Any]:
        """A claim request of the slot loop: a stop lets it be answered (see :meth:`stop`)."""
        task = self._spawn(coro)
        self._sent.add(task)
        task.add_done_callback(self._sent.discard)
        return task

    def _loop_ended(self, task: asyncio.Future[Any]) -> None:
        self._loops.discard(task)
        if task.cancelled() or self._stopping:
            return
        error = task.exception()
        if error is None and task not in self._forever:
            return  # a claim batch, a catch-up, a registry without a store to keep it
        if error is None:
            error = SchedulerStateError("an engine loop ended unexpectedly")
        self.log.error(
            "engine loop crashed: this instance stops claiming and leaves the registry "
            "(Scheduler.failed says why); restart it",
            exc_info=error,
        )
        self._fail(error)

    def _fail(self, error: BaseException) -> None:
        """Stop claiming (and taking over) for good and leave the registry; the runs in
        flight go on to their end."""
        if self.failed is not None:
            return
        self.failed = error
        self.failed_event.set()
        for task in list(self._loops):
            if task is not self._heartbeat:  # runs in flight keep their leases
                task.cancel()
        if self.opened:
            leaving = asyncio.ensure_future(self.registry.leave())
            self._loops.add(leaving)
            leaving.add_done_callback(self._loops.discard)

    # -- stop ------------------------------------------------------------------------
    async def stop(self, grace_ms: int) -> None:
        """Stop claiming and leave the registry at once; wait up to ``grace_ms`` for the
        running runs, then hand over those whose handler still runs."""
        self._stopping = True
        for task in list(self._loops):
            if task is not self._heartbeat and task not in self._sent:  # see below
                task.cancel()
        await self._drain(self._claiming)
        leaving = asyncio.ensure_future(self.registry.leave() if self.opened else _nothing())
        # Claims already sent are answered (briefly) and what they win runs in the grace
        # like any run in flight: a claim won at the instant of the stop is not lost.
        if self._sent:
            if grace_ms > 0:
                await asyncio.wait(set(self._sent), timeout=min(grace_ms, CLAIM_WAIT_MS) / 1000)
            for task in self._sent:
                task.cancel()
        # Beside the runs' grace, not before it: an unanswered request must not delay
        # the hand-over of the runs that are running.
        giving_back = asyncio.ensure_future(self.claimer.give_back_cut_requests(self.jobs))
        await self._grace(grace_ms)
        await self.attempts.hand_over()
        await self.attempts.drain_finishes(self.config.lease_ms / 1000)
        cut_off = await giving_back
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        await self._drain({*self._loops, *self.attempts.tasks, *cut_off})
        self.attempts.close()  # every attempt has ended: no self-fence is due any more
        await leaving
        if self.opened:
            await self.registry.leave()  # again: a refresh cut off at stop may land late
        await self.backend.close()

    def hurry(self) -> None:
        """End a stop's wait for running runs now: they are handed over at once."""
        self._hurried.set()

    async def _grace(self, grace_ms: int) -> None:
        """Wait up to ``grace_ms`` for the running runs to end, or until :meth:`hurry`."""
        running = set(self.attempts.tasks)
        if not running or grace_ms <= 0:
            return
        self.log.info(
            "stopping: waiting up to %.1f s for %d running run(s), then handing them over",
            grace_ms / 1000,
            len(running),
        )
        ended = asyncio.ensure_future(asyncio.wait(running))
        hurried = asyncio.ensure_future(self._hurried.wait())
        try:
            await asyncio.wait(
                {ended, hurried}, timeout=grace_ms / 1000, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            ended.cancel()  # the runs themselves go on: hand_over() ends them
            hurried.cancel()
        if self._hurried.is_set() and not ended.done():
            self.log.warn("stop hurried: handing the running runs over now")

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

    # -- housekeeping ----------------------------------------------------------------
    async def _prune_loop(self) -> None:
        """Apply this instance's retention to its own jobs only.

        Services sharing a store each keep their own retention: pruning every job in
        the store with this instance's bound would delete other services' history.
        """
        await asyncio.sleep(random.uniform(10, 60))
        while True:
            mine = sorted(self.jobs)  # stored definitions come and go
            # A run record must outlive every horizon it can still be claimed within.
            keep = max(
                [self.config.history_retention_ms]
                + [
                    max(j.options.catch_up_window_ms, j.options.misfire_grace_ms or 0)
                    + MAX_MISFIRE_GRACE_MS
                    for j in self.jobs.values()
                ]
            )
            try:
                deleted = await self.backend.prune(self.config.clock() - keep, jobs=mine)
                if deleted:
                    self.log.info("pruned %d history record(s)", deleted)
                if self.follower is not None and self.follower.kept:
                    retired = await self.follower.retire_one_offs(self.config.clock() - keep)
                    if retired:
                        self.log.info("removed %d one-off definition(s) that fired", retired)
            except Exception as exc:
                self.telemetry.store_error("prune")
                self.log.warn("prune failed: %s", exc)
            await asyncio.sleep(PRUNE_EVERY_S * random.uniform(0.9, 1.1))


async def _nothing() -> None:
    pass
