"""The asyncio engine: slot loops, claims, catch-up, takeovers, pruning, stop.

One :class:`Engine` lives between ``Scheduler.start()`` and ``stop()``. It runs one
timer for every job that sleeps to the next due slot (plus jitter) and sends the claims
due together as one request, in a task of its own (a claim retried through an outage
must not hold up the next slots), one task that
sweeps the store for runs to continue (expired leases and due retries: the *backup*
role in docs/concepts.md, batched for all jobs), and one that prunes history. Won attempts
are handed to :class:`~anarchon_core._attempts.Attempts`, which runs them and keeps
their leases. Every store call survives an outage: it is logged, counted and
retried, never raised out of a loop. Every event is reported to the configuration's
:class:`~anarchon_core.telemetry.Telemetry` (counters, metrics, traces).
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import importlib.metadata
import itertools
import os
import random
import secrets
import socket
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from ._attempts import Attempts
from ._candidates import Candidates, Role, unit_interval
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
    jobs_json,
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
#: How long stop() waits for the answers of claims and takeovers in flight, to give
#: back what they won (a request still unanswered then leaves its lease to expire).
STOP_REQUEST_WAIT_S = 2.0
#: Prune history at most this often per instance.
PRUNE_EVERY_S = 3600.0
#: Most due runs the slot loop takes per event-loop iteration: a burst of 10,000 jobs due
#: at one instant is handed on in portions, so an application that shares the loop (a
#: web server) is polled between them.
DUE_PER_TURN = 256
#: Most claims sent to the store in one request.
MAX_CLAIM_BATCH = 500
#: A watcher claims this long after the candidates' jitter window has closed.
WATCH_AFTER_MS = 250


@dataclass(slots=True)
class _Run:
    """A run this instance is about to claim, and the token it claims it with."""

    job: Job
    slot: int
    origin: Origin
    horizon: int
    jitter: int
    skip_overlap: bool
    token: str = field(default_factory=lambda: secrets.token_hex(16))
    sent: float | None = None
    """When (loop time) the current token was first sent: self-fencing counts from it."""

    def request(self, instance_id: str, lease_ms: int) -> ClaimRequest:
        return ClaimRequest(
            job=self.job.store_name,
            slot=self.slot,
            origin=self.origin,
            token=self.token,
            instance_id=instance_id,
            lease_ms=lease_ms,
            horizon_ms=self.horizon,
            skip_overlap=self.skip_overlap,
            fingerprint=self.job.fingerprint,
        )


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
        #: Set to end a stop's grace early (a second Ctrl-C).
        self._hurried = asyncio.Event()
        #: Claims and takeovers in flight, each with how to read the leases its answer
        #: won: a stop that cuts off their caller gives those leases back.
        self._requests: dict[asyncio.Future[Any], Callable[[Any], list[Lease]]] = {}
        self._started_at = config.clock()
        #: Set when the store turned out unusable after a background start (not an outage).
        self.failed: BaseException | None = None
        #: The store opened and the loops run (False while an outage at start is retried).
        self.opened = False
        self._reported_mismatches: set[str] = set()
        self._logged_skew: int | None = None
        #: Who claims which run (every instance, without a registry view).
        self.candidates = Candidates(
            config.candidates if self._lease else None,
            config.instance_id,
            stale_after_ms=config.lease_ms,
        )
        #: Slots passed without a claim (not a candidate), by job: claimed after all
        #: if their candidates leave the registry within the slot's horizon.
        self._passed: dict[str, deque[int]] = {}
        self._jitter_seed = random.getrandbits(64)  # seeded by simulations

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
        self.opened = True
        self._spawn(self._slot_loop())
        for job in self.jobs.values():
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
        # Beside the runs' grace, not before it: an unanswered request must not delay
        # the hand-over of the runs that are running.
        giving_back = asyncio.ensure_future(self._give_back_cut_requests())
        await self._grace(grace_ms)
        await self.attempts.hand_over()
        cut_off = await giving_back
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        await self._drain({*self._loops, *self.attempts.tasks, *cut_off})
        self.attempts.close()  # every attempt has ended: no self-fence is due any more
        if self.opened:
            try:
                async with asyncio.timeout(REGISTRY_STOP_TIMEOUT_S):
                    await self.backend.unregister(self.config.instance_id)
            except CapabilityError:
                pass
            except Exception as exc:  # it expires on its own after one lease
                self.log.warn(None, None, None, "could not leave the instance registry: %s", exc)
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
            None,
            None,
            None,
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
            self.log.warn(None, None, None, "stop hurried: handing the running runs over now")

    async def _give_back_cut_requests(self) -> set[asyncio.Future[Any]]:
        """Wait briefly for the claims and takeovers whose callers the stop cancelled,
        and release what they won: nothing here will run it, and a won lease left to
        expire would block its run, and the job's next slots, for a whole lease. Returns
        the requests still unanswered (cancelled: their leases, if any, expire)."""
        requests, self._requests = self._requests, {}
        if not requests:
            return set()
        done, pending = await asyncio.wait(requests, timeout=STOP_REQUEST_WAIT_S)
        for request in pending:
            request.cancel()
        won = [
            lease
            for request in done
            if not request.cancelled() and request.exception() is None
            for lease in requests[request](request.result())
        ]
        if self._lease:
            await self.attempts.give_back([(self.jobs[lease.job], lease) for lease in won])
        else:  # a claim-only store has no takeover: the run is not run
            for lease in won:
                self.log.warn(self.jobs[lease.job], lease.slot, 1, "won while stopping: not run")
        return pending

    async def _uncut(self, call: Awaitable[T], won: Callable[[T], list[Lease]]) -> T:
        """Await a store request that may start leases; a stop that cancels the caller
        does not cut the request off: it reads the answer and gives ``won(answer)``
        back (see :meth:`_give_back_cut_requests`)."""
        request = asyncio.ensure_future(call)
        self._requests[request] = won
        try:
            answer = await asyncio.shield(request)
        except asyncio.CancelledError:
            raise  # the stop reads the answer
        except BaseException:
            self._requests.pop(request, None)
            raise
        self._requests.pop(request, None)
        return answer

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

    async def _slot_loop(self) -> None:
        """One timer for every job: wake at the next due instant, hand the due runs on.

        A heap holds each job's next slot at the time this instance acts on it: the slot
        plus its jitter. Due, a run is claimed if this instance is one of its candidates,
        pushed back to the end of the jitter window if it is the watcher, and noted as
        passed otherwise. The runs due at one instant leave as one batched claim, in a
        task of its own (a slow or retried claim must not hold up the next slots).
        """
        heap: list[tuple[int, int, Job, int, bool]] = []
        order = itertools.count()  # ties leave in the order they were pushed
        reported: dict[str, int] = {}

        def push(job: Job, slot: int, previous: int | None) -> None:
            # The gap the cluster waits through now (for `every`, the interval): what a
            # "did not run for 2 intervals" alert compares the last success with.
            gap = slot - previous if previous is not None else job.schedule.next_slot(slot) - slot
            if reported.get(job.store_name) != gap:
                self.telemetry.job_interval(job.store_name, gap / 1000)
                reported[job.store_name] = gap
            jitter = self._jitter(job, slot)
            heapq.heappush(heap, (slot + jitter, next(order), job, slot, False))

        now = self.now()
        for job in self.jobs.values():
            push(job, job.schedule.next_slot(now), None)
        while heap:
            delay = heap[0][0] - self.now()
            if delay > 0:
                await asyncio.sleep(delay / 1000)
            now = self.now()
            due: list[_Run] = []
            taken = 0
            while heap and heap[0][0] <= now and taken < DUE_PER_TURN:
                taken += 1
                at, _, job, slot, watching = heapq.heappop(heap)
                if not watching:
                    push(job, job.schedule.next_slot(slot), slot)
                    role = self.candidates.role(job.store_name, slot, now)
                    if role == Role.WATCHER:
                        end = slot + job.jitter_bound_ms(slot) + WATCH_AFTER_MS
                        watch_at = min(end, slot + job.horizon_ms(slot) // 2)
                        heapq.heappush(heap, (max(watch_at, at), next(order), job, slot, True))
                        continue
                    if role == Role.NONE:
                        self._pass(job, slot, now)
                        continue
                run = self._due_run(job, slot, at - slot, now)  # the wait past the slot
                if run is not None:
                    due.append(run)
            for start in range(0, len(due), MAX_CLAIM_BATCH):
                self._spawn(self._claim_runs(due[start : start + MAX_CLAIM_BATCH]))
            if heap and heap[0][0] <= now:  # more due: let the loop poll its sockets first
                await asyncio.sleep(0)

    def _jitter(self, job: Job, slot: int) -> int:
        """This instance's jitter for ``slot``: one fraction per (instance, slot), scaled
        to each job's bound, so the claims of the jobs due at one instant leave together."""
        bound = job.jitter_bound_ms(slot)
        return int(unit_interval(self._jitter_seed, slot) * (bound + 1)) if bound > 0 else 0

    def _due_run(self, job: Job, slot: int, jitter: int, now: int) -> _Run | None:
        """The claim of a due slot, or ``None`` if it is already past its horizon."""
        horizon = job.horizon_ms(slot)
        if now > slot + horizon + HORIZON_MARGIN_MS:
            self.telemetry.abandoned(job.store_name)
            self.log.warn(job, slot, None, "slot abandoned: past its horizon of %d ms", horizon)
            return None
        return _Run(job, slot, Origin.SCHEDULE, horizon, jitter, job.options.overlap == "skip")

    def _pass(self, job: Job, slot: int, now: int) -> None:
        """Note a slot left to its candidates, forgetting those past their horizon."""
        passed = self._passed.setdefault(job.store_name, deque())
        while passed and passed[0] + job.horizon_ms(passed[0]) < now:
            passed.popleft()
        passed.append(slot)

    def _rescue(self, now: int) -> None:
        """Claim the passed slots that this instance is a candidate or watcher of now
        that instances left the registry: their candidates may have died before them."""
        runs = []
        for name, passed in self._passed.items():
            job = self.jobs[name]
            left: deque[int] = deque()
            for slot in passed:
                if slot + job.horizon_ms(slot) < now:
                    continue
                if self.candidates.role(name, slot, now) == Role.NONE:
                    left.append(slot)  # still another's: this instance may be next
                elif (run := self._due_run(job, slot, 0, now)) is not None:
                    runs.append(run)
            self._passed[name] = left
        if runs:
            self.log.info(None, None, None, "claiming %d slot(s) of departed instances", len(runs))
        for start in range(0, len(runs), MAX_CLAIM_BATCH):
            self._spawn(self._claim_runs(runs[start : start + MAX_CLAIM_BATCH]))

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
        """Claim one run; start it if won. Returns the run's task when this instance won."""
        overlap = (job.options.overlap == "skip") if skip_overlap is None else skip_overlap
        (task,) = await self._claim_runs([_Run(job, slot, origin, horizon, jitter, overlap)])
        return task

    async def _claim_runs(self, runs: list[_Run]) -> list[asyncio.Task[Any] | None]:
        """Claim runs in one store request; start the won ones. One task (or ``None``)
        per run, in order.

        A lost reply is retried with the same tokens, and each attempt's self-fence
        deadline counts from its first send: the store may have started the lease then.
        Once the earliest horizon of the batch has passed, its runs are abandoned and
        the rest retried. On a lease store an answer ``EARLY`` wrote nothing, so a claim
        sent again at the slot is a new one, with a new token (a late copy of the first
        can then never pass for it and its lease). A claim-only store may keep an early
        claim (a stream entry) and recognise the same token at the slot.
        """
        loop = asyncio.get_running_loop()
        tasks: dict[int, asyncio.Task[Any] | None] = {}
        pending = runs
        while pending:
            for run in pending:
                if run.sent is None:
                    run.sent = loop.time()
            requests = [r.request(self.config.instance_id, self.config.lease_ms) for r in pending]
            deadline = min(r.slot + r.horizon for r in pending)
            single = pending[0] if len(pending) == 1 else None
            answer = await self._retry(
                functools.partial(self._timed_claims, requests),
                what="claim",
                deadline=deadline,
                job=single.job if single else None,
                slot=single.slot if single else None,
            )
            if answer is None:  # the earliest horizon passed: the later ones are retried
                cutoff = max(deadline, self.now())
                for run in pending:
                    if run.slot + run.horizon <= cutoff:
                        self.telemetry.claim(run.job.store_name, Outcome.EXPIRED, None)
                        tasks[id(run)] = self._settle(run, Claim(Outcome.EXPIRED), None)
                pending = [r for r in pending if id(r) not in tasks]
                continue
            claims, latency = answer
            early = []
            wait = 10
            for run, claim in zip(pending, claims, strict=True):
                self.telemetry.claim(run.job.store_name, claim.outcome, latency)
                if claim.outcome == Outcome.EARLY:
                    early.append(run)
                    wait = max(run.slot - (claim.store_now or run.slot), wait)
                else:
                    tasks[id(run)] = self._settle(run, claim, latency)
            pending = early
            if early:
                for run in early:
                    run.sent = None
                    if self._lease:
                        run.token = secrets.token_hex(16)
                await asyncio.sleep(wait / 1000)
        return [tasks[id(run)] for run in runs]

    def _settle(self, run: _Run, claim: Claim, latency: float | None) -> asyncio.Task[Any] | None:
        """Act on a claim's answer: start a won attempt, log why anything else ran nothing."""
        job, slot = run.job, run.slot
        if claim.outcome == Outcome.WON:
            assert run.sent is not None
            lease = Lease(job.store_name, slot, claim.attempt, run.token)
            return self.attempts.start(
                job,
                lease,
                run.origin,
                run.jitter,
                sent=run.sent,
                horizon_end=slot + run.horizon,
                store_now=_store_now_at_most(claim, latency),
            )
        if claim.outcome in (Outcome.SKIPPED, Outcome.PAUSED):
            self.log.info(job, slot, None, "slot %s", claim.outcome)
        elif claim.outcome == Outcome.EXPIRED:
            self.log.warn(job, slot, None, "slot abandoned: claimed past its horizon")
        elif claim.outcome == Outcome.LAPSED:
            self.log.warn(job, slot, 1, "not started: the claim's lease lapsed before its answer")
        return None

    async def _timed_claims(self, requests: list[ClaimRequest]) -> tuple[list[Claim], float]:
        """The claims' answers and their round trip in seconds, sampling the skew
        (store − local) from the first answer.

        A slow answer (a pool wait, a reconnect) says nothing about the clocks: its
        midpoint could be seconds off, so such samples are dropped.
        """
        loop = asyncio.get_running_loop()
        sent, sent_at = self.now(), loop.time()
        call = (
            _listed(self.backend.claim(requests[0]))
            if len(requests) == 1
            else self.backend.claim_many(requests)
        )
        claims = await self._uncut(call, functools.partial(_won_leases, requests))
        latency = loop.time() - sent_at
        received = self.now()
        first = claims[0].store_now if claims else None
        if (
            first is not None
            and self.backend.capabilities.store_clock
            and received - sent <= SKEW_SAMPLE_MAX_RTT_MS
        ):
            self._observe_skew(first - (sent + received) // 2)
        return claims, latency

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
            lambda: _timed(
                self._uncut(self.backend.take_over(request), lambda c: _won_leases([request], [c]))
            ),
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
        jobs = {name: job.spec() for name, job in self.jobs.items()}
        return InstanceInfo(
            instance_id=self.config.instance_id,
            host=socket.gethostname(),
            pid=os.getpid(),
            version=_version(),
            started_at=self._started_at,
            last_seen=0,
            jobs=jobs,
            jobs_json=jobs_json(self.config.instance_id, jobs),
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
                ranking = self.candidates.k is not None
                if ranking or periods % MISMATCH_CHECK_PERIODS == 0:
                    live = await self.backend.instances()
                    if ranking:
                        self._new_view(live)
                    if periods % MISMATCH_CHECK_PERIODS == 0:
                        self._check_fingerprints(live)
            except CapabilityError as exc:  # a store without a registry: nothing to refresh
                self.log.warn(None, None, None, "no instance registry: %s", exc)
                return
            except Exception as exc:
                self.telemetry.store_error("registry")
                self.log.warn(None, None, None, "registry refresh failed: %s", exc)
            periods += 1
            await asyncio.sleep(self.config.heartbeat_ms / 1000)

    def _new_view(self, live: list[InstanceInfo]) -> None:
        """Rank by a fresh registry read; rescue the passed slots of departed instances.

        An instance leaves the registry one lease after its last refresh, so its slots
        are rescued at most ``lease_ms + heartbeat_ms`` after it died.
        """
        now = self.now()
        departed = self.candidates.update((i.instance_id for i in live), now)
        if departed:
            self.log.info(None, None, None, "instance(s) left the registry: %s", sorted(departed))
            self._rescue(now)

    def _check_fingerprints(self, live: list[InstanceInfo]) -> None:
        """Warn when live replicas disagree about one of our jobs (a rolling deploy)."""
        mismatches = {
            job: prints for job, prints in fingerprint_mismatches(live).items() if job in self.jobs
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
        """Apply this instance's retention to its own jobs only.

        Services sharing a store each keep their own retention: pruning every job in
        the store with this instance's bound would delete other services' history.
        """
        mine = sorted(job.store_name for job in self.jobs.values())
        if not mine:
            return
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
                deleted = await self.backend.prune(self.now() - keep, jobs=mine)
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


async def _listed(call: Awaitable[T]) -> list[T]:
    return [await call]


def _won_leases(
    requests: Sequence[ClaimRequest | TakeoverRequest], claims: Sequence[Claim]
) -> list[Lease]:
    """The leases that ``claims``, the answers to ``requests``, won."""
    return [
        Lease(request.job, request.slot, claim.attempt, request.token)
        for request, claim in zip(requests, claims, strict=True)
        if claim.outcome == Outcome.WON
    ]


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
