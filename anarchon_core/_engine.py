"""The asyncio engine: slot loops, claims, attempts, heartbeats, takeovers, hand-over.

One :class:`Engine` lives between ``Scheduler.start()`` and ``stop()``. It runs
one task per job that sleeps to each slot (plus jitter) and claims it, one task
that heartbeats every held lease in a batch, one that sweeps the store for runs to
continue (expired leases and due retries: the *backup* role of SPEC §4.6, batched
for all jobs), and one that prunes history. Every store call survives an outage:
it is logged, counted and retried with backoff, never raised out of a loop.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import secrets
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ._execution import describe_exception, start_handler
from .backend import Backend, Claim, ClaimRequest, DueRun, Lease, TakeoverRequest
from .context import RunContext
from .errors import SchemaVersionError
from .job import MAX_CATCH_UP_SLOTS, MAX_MISFIRE_GRACE_MS, Job
from .records import Origin, Outcome, Status

__all__ = ["Engine"]

T = TypeVar("T")

#: A slot this far past its horizon by the local estimate of the store clock is not
#: even sent to the store (it would come back EXPIRED).
HORIZON_MARGIN_MS = 1000
#: Prune history at most this often per instance.
PRUNE_EVERY_S = 3600.0
MAX_META_BYTES = 1024


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(eq=False)
class _Attempt:
    """An attempt this instance runs."""

    job: Job
    lease: Lease
    ctx: RunContext
    last_ack: float
    future: asyncio.Future[Any] | None = None
    deadline: asyncio.TimerHandle | None = None
    lost: bool = False
    done: bool = False
    released: bool = False


@dataclass
class EngineConfig:
    instance_id: str
    heartbeat_ms: int
    lease_ms: int
    history_retention_ms: int
    logger: logging.Logger
    clock: Callable[[], int] = wall_ms


@dataclass
class _Tasks:
    loops: set[asyncio.Future[Any]] = field(default_factory=set)
    runs: set[asyncio.Task[Any]] = field(default_factory=set)


class Engine:
    """The running state of one started scheduler."""

    def __init__(self, backend: Backend, jobs: Mapping[str, Job], config: EngineConfig) -> None:
        self.backend = backend
        self.config = config
        self.jobs = {job.store_name: job for job in jobs.values()}
        self.stats: Counter[str] = Counter()
        self.skew_ms = 0
        self._lease = backend.capabilities.lease
        self._held: dict[tuple[str, int], _Attempt] = {}
        self._tasks = _Tasks()
        self._stopping = False
        self._heartbeat_task: asyncio.Future[Any] | None = None
        self._log = config.logger

    # -- life cycle --------------------------------------------------------------
    async def start(self) -> None:
        """Open the store (retrying in the background if it is down) and start the loops."""
        try:
            await self.backend.open()
        except SchemaVersionError:
            raise
        except Exception as exc:
            self._warn(None, None, None, "store unavailable at start, retrying: %s", exc)
            self._spawn(self._open_then_run())
            return
        self._start_loops()

    async def _open_then_run(self) -> None:
        await self._retry(self.backend.open, what="open", deadline=None)
        self._start_loops()

    def _start_loops(self) -> None:
        for job in self.jobs.values():
            self._spawn(self._job_loop(job))
            if self._lease and job.options.catch_up != "none":
                self._spawn(self._catch_up(job))
        if self._lease:
            self._heartbeat_task = self._spawn(self._heartbeat_loop())
            self._spawn(self._sweep_loop())
        self._spawn(self._prune_loop())

    def _spawn(self, coro: Awaitable[Any]) -> asyncio.Future[Any]:
        task = asyncio.ensure_future(coro)
        self._tasks.loops.add(task)
        task.add_done_callback(self._loop_ended)
        return task

    def _loop_ended(self, task: asyncio.Future[Any]) -> None:
        self._tasks.loops.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self._log.error("engine loop crashed", exc_info=task.exception())

    async def stop(self, grace_ms: int) -> None:
        """Stop claiming, wait up to ``grace_ms`` for runs, then hand the rest over."""
        self._stopping = True
        for task in list(self._tasks.loops):
            if task is not self._heartbeat_task:  # runs keep their leases until handed over
                task.cancel()
        if self._tasks.runs:
            await asyncio.wait(set(self._tasks.runs), timeout=grace_ms / 1000)
        await self._hand_over()
        if self._heartbeat_task is not None:
            self._heartbeat_task.cancel()
        await asyncio.gather(*self._tasks.loops, *self._tasks.runs, return_exceptions=True)
        await self.backend.close()

    async def _hand_over(self) -> None:
        """Cancel what is still running and release its leases so a backup starts at once."""
        remaining = [a for a in self._held.values() if not a.done]
        for attempt in remaining:
            attempt.released = True
            self._signal(attempt, "stopping")
        if self._lease and remaining:
            results = await asyncio.gather(
                *(self.backend.release(a.lease) for a in remaining), return_exceptions=True
            )
            for attempt, result in zip(remaining, results, strict=True):
                if isinstance(result, BaseException):
                    self._warn(attempt.job, attempt.lease.slot, attempt.lease.attempt,
                               "could not release the lease at stop (a backup takes over "
                               "after expiry): %s", result)
                else:
                    self.stats["handed_over"] += 1
                    self._info(attempt.job, attempt.lease.slot, attempt.lease.attempt,
                               "handed over at stop")
        for task in list(self._tasks.runs):
            task.cancel()

    # -- slots -------------------------------------------------------------------
    def now(self) -> int:
        return self.config.clock()

    async def _sleep_until(self, target_ms: int) -> None:
        delay = target_ms - self.now()
        if delay > 0:
            await asyncio.sleep(delay / 1000)

    async def _job_loop(self, job: Job) -> None:
        slot = job.schedule.next_slot(self.now())
        while True:
            bound = job.jitter_bound_ms(slot)
            jitter = random.randint(0, bound) if bound > 0 else 0
            await self._sleep_until(slot + jitter)
            horizon = job.horizon_ms(slot)
            if self.now() + self.skew_ms > slot + horizon + HORIZON_MARGIN_MS:
                self.stats["abandoned"] += 1
                self._warn(job, slot, None, "slot abandoned: past its horizon of %d ms", horizon)
            else:
                await self._claim(job, slot, Origin.SCHEDULE, horizon, jitter)
            slot = job.schedule.next_slot(slot)

    async def _catch_up(self, job: Job) -> None:
        """Claim, in order and one at a time, the slots missed since the last recorded run."""
        last = await self._retry(
            lambda: self.backend.last_scheduled_slot(job.store_name), what="catch-up read"
        )
        if last is None:
            return
        now = self.now()
        window = job.options.catch_up_window_ms
        missed = job.schedule.slots_between(max(last, now - window), now)[-MAX_CATCH_UP_SLOTS:]
        if job.options.catch_up == "latest":
            missed = missed[-1:]
        if missed:
            self._info(job, None, None, "catching up %d missed slot(s)", len(missed))
        for slot in missed:
            run = await self._claim(job, slot, Origin.CATCH_UP, window, 0, skip_overlap=False)
            if run is not None:
                await asyncio.wait({run})

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
        token = secrets.token_hex(16)
        request = ClaimRequest(
            job=job.store_name,
            slot=slot,
            origin=origin,
            token=token,
            instance_id=self.config.instance_id,
            lease_ms=self.config.lease_ms,
            horizon_ms=horizon,
            skip_overlap=(job.options.overlap == "skip") if skip_overlap is None else skip_overlap,
            fingerprint=job.fingerprint(),
        )
        while True:
            sent = self.now()
            claim = await self._retry(
                lambda: self.backend.claim(request), what="claim", deadline=slot + horizon
            )
            if claim is None:
                claim = Claim(Outcome.EXPIRED)
            self._observe_skew(claim, sent)
            self.stats[f"claim_{claim.outcome}"] += 1
            if claim.outcome != Outcome.EARLY:
                break
            await asyncio.sleep(max(slot - (claim.store_now or slot), 10) / 1000)
        if claim.outcome == Outcome.WON:
            lease = Lease(job.store_name, slot, claim.attempt, token)
            return self._start_attempt(job, lease, origin, jitter)
        if claim.outcome in (Outcome.SKIPPED, Outcome.PAUSED):
            self._info(job, slot, None, "slot %s", claim.outcome)
        elif claim.outcome == Outcome.EXPIRED:
            self._warn(job, slot, None, "slot abandoned: claimed past its horizon")
        return None

    def _observe_skew(self, claim: Claim, sent: int) -> None:
        if claim.store_now is not None and self.backend.capabilities.store_clock:
            self.skew_ms = claim.store_now - (sent + self.now()) // 2

    # -- attempts ------------------------------------------------------------------
    def _start_attempt(
        self, job: Job, lease: Lease, origin: Origin, jitter: int
    ) -> asyncio.Task[Any]:
        ctx = RunContext(
            job=job.name,
            slot=lease.slot,
            attempt=lease.attempt,
            instance_id=self.config.instance_id,
            origin=origin,
            loop=asyncio.get_running_loop(),
            logger=self._log,
        )
        ctx.jitter_ms = jitter
        attempt = _Attempt(job, lease, ctx, last_ack=time.monotonic())
        if self._lease:
            self._held[(lease.job, lease.slot)] = attempt
            self._arm_self_fence(attempt)
        task = asyncio.ensure_future(self._run_attempt(attempt))
        self._tasks.runs.add(task)
        task.add_done_callback(self._tasks.runs.discard)
        return task

    async def _run_attempt(self, attempt: _Attempt) -> None:
        job, lease, ctx = attempt.job, attempt.lease, attempt.ctx
        self._info(job, lease.slot, lease.attempt, "run started (%s)", ctx.origin)
        try:
            status, error = await self._call(attempt)
            if attempt.lost or attempt.released:
                self._warn(job, lease.slot, lease.attempt,
                           "run ended after losing its lease (%s): outcome not recorded",
                           ctx.cancel_reason)
                return
            retry_in = self._retry_delay(job, lease.attempt) if status == Status.FAILED else None
            log = self._info if status == Status.SUCCESS else self._warn
            log(job, lease.slot, lease.attempt, "run %s%s", status, f": {error}" if error else "")
            self.stats[f"run_{status}"] += 1
            await self._finish(attempt, status, error, retry_in)
        finally:
            attempt.done = True
            if attempt.deadline is not None:
                attempt.deadline.cancel()
            self._held.pop((lease.job, lease.slot), None)

    async def _call(self, attempt: _Attempt) -> tuple[Status, str | None]:
        job, ctx = attempt.job, attempt.ctx
        try:
            future = start_handler(job, ctx)
        except Exception as exc:  # an async handler that raised before its first await
            return Status.FAILED, describe_exception(exc)
        attempt.future = future
        timeout_ms = job.options.timeout_ms
        try:
            done, _ = await asyncio.wait({future}, timeout=timeout_ms / 1000 if timeout_ms else None)
        except asyncio.CancelledError:
            future.cancel()
            raise
        if not done:
            self._signal(attempt, "timeout")
            return Status.FAILED, f"timed out after {timeout_ms} ms"
        if future.cancelled():
            return Status.FAILED, f"cancelled ({ctx.cancel_reason or 'by the handler'})"
        exc = future.exception()
        if exc is not None:
            return Status.FAILED, describe_exception(exc)
        return Status.SUCCESS, None

    def _retry_delay(self, job: Job, attempt: int) -> int | None:
        """Retry after a failure while retries and attempts remain (lease backends)."""
        if not self._lease or attempt > job.options.retries or attempt >= job.options.max_attempts:
            return None
        return job.options.retry_backoff_ms * 2 ** (attempt - 1)

    async def _finish(
        self, attempt: _Attempt, status: Status, error: str | None, retry_in: int | None
    ) -> None:
        if not self.backend.capabilities.finish:
            return
        meta = self._bounded_meta(attempt)
        ok = await self._retry(
            lambda: self.backend.finish(
                attempt.lease, status, error=error, meta=meta, retry_in_ms=retry_in
            ),
            what="finish",
            deadline=None,
        )
        if ok is False:
            self.stats["fenced_finish"] += 1
            self._warn(attempt.job, attempt.lease.slot, attempt.lease.attempt,
                       "finish rejected: this attempt was fenced")

    def _bounded_meta(self, attempt: _Attempt) -> dict[str, Any]:
        meta = attempt.ctx.meta
        try:
            size = len(json.dumps(meta).encode())
        except (TypeError, ValueError) as exc:
            return {"meta_error": f"ctx.meta is not JSON-serialisable: {exc}"}
        if size > MAX_META_BYTES:
            return {"meta_error": f"ctx.meta is {size} bytes; at most {MAX_META_BYTES} are kept"}
        return dict(meta)

    def _signal(self, attempt: _Attempt, reason: str) -> None:
        attempt.ctx._cancel(reason)
        if attempt.job.is_async and attempt.future is not None:
            attempt.future.cancel()

    # -- leases ------------------------------------------------------------------
    def _arm_self_fence(self, attempt: _Attempt) -> None:
        """Stop a runner before any backup could take over if its heartbeats go unanswered."""
        if attempt.deadline is not None:
            attempt.deadline.cancel()
        limit = (self.config.lease_ms - self.config.heartbeat_ms) / 1000
        loop = asyncio.get_running_loop()
        when = loop.time() + limit - (time.monotonic() - attempt.last_ack)
        attempt.deadline = loop.call_at(when, self._lose, attempt, "no heartbeat acknowledged")

    def _lose(self, attempt: _Attempt, reason: str) -> None:
        if attempt.done or attempt.lost:
            return
        attempt.lost = True
        self.stats["lost_lease"] += 1
        self._warn(attempt.job, attempt.lease.slot, attempt.lease.attempt, "lost the run: %s",
                   reason)
        self._signal(attempt, f"lease lost: {reason}")

    async def _heartbeat_loop(self) -> None:
        period = self.config.heartbeat_ms / 1000
        while True:
            await asyncio.sleep(period)
            held = [a for a in self._held.values() if not (a.done or a.lost)]
            if not held:
                continue
            sent = time.monotonic()
            try:
                verdicts = await self.backend.heartbeat(
                    [a.lease for a in held], self.config.lease_ms
                )
            except Exception as exc:
                self.stats["store_errors"] += 1
                self._warn(None, None, None, "heartbeat failed: %s", exc)
                continue
            for attempt, ok in zip(held, verdicts, strict=True):
                if attempt.done or attempt.released:
                    continue
                if ok:
                    attempt.last_ack = sent
                    self._arm_self_fence(attempt)
                else:
                    self.stats["fenced_heartbeat"] += 1
                    self._lose(attempt, "heartbeat rejected by the store")

    async def _sweep_loop(self) -> None:
        """Continue runs whose runner died or whose retry is due (any of our jobs)."""
        names = frozenset(self.jobs)
        while True:
            await asyncio.sleep(self.config.heartbeat_ms * random.uniform(1, 2) / 1000)
            try:
                due = await self.backend.due_runs(names)
            except Exception as exc:
                self.stats["store_errors"] += 1
                self._warn(None, None, None, "sweep failed: %s", exc)
                continue
            for run in due:
                if (run.job, run.slot) not in self._held and run.job in self.jobs:
                    await self._take_over(run)

    async def _take_over(self, run: DueRun) -> None:
        job = self.jobs[run.job]
        horizon = (
            job.options.catch_up_window_ms if run.origin == Origin.CATCH_UP
            else job.horizon_ms(run.slot) if run.origin == Origin.SCHEDULE
            else MAX_MISFIRE_GRACE_MS
        )
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
        try:
            claim = await self.backend.take_over(request)
        except Exception as exc:
            self.stats["store_errors"] += 1
            self._warn(job, run.slot, run.attempt + 1, "takeover failed: %s", exc)
            return
        self.stats[f"takeover_{claim.outcome}"] += 1
        if claim.outcome == Outcome.WON:
            self._info(job, run.slot, claim.attempt, "took over the run (%s)", run.reason)
            self._start_attempt(job, Lease(run.job, run.slot, claim.attempt, token), run.origin, 0)
        elif claim.outcome in (Outcome.EXHAUSTED, Outcome.EXPIRED):
            self._warn(job, run.slot, run.attempt,
                       "run ended interrupted: %s", "max_attempts reached"
                       if claim.outcome == Outcome.EXHAUSTED else "past its horizon")

    async def _prune_loop(self) -> None:
        await asyncio.sleep(random.uniform(10, 60))
        keep = max(
            [self.config.history_retention_ms]
            + [j.options.catch_up_window_ms + MAX_MISFIRE_GRACE_MS for j in self.jobs.values()]
        )
        while True:
            try:
                deleted = await self.backend.prune(self.now() - keep)
                if deleted:
                    self._info(None, None, None, "pruned %d history record(s)", deleted)
            except Exception as exc:
                self._warn(None, None, None, "prune failed: %s", exc)
            await asyncio.sleep(PRUNE_EVERY_S * random.uniform(0.9, 1.1))

    # -- plumbing ------------------------------------------------------------------
    async def _retry(
        self,
        call: Callable[[], Awaitable[T]],
        *,
        what: str,
        deadline: int | None = None,
    ) -> T | None:
        """Call the store until it answers; ``None`` once ``deadline`` (epoch ms) passed."""
        delay = 0.05
        while True:
            try:
                return await call()
            except SchemaVersionError:
                raise
            except Exception as exc:
                self.stats["store_errors"] += 1
                if deadline is not None and self.now() >= deadline:
                    self._warn(None, None, None, "%s gave up, store unavailable: %s", what, exc)
                    return None
                self._warn(None, None, None, "%s failed, retrying in %.2fs: %s", what, delay, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    def _extra(self, job: Job | None, slot: int | None, attempt: int | None) -> dict[str, Any]:
        return {
            "job": job.name if job else None,
            "slot": slot,
            "attempt": attempt,
            "instance": self.config.instance_id,
        }

    def _info(self, job: Job | None, slot: int | None, attempt: int | None, msg: str,
              *args: Any) -> None:
        self._log.info(_prefix(job, slot, attempt) + msg, *args,
                       extra=self._extra(job, slot, attempt))

    def _warn(self, job: Job | None, slot: int | None, attempt: int | None, msg: str,
              *args: Any) -> None:
        self._log.warning(_prefix(job, slot, attempt) + msg, *args,
                          extra=self._extra(job, slot, attempt))


def _prefix(job: Job | None, slot: int | None, attempt: int | None) -> str:
    if job is None:
        return ""
    where = job.name if slot is None else f"{job.name}@{slot}"
    return f"[{where}#{attempt}] " if attempt else f"[{where}] "
