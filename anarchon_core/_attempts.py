"""The attempts this instance runs: the handler call, heartbeats, fencing, finish, hand-over.

Every held attempt is in :attr:`Attempts.held` from the moment its claim or takeover
was won until its outcome is recorded, so that its lease keeps being extended while
the finish mark is (re)sent. The heartbeat is one batched store call per period for
all held attempts; each acknowledgement moves the attempt's self-fence deadline to
``lease_ms − heartbeat_ms`` after that heartbeat was sent, and one timer fences every
runner whose deadline passes (the store stopped answering). The first deadline counts
from the first send of the winning claim or takeover, and an answer that arrives after
it starts nothing. Every time here is the event loop's clock, so a loop on virtual
time runs the whole protocol on it.
Each handler call runs inside its telemetry span (current while it runs); an attempt
is counted as a run once its outcome is recorded.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ._execution import describe_exception, start_handler
from ._support import Coalescer, EngineConfig, EngineLog, retry_store
from .backend import Backend, FinishRequest, Lease
from .context import RunContext, bounded_meta
from .job import Job
from .records import Origin, Status

__all__ = ["Attempt", "Attempts"]

#: Most finishes sent to the store in one request.
MAX_FINISH_BATCH = 500


@dataclass(eq=False)
class Attempt:
    """An attempt this instance runs."""

    job: Job
    lease: Lease
    ctx: RunContext
    #: When (loop time) the last acknowledged heartbeat was sent; at first, when the
    #: claim or takeover that won the attempt was first sent.
    last_ack: float
    future: asyncio.Future[Any] | None = None
    #: When (loop time) it fences itself unless a heartbeat is acknowledged first.
    fence_at: float = float("inf")
    lost: bool = False
    done: bool = False
    released: bool = False
    #: Its finish mark was sent: a heartbeat refused (or unanswered) from then on may be
    #: so because that mark landed first; the finish's own answer tells if it was fenced.
    finishing: bool = False


class Attempts:
    """Runs won attempts and keeps their leases."""

    def __init__(self, backend: Backend, config: EngineConfig, log: EngineLog) -> None:
        self.backend = backend
        self.config = config
        self.log = log
        self.telemetry = config.telemetry
        self.held: dict[tuple[str, int], Attempt] = {}
        self.tasks: set[asyncio.Task[Any]] = set()
        self._lease = backend.capabilities.lease
        #: One timer for every held attempt's self-fence, set for the soonest.
        self._fence_timer: asyncio.TimerHandle | None = None
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
        ends it past its horizon, without waiting for the lease to expire.
        """
        ctx = self._context(job, lease, lease.attempt, origin)
        ctx.jitter_ms = jitter
        attempt = Attempt(job, lease, ctx, last_ack=sent)
        if self._lease:
            reason = self._too_late(attempt, horizon_end, store_now)
            if reason is not None:
                self.telemetry.not_started(job.store_name, reason)
                self.log.warn(
                    job,
                    lease.slot,
                    lease.attempt,
                    "won, not started: the answer came %s",
                    "past the attempt's self-fence deadline"
                    if reason == "fence"
                    else "past the slot's horizon",
                )
                self._track(asyncio.ensure_future(self._give_back(job, lease)))
                return None
            self.held[(lease.job, lease.slot)] = attempt
            self._arm_self_fence(attempt)
        return self._track(asyncio.ensure_future(self._run(attempt)))

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
                job,
                lease.slot,
                lease.attempt,
                "could not release the attempt not started (it expires): %s",
                exc,
            )

    def _too_late(self, attempt: Attempt, horizon_end: int, store_now: int | None) -> str | None:
        """Why a won attempt may not start now (``fence`` or ``horizon``), or ``None``."""
        if asyncio.get_running_loop().time() >= attempt.last_ack + self._fence_window_s:
            return "fence"
        if (self.config.clock() if store_now is None else store_now) > horizon_end:
            return "horizon"
        return None

    @property
    def _fence_window_s(self) -> float:
        """How long a runner may go without an acknowledged heartbeat before it fences."""
        return (self.config.lease_ms - self.config.heartbeat_ms) / 1000

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

    async def _run(self, attempt: Attempt) -> None:
        job, lease, ctx = attempt.job, attempt.lease, attempt.ctx
        self.log.info(job, lease.slot, lease.attempt, "run started (%s)", ctx.origin)
        self.telemetry.run_started(job.store_name, (self.config.clock() - lease.slot) / 1000)
        began = asyncio.get_running_loop().time()
        try:
            status, error = await self._call(attempt)
            if not self._lease:
                status, error = await self._retry_in_process(attempt, status, error)
            if (attempt.lost or attempt.released) and not attempt.ctx.recorded:
                self.log.warn(
                    job,
                    lease.slot,
                    lease.attempt,
                    "run ended after losing its lease (%s): outcome not recorded",
                    ctx.cancel_reason,
                )
                return
            retry_in = self._retry_delay(job, lease.attempt) if status == Status.FAILED else None
            log = self.log.info if status == Status.SUCCESS else self.log.warn
            log(job, lease.slot, lease.attempt, "run %s%s", status, f": {error}" if error else "")
            duration = asyncio.get_running_loop().time() - began
            if await self._finish(attempt, status, error, retry_in):
                self.telemetry.run_ended(job.store_name, status, duration, self.config.clock())
        finally:
            attempt.done = True
            if self.held.get((lease.job, lease.slot)) is attempt:
                del self.held[(lease.job, lease.slot)]

    async def _call(self, attempt: Attempt) -> tuple[Status, str | None]:
        """One handler call, inside its span: the handler's own spans nest under it."""
        with self.telemetry.run_span(attempt.job.store_name, attempt.ctx) as span:
            status, error, exc = await self._invoke(attempt)
            if (attempt.lost or attempt.released) and not attempt.ctx.recorded:
                span.end(Status.INTERRUPTED, reason=attempt.ctx.cancel_reason)
            else:
                span.end(status, exc, None if exc is not None else error)
        return status, error

    async def _invoke(self, attempt: Attempt) -> tuple[Status, str | None, BaseException | None]:
        """Call the handler; its status, error text and exception (if it raised)."""
        job, ctx = attempt.job, attempt.ctx
        try:
            future = start_handler(job, ctx)
        except Exception as exc:  # an async handler that raised before its first await
            return Status.FAILED, describe_exception(exc), exc
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
            self._signal(attempt, "timeout")
            return Status.FAILED, f"timed out after {timeout_ms} ms", None
        if future.cancelled():
            return Status.FAILED, f"cancelled ({ctx.cancel_reason or 'by the handler'})", None
        error = future.exception()
        if error is not None:
            return Status.FAILED, describe_exception(error), error
        return Status.SUCCESS, None, None

    async def _retry_in_process(
        self, attempt: Attempt, status: Status, error: str | None
    ) -> tuple[Status, str | None]:
        """Claim-only stores cannot hand a retry to another instance: retry here.

        The handler runs again with ``ctx.attempt`` counting up, after the same
        doubling backoff, while ``retries`` and ``max_attempts`` allow; the store
        records the outcome of the last one.
        """
        job, lease = attempt.job, attempt.lease
        number = 1
        while status == Status.FAILED and number <= job.options.retries:
            if number >= job.options.max_attempts:
                break
            delay = job.options.retry_backoff_ms * 2 ** (number - 1)
            self.log.warn(
                job,
                lease.slot,
                number,
                "failed, retrying in this process in %d ms: %s",
                delay,
                error,
            )
            await asyncio.sleep(delay / 1000)
            number += 1
            attempt.ctx = self._context(job, lease, number, attempt.ctx.origin)
            status, error = await self._call(attempt)
        return status, error

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
        attempt.finishing = True
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
                job, lease.slot, lease.attempt, "finish rejected: this attempt was fenced"
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

    def _signal(self, attempt: Attempt, reason: str) -> None:
        attempt.ctx._cancel(reason)
        if attempt.job.is_async and attempt.future is not None:
            attempt.future.cancel()

    # -- leases ------------------------------------------------------------------
    def _arm_self_fence(self, attempt: Attempt) -> None:
        """Stop a runner before any backup could take over if its heartbeats go unanswered.

        One timer serves every held attempt (a timer per attempt, re-made at every
        acknowledgement, would be thousands of long-lived timer handles to collect): it
        is set no later than the soonest deadline (an acknowledgement moves deadlines
        later and leaves it early) and, when it fires, fences what is due and is set
        again for the soonest deadline left.
        """
        loop = asyncio.get_running_loop()
        attempt.fence_at = attempt.last_ack + self._fence_window_s
        timer = self._fence_timer
        if timer is None or attempt.fence_at < timer.when():
            self._set_fence_timer(loop, attempt.fence_at)

    def _set_fence_timer(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self._fence_timer is not None:
            self._fence_timer.cancel()
        self._fence_timer = loop.call_at(when, self._fence_due, loop, when)

    def close(self) -> None:
        """Cancel the self-fence timer (every attempt has ended)."""
        if self._fence_timer is not None:
            self._fence_timer.cancel()
            self._fence_timer = None

    def _fence_due(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        """Fence every held attempt whose deadline has come (the loop runs a timer
        slightly before its time, within the clock's resolution); wait for the next."""
        self._fence_timer = None
        now = max(loop.time(), when)
        live = [a for a in self.held.values() if not (a.done or a.lost or a.released)]
        later = [a.fence_at for a in live if a.fence_at > now]
        if later:  # first: a failure below must not stop the other attempts' fencing
            self._set_fence_timer(loop, min(later))
        for attempt in live:
            if attempt.fence_at <= now:
                try:
                    self._lose(attempt, "no heartbeat acknowledged")
                except Exception as exc:  # a logging filter or a metrics exporter
                    loop.call_exception_handler(
                        {"message": "anarchon: self-fencing an attempt failed", "exception": exc}
                    )

    def _lose(self, attempt: Attempt, reason: str) -> None:
        if attempt.done or attempt.lost or attempt.finishing:  # the finish's answer decides
            return
        attempt.lost = True
        self.telemetry.lost_lease(attempt.job.store_name)
        self.log.warn(
            attempt.job, attempt.lease.slot, attempt.lease.attempt, "lost the run: %s", reason
        )
        self._signal(attempt, f"lease lost: {reason}")

    async def heartbeat_loop(self) -> None:
        """Extend every held lease once per heartbeat period, in one batched call.

        Sent at a fixed rate, and at least twice per self-fence window
        (``lease_ms − heartbeat_ms``), so that a lease of twice the heartbeat still
        gets an acknowledgement before its runner would fence itself.
        """
        config = self.config
        period = min(config.heartbeat_ms, (config.lease_ms - config.heartbeat_ms) / 2) / 1000
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            next_at = max(next_at + period, loop.time())
            await asyncio.sleep(next_at - loop.time())
            held = [a for a in self.held.values() if not (a.done or a.lost)]
            if not held:
                continue
            sent = loop.time()
            try:
                verdicts = await self.backend.heartbeat(
                    [a.lease for a in held], self.config.lease_ms
                )
            except Exception as exc:
                self.telemetry.store_error("heartbeat")
                self.log.warn(None, None, None, "heartbeat failed: %s", exc)
                continue
            for attempt, ok in zip(held, verdicts, strict=True):
                if attempt.done or attempt.released or (attempt.finishing and not ok):
                    continue
                if ok:
                    attempt.last_ack = sent
                    self._arm_self_fence(attempt)
                else:
                    self.telemetry.fenced(attempt.job.store_name, "heartbeat")
                    self._lose(attempt, "heartbeat rejected by the store")

    async def hand_over(self) -> None:
        """Cancel what still runs and release its leases so that a backup starts at once."""
        remaining = [a for a in self.held.values() if not a.done]
        for attempt in remaining:
            attempt.released = True
            self._signal(attempt, "stopping")
        if self._lease and remaining:
            results = await asyncio.gather(
                *(self.backend.release(a.lease) for a in remaining), return_exceptions=True
            )
            for attempt, result in zip(remaining, results, strict=True):
                where = (attempt.job, attempt.lease.slot, attempt.lease.attempt)
                if isinstance(result, BaseException):
                    self.telemetry.store_error("release", attempt.job.store_name)
                    self.log.warn(
                        *where,
                        "could not release the lease at stop (a backup "
                        "takes over after expiry): %s",
                        result,
                    )
                else:
                    self.telemetry.handed_over(attempt.job.store_name)
                    self.log.info(*where, "handed over at stop")
        for task in list(self.tasks):
            task.cancel()
