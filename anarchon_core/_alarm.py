"""One event-loop timer for many sleepers.

An engine with 1,000 jobs has 1,000 job loops asleep until their next slot. Each
``asyncio.sleep()`` makes a timer handle, a copy of the context, a future and a
coroutine, all of which live until the slot: they outlive two garbage collections and
are promoted to the oldest generation, and that many promotions per slot boundary
trigger a full collection about once a boundary (tens of milliseconds with a web app's
heap, on the loop the app serves its requests from). Asleep on an :class:`Alarm`, a
loop costs one future and one heap entry; one timer handle serves them all.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools

__all__ = ["Alarm"]


class Alarm:
    """Futures that complete at given times of the running loop's clock."""

    def __init__(self) -> None:
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()  # ties are woken in the order they were set
        self._timer: asyncio.TimerHandle | None = None

    def sleep(self, delay_s: float) -> asyncio.Future[None]:
        """A future that completes after ``delay_s`` seconds; cancel it to stop waiting."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        when = loop.time() + max(delay_s, 0.0)
        heapq.heappush(self._sleepers, (when, next(self._order), future))
        if self._timer is None or when < self._timer.when():
            self._arm(loop, when)
        return future

    def close(self) -> None:
        """Cancel the timer and forget every sleeper (their loops have ended)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for _, _, future in self._sleepers:
            future.cancel()
        self._sleepers.clear()

    def _arm(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = loop.call_at(when, self._ring, loop, when)

    def _ring(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        """Wake every sleeper due by the time this timer was set for (the loop runs a
        timer slightly before its time, within the clock's resolution), re-arm for the
        next one."""
        self._timer = None
        sleepers = self._sleepers
        now = max(loop.time(), when)
        while sleepers and sleepers[0][0] <= now:
            future = heapq.heappop(sleepers)[2]
            if not future.done():  # else its loop was cancelled (a stop)
                future.set_result(None)
        if sleepers:
            self._arm(loop, sleepers[0][0])
