"""The attempts this instance runs: the handler call, its outcome, the hand-over.

A won attempt runs in a task of its own; :class:`~.leases.Leases` keeps its lease from
the moment it was won until its outcome is recorded. An answer that arrives past the
attempt's self-fence deadline or its slot's horizon starts nothing. Each handler call
runs inside its telemetry span (current while it runs); an attempt is counted as a run
once its outcome is recorded. A stop hands over only attempts whose handler is still
running: one whose handler returned keeps resending its finish, since a backup would
run the handler a second time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NamedTuple

from ..backend import Backend, FinishRequest, Lease
from ..context import RunContext, bounded_meta
from ..job import Job
from ..records import Origin, Status, error_summary
from .execution import describe_exception, start_handler
from .leases import Attempt, Leases
from .support import Coalescer, EngineConfig, EngineLog, Where, retry_store

__all__ = ["Attempts", "BeforeStart"]

#: Awaited before a won attempt's handler starts; ``False``: release it instead.
BeforeStart = Callable[[], Awaitable[bool]]

#: Most finishes sent to the store in one request.
MAX_FINISH_BATCH = 500


class Ended(NamedTuple):
    """How a handler call ended: its status, error text and exception (if it raised)."""

    status: Status
    error: str | None = None
    exc: BaseException | None = None


class Attempts:
    """Runs won attempts and keeps their leases."""

    def __init__(self, backend: Backend, config: EngineConfig, log: EngineLog) -> None:
        self.backend = backend
        self.config = config
        self.log = log
        self.telemetry = config.telemetry
        self.leases = Leases(backend, config, log)
        self.tasks: set[asyncio.Task[Any]] = set()
        #: The task of each attempt started here, until it ends.
        self._running: dict[asyncio.Task[Any], Attempt] = {}
        self._lease = backend.capabilities.lease
        #: The finishes of one event-loop iteration go to the store as one request.
        self._finishes = Coalescer(self._finish_one, backend.finish_many, MAX_FINISH_BATCH)

    def start(
        self,
        job: Job,
        lease: Lease,
        origin: Origin,
        jitter: int,
        *,
        sent: float,
        horizon_end: int,
        store_now: int | None,
        before: BeforeStart | None = None,
    ) -> asyncio.Task[Any] | None:
        """Run a won attempt in a task of its own and return that task.

        ``sent`` is when (the loop's clock) the winning claim or takeover was first
        sent: the store started the lease no earlier, so self-fencing counts from there.
        An answer that arrives once that deadline has passed, or once the slot's
        horizon (``horizon_end``, epoch ms) has passed, starts nothing (``None``): a
        backup may already run the attempt after it, and a slot is never run late. The
        horizon is judged by ``store_now``, the store's clock now at the latest (its
        time in the answer plus the round trip), so that no clock skew enters; by the
        local clock where the store gave no time. The attempt is then released at once
        (``interrupted``: its handler never ran), so that a backup takes the run over, or
        ends it past its horizon, without waiting for the lease to expire. ``before`` is
        awaited, lease held, before the handler starts; ``False`` releases the attempt.
        """
        ctx = self._context(job, lease, lease.attempt, origin)
        ctx.jitter_ms = jitter
        attempt = Attempt(job, lease, ctx, last_ack=sent)
        if self._lease:
            reason = self._too_late(attempt, horizon_end, store_now)
            if reason is not None:
                self.telemetry.not_started(job.store_name, reason)
                self.log.warn(
                    "won, not started: the answer came %s",
                    "past the attempt's self-fence deadline"
                    if reason == "fence"
                    else "past the slot's horizon",
                    job=job,
                    slot=lease.slot,
                    attempt=lease.attempt,
                )
                self._track(asyncio.ensure_future(self._give_back(job, lease)))
                return None
            self.leases.hold(attempt)
        task = self._track(asyncio.ensure_future(self._run(attempt, before)))
        self._running[task] = attempt
        task.add_done_callback(self._running.pop)
        return task

    def _track(self, task: asyncio.Task[Any]) -> asyncio.Task[Any]:
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def give_back(self, won: Sequence[tuple[Job, Lease]]) -> None:
        """Release won attempts that will not be started here (see :meth:`_give_back`)."""
        await asyncio.gather(*(self._give_back(job, lease) for job, lease in won))

    async def _give_back(self, job: Job, lease: Lease) -> None:
        """Release a won attempt that was not started, so that its lease (fenced by its
        token, possibly taken over already) does not keep the run, and the job's next
        slots, blocked until it expires; a backup takes it over at once, or ends it
        past its horizon. A failed release only means waiting for the expiry."""
        try:
            await self.backend.release(lease)
        except Exception as exc:
            self.telemetry.store_error("release", job.store_name)
            self.log.warn(
                "could not release the attempt not started (it expires): %s",
                exc,
                job=job,
                slot=lease.slot,
                attempt=lease.attempt,
            )

    def _too_late(self, attempt: Attempt, horizon_end: int, store_now: int | None) -> str | None:
        """Why a won attempt may not start now (``fence`` or ``horizon``), or ``None``."""
        if asyncio.get_running_loop().time() >= attempt.last_ack + self.leases.fence_window_s:
            return "fence"
        if (self.config.clock() if store_now is None else store_now) > horizon_end:
            return "horizon"
        return None

    def _context(self, job: Job, lease: Lease, number: int, origin: Origin) -> RunContext:
        return RunContext(
            job=job.name,
            slot=lease.slot,
            attempt=number,
            instance_id=self.config.instance_id,
            origin=origin,
            loop=asyncio.get_running_loop(),
            logger=self.config.logger,
            lease=lease,
        )

    async def _run(self, attempt: Attempt, before: BeforeStart | None) -> None:
        job, lease, ctx = attempt.job, attempt.lease, attempt.ctx
        where: Where = {"job": job, "slot": lease.slot, "attempt": lease.attempt}
        try:
            if before is not None and not await before():
                attempt.released = True
                await self._give_back(job, lease)
                return
            if attempt.lost or attempt.released:  # fenced while it waited: never start it
                self.log.warn("not started: lost its lease before its handler started", **where)
                return
            self.log.info("run started (%s)", ctx.origin, **where)
            self.telemetry.run_started(job.store_name, (self.config.clock() - lease.slot) / 1000)
            began = asyncio.get_running_loop().time()
            ended = await self._call(attempt)
            if not self._lease:
                ended = await self._retry_in_process(attempt, ended)
            status, error = ended.status, ended.error
            if (attempt.lost or attempt.released) and not attempt.ctx.recorded:
                self.log.warn(
                    "run ended after losing its lease (%s): outcome not recorded",
                    ctx.cancel_reason,
                    **where,
                )
                return
            attempt.finishing = True  # from here on, never handed over
            retry_in = self._retry_delay(job, lease.attempt) if status == Status.FAILED else None
            self._report(ended, where)
            duration = asyncio.get_running_loop().time() - began
            if await self._finish(attempt, status, error, retry_in):
                self.telemetry.run_ended(job.store_name, status, duration, self.config.clock())
        finally:
            attempt.done = True
            self.leases.drop(attempt)

    def _report(self, ended: Ended, where: Where) -> None:
        """Log a run's outcome: a handler that raised is an ERROR with its exception
        attached (what error trackers pick up), a timeout or a cancellation a WARNING."""
        if ended.status == Status.SUCCESS:
            self.log.info("run success", **where)
        elif ended.exc is not None:
            summary = error_summary(ended.error)
            self.log.error("run failed: %s", summary, exc_info=ended.exc, **where)
        else:
            self.log.warn("run failed: %s", ended.error, **where)

    async def _call(self, attempt: Attempt) -> Ended:
        """One handler call, inside its span: the handler's own spans nest under it."""
        with self.telemetry.run_span(attempt.job.store_name, attempt.ctx) as span:
            ended = await self._invoke(attempt)
            if (attempt.lost or attempt.released) and not attempt.ctx.recorded:
                span.end(Status.INTERRUPTED, reason=attempt.ctx.cancel_reason)
            else:
                span.end(ended.status, ended.exc, None if ended.exc is not None else ended.error)
        return ended

    async def _invoke(self, attempt: Attempt) -> Ended:
        """Call the handler; its status, error text and exception (if it raised)."""
        job, ctx = attempt.job, attempt.ctx
        try:
            future = start_handler(job, ctx)
        except Exception as exc:  # an async handler that raised before its first await
            return Ended(Status.FAILED, describe_exception(exc), exc)
        attempt.future = future
        timeout_ms = job.options.timeout_ms
        try:
            done, _ = await asyncio.wait(
                {future}, timeout=timeout_ms / 1000 if timeout_ms else None
            )
        except asyncio.CancelledError:
            future.cancel()
            raise
        if not done:
            attempt.signal("timeout")
            return Ended(Status.FAILED, f"timed out after {timeout_ms} ms")
        if future.cancelled():
            return Ended(Status.FAILED, f"cancelled ({ctx.cancel_reason or 'by the handler'})")
        error = future.exception()
        if error is not None:
            return Ended(Status.FAILED, describe_exception(error), error)
        return Ended(Status.SUCCESS)

    async def _retry_in_process(self, attempt: Attempt, ended: Ended) -> Ended:
        """Claim-only stores cannot hand a retry to another instance: retry here.

        The handler runs again with ``ctx.attempt`` counting up, after the same
        doubling backoff, while ``retries`` and ``max_attempts`` allow; the store
        records the outcome of the last one.
        """
        job, lease = attempt.job, attempt.lease
        number = 1
        while ended.status == Status.FAILED and number <= job.options.retries:
            if number >= job.options.max_attempts:
                break
            delay = job.options.retry_backoff_ms * 2 ** (number - 1)
            self.log.warn(
                "failed, retrying in this process in %d ms: %s",
                delay,
                error_summary(ended.error),
                job=job,
                slot=lease.slot,
                attempt=number,
            )
            await asyncio.sleep(delay / 1000)
            number += 1
            attempt.ctx = self._context(job, lease, number, attempt.ctx.origin)
            ended = await self._call(attempt)
        return ended

    def _retry_delay(self, job: Job, attempt: int) -> int | None:
        """Retry after a failure while retries and attempts remain (lease backends)."""
        options = job.options
        if not self._lease or attempt > options.retries or attempt >= options.max_attempts:
            return None
        delay: int = options.retry_backoff_ms * 2 ** (attempt - 1)
        return delay

    async def _finish(
        self, attempt: Attempt, status: Status, error: str | None, retry_in: int | None
    ) -> bool:
        """Record the outcome; False if the store rejected it (this attempt was fenced)."""
        if not self.backend.capabilities.finish:
            return True  # the claim is all such a store records
        meta = bounded_meta(attempt.ctx.meta)
        job, lease = attempt.job, attempt.lease
        request = FinishRequest(lease, status, error, meta, retry_in)
        ok = await retry_store(
            lambda: self._finishes.call(request),
            what="finish",
            config=self.config,
            log=self.log,
            # The run keeps its lease (and blocks overlapping slots) until the finish
            # lands: retry at heartbeat pace, not with a long backoff.
            max_delay_s=self.config.heartbeat_ms / 1000,
            job=job,
            slot=lease.slot,
            attempt=lease.attempt,
        )
        if ok is False:
            self.telemetry.fenced(job.store_name, "finish")
            self.log.warn(
                "finish rejected: this attempt was fenced",
                job=job,
                slot=lease.slot,
                attempt=lease.attempt,
            )
            return False
        return True

    async def _finish_one(self, request: FinishRequest) -> bool:
        return await self.backend.finish(
            request.lease,
            request.status,
            error=request.error,
            meta=request.meta,
            retry_in_ms=request.retry_in_ms,
        )

    # -- stop --------------------------------------------------------------------------
    @staticmethod
    def _returned(attempt: Attempt) -> bool:
        """The handler has returned (its outcome is being recorded, or about to be)."""
        return attempt.finishing or (attempt.future is not None and attempt.future.done())

    async def hand_over(self) -> None:
        """Cancel the handlers that still run and release their leases, so that a backup
        starts at once. An attempt whose handler returned is not handed over (a backup
        would run it again): its finish goes on, see :meth:`drain_finishes`."""
        running = {
            task: a for task, a in self._running.items() if not (a.done or self._returned(a))
        }
        for attempt in running.values():
            attempt.released = True
            attempt.signal("stopping")
        held = [a for a in running.values() if a in self.leases.held.values()]
        if self._lease and held:
            results = await asyncio.gather(
                *(self.backend.release(a.lease) for a in held), return_exceptions=True
            )
            for attempt, result in zip(held, results, strict=True):
                where: Where = {
                    "job": attempt.job,
                    "slot": attempt.lease.slot,
                    "attempt": attempt.lease.attempt,
                }
                if isinstance(result, BaseException):
                    self.telemetry.store_error("release", attempt.job.store_name)
                    self.log.warn(
                        "could not release the lease at stop (a backup "
                        "takes over after expiry): %s",
                        result,
                        **where,
                    )
                else:
                    self.telemetry.handed_over(attempt.job.store_name)
                    self.log.info("handed over at stop", **where)
        finishing = {task for task, a in self._running.items() if task not in running}
        for task in self.tasks - finishing:
            task.cancel()

    async def drain_finishes(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for the finishes still being sent at a stop; one that
        cannot land by then is left to its lease's expiry, as after a crash (the store
        cannot know that the handler returned: a backup runs it again)."""
        finishing = {
            task: a for task, a in self._running.items() if not task.done() and self._returned(a)
        }
        if not finishing:
            return
        _, pending = await asyncio.wait(finishing, timeout=max(timeout_s, 0.0))
        for task in pending:
            attempt = finishing[task]
            self.log.warn(
                "stopping with its outcome not recorded: its lease expires, and a backup "
                "may run it again",
                job=attempt.job,
                slot=attempt.lease.slot,
                attempt=attempt.lease.attempt,
            )
            task.cancel()

    def close(self) -> None:
        """Every attempt has ended: no self-fence is due any more."""
        self.leases.close()
