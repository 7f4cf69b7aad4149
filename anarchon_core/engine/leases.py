"""The leases of the attempts this instance holds: heartbeats and self-fencing.

Every held attempt is in :attr:`Leases.held` from the moment its claim or takeover was
won until its outcome is recorded, so that its lease keeps being extended while the
finish mark is (re)sent. The heartbeat is one batched store call per period for all
held attempts; each acknowledgement moves the attempt's self-fence deadline to
``lease_ms − heartbeat_ms`` after that heartbeat was sent, and one timer fences every
runner whose deadline passes (the store stopped answering). The first deadline counts
from the first send of the winning claim or takeover. Every time here is the event
loop's clock, so a loop on virtual time runs the whole protocol on it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from ..backend import Backend, Lease
from ..context import RunContext
from ..job import Job
from .support import EngineConfig, EngineLog

__all__ = ["Attempt", "Leases"]


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
    #: Its handler has returned and its finish mark is being sent: from then on it is
    #: never handed over, and a heartbeat refused (or unanswered) may be so because that
    #: mark landed first; the finish's own answer tells if it was fenced.
    finishing: bool = False

    def signal(self, reason: str) -> None:
        """Tell the handler to stop (an async one is cancelled too)."""
        self.ctx._cancel(reason)
        if self.job.is_async and self.future is not None:
            self.future.cancel()


class Leases:
    """Keeps the held attempts' leases: one heartbeat call per period, one fence timer."""

    def __init__(self, backend: Backend, config: EngineConfig, log: EngineLog) -> None:
        self.backend = backend
        self.config = config
        self.log = log
        self.telemetry = config.telemetry
        self.held: dict[tuple[str, int], Attempt] = {}
        #: One timer for every held attempt's self-fence, set for the soonest.
        self._fence_timer: asyncio.TimerHandle | None = None

    @property
    def fence_window_s(self) -> float:
        """How long a runner may go without an acknowledged heartbeat before it fences."""
        return (self.config.lease_ms - self.config.heartbeat_ms) / 1000

    def hold(self, attempt: Attempt) -> None:
        """Keep ``attempt``'s lease from now on (its first deadline counts from
        ``attempt.last_ack``)."""
        self.held[(attempt.lease.job, attempt.lease.slot)] = attempt
        self._arm_self_fence(attempt)

    def drop(self, attempt: Attempt) -> None:
        """Stop keeping ``attempt``'s lease (its outcome is recorded, or it was lost)."""
        if self.held.get((attempt.lease.job, attempt.lease.slot)) is attempt:
            del self.held[(attempt.lease.job, attempt.lease.slot)]

    def _arm_self_fence(self, attempt: Attempt) -> None:
        """Stop a runner before any backup could take over if its heartbeats go unanswered.

        One timer serves every held attempt (a timer per attempt, re-made at every
        acknowledgement, would be thousands of long-lived timer handles to collect): it
        is set no later than the soonest deadline (an acknowledgement moves deadlines
        later and leaves it early) and, when it fires, fences what is due and is set
        again for the soonest deadline left.
        """
        loop = asyncio.get_running_loop()
        attempt.fence_at = attempt.last_ack + self.fence_window_s
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
                    self.lose(attempt, "no heartbeat acknowledged")
                except Exception as exc:  # a logging filter or a metrics exporter
                    loop.call_exception_handler(
                        {"message": "anarchon: self-fencing an attempt failed", "exception": exc}
                    )

    def lose(self, attempt: Attempt, reason: str) -> None:
        """The attempt lost its lease: tell its handler (unless its finish decides)."""
        if attempt.done or attempt.lost or attempt.finishing:
            return
        attempt.lost = True
        self.telemetry.lost_lease(attempt.job.store_name)
        self.log.warn(
            "lost the run: %s",
            reason,
            job=attempt.job,
            slot=attempt.lease.slot,
            attempt=attempt.lease.attempt,
        )
        attempt.signal(f"lease lost: {reason}")

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
            if held:
                await self._beat(held, loop.time())

    async def _beat(self, held: list[Attempt], sent: float) -> None:
        try:
            verdicts = await self.backend.heartbeat([a.lease for a in held], self.config.lease_ms)
        except Exception as exc:
            self.telemetry.store_error("heartbeat")
            self.log.warn("heartbeat failed: %s", exc)
            return
        for attempt, ok in zip(held, verdicts, strict=True):
            if attempt.done or attempt.released or (attempt.finishing and not ok):
                continue
            if ok:
                attempt.last_ack = sent
                self._arm_self_fence(attempt)
            else:
                self.telemetry.fenced(attempt.job.store_name, "heartbeat")
                self.lose(attempt, "heartbeat rejected by the store")
